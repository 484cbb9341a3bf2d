"""experiments/benchmarks/grid_epoch.py: a grid's per-run cost from its own records, and the program end to end."""

from __future__ import annotations

import json
import pathlib

import pytest
from absl import app

from experiments.benchmarks import grid_epoch
from stalesgd.studies import STUDIES
from stalesgd.studies._study_runs import StudySettings, study_config
from tests.helpers.programs import output_tail, run_program


def _run_directory(path: pathlib.Path, evaluation_walls, *, startup=5.0, evaluation=4.0) -> pathlib.Path:
  """A finished run: log records between evaluations at the given loop wall times, and its summary."""
  path.mkdir(parents=True)
  records = []
  for step, wall in enumerate(evaluation_walls, start=1):
    records.append({"step": 10 * step - 5, "train_loss": 1.0, "wall_time": wall - 7.0})  # a log record, no test
    records.append({"step": 10 * step, "train_loss": 1.0, "wall_time": wall, "test_error": 50.0})
  (path / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
  breakdown = {"startup_s": startup, "training_s": 1.0, "evaluation_s": evaluation, "checkpoint_s": 0.1}
  (path / "summary.json").write_text(json.dumps({"wall_time_breakdown": breakdown}))
  return path


def test_the_figures_come_from_the_walls_at_the_first_two_evaluations(tmp_path):
  run = _run_directory(tmp_path / "run", [30.0, 50.0])
  figures = grid_epoch.epoch_figures(run, full_epochs=140)
  # first epoch 30 s (compilation in it); steady 50 - 30 = 20 s; the final evaluation 4 / 2 = 2 s;
  # full length: 5 + 30 + 139 x 20 + 2 = 2,817 s.
  assert figures["first_epoch_s"] == 30.0 and figures["steady_epoch_s"] == 20.0
  assert figures["evaluation_s"] == 2.0 and figures["startup_s"] == 5.0
  assert figures["full_length_s"] == pytest.approx(2817.0)
  assert figures["full_length_h"] == pytest.approx(2817.0 / 3600)
  # A third evaluation does not move the steady epoch (the first two time it), only the mean evaluation.
  later = grid_epoch.epoch_figures(_run_directory(tmp_path / "three", [30.0, 50.0, 90.0], evaluation=6.0), 3)
  assert later["steady_epoch_s"] == 20.0 and later["full_length_s"] == pytest.approx(5 + 30 + 2 * 20 + 2)


def test_a_run_with_one_evaluation_times_no_steady_epoch(tmp_path):
  run = _run_directory(tmp_path / "run", [30.0])
  with pytest.raises(RuntimeError, match="recorded 1 evaluations; timing a steady epoch needs 2"):
    grid_epoch.epoch_figures(run, full_epochs=140)


def test_the_table_totals_the_timed_runs_and_names_a_failed_one():
  rows = [
    {"variant": "a", "status": 0, "startup_s": 5, "first_epoch_s": 30, "steady_epoch_s": 20, "full_epochs": 140,
     "full_length_s": 3600.0, "full_length_h": 1.0},
    {"variant": "b", "status": "timeout", "full_epochs": 140},
    {"variant": "c", "status": 0, "startup_s": 5, "first_epoch_s": 30, "steady_epoch_s": 20, "full_epochs": 140,
     "full_length_s": 5400.0, "full_length_h": 1.5},
  ]  # fmt: skip
  text = grid_epoch.table(rows)
  assert "| b | failed: timeout | | | 140 | |" in text
  assert "| the 2 timed, one seed each | | | | | 9000 s = 2.50 h |" in text


@pytest.mark.slow
def test_the_program_times_a_quick_study_variant_and_refuses_an_unknown_one(tmp_path):
  output = tmp_path / "grid.json"
  run = lambda *flags: run_program("experiments.benchmarks.grid_epoch", "--study=demo", "--quick", *flags)
  completed = run("--variants=hardsync", f"--output={output}")
  assert completed.returncode == 0, output_tail(completed)
  report = json.loads(output.read_text())
  (row,) = report["rows"]
  quick_epochs = study_config(STUDIES["demo"], STUDIES["demo"].select(["hardsync"])[0], StudySettings(quick=True))
  assert row["variant"] == "hardsync" and row["status"] == 0 and row["full_epochs"] == quick_epochs.num_epochs
  assert report["epochs_timed"] == grid_epoch.EPOCHS_TIMED and report["machine"]["platform"] == "cpu"
  assert row["first_epoch_s"] > 0 and row["steady_epoch_s"] > 0
  assert row["full_length_s"] == pytest.approx(
    row["startup_s"] + row["first_epoch_s"] + (row["full_epochs"] - 1) * row["steady_epoch_s"] + row["evaluation_s"]
  )
  assert "| hardsync |" in completed.stdout
  refused = run("--variants=nonesuch", f"--output={tmp_path / 'none.json'}")
  assert refused.returncode != 0 and "allowed: a non-empty subset of ['hardsync'" in refused.stderr
  assert not (tmp_path / "none.json").exists()


def test_a_study_with_a_pilot_is_refused_before_any_run_naming_its_field_and_the_allowed_studies():
  with pytest.raises(app.UsageError, match=r"--study=kale_outer_steps_digits takes outer.learning_rate from its pilot"):
    grid_epoch.refuse_a_piloted_study(STUDIES["kale_outer_steps_digits"])
  with pytest.raises(app.UsageError, match=r"allowed: a study without a pilot \(.*zhang_cifar10_e140"):
    grid_epoch.refuse_a_piloted_study(STUDIES["streaming_diloco_digits_piloted"])
  grid_epoch.refuse_a_piloted_study(STUDIES["zhang_cifar10_e140"])  # no pilot: nothing to refuse
