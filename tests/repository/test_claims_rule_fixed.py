"""The README's claims table says "pre-registered" or "exploratory" for every row as the results computed it.

Each row's *rule fixed* cell must be "pre-registered" exactly when every results directory the row links (or the
row above, for "same") holds a ``preregistration.json`` (a finished report's, or an unfinished grid's in
``progress/``) whose status is pre-registered; a row may not assert it by hand.
"""

from __future__ import annotations

import json
import pathlib
import re

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
HEADER = "| verdict | claim (paper's number) | setting"
CLAIM = "claim (paper's number)"
LINK = re.compile(r"\(results/([\w.-]+)/README\.md\)")


def _claim_rows() -> list[list[str]]:
  lines = (REPOSITORY / "README.md").read_text().splitlines()
  start = next(index for index, line in enumerate(lines) if line.startswith(HEADER))
  header = [cell.strip() for cell in lines[start].strip("|").split("|")]
  rows = []
  for line in lines[start + 2 :]:
    if not line.startswith("|"):
      break
    rows.append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
  return rows


def _status(directory: str) -> str:
  for path in (
    REPOSITORY / "results" / directory / "preregistration.json",
    REPOSITORY / "results" / directory / "progress" / "preregistration.json",
  ):
    if path.exists():
      return json.loads(path.read_text())["status"]
  raise AssertionError(f"results/{directory} holds no preregistration.json (python -m experiments.preregistration)")


def test_every_row_says_what_its_results_computed():
  rows, linked = _claim_rows(), None
  assert rows
  for row in rows:
    linked = LINK.findall(row["results"]) or linked
    assert linked, row[CLAIM]
    expected = "pre-registered" if all(_status(d) == "pre-registered" for d in linked) else "exploratory"
    assert row["rule fixed"].split(" ")[0] == expected, (row[CLAIM], linked)


def test_every_results_readme_says_pre_registered_or_exploratory_as_computed():
  """Where a directory holds a computed ``preregistration.json``, its README says that status; elsewhere (no claim,
  or runs from before the digests were recorded) it says "exploratory"."""
  for directory in sorted(path for path in (REPOSITORY / "results").iterdir() if (path / "README.md").exists()):
    text = (directory / "README.md").read_text().lower()
    try:
      status = _status(directory.name)
    except AssertionError:
      status = "exploratory"
    expected = "pre-registered" if status == "pre-registered" else "exploratory"
    assert expected in text, (directory.name, expected)
