"""Seeds, parallel sweeps and job arrays: each run computes what it computes alone, and finished runs are reused."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from stalesgd.studies import Study, StudySettings, Variant, run_study
from stalesgd.studies import _processes as processes
from stalesgd.studies._sweep import gather_refusal
from stalesgd.studies._tasks import plan_tasks

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
EPOCHS = 0.1


def _study() -> Study:
  return Study(
    "tiny_parallel",
    "tiny",
    "demo: none",
    (Variant("hardsync", "demo", "hardsync"), Variant("async dc", "demo", "async_dc")),
    paper_data=False,
    has_quick=False,
  )


def _digest(directory: pathlib.Path) -> str:
  return json.loads((directory / "summary.json").read_text())["params_sha256"]


@pytest.mark.slow
def test_a_parallel_sweep_gives_the_weights_of_the_same_runs_one_after_the_other(tmp_path):
  # hardsync sums 8 gradients per update: the case whose last bits depend on the device count.
  study = Study(
    "tiny_parallel", "tiny", "demo: none", (Variant("hardsync", "demo", "hardsync"),), paper_data=False, has_quick=False
  )
  # In this process, one run after the other (8 host devices, conftest)...
  sequential = run_study(
    study, tmp_path / "sequential", StudySettings(num_epochs=EPOCHS), seeds=2, echo=lambda line: None
  )
  # ... and the demo study's hardsync as 2 concurrent processes through the command line, each on the
  # study's 8 host devices.
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.reproduce",
    "--study=demo",
    f"--workdir={tmp_path / 'parallel'}",
    f"--epochs={EPOCHS}",
    "--variants=hardsync",
    "--seeds=2",
    "--parallel=2",
  ]
  environment = {key: value for key, value in os.environ.items() if key != "JAX_NUM_CPU_DEVICES"}
  ran = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=900, env=environment)
  assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
  assert "running 2 as up to 2 processes at a time" in ran.stdout and "8 host devices" in ran.stdout
  digests = {}
  for row in sequential.rows:
    alone = pathlib.Path(row["workdir"])
    assert _digest(tmp_path / "parallel" / "hardsync" / alone.name) == _digest(alone), alone.name
    digests[row["seed"]] = _digest(alone)
  assert digests[0] != digests[1]  # another seed is another run
  assert "JAX_NUM_CPU_DEVICES=8 python -m stalesgd.cli.train --config=demo:hardsync" in sequential.rows[0]["command"]
  # More seeds later: the finished two are reused, only the third trains.
  again = subprocess.run(
    command[:-2] + ["--seeds=3", "--parallel=2"],
    cwd=REPOSITORY,
    capture_output=True,
    text=True,
    timeout=900,
    env=environment,
  )
  assert again.returncode == 0, again.stderr[-3000:]
  assert "2 of 3 runs already finished; running 1" in again.stdout
  import csv

  with open(tmp_path / "parallel" / "results.csv", newline="", encoding="utf-8") as file:
    assert [row["seeds"] for row in csv.DictReader(file)] == ["3"]


@pytest.mark.slow
def test_a_job_array_runs_one_task_each_then_gathers(tmp_path):
  study = _study()
  settings = StudySettings(num_epochs=EPOCHS)
  tasks = plan_tasks(study, tmp_path, settings, seeds=1)
  assert [task.label for task in tasks] == ["hardsync, seed 0", "async dc, seed 0"]
  first = run_study(study, tmp_path, settings, only_task=0, echo=lambda line: None)
  assert first.table is None and [row["variant"] for row in first.rows] == ["hardsync"]
  with pytest.raises(ValueError, match=r"1 of 2 runs has not finished: --task=1 \(async dc, seed 0"):
    run_study(study, tmp_path, settings, gather_only=True, echo=lambda line: None)
  run_study(study, tmp_path, settings, only_task=1, echo=lambda line: None)
  gathered = run_study(study, tmp_path, settings, gather_only=True, echo=lambda line: None)
  assert [row["variant"] for row in gathered.rows] == ["hardsync", "async dc"] and "| hardsync" in gathered.table
  with pytest.raises(ValueError, match=r"task=2; allowed: an index in \[0, 2\)"):
    run_study(study, tmp_path, settings, only_task=2)


def test_the_gather_refusal_counts_the_unfinished_runs_in_the_singular_and_the_plural(tmp_path):
  tasks = plan_tasks(_study(), tmp_path, StudySettings(num_epochs=EPOCHS), seeds=2)
  assert gather_refusal(tasks).startswith("4 of 4 runs have not finished: --task=0 (hardsync, seed 0, ")
  assert gather_refusal(tasks[:1]).startswith("1 of 1 runs has not finished: --task=0 (hardsync, seed 0, ")


def test_visible_gpus_come_from_cuda_visible_devices_or_the_host_list():
  assert processes.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}) == ["2", "5"]
  assert processes.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
  assert processes.visible_gpus({}, list_gpus=lambda: ["0", "1", "2", "3"]) == ["0", "1", "2", "3"]
  assert processes.automatic_parallelism(10, ["0", "1", "2", "3"], cores=16) == 4
  assert processes.automatic_parallelism(10, [], cores=2) == 2
  assert processes.automatic_parallelism(1, [], cores=16) == 1


def test_each_process_gets_its_own_gpus_from_a_fake_device_list(tmp_path):
  # Each task writes the CUDA_VISIBLE_DEVICES it saw and how many tasks overlapped it.
  script = (
    "import os, pathlib, sys, time; out = pathlib.Path(sys.argv[1]); "
    "out.write_text(os.environ['CUDA_VISIBLE_DEVICES']); time.sleep(0.5)"
  )
  gpus = [1, 2, 1, 1]
  tasks = [
    processes.ProcessTask(
      f"task {index}",
      [sys.executable, "-c", script, str(tmp_path / f"gpus_{index}")],
      tmp_path / f"log_{index}",
      gpus=count,
    )
    for index, count in enumerate(gpus)
  ]
  lines = []
  statuses = processes.run_in_processes(tasks, parallel=3, gpu_ids=["4", "6"], echo=lines.append, poll_seconds=0.05)
  assert statuses == {0: 0, 1: 0, 2: 0, 3: 0}
  seen = [(tmp_path / f"gpus_{index}").read_text().split(",") for index in range(len(gpus))]
  assert [len(ids) for ids in seen] == gpus
  assert seen[1] == ["4", "6"]  # the two-GPU task waited until both were free
  assert all(set(ids) <= {"4", "6"} for ids in seen)
  starts = [line for line in lines if "started" in line]
  assert len(starts) == 4 and "GPUs 4,6" in starts[1]
  with pytest.raises(ValueError, match="needs 3 GPUs; this host has 2"):
    processes.run_in_processes(
      [processes.ProcessTask("big", ["true"], tmp_path / "log", gpus=3)], parallel=1, gpu_ids=["0", "1"]
    )


def test_a_failing_process_stops_new_starts_and_is_reported(tmp_path):
  tasks = [
    processes.ProcessTask("bad", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "bad.log"),
    processes.ProcessTask("never", [sys.executable, "-c", "pass"], tmp_path / "never.log"),
  ]
  lines = []
  statuses = processes.run_in_processes(tasks, parallel=1, echo=lines.append, poll_seconds=0.05)
  assert statuses == {0: 3}
  assert any("FAILED (exit status 3): bad" in line for line in lines)


def test_the_job_array_script_runs_its_element_then_gathers(tmp_path):
  # A stub interpreter records the command each step runs.
  stub = tmp_path / "python"
  stub.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n')
  stub.chmod(0o755)
  script = REPOSITORY / "launch" / "study_array.sbatch"
  base = {"PATH": os.environ["PATH"], "PYTHON": str(stub), "SLURM_SUBMIT_DIR": str(REPOSITORY), "SLURM_JOB_ID": "7"}
  flags = ["--study=zhang_cifar10", "--seeds=3", "--workdir=/shared/runs/zhang"]
  subprocess.run(["bash", str(script), *flags], env={**base, "SLURM_ARRAY_TASK_ID": "4"}, check=True, timeout=60)
  subprocess.run(["bash", str(script), *flags], env={**base, "STUDY_STEP": "gather"}, check=True, timeout=60)
  missing = subprocess.run(["bash", str(script), *flags], env=base, capture_output=True, text=True, timeout=60)
  assert missing.returncode == 2 and "SLURM_ARRAY_TASK_ID is not set" in missing.stderr
  calls = (tmp_path / "calls").read_text().splitlines()
  assert calls == [
    f"-m stalesgd.cli.reproduce --task=4 {' '.join(flags)}",
    f"-m stalesgd.cli.reproduce --gather {' '.join(flags)}",
  ]
