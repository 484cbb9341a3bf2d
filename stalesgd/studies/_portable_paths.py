"""The paths a study's report records, written so that they hold on any machine.

A report (``runs.csv``, ``README.md``, the progress report) is committed under ``results/`` and read elsewhere,
so it names no absolute path of the machine that ran it:

* a data directory (``--data_dir=``, ``--config.data_dir=``, ``CIFAR10_NPZ=``, ``MNIST_NPZ=``, any flag or
  variable whose name ends in ``data_dir``, ``DATA_DIR`` or ``_NPZ``) is `DATA_DIR`, a placeholder for the
  reader's own copy (its content is recorded as sha256 digests in the README's *Code, machine, data*);
* every other path a report records (a run's directory, the study's ``--workdir``, ``--pilot_dir``,
  ``--compare_with``) is relative to the study's directory: a run's is ``<variant slug>/seed_<s>``, the study's
  own ``.``, its pilot's e.g. ``../kale_pilot``. A relative path in a command (``--workdir=runs/demo``) is kept as
  typed, since it names no machine.

`stalesgd.studies._report` writes through `portable_row` and `portable_text`;
``experiments/relative_result_paths.py`` rewrites reports written before them with the same functions.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

DATA_DIR = "$DATA_DIR"
# A data directory given as a flag or an environment variable: the name, then an absolute path.
_DATA_PATH = re.compile(
  r"(?P<name>--[\w.]*data_dir=|(?<![\w$])[A-Z][A-Z0-9_]*(?:DATA_DIR|_NPZ)=)(?P<path>/[^\s,;\"'`)\]]*)"
)
# An absolute path a flag names (``--workdir=/...``, ``--pilot_dir /...``).
_FLAG_PATH = re.compile(r"(?P<name>--[\w.-]+[= ])(?P<path>/[\w.+@%~-][^\s,;\"'`)\]]*)")
# Any absolute path of two or more parts standing alone: after the start of a line, a space, a quote, a
# backquote, "(", "=" or ",".
ABSOLUTE_PATH = re.compile(r"(?:^|(?<=[\s\"'`(=,]))(?P<path>/[\w.+@%~-]+/[^\s,;\"'`)\]]*)", re.MULTILINE)


def relative_to_study(path: str | os.PathLike[str], study_dir: str | os.PathLike[str]) -> str:
  """``path`` relative to the study's directory (``.`` for the directory itself), with ``/`` separators."""
  return pathlib.PurePath(os.path.relpath(os.path.abspath(path), os.path.abspath(study_dir))).as_posix()


def portable_path(path: str | os.PathLike[str], study_dir: str | os.PathLike[str]) -> str:
  """A path a report names: an absolute one relative to the study's directory, a relative one as given."""
  return relative_to_study(path, study_dir) if os.path.isabs(path) else pathlib.PurePath(path).as_posix()


def _strip(path: str) -> tuple[str, str]:
  """A path matched in prose, and the sentence punctuation after it (``/a/b.`` -> ``/a/b``, ``.``)."""
  stripped = path.rstrip(".:")
  return stripped, path[len(stripped) :]


def _under(path: str, study_dir: str) -> bool:
  return path == study_dir or path.startswith(study_dir.rstrip("/") + "/")


def portable_text(text: str, study_dir: str | os.PathLike[str] | None) -> str:
  """``text`` (a command, a README, a CSV's text) with its absolute paths written as the module docstring says.

  Rewritten: a data directory given as a flag or variable (`DATA_DIR`); a path a flag names (relative to
  ``study_dir``); any absolute path inside ``study_dir`` wherever it stands. Another absolute path in prose is
  left as it is (`absolute_paths` finds it). ``study_dir`` None (not known): data directories only.
  Idempotent: what it writes holds no absolute path it would rewrite again.
  """
  text = _DATA_PATH.sub(lambda match: match["name"] + DATA_DIR, text)
  if study_dir is None:
    return text
  study = os.path.abspath(study_dir)

  def flag(match: re.Match[str]) -> str:
    path, tail = _strip(match["path"])
    return match["name"] + relative_to_study(path, study) + tail

  text = _FLAG_PATH.sub(flag, text)
  if not os.path.isabs(os.fspath(study_dir)):
    return text

  def inside(match: re.Match[str]) -> str:
    path, tail = _strip(match["path"])
    return relative_to_study(path, study) + tail if _under(path, study) else match[0]

  return ABSOLUTE_PATH.sub(inside, text)


def portable_row(row: Mapping[str, Any], study_dir: str | os.PathLike[str]) -> dict[str, Any]:
  """A ``runs.csv`` row as written: its ``workdir`` relative to the study's directory, its ``command`` likewise
  (`portable_text`). The row the report reads its runs from keeps the path it was given."""
  written = dict(row)
  if written.get("workdir") is not None:
    written["workdir"] = relative_to_study(written["workdir"], study_dir)
  if isinstance(written.get("command"), str):
    command = written["command"]
    if written.get("workdir") is not None:
      command = command.replace(f"--workdir={row['workdir']}", f"--workdir={written['workdir']}")
    written["command"] = portable_text(command, study_dir)
  return written


def absolute_paths(text: str) -> list[str]:
  """The absolute paths that stand alone in ``text`` (`ABSOLUTE_PATH`), in order."""
  return [_strip(match["path"])[0] for match in ABSOLUTE_PATH.finditer(text)]
