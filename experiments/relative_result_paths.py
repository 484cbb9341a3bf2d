"""Rewrites results directories so that they name no absolute path of the machine that ran them.

  python experiments/relative_result_paths.py [--check] [DIR ...]

DIR: a results directory, or ``results/`` itself (the default: every directory under it). Rewritten: every
report file of DIR (``README.md``, ``runs.csv``, ``results.csv``, the other ``.md``, ``.csv``, ``.json`` and
``.log`` files, ``progress/`` included), as a new report writes them (`stalesgd.studies._portable_paths`): a data
directory named by a flag or variable (``--data_dir=``, ``--config.data_dir=``, ``CIFAR10_NPZ=``) as
``$DATA_DIR``; a run's directory, the study's ``--workdir`` and every other path a flag names relative to the
study's directory (``hardsync/seed_0``, ``.``, ``../kale_pilot``). The study's directory on the machine that ran
it is read from the README's command (``--workdir=``), or else from the run directories of ``runs.csv`` /
``results.csv`` (``<study>/<variant slug>/seed_<s>``). Run records under ``DIR/runs/`` (``config.json``,
``summary.json``, ...) are raw records and are left as they were written.

Idempotent: a second pass changes nothing. Prints every file it changed, and every absolute path it left (one
it cannot place, e.g. in a hand-written *Notes* section: edit that by hand). ``--check`` changes nothing and exits
1 if a file would change or an absolute path is left.

``experiments/run_pinned.sh save`` runs it, from the working tree's code, on every directory it saves: its grids
are gathered by the runs' own pinned commits, whose reports may predate these rules.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import os
import pathlib
import re
import sys
from collections.abc import Iterator, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file (python experiments/relative_result_paths.py), not only with -m
  sys.path.insert(0, str(ROOT))

from stalesgd.studies import _portable_paths as portable  # noqa: E402

RESULTS = ROOT / "results"
RUN_RECORDS = "runs"  # DIR/runs/: the runs' own records, copied as they were written
REPORT_SUFFIXES = (".md", ".csv", ".json", ".log")
_COMMAND_WORKDIR = re.compile(r"^stalesgd-reproduce .*?--workdir=(?P<path>/\S+)", re.MULTILINE)
_RUN_DIRECTORY = re.compile(r"^(?P<study>/.+)/[^/]+/seed_\d+/?$")


def report_files(directory: pathlib.Path) -> Iterator[pathlib.Path]:
  """The report files under ``directory`` (`REPORT_SUFFIXES`), leaving out every results directory's ``runs/``.

  ``directory`` is a results directory (its ``runs/``: the first part below it) or ``results/`` (the second).
  """
  for path in sorted(directory.rglob("*")):
    if path.is_file() and path.suffix in REPORT_SUFFIXES:
      if RUN_RECORDS not in path.relative_to(directory).parts[:-1][:2]:
        yield path


def results_directory_of(path: pathlib.Path) -> pathlib.Path:
  """The results directory a report file belongs to (``progress/`` is its directory's)."""
  return path.parent.parent if path.parent.name == "progress" else path.parent


def _run_directories(directory: pathlib.Path) -> list[str]:
  found = []
  for name in ("runs.csv", "results.csv"):
    path = directory / name
    if path.exists():
      with open(path, newline="", encoding="utf-8") as file:
        found += [row["workdir"] for row in csv.DictReader(file) if row.get("workdir")]
  return found


def study_directory(directory: pathlib.Path) -> str | None:
  """Where the study of a results directory ran, on the machine that ran it, if its files record it absolute.

  The README's ``stalesgd-reproduce ... --workdir=/...``; else the directory most of its absolute run directories
  (``<study>/<slug>/seed_<s>``) lie in; else None (nothing absolute is known).
  """
  readme = directory / "README.md"
  if readme.exists():
    match = _COMMAND_WORKDIR.search(readme.read_text(encoding="utf-8"))
    if match:
      return match["path"].rstrip("/")
  studies = collections.Counter(
    match["study"] for path in _run_directories(directory) if (match := _RUN_DIRECTORY.match(path))
  )
  return studies.most_common(1)[0][0] if studies else None


def rewrite_csv(text: str, study_dir: str | None) -> str:
  """A CSV's text with its ``workdir`` column relative to the study's directory and every cell `portable_text`."""
  rows = list(csv.reader(io.StringIO(text, newline="")))
  if not rows:
    return text
  header = rows[0]
  workdir = header.index("workdir") if "workdir" in header else None
  for row in rows[1:]:
    for index, cell in enumerate(row):
      if index == workdir and study_dir is not None and cell.startswith("/"):
        row[index] = portable.portable_path(cell, study_dir)
      else:
        row[index] = portable.portable_text(cell, study_dir)
  out = io.StringIO(newline="")
  csv.writer(out, lineterminator="\r\n" if "\r\n" in text else "\n").writerows(rows)
  return out.getvalue()


_ANOTHER_RESULTS_DIRECTORY = re.compile(r"/[^\s`'\"()\[\]]*?/results/(?P<name>[\w.-]+)")


def _relative_results_links(text: str, path: pathlib.Path) -> str:
  """An absolute path of another results directory (a progress report's earlier grid, written by code pinned before
  reports wrote relative paths), as the path from ``path``'s folder to that directory."""

  def relative(match: re.Match) -> str:
    target = RESULTS / match.group("name")
    return os.path.relpath(target, path.parent) if target.is_dir() else match.group(0)

  return _ANOTHER_RESULTS_DIRECTORY.sub(relative, text)


def rewritten(path: pathlib.Path, study_dir: str | None) -> str:
  text = _relative_results_links(path.read_text(encoding="utf-8"), path)
  if path.suffix == ".csv":
    return rewrite_csv(text, study_dir) if portable.absolute_paths(text) else text
  return portable.portable_text(text, study_dir)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("directories", nargs="*", type=pathlib.Path, help="results directories (default: results/)")
  parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything would change")
  arguments = parser.parse_args(argv)
  directories = arguments.directories or [RESULTS]
  changed, left = [], []
  studies: dict[pathlib.Path, str | None] = {}
  for directory in directories:
    if not directory.is_dir():
      parser.error(f"{directory}: not a directory; allowed: a results directory or results/")
    for path in report_files(directory):
      owner = results_directory_of(path)
      if owner not in studies:
        studies[owner] = study_directory(owner)
      text = rewritten(path, studies[owner])
      if text != path.read_text(encoding="utf-8"):
        changed.append(path)
        if not arguments.check:
          path.write_text(text, encoding="utf-8")
      left += [f"{path}: {found}" for found in dict.fromkeys(portable.absolute_paths(text))]
  for path in changed:
    print(f"{'would rewrite' if arguments.check else 'rewrote'} {path}")
  for entry in left:
    print(f"absolute path left (edit by hand): {entry}", file=sys.stderr)
  return 1 if arguments.check and (changed or left) else 0


if __name__ == "__main__":
  raise SystemExit(main())
