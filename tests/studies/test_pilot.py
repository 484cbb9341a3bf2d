"""A study's pilot (stalesgd.studies._pilot): its grid, the rule that chooses a value per family, and the decision
grid that reads the choice.

The rule under test (docs/studies.md, *Pilots*): per family, the value with the lowest mean validation error over
the family's runs, among the values none of whose runs diverged; equal means go to the smaller value.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from stalesgd.studies import STUDIES
from stalesgd.studies import _pilot as pilots
from stalesgd.studies import _registration as registration
from stalesgd.studies._report import FINAL
from stalesgd.studies._study import Pilot, Study, Variant, slug_of

PILOT = Pilot(field="outer.learning_rate", values=(0.2, 0.5), first_seed=100, seeds=2, validation_fraction=0.25)


def _study() -> Study:
  return Study(
    name="toy_piloted",
    title="toy",
    finding="toy",
    variants=(
      Variant("A M=2", "diloco_digits", "diloco", {"learners": 2}, family="sync"),
      Variant("B M=2", "diloco_digits", "eager", {"learners": 2}, family="eager"),
      Variant("C M=2", "diloco_digits", "delayed", {"learners": 2}, family="eager"),
    ),
    paper_data=False,
    has_quick=False,
    pilot=PILOT,
  )


def _row(label: str, value: float, seed: int, final: float | None, status: str = "ok") -> dict:
  slug = slug_of(f"{label}, outer.learning_rate={value:g}")
  return {"variant": label, "slug": slug, "seed": seed, FINAL: final, "status": status}


def test_the_pilots_grid_is_every_variant_at_every_value_on_the_validation_split():
  grid = pilots.pilot_study(_study())
  assert [variant.label for variant in grid.variants] == [
    "A M=2, outer.learning_rate=0.2",
    "A M=2, outer.learning_rate=0.5",
    "B M=2, outer.learning_rate=0.2",
    "B M=2, outer.learning_rate=0.5",
    "C M=2, outer.learning_rate=0.2",
    "C M=2, outer.learning_rate=0.5",
  ]
  assert grid.variants[1].overrides == {"learners": 2, "outer.learning_rate": 0.5, "validation_fraction": 0.25}
  assert grid.claims == () and grid.pilot is None
  assert "--config.validation_fraction=0.25" in grid.variants[0].command(quick=False)


def test_the_lowest_mean_over_the_familys_runs_is_chosen():
  rows = [
    _row("A M=2", 0.2, 100, 3.0),
    _row("A M=2", 0.2, 101, 5.0),  # mean 4.0
    _row("A M=2", 0.5, 100, 2.0),
    _row("A M=2", 0.5, 101, 4.5),  # mean 3.25: chosen
    # family eager: B and C together. 0.2: (1 + 2 + 9 + 10) / 4 = 5.5; 0.5: (4 + 4 + 4 + 4) / 4 = 4.0
    _row("B M=2", 0.2, 100, 1.0),
    _row("B M=2", 0.2, 101, 2.0),
    _row("C M=2", 0.2, 100, 9.0),
    _row("C M=2", 0.2, 101, 10.0),
    *(_row(label, 0.5, seed, 4.0) for label in ("B M=2", "C M=2") for seed in (100, 101)),
  ]
  choice = pilots.choose(_study(), rows)
  assert choice["families"]["sync"]["chosen"] == 0.5
  assert choice["families"]["sync"]["scores"]["0.2"]["mean"] == pytest.approx(4.0)
  assert choice["families"]["sync"]["scores"]["0.5"]["mean"] == pytest.approx(3.25)
  assert choice["families"]["eager"]["chosen"] == 0.5
  assert choice["families"]["eager"]["scores"]["0.2"]["mean"] == pytest.approx(5.5)
  assert choice["pilot"] == PILOT.record() and choice["pilot"]["seeds"] == [100, 101]


def test_a_value_with_a_diverged_run_is_never_chosen_however_low_its_other_runs():
  rows = [
    _row("A M=2", 0.2, 100, 5.0),
    _row("A M=2", 0.2, 101, 5.0),
    _row("A M=2", 0.5, 100, 0.5),
    _row("A M=2", 0.5, 101, 85.9, status="diverged: back at chance loss from update 40"),
  ]
  choice = pilots.choose(_study(), rows)["families"]["sync"]
  assert choice["chosen"] == 0.2
  assert choice["scores"]["0.5"]["diverged"] == 1 and choice["scores"]["0.5"]["mean"] == pytest.approx(0.5)
  assert "1 of 2 diverged" in pilots.choice_markdown(pilots.choose(_study(), rows))


@pytest.mark.parametrize("missing", [None, float("inf"), float("nan")])
def test_a_value_with_a_run_that_has_no_finite_result_has_no_mean_and_is_not_chosen(missing):
  """A run not marked diverged whose final value is absent or not finite: its value has no mean (not the
  infinite or undefined mean of its runs), so the other value is chosen even though its mean is higher."""
  rows = [
    _row("A M=2", 0.2, 100, 1.0),
    _row("A M=2", 0.2, 101, missing),
    _row("A M=2", 0.5, 100, 3.0),
    _row("A M=2", 0.5, 101, 3.0),
  ]
  choice = pilots.choose(_study(), rows)["families"]["sync"]
  assert choice["scores"]["0.2"]["mean"] is None and choice["scores"]["0.2"]["diverged"] == 0
  assert choice["chosen"] == 0.5


def test_equal_means_go_to_the_smaller_value_and_all_diverged_chooses_none():
  rows = [_row("A M=2", value, seed, 3.0) for value in (0.5, 0.2) for seed in (100, 101)]
  rows += [
    _row(label, value, seed, 90.0, "diverged at update 7")
    for label in ("B M=2", "C M=2")
    for value in (0.2, 0.5)
    for seed in (100, 101)
  ]
  choice = pilots.choose(_study(), rows)
  assert choice["families"]["sync"]["chosen"] == 0.2
  assert choice["families"]["eager"]["chosen"] is None


def test_the_decision_grid_reads_the_choice_and_refuses_another_pilots(tmp_path):
  study = _study()
  rows = [
    _row(label, value, seed, 2.0 if value == 0.5 else 3.0)
    for label in ("A M=2", "B M=2", "C M=2")
    for value in (0.2, 0.5)
    for seed in (100, 101)
  ]
  with pytest.raises(FileNotFoundError, match="--pilot"):
    pilots.read_choice(study, tmp_path)
  pilots.write_choice(study, rows, tmp_path)
  decided = pilots.with_choice(study, pilots.read_choice(study, tmp_path))
  assert [variant.overrides["outer.learning_rate"] for variant in decided.variants] == [0.5, 0.5, 0.5]
  assert decided.variants[0].overrides["learners"] == 2 and "validation_fraction" not in decided.variants[0].overrides
  other = Study(**{**study.__dict__, "pilot": Pilot(field="outer.learning_rate", values=(0.1, 0.5))})
  with pytest.raises(ValueError, match="another pilot"):
    pilots.read_choice(other, tmp_path)
  choice = json.loads((tmp_path / pilots.CHOICE_FILENAME).read_text())
  for name in ("another_study", "zz_another_study"):  # the same pilot, another study's (sorting before and after)
    (tmp_path / pilots.CHOICE_FILENAME).write_text(json.dumps({**choice, "study": name}))
    with pytest.raises(ValueError, match=f"another pilot \\('{name}'"):
      pilots.read_choice(study, tmp_path)
  choice["families"]["eager"]["chosen"] = None
  (tmp_path / pilots.CHOICE_FILENAME).write_text(json.dumps(choice))
  with pytest.raises(ValueError, match="eager"):
    pilots.read_choice(study, tmp_path)


def test_the_decision_grid_keeps_a_copy_of_the_choice_beside_its_report(tmp_path):
  study = _study()
  rows = [
    _row(label, value, seed, 2.0)
    for label in ("A M=2", "B M=2", "C M=2")
    for value in (0.2, 0.5)
    for seed in (100, 101)
  ]
  (tmp_path / "pilot").mkdir()
  pilots.write_choice(study, rows, tmp_path / "pilot")
  # The file is the record as the results keep it: JSON indented by 2, one trailing newline.
  written = (tmp_path / "pilot" / pilots.CHOICE_FILENAME).read_text()
  assert written == json.dumps(pilots.choose(study, rows), indent=2) + "\n"
  pilots.copy_choice(tmp_path / "pilot", tmp_path / "grid" / "first")  # a directory made with its parents
  for name in (pilots.CHOICE_FILENAME, pilots.CHOICE_MARKDOWN):
    assert (tmp_path / "grid" / "first" / f"pilot_{name}").read_text() == (tmp_path / "pilot" / name).read_text()
  assert sorted(path.name for path in (tmp_path / "grid" / "first").iterdir()) == [
    "pilot_choice.json",
    "pilot_choice.md",
  ]
  (tmp_path / "pilot" / pilots.CHOICE_MARKDOWN).unlink()  # a choice without its table: the file is copied alone
  (tmp_path / "grid_2").mkdir()  # a grid directory that exists already
  pilots.copy_choice(tmp_path / "pilot", tmp_path / "grid_2")
  assert sorted(path.name for path in (tmp_path / "grid_2").iterdir()) == ["pilot_choice.json"]


def test_the_registration_holds_the_pilot_and_the_chosen_values_and_is_unchanged_without_a_pilot():
  study = _study()
  assert registration.claims_record(study)["pilot"] == PILOT.record()
  assert "pilot" not in registration.claims_record(STUDIES["zhang_mnist"])


def test_families_go_with_a_pilot_and_only_with_one():
  with pytest.raises(ValueError, match="famil"):
    Study("s", "t", "f", (Variant("A", "demo", "hardsync", family="x"),), paper_data=False)
  with pytest.raises(ValueError, match="famil"):
    Study("s", "t", "f", (Variant("A", "demo", "hardsync"),), paper_data=False, pilot=PILOT)
  with pytest.raises(ValueError, match="famil"):  # a pilot with a family for some variants only
    Study(
      "s",
      "t",
      "f",
      (Variant("A", "demo", "hardsync", family="x"), Variant("B", "demo", "hardsync")),
      paper_data=False,
      pilot=PILOT,
    )
  with pytest.raises(ValueError, match="first_seed"):
    Pilot(field="outer.learning_rate", values=(0.1,), first_seed=0)


def test_a_pilots_definition_its_defaults_its_bounds_and_its_record():
  """Defaults: seeds 100 and 101, a fifth of the training split; the smallest pilot (first seed 10, one seed) is
  accepted; seeds first_seed .. first_seed + seeds - 1; every bound refused just past it."""
  assert Pilot("f", (0.5, 0.1)).record() == {
    "field": "f",
    "values": [0.5, 0.1],
    "seeds": [100, 101],
    "validation_fraction": 0.2,
  }
  assert Pilot("f", (0.1,), first_seed=10, seeds=1).record()["seeds"] == [10]
  assert Pilot("f", (0.1,), first_seed=10, seeds=3).record()["seeds"] == [10, 11, 12]
  assert len(Pilot("f", tuple(range(300))).values) == 300  # distinct values, past Python's shared small ints
  with pytest.raises(dataclasses.FrozenInstanceError):  # part of the registration: never changed after it
    PILOT.seeds = 3
  for bad, match in (
    ({"values": ()}, "values"),
    ({"values": (0.1, 0.1)}, "values"),
    ({"first_seed": 9}, "first_seed"),
    ({"seeds": 0}, "seeds"),
    ({"validation_fraction": 0.0}, "validation_fraction"),
    ({"validation_fraction": -0.1}, "validation_fraction"),
    ({"validation_fraction": 1.0}, "validation_fraction"),
    ({"validation_fraction": 1.5}, "validation_fraction"),
  ):
    with pytest.raises(ValueError, match=match):
      Pilot(**{"field": "f", "values": (0.1,), **bad})


def test_the_piloted_studies_pilot_the_outer_rate_per_family_and_m():
  kale = STUDIES["kale_outer_steps_digits"]
  assert sorted({variant.family for variant in kale.variants}) == sorted(
    f"{family} M={learners}" for family in ("synchronous", "delayed", "eager") for learners in (2, 4, 8)
  )
  assert kale.pilot.values == (0.1, 0.2, 0.35, 0.5, 0.7) and kale.pilot.field == "outer.learning_rate"
  streaming = STUDIES["streaming_diloco_digits_piloted"]
  assert {variant.family for variant in streaming.variants} == {"synchronous", "streaming"}


def _reproduce(*arguments: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-m", "stalesgd.cli.reproduce", "--study=kale_outer_steps_digits", *arguments],
    capture_output=True,
    text=True,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    timeout=300,
  )


def test_the_command_runs_the_pilot_on_its_own_seeds_and_the_decision_grid_only_after_it(tmp_path):
  slug = pilots.pilot_study(STUDIES["kale_outer_steps_digits"]).variants[0].slug
  listed = _reproduce("--pilot", f"--variants={slug}", f"--workdir={tmp_path}", "--list_tasks")
  assert listed.returncode == 0, listed.stderr[-2000:]
  lines = listed.stdout.splitlines()
  assert len(lines) == 2 and "seed 100" in lines[0] and "seed 101" in lines[1]
  refused = _reproduce(f"--workdir={tmp_path / 'decision'}", "--list_tasks")
  assert refused.returncode != 0 and "--pilot" in refused.stderr and "choice.json" in refused.stderr
