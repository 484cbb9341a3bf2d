"""The argument grammar of every config in `stalesgd.configs`, parsed in one place.

A config is selected as ``--config=NAME:ARG`` (ml_collections passes ``ARG``
to ``get_config``). ``ARG`` is a comma-separated list of tokens, in any order:

* ``quick``: the variant that runs in minutes on a CPU with no download (what
  it changes is in each file's ``get_config`` docstring);
* one variant name of that file (e.g. ``softsync_inverse``); without one, the
  file's default variant.

So ``""``, ``"quick"``, ``"softsync_inverse"``, ``"quick,softsync_inverse"``
and ``"softsync_inverse,quick"`` are all valid. Numbers (``n``, ``learners``,
epochs...) are not part of the grammar: override them on the command line,
e.g. ``--config.n=15``, so that every run is one config string plus overrides.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import NamedTuple

QUICK = "quick"


class ConfigArguments(NamedTuple):
  """A parsed config argument.

  Attributes:
    variant: the selected variant name.
    quick: whether the CPU-sized ``quick`` variant was asked for.
  """

  variant: str
  quick: bool


def parse_config_argument(
  arg: str | None, *, variants: Sequence[str], default: str, has_quick: bool = True
) -> ConfigArguments:
  """Parses ``"[quick,][VARIANT]"`` (tokens comma-separated, any order).

  Args:
    arg: the string after ``:`` in ``--config=FILE.py:ARG``; None or empty
      selects the default variant.
    variants: the variant names the config file offers.
    default: the variant used when ``arg`` names none; one of ``variants``.
    has_quick: whether the file has a ``quick`` variant; without one, ``quick`` is an unknown token and no
      message offers it.

  Returns:
    The variant and whether ``quick`` was given.

  Raises:
    ValueError: for an unknown or repeated token, or two variant names.
  """
  if default not in variants:
    raise ValueError(f"default={default!r} is not a variant; allowed: {tuple(variants)}")
  tokens = [token.strip() for token in (arg or "").split(",") if token.strip()]
  if has_quick:
    allowed = f"{QUICK!r} and at most one of {tuple(variants)}, comma-separated"
  else:
    allowed = f"one of {tuple(variants)} (this config has no {QUICK!r} variant)"
  if len(set(tokens)) != len(tokens):
    raise ValueError(f"config argument {arg!r} repeats a token; allowed: {allowed}")
  known = (*variants, QUICK) if has_quick else tuple(variants)
  unknown = [token for token in tokens if token not in known]
  if unknown:
    nearest = difflib.get_close_matches(unknown[0], known, n=1)
    hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
    raise ValueError(f"config argument {arg!r} has unknown token(s) {unknown}{hint}; allowed: {allowed}")
  named = [token for token in tokens if token != QUICK]
  if len(named) > 1:
    raise ValueError(f"config argument {arg!r} names {len(named)} variants {named}; allowed: {allowed}")
  return ConfigArguments(variant=named[0] if named else default, quick=QUICK in tokens)
