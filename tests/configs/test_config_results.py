"""Every number a packaged config's docstring *Result* quotes is its ``RESULTS``, and both agree with ``results/``.

Each config module's ``RESULTS`` (`stalesgd.configs._results.ConfigResult`) names, per number, the results
directory, the variant (a row of that directory's ``results.csv``), the statistic (its columns) and the value and
std to the precision printed. Here each is read back from ``results.csv`` and rounded to that precision, and the
docstring's *Result* paragraph must print the same number and cite the same directory: a rerun that changes a
results.csv, or an edit of either the docstring or RESULTS alone, fails here. A config whose *Result* names no
number (its RESULTS empty) must say "not measured" there.
"""

from __future__ import annotations

import csv
import functools
import importlib
import pathlib
import re

import pytest

from stalesgd import configs
from stalesgd.configs._results import FINAL, LAST, STATISTIC_COLUMNS, ConfigResult

ROOT = pathlib.Path(__file__).resolve().parents[2]
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def module(name: str):
  return importlib.import_module(f"stalesgd.configs.{name}")


def result_paragraph(name: str) -> str:
  """The docstring's paragraph starting ``Result``, its whitespace collapsed (a number may wrap a line)."""
  found = [part for part in PARAGRAPH_BREAK.split(module(name).__doc__ or "") if part.lstrip().startswith("Result")]
  assert len(found) == 1, f"{name}: {len(found)} paragraphs start with 'Result'; one wanted"
  return " ".join(found[0].split())


@functools.cache
def results_csv(directory: str) -> tuple[dict[str, str], ...]:
  with open(ROOT / directory / "results.csv", newline="", encoding="utf-8") as file:
    return tuple(csv.DictReader(file))


def printed_in(number: str, text: str) -> bool:
  """Whether ``text`` prints ``number`` as a whole number (``1.3`` is not in ``1.33`` nor in ``21.3``)."""
  return re.search(rf"(?<![\d.]){re.escape(number)}(?!\d|\.\d)", text) is not None


QUOTED = [(name, result) for name in configs.names() for result in module(name).RESULTS]
NOT_QUOTED = [name for name in configs.names() if not module(name).RESULTS]


def test_every_config_has_its_results_as_data():
  for name in configs.names():
    results = module(name).RESULTS
    assert isinstance(results, tuple) and all(isinstance(result, ConfigResult) for result in results), name
  assert len(QUOTED) >= 40 and len(NOT_QUOTED) <= 5, (len(QUOTED), NOT_QUOTED)


@pytest.mark.parametrize(
  "name, result", QUOTED, ids=[f"{name}: {result.variant} ({result.directory})" for name, result in QUOTED]
)
def test_the_value_is_what_results_csv_holds_to_the_printed_precision(name, result):
  rows = [row for row in results_csv(result.directory) if row["variant"] == result.variant]
  assert len(rows) == 1, f"{name}: {len(rows)} rows of {result.directory}/results.csv are {result.variant!r}"
  value_column, std_column = STATISTIC_COLUMNS[result.statistic]
  shown = f"{float(rows[0][value_column]):.{result.decimals}f}"
  assert shown == f"{result.value:.{result.decimals}f}", (
    f"{name}: {result.variant} in {result.directory} is {shown} ({value_column}), RESULTS says {result.value}"
  )
  if result.std is not None:
    shown_std = f"{float(rows[0][std_column]):.{result.decimals}f}"
    assert shown_std == f"{result.std:.{result.decimals}f}", (
      f"{name}: {result.variant}'s std in {result.directory} is {shown_std}, RESULTS says {result.std}"
    )


@pytest.mark.parametrize(
  "name, result", QUOTED, ids=[f"{name}: {result.variant} ({result.directory})" for name, result in QUOTED]
)
def test_the_docstrings_result_quotes_the_same_number_and_directory(name, result):
  paragraph = result_paragraph(name)
  assert printed_in(result.printed(), paragraph), f"{name}: its Result does not print {result.printed()!r}"
  assert result.directory in paragraph, f"{name}: its Result does not cite {result.directory}"


@pytest.mark.parametrize("name", NOT_QUOTED)
def test_a_config_whose_result_names_no_number_says_not_measured(name):
  """These configs' Result paragraphs name no number of results/ (RESULTS is empty): each says so."""
  assert result_paragraph(name).startswith("Result: not measured"), f"{name}: RESULTS is empty, its Result is not"


def test_a_result_names_a_known_statistic_and_prints_as_the_docstring_does():
  assert ConfigResult("results/x", "v", value=1.4, std=0.3, decimals=1).printed() == "1.4 ± 0.3"
  assert ConfigResult("results/x", "v", LAST, value=51.88).printed() == "51.88"
  assert ConfigResult("results/x", "v", FINAL, value=33.0, decimals=0).printed() == "33"
  with pytest.raises(ValueError, match="allowed: one of"):
    ConfigResult("results/x", "v", "accuracy", value=1.0)
  with pytest.raises(ValueError, match="results/NAME"):
    ConfigResult("x", "v", value=1.0)
  with pytest.raises(ValueError, match="has none"):
    ConfigResult("results/x", "v", LAST, value=1.0, std=0.1)
  assert printed_in("1.3", "reach 1.3 % in") and not printed_in("1.3", "1.33 and 21.3 and 1.3.4")
