"""stalesgd.cli.reproduce (``stalesgd-reproduce``) and the sweep.

Variants chosen by flag, divergence recorded, finished runs reused, preempted runs resumed. What a whole study
writes (tables, curves, plots, its README) is checked on the demo's seed 0 in tests/studies/test_demo_robustness.py.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from stalesgd.studies import Study, StudySettings, Variant, run_study

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
  # --epochs reaches each run as a config override, recorded in its command (tests/studies/test_demo_robustness.py
  # checks the rest of what the sweep writes, on the demo's seed 0 at full length).
  for row in _read_csv(tmp_path / "runs.csv"):
    assert "--num_epochs" not in row["command"] and "--config.num_epochs=0.1" in row["command"]
    assert 0.1 <= float(row["epochs"]) < 0.2  # whole updates (hardsync's: 64 of 1,497 images, 0.043 epochs)


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
  result = run_study(_diverging_study(), tmp_path, StudySettings(num_epochs=0.2), echo=lines.append)
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
  again = run_study(_diverging_study(), tmp_path, StudySettings(num_epochs=0.2), echo=lines.append)
  assert time.monotonic() - started < 30  # nothing trained again (the report alone takes seconds)
  assert sum("reused the finished run" in line for line in lines) == 2
  assert [row["status"] for row in again.rows] == [finished["status"], diverged["status"]]
  assert again.rows[0]["test_error"] == finished["test_error"]

  with pytest.raises(ValueError, match=r"holds a run of another config \(eval_every_epochs: .*num_epochs: 0.2 -> 0.3"):
    run_study(_diverging_study(), tmp_path, StudySettings(num_epochs=0.3), echo=lines.append)


@pytest.mark.slow
def test_a_preempted_run_is_resumed_not_reused(tmp_path):
  study = _diverging_study()
  study = Study(study.name, study.title, study.finding, study.variants[:1], paper_data=False, has_quick=False)
  first = run_study(study, tmp_path, StudySettings(num_epochs=0.1), echo=lambda line: None)
  summary_path = tmp_path / "hardsync" / "seed_0" / "summary.json"
  summary = json.loads(summary_path.read_text())
  summary_path.write_text(json.dumps({**summary, "preempted": True}))  # as a SIGTERM'd run leaves it
  lines = []
  second = run_study(study, tmp_path, StudySettings(num_epochs=0.1), echo=lines.append)
  assert not any("reused" in line for line in lines)
  assert second.rows[0]["test_error"] == first.rows[0]["test_error"]
  assert json.loads(summary_path.read_text())["preempted"] is False


@pytest.mark.slow
def test_a_preempted_job_array_element_exits_75_so_its_scheduler_requeues_it(tmp_path, compilation_cache):
  from tests.fixtures.make_study_fixture import PACED_TASK, preempt_after_first_evaluation

  flags = ["--study=demo", "--epochs=2", "--variants=hardsync", f"--workdir={tmp_path}", "--task=0"]
  metrics = tmp_path / "hardsync" / "seed_0" / "metrics.jsonl"
  env = {**_environment(compilation_cache), "PYTHONPATH": str(REPOSITORY)}
  # --task with every block slowed, so SIGTERM finds it after its first evaluation.
  element = preempt_after_first_evaluation(
    [sys.executable, "-c", PACED_TASK, "0.2", *flags], metrics, cwd=REPOSITORY, env=env
  )
  assert element.returncode == 75, element.stdout[-2000:]  # launch/requeue_on_preemption.sh requeues on 75 only
  assert f"hardsync, seed 0: preempted; run the same command again to resume it ({metrics.parent})" in element.stdout
  again = subprocess.run(
    [sys.executable, "-m", "stalesgd.cli.reproduce", *flags], cwd=REPOSITORY, env=env, capture_output=True, text=True
  )
  assert again.returncode == 0 and "resumed from the checkpoint at update" in again.stdout, again.stderr[-2000:]
  assert "hardsync, seed 0: ok, test error " in again.stdout
