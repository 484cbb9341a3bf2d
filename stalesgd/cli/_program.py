"""What the programs share: absl's ``app.run`` with one-line flag and usage errors (`run_main`, `flag_error_line`)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

HELP_HINT = "Pass --helpshort or --helpfull to see help on flags."
_SUGGESTION = re.compile(r'Did you mean "([^"]+)" instead of "([^"]+)"\?')


def flag_error_line(error: BaseException, argv: Sequence[str]) -> str:
  """One line for a flag that could not be parsed, instead of the traceback absl and ml_collections print.

  * a misspelt config field (``--config.learnrs=4``): ml_collections' AttributeError holds the suggestion;
  * an error inside a config file's ``get_config`` (``--config=demo:nonsense``): absl wraps the file's
    traceback into the flag's error; its last line is the message;
  * other flag errors: absl's own message, first line.
  """
  text = str(error)
  suggestion = _SUGGESTION.search(text)
  if suggestion:
    wanted, given = suggestion.groups()
    flag = next((arg.split("=", 1)[0] for arg in argv if f".{given}" in arg.split("=", 1)[0]), f"--config.{given}")
    return f"{flag}: no such config field; did you mean {flag.rsplit('.', 1)[0]}.{wanted}?"
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  if "Traceback (most recent call last)" in text:
    flag = lines[0].split(": Error whilst", 1)[0] if lines else "a flag"
    return f"{flag}: {lines[-1]}"
  return lines[0] if lines else type(error).__name__


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, ending in `flag_error_line` and exit status 1 where it would print a traceback."""
  from absl import flags

  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError) as error:
    sys.stderr.write(f"FATAL Flags parsing error: {flag_error_line(error, argv)}\n{HELP_HINT}\n")
    sys.exit(1)


def _one_line_usage_errors(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """``main``, printing an ``app.UsageError`` (a bad value, refused before anything expensive starts) as one line.

  absl would print the program's whole short help above the message; the line and the hint to ``--helpshort``
  say the same, and the exit status stays the error's (absl's usage status, 1).
  """
  from absl import app

  def wrapped(argv: list[str]) -> None:
    try:
      main(argv)
    except app.UsageError as error:
      sys.stderr.write(f"FATAL {error}\n{HELP_HINT}\n")
      sys.exit(error.exitcode)

  return wrapped


def run_main(main: Callable[[list[str]], None], module: ModuleType) -> None:
  """``absl.app.run(main)``, with ``module``'s flags listed by ``--helpshort`` and one-line flag and usage errors.

  absl's short help lists the flags of the module ``sys.argv[0]`` names: the
  console script or a wrapper (tests/helpers/workers/paced_main.py) rather
  than the module that defines them, so they are declared key flags of that program as well; and ``--help``
  prints ``module``'s docstring (the program's usage and examples), which absl reads from ``__main__``.
  """
  from absl import (
    app,
    flags,
  )

  for flag in flags.FLAGS.get_key_flags_for_module(module):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  entry = sys.modules.get("__main__")
  if entry is not None and entry is not module and not entry.__doc__:
    # absl's --help prints the docstring of __main__: a console script's wrapper has none (an empty usage line).
    entry.__doc__ = module.__doc__
  app.run(_one_line_usage_errors(main), flags_parser=_parse_flags)
