"""Every packaged config says what it gives, in its module docstring (the reader's first stop).

In at most `MAX_LINES` lines: its ``stalesgd-train --config=NAME`` command (and ``stalesgd-reproduce
--study=STUDY`` for every study that runs it), a paragraph starting ``Cost`` and one starting ``Result``, each
citing the ``results/`` path that holds its number or saying "not measured". Every ``results/`` path a
docstring cites exists, so a moved or renamed results directory fails here instead of leaving a dead pointer.
"""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

from stalesgd import configs
from stalesgd.studies import STUDIES

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_LINES = 25
NOT_MEASURED = "not measured"
RESULTS_PATH = re.compile(r"\bresults/[\w.-]*\w")
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def docstring(name: str) -> str:
  return importlib.import_module(f"stalesgd.configs.{name}").__doc__ or ""


def paragraphs_starting(text: str, label: str) -> list[str]:
  return [paragraph for paragraph in PARAGRAPH_BREAK.split(text) if re.match(rf"{label}\b", paragraph.lstrip())]


def test_the_configs_are_found():
  assert len(configs.names()) >= 10


@pytest.mark.parametrize("name", configs.names())
def test_the_docstring_is_short_and_names_the_command(name):
  text = docstring(name)
  assert len(text.strip().splitlines()) <= MAX_LINES, f"{name}: docstring over {MAX_LINES} lines"
  assert f"stalesgd-train --config={name}" in text, f"{name}: docstring lacks its stalesgd-train command"
  assert "python -m experiments" not in text and "experiments/configs" not in text, f"{name}: a removed form"


@pytest.mark.parametrize("name", configs.names())
@pytest.mark.parametrize("label", ["Cost", "Result"])
def test_cost_and_result_cite_a_results_path_or_say_not_measured(name, label):
  found = paragraphs_starting(docstring(name), label)
  assert len(found) == 1, f"{name}: {len(found)} paragraphs start with {label!r}; one wanted"
  assert RESULTS_PATH.search(found[0]) or NOT_MEASURED in found[0], (
    f"{name}: its {label} paragraph neither cites a results/ path nor says {NOT_MEASURED!r}: {found[0]!r}"
  )


@pytest.mark.parametrize("name", configs.names())
def test_every_cited_results_path_exists(name):
  missing = [path for path in RESULTS_PATH.findall(docstring(name)) if not (ROOT / path).exists()]
  assert not missing, f"{name}: cites {missing}, not in the repository"


def test_every_study_is_named_by_the_configs_it_runs():
  missing = [
    f"{config}: stalesgd-reproduce --study={study.name}"
    for study in STUDIES.values()
    for config in sorted({variant.config_file for variant in study.variants})
    if f"stalesgd-reproduce --study={study.name}" not in docstring(config)
  ]
  assert not missing, f"docstrings lacking a study that runs them: {missing}"


def test_the_checks_catch_what_they_are_for():
  uncited = "Cost: about an hour.\n\nResult: 1.2 %.\n"
  assert not RESULTS_PATH.search(paragraphs_starting(uncited, "Cost")[0])
  assert RESULTS_PATH.findall("Result: 1 % (results/demo_3seeds). And results/x.json.") == [
    "results/demo_3seeds",
    "results/x.json",
  ]
