"""stalesgd.cli.reproduce (``stalesgd-reproduce``) and the sweep.

Tables and plots written, divergence recorded, finished runs reused.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from stalesgd.studies import RunSettings, Study, Variant, run_study

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: pathlib.Path) -> None:
  assert path.read_bytes()[:8] == PNG_SIGNATURE, path


def _read_csv(path: pathlib.Path) -> list[dict[str, str]]:
  with open(path, newline="", encoding="utf-8") as file:
    return list(csv.DictReader(file))


def _environment(cache: pathlib.Path) -> dict[str, str]:
  """The runs' environment: the CPU, and the session's persistent compilation cache (the runs of these tests
  compile the same programs; loading one changes no bit)."""
  return {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "JAX_COMPILATION_CACHE_DIR": str(cache),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
  }


def _short_demo(workdir, cache):
  """The demo study from the command line at 0.2 epochs per run (a rerun reads the finished runs back)."""
  return subprocess.run(
    [sys.executable, "-m", "stalesgd.cli.reproduce", "--study=demo", f"--workdir={workdir}", "--epochs=0.2"],
    cwd=REPOSITORY,
    capture_output=True,
    text=True,
    timeout=600,
    env=_environment(cache),
  )


@pytest.mark.slow
def test_demo_study_from_the_command_line_writes_table_and_plots(tmp_path, compilation_cache):
  workdir = tmp_path / "demo"
  result = _short_demo(workdir, compilation_cache)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = _read_csv(workdir / "runs.csv")
  assert [row["variant"] for row in rows] == ["hardsync", "8-softsync, a0", "8-softsync, a0/sigma", "async, DC-ASGD-a"]
  assert [row["seed"] for row in rows] == ["0"] * 4
  per_variant = _read_csv(workdir / "results.csv")
  assert [row["variant"] for row in per_variant] == [row["variant"] for row in rows]
  assert [row["final_test_error"] for row in per_variant] == [row["final_test_error"] for row in rows]
  for row in rows:
    assert row["status"] == "ok" and 0.0 <= float(row["test_accuracy"]) <= 1.0 and float(row["sim_time"]) > 0
    assert "--num_epochs" not in row["command"] and "--config.num_epochs=0.2" in row["command"]
    assert (pathlib.Path(row["workdir"]) / "summary.json").exists()
  assert float(rows[0]["staleness_max"]) == 0 and float(rows[1]["staleness_mean"]) > 1
  for name in ("test_error.png", "train_loss.png", "staleness.png"):
    _assert_png(workdir / name)
  table = (workdir / "results.md").read_text()
  assert "| variant" in table and "final (mean ± std)" in table and "sim_time" in table and "(1 seed)" in table
  # The demo prints the coarse table of its bands (a study without bands prints results.md), and its claims.
  assert (workdir / "bands.md").read_text() in result.stdout
  assert "not decided (1 seed: no interval)" in result.stdout
  assert str(workdir) in result.stdout
  # The learning curves: EVALUATIONS_PER_SHORT_RUN (4) evaluations of each run, in epoch order.
  curves = _read_csv(workdir / "evaluations.csv")
  for row in rows:
    epochs = [float(point["epoch"]) for point in curves if point["variant"] == row["variant"]]
    assert len(epochs) == 4 and epochs == sorted(epochs) and epochs[-1] == pytest.approx(float(row["epochs"]))
  assert {point["test_error"] for point in curves if point["variant"] == "hardsync"} >= {rows[0]["test_error"]}
  # The directory describes itself: the command, the code and host the runs recorded, the data's digest, the
  # table, the decisions, every run's wall time and the plots; a hand-written Notes section survives a new report.
  readme = (workdir / "README.md").read_text()
  assert f"stalesgd-reproduce --study=demo --workdir={workdir} --epochs=0.2" in readme
  assert "- code: stalesgd 0.2.0 at " in readme and " cores" in readme and "load average" in readme
  assert "digits from embedded" in readme and "sha256 train" in readme
  assert table.strip() in readme and "## Decisions" in readme and "![test error](test_error.png)" in readme
  assert len(re.findall(r"^\| .+ \| 0 \| 0\.2\d \| \d+\.\d\d \| \d+ min \| ok \|$", readme, re.MULTILINE)) == 4
  (workdir / "README.md").write_text(readme.replace("(none yet: this section", "Superseded by X.\n(was: this section"))
  again = _short_demo(workdir, compilation_cache)
  assert again.returncode == 0, again.stderr[-3000:]
  assert (
    (workdir / "README.md")
    .read_text()
    .endswith("## Notes\n\nSuperseded by X.\n(was: this section is kept by hand and survives a new report)\n")
  )


@pytest.mark.slow
def test_variants_flag_runs_a_subset_and_refuses_unknown_names(tmp_path, compilation_cache):
  command = [sys.executable, "-m", "stalesgd.cli.reproduce", "--study=demo", f"--workdir={tmp_path}", "--epochs=0.1"]
  env = _environment(compilation_cache)
  refused = subprocess.run(
    command + ["--variants=hardsync,8_softsync_a1"],
    cwd=REPOSITORY,
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )
  assert refused.returncode == 1  # absl's usage status, one line and the hint to --helpshort, no help text
  lines = refused.stderr.strip().splitlines()
  assert len(lines) == 2 and lines[0].startswith("FATAL --variants: ") and "Traceback" not in refused.stderr, lines
  assert "'8_softsync_a1'" in lines[0] and "8_softsync_a0" in lines[0]
  assert not (tmp_path / "hardsync").exists()
  ran = subprocess.run(
    command + ["--variants=8_softsync_a0_sigma,hardsync"],
    cwd=REPOSITORY,
    capture_output=True,
    text=True,
    timeout=600,
    env=env,
  )
  assert ran.returncode == 0, ran.stderr[-3000:]
  # Study order, whatever order the flag gives.
  assert [row["variant"] for row in _read_csv(tmp_path / "results.csv")] == ["hardsync", "8-softsync, a0/sigma"]
  assert sorted(path.name for path in tmp_path.iterdir() if path.is_dir()) == ["8_softsync_a0_sigma", "hardsync"]
  assert (tmp_path / "hardsync" / "seed_0" / "summary.json").exists()


def _diverging_study() -> Study:
  # A learning rate of 1e6 makes the loss non-finite within a few updates.
  return Study(
    name="test_divergence",
    title="divergence",
    finding="the second run diverges",
    variants=(
      Variant("hardsync", "demo", "hardsync", published={"test_error": 3.0}),
      Variant("exploding", "demo", "softsync_fixed", overrides={"learning_rate": 1e6}, published={"test_error": 90.0}),
    ),
    paper_data=False,
    has_quick=False,
  )


@pytest.mark.slow
def test_a_diverging_run_is_recorded_and_a_rerun_reuses_every_finished_run(tmp_path):
  lines = []
  result = run_study(_diverging_study(), tmp_path, RunSettings(num_epochs=0.2), echo=lines.append)
  finished, diverged = result.rows
  assert finished["status"] == "ok" and finished["published_test_error"] == 3.0
  assert diverged["status"].startswith("diverged at update ") and diverged["updates"] >= 0
  # Chance level from the data (dataset.json): always the digits' most frequent test class, 35 of 300 images.
  assert diverged["test_error"] == pytest.approx(100.0 * (1 - 35 / 300)) and diverged["published_test_error"] == 90.0
  assert diverged["sim_time"] > 0
  record = json.loads((tmp_path / "exploding" / "seed_0" / "diverged.json").read_text())
  assert record["update"] == diverged["updates"] and "at update" in record["message"]
  assert any("diverged at update" in line for line in lines)
  assert "| exploding" in result.table and "published_test_error" in result.table
  assert result.table.startswith((tmp_path / "results.md").read_text())  # then the decisions
  _assert_png(tmp_path / "test_error.png")

  lines.clear()
  started = time.monotonic()
  again = run_study(_diverging_study(), tmp_path, RunSettings(num_epochs=0.2), echo=lines.append)
  assert time.monotonic() - started < 30  # nothing trained again (the report alone takes seconds)
  assert sum("reused the finished run" in line for line in lines) == 2
  assert [row["status"] for row in again.rows] == [finished["status"], diverged["status"]]
  assert again.rows[0]["test_error"] == finished["test_error"]

  with pytest.raises(ValueError, match=r"holds a run of another config \(eval_every_epochs: .*num_epochs: 0.2 -> 0.3"):
    run_study(_diverging_study(), tmp_path, RunSettings(num_epochs=0.3), echo=lines.append)


@pytest.mark.slow
def test_a_preempted_run_is_resumed_not_reused(tmp_path):
  study = _diverging_study()
  study = Study(study.name, study.title, study.finding, study.variants[:1], paper_data=False, has_quick=False)
  first = run_study(study, tmp_path, RunSettings(num_epochs=0.1), echo=lambda line: None)
  summary_path = tmp_path / "hardsync" / "seed_0" / "summary.json"
  summary = json.loads(summary_path.read_text())
  summary_path.write_text(json.dumps({**summary, "preempted": True}))  # as a SIGTERM'd run leaves it
  lines = []
  second = run_study(study, tmp_path, RunSettings(num_epochs=0.1), echo=lines.append)
  assert not any("reused" in line for line in lines)
  assert second.rows[0]["test_error"] == first.rows[0]["test_error"]
  assert json.loads(summary_path.read_text())["preempted"] is False
