"""A study's pilot: its grid of runs, the value it chooses per variant family, and the decision grid that uses it.

A study with a `stalesgd.studies._study.Pilot` runs in two steps (docs/studies.md, *Pilots*):

1. ``stalesgd-reproduce --study=NAME --pilot``: `pilot_study` runs every variant at every value of the pilot's
   grid, on the pilot's seeds, evaluated on a validation split held out of the training data; `write_choice`
   then writes ``choice.json`` and ``choice.md`` into the pilot's directory: every family's mean validation
   error per value, which values had a diverged run, and the value chosen (`Pilot`'s rule).
2. ``stalesgd-reproduce --study=NAME``: `read_choice` reads that file (refusing one written for another pilot
   definition, or a family with no value chosen) and `with_choice` sets each variant's field to its family's
   value; the decision grid copies the choice into its own directory, beside its report.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from stalesgd.reports import _tables as tables
from stalesgd.studies._report import FINAL, is_diverged
from stalesgd.studies._study import Study, Variant

CHOICE_FILENAME = "choice.json"
CHOICE_MARKDOWN = "choice.md"
DEFAULT_PILOT_DIRECTORY = "pilot"  # a decision grid's pilot, under its workdir, unless --pilot_dir names another
RULE = (
  "per family, the value whose runs' mean validation error (each run: the mean of its last {last} evaluations) "
  "is lowest, among the values none of whose runs diverged; equal means go to the smaller value"
)


def _value_text(value: float) -> str:
  return f"{value:g}"


def _pilot_variant(variant: Variant, field: str, value: float, fraction: float) -> Variant:
  return Variant(
    f"{variant.label}, {field}={_value_text(value)}",
    variant.config_file,
    variant.config_variant,
    {**variant.overrides, field: value, "validation_fraction": fraction},
  )


def pilot_study(study: Study) -> Study:
  """The pilot's grid as a study of its own (no claims): every variant at every value, on the validation split.

  Raises:
    ValueError: for a study without a pilot.
  """
  pilot = _require_pilot(study)
  variants = tuple(
    _pilot_variant(variant, pilot.field, value, pilot.validation_fraction)
    for variant in study.variants
    for value in pilot.values
  )
  return Study(
    name=f"{study.name}_pilot",
    title=f"pilot of {study.name}: {pilot.field} on a validation split ({pilot.validation_fraction:g} of train)",
    finding=f"chooses {pilot.field} per variant family for {study.name}'s decision grid: "
    + RULE.format(last=study.last_evaluations),
    variants=variants,
    paper_data=study.paper_data,
    has_quick=study.has_quick,
    short_epochs=study.short_epochs,
    last_evaluations=study.last_evaluations,
  )


def _require_pilot(study: Study):
  if study.pilot is None:
    raise ValueError(f"study {study.name!r} has no pilot; allowed: a study whose Study.pilot is set")
  return study.pilot


def _cells(study: Study) -> dict[str, tuple[str, float]]:
  """The pilot run's slug -> (its family, its value), in `pilot_study`'s order (variant by variant, each value)."""
  values = _require_pilot(study).values
  cells = [(variant.family, value) for variant in study.variants for value in values]
  return {variant.slug: cell for variant, cell in zip(pilot_study(study).variants, cells, strict=True)}


def choose(study: Study, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """The choice record from the pilot's finished runs (their report rows, with `FINAL` and ``status``).

  Per family and value: the runs, their mean value, and how many diverged; the chosen value (None if every value
  had a diverged run). Rule: `Pilot`'s, in words in the record.
  """
  pilot = _require_pilot(study)
  cells = _cells(study)
  families: dict[str, dict[str, Any]] = {}
  for family in dict.fromkeys(variant.family for variant in study.variants):
    scores = {}
    for value in pilot.values:
      runs = [row for row in rows if cells.get(row["slug"]) == (family, value)]
      diverged = sum(is_diverged(row) for row in runs)
      finals = [row.get(FINAL) for row in runs if not is_diverged(row)]
      complete = all(isinstance(final, (int, float)) and math.isfinite(final) for final in finals)
      scores[_value_text(value)] = {
        "value": value,
        "runs": len(runs),
        "diverged": diverged,
        "mean": sum(finals) / len(finals) if finals and complete else None,
      }
    eligible = [score for score in scores.values() if score["diverged"] == 0 and score["mean"] is not None]
    chosen = min(eligible, key=lambda score: (score["mean"], score["value"]))["value"] if eligible else None
    families[family] = {"chosen": chosen, "scores": scores}
  return {
    "study": study.name,
    "pilot": pilot.record(),
    "last_evaluations": study.last_evaluations,
    "rule": RULE.format(last=study.last_evaluations),
    "families": families,
  }


def choice_markdown(choice: Mapping[str, Any]) -> str:
  """The choice as a Markdown table: one row per family, one column per value, the chosen value last."""
  pilot = choice["pilot"]
  values = [_value_text(value) for value in pilot["values"]]
  rows = []
  for family, entry in choice["families"].items():
    row = {"family": family}
    for text in values:
      score = entry["scores"][text]
      if score["diverged"]:
        row[text] = f"{score['diverged']} of {score['runs']} diverged"
      else:
        row[text] = "-" if score["mean"] is None else f"{score['mean']:.2f}"
    row["chosen"] = "none (every value had a diverged run)" if entry["chosen"] is None else _value_text(entry["chosen"])
    rows.append(row)
  heading = (
    f"Pilot of {choice['study']}: {pilot['field']}, validation error % (mean over the family's runs, seeds "
    f"{', '.join(str(seed) for seed in pilot['seeds'])}; {pilot['validation_fraction']:g} of the training split "
    f"held out, the test split unread). Rule: {choice['rule']}.\n\n"
  )
  return heading + tables.markdown_table(rows, ["family", *values, "chosen"])


def write_choice(study: Study, rows: Sequence[Mapping[str, Any]], directory: str | pathlib.Path) -> str:
  """Writes ``choice.json`` and ``choice.md`` into the pilot's directory; returns the Markdown."""
  directory = pathlib.Path(directory)
  choice = choose(study, rows)
  (directory / CHOICE_FILENAME).write_text(json.dumps(choice, indent=2) + "\n", encoding="utf-8")
  markdown = choice_markdown(choice)
  (directory / CHOICE_MARKDOWN).write_text(markdown, encoding="utf-8")
  return markdown


