r"""Whether each committed study result was pre-registered, computed from what its runs recorded.

A new report computes it itself (`stalesgd.studies._report`, ``preregistration.json``); this script applies the
same rule (`stalesgd.studies._registration.judge`) to the result directories written before it existed, and to
any other, from the records they keep: ``runs/<variant>/seed_<s>/`` (``registration.json``, ``summary.json``) or
``summaries/<variant>_seed_<s>.json``, for every run that ``runs.csv`` lists (every kept summary where an older
report has no ``runs.csv``); the study is the one its README's
command names (or the one named after a colon). A run whose record is not kept counts as one that recorded no
commit.

  python -m experiments.preregistration results/zhang_mnist_3seeds results/demo_3seeds:demo ...

Writes ``preregistration.json`` (status and reasons) into each directory and prints one line per directory.
Reading an older commit's claims imports that commit's code in a fresh interpreter: a few seconds per commit.
"""

from __future__ import annotations

import csv
import json
import pathlib
import re
import sys

from stalesgd.studies import STUDIES
from stalesgd.studies import _registration as registration
from stalesgd.studies._report import PREREGISTRATION_FILENAME

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
STUDY_FLAG = re.compile(r"--study=(\w+)")


def run_evidence(directory: pathlib.Path, slug: str, seed: int, label: str) -> registration.RunEvidence:
  """The evidence a result directory keeps of one run (its run directory, else its kept summary)."""
  kept = directory / "runs" / slug / f"seed_{seed}"
  if kept.is_dir():
    return registration.evidence_of(label, kept)
  summary = directory / "summaries" / f"{slug}_seed_{seed}.json"
  if summary.exists():
    return registration.RunEvidence(label, None, registration.first_session_commit(json.loads(summary.read_text())))
  return registration.RunEvidence(label, None, None)  # not kept, or diverged (its record holds no commit)


def judge_directory(directory: pathlib.Path, study_name: str | None = None) -> registration.Registration:
  """The verdict for one result directory (its study ``study_name`` or the one its README's command names; its
  runs from runs.csv).

  Raises:
    ValueError: if no known study is named or there is no runs.csv.
  """
  readme = directory / "README.md"
  names = [study_name] if study_name else STUDY_FLAG.findall(readme.read_text()) if readme.exists() else []
  if not names or names[0] not in STUDIES:
    raise ValueError(f"{directory}: its README names no study of {sorted(STUDIES)}")
  study = STUDIES[names[0]]
  runs_csv = directory / "runs.csv"
  if runs_csv.exists():
    with open(runs_csv, newline="", encoding="utf-8") as file:
      rows = list(csv.DictReader(file))
    runs = [
      run_evidence(directory, row["slug"], int(row["seed"]), f"{row['variant']}, seed {row['seed']}") for row in rows
    ]
  elif (directory / "summaries").is_dir():  # a report older than runs.csv: the runs whose summaries it kept
    runs = [
      registration.RunEvidence(path.stem, None, registration.first_session_commit(json.loads(path.read_text())))
      for path in sorted((directory / "summaries").glob("*.json"))
    ]
  else:
    raise ValueError(f"{directory}: neither runs.csv nor summaries/; allowed: a study's report directory")
  return registration.judge(
    study,
    runs,
    registration=None,  # the grid's flags are not kept: the claims are compared, with each run's own record
    claims_at=lambda commit: registration.claims_at_commit(REPOSITORY, commit, study.name),
  )


def main(argv: list[str]) -> int:
  if not argv:
    print(__doc__.strip().splitlines()[6], file=sys.stderr)
    return 2
  for argument in argv:
    name, _, study_name = argument.partition(":")
    directory = pathlib.Path(name)
    verdict = judge_directory(directory, study_name or None)
    (directory / PREREGISTRATION_FILENAME).write_text(
      json.dumps({"status": verdict.status, "reasons": list(verdict.reasons)}, indent=2) + "\n", encoding="utf-8"
    )
    print(f"{directory}: {verdict.describe(most=2)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