def read_choice(study: Study, directory: str | pathlib.Path) -> dict[str, Any]:
  """The choice a finished pilot wrote into ``directory``.

  Raises:
    FileNotFoundError: no pilot has finished there (the message gives the command that runs it).
    ValueError: the file was written for another pilot definition or study, or a family has no value chosen.
  """
  path = pathlib.Path(directory) / CHOICE_FILENAME
  if not path.exists():
    raise FileNotFoundError(
      f"study {study.name!r} chooses {_require_pilot(study).field} in a pilot first, and {path} does not exist: "
      f"run `stalesgd-reproduce --study={study.name} --pilot --workdir={directory}` (same data flags) and let it "
      "finish, then this grid"
    )
  choice = json.loads(path.read_text(encoding="utf-8"))
  pilot = _require_pilot(study).record()
  if choice.get("study") != study.name or choice.get("pilot") != pilot:
    raise ValueError(
      f"{path} holds the choice of another pilot ({choice.get('study')!r}: {choice.get('pilot')}); allowed: "
      f"study {study.name!r}'s pilot {pilot}: run its pilot again"
    )
  missing = [family for family in dict.fromkeys(v.family for v in study.variants) if family not in choice["families"]]
  unchosen = [family for family, entry in choice["families"].items() if entry["chosen"] is None]
  if missing or unchosen:
    raise ValueError(
      f"{path}: no value chosen for the families {missing + unchosen} (every value had a diverged run, or the "
      f"family was not piloted); allowed: a pilot whose grid {pilot['values']} holds a value that trains"
    )
  return choice


def with_choice(study: Study, choice: Mapping[str, Any]) -> Study:
  """The decision grid: every variant with its family's chosen value of the pilot's field as an override (so the
  value is part of every run's config and of the registration, which also records the pilot's definition)."""
  pilot = _require_pilot(study)
  variants = tuple(
    dataclasses.replace(
      variant, overrides={**variant.overrides, pilot.field: choice["families"][variant.family]["chosen"]}
    )
    for variant in study.variants
  )
  return dataclasses.replace(study, variants=variants)


def copy_choice(source: str | pathlib.Path, workdir: str | pathlib.Path) -> None:
  """Copies a pilot's ``choice.json`` and ``choice.md`` into the decision grid's directory as
  ``pilot_choice.json`` / ``pilot_choice.md``, beside its report."""
  source, workdir = pathlib.Path(source), pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  for name in (CHOICE_FILENAME, CHOICE_MARKDOWN):
    if (source / name).exists():
      (workdir / f"pilot_{name}").write_text((source / name).read_text(encoding="utf-8"), encoding="utf-8")
