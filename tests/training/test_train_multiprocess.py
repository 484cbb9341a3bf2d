"""``launch/local.sh 2``: the whole training run on 2 processes x 4 CPU devices equals 1 process x 8.

Async DC-ASGD-a for a quarter epoch through ``stalesgd-train`` on two gloo
processes. The engine's server state is sharded over parameters across both
processes, and evaluation batches are split over all 8 devices. The final
weights must be bit-identical to the same config run in this process on 8
devices (nothing in the engine sums across devices in a different order; see
tests/engine/test_engine_multiprocess.py), and so must every logged number
except the wall-clock ones. Only process 0 writes the workdir's files.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

import pytest

from stalesgd.training._loop import PREEMPTED_EXIT_STATUS, train_and_evaluate
from tests.helpers.train_helpers import (
  CONFIG_FILE,
  PACED_MAIN,
  REPOSITORY_ROOT,
  WALL_CLOCK_FIELDS,
  complete_checkpoints,
  log_tail,
  main_environment,
  read_metrics,
  read_summary,
  tiny_config,
)

pytestmark = pytest.mark.multiprocess

LOCAL_SH = REPOSITORY_ROOT / "launch" / "local.sh"
EPOCHS = 0.25  # 47 updates
TIMEOUT = 180.0  # seconds; about 15 s on 2 idle cores


def run_both(variant: str, tmp_path: pathlib.Path, compilation_cache) -> tuple[pathlib.Path, dict, pathlib.Path]:
  """``launch/local.sh 2`` on a tiny config, then the same config in this process on 8 devices.

  Returns the two-process workdir, the in-process summary and its workdir.
  """
  workdir, log = tmp_path / "two_processes", tmp_path / "local_sh.log"
  environment = main_environment(compilation_cache)
  environment.pop("JAX_NUM_CPU_DEVICES")  # local.sh gives each process 8 / 2 devices
  environment["LAUNCH_KILL_GRACE"] = "1"
  with open(log, "wb") as output:
    launch = subprocess.Popen(
      [
        str(LOCAL_SH),
        "2",
        f"--config={CONFIG_FILE}:{variant}",
        f"--config.num_epochs={EPOCHS}",
        f"--workdir={workdir}",
      ],
      cwd=REPOSITORY_ROOT,
      env=environment,
      stdout=output,
      stderr=subprocess.STDOUT,
    )
  reference_dir = tmp_path / "one_process"
  try:
    # The reference runs after the launch, not beside it, so the two processes have the cores to themselves.
    returncode = launch.wait(timeout=TIMEOUT)
  except BaseException as error:
    launch.terminate()  # local.sh stops its processes on SIGTERM
    launch.wait()
    if isinstance(error, subprocess.TimeoutExpired):
      pytest.fail(f"launch/local.sh did not end within {TIMEOUT} s:\n{log_tail(log)}")
    raise
  assert returncode == 0, log_tail(log, lines=200)
  assert "local.sh: 2 x 4 host devices" in log.read_text()
  reference = train_and_evaluate(tiny_config(variant, num_epochs=EPOCHS), str(reference_dir))
  return workdir, reference, reference_dir


@pytest.mark.slow
def test_two_processes_end_with_the_weights_and_metrics_of_one(devices, tmp_path, compilation_cache):
  workdir, reference, reference_dir = run_both("async_dc", tmp_path, compilation_cache)
  summary = read_summary(workdir)
  assert summary["updates"] == reference["updates"] and not summary["preempted"]
  assert summary["params_sha256"] == reference["params_sha256"]
  strip = lambda record: {key: value for key, value in record.items() if key not in WALL_CLOCK_FIELDS}
  assert [strip(record) for record in read_metrics(workdir)] == [
    strip(record) for record in read_metrics(reference_dir)
  ]
  assert complete_checkpoints(workdir)[-1] == reference["updates"]
  assert len(list(pathlib.Path(workdir).glob("events.out.tfevents.*"))) == 1  # process 1 wrote none


@pytest.mark.slow
def test_two_processes_run_dcs3gd_like_one(devices, tmp_path, compilation_cache):
  """DC-S3GD's per-learner losses live on both processes: the loop must still log them.

  Not bit-identical: gloo's cross-process all-reduce adds in another order than
  the in-process one, so the losses agree to float32 rounding.
  """
  workdir, reference, reference_dir = run_both("dcs3gd", tmp_path, compilation_cache)
  summary = read_summary(workdir)
  assert summary["updates"] == reference["updates"] and not summary["preempted"]
  ours, theirs = read_metrics(workdir), read_metrics(reference_dir)
  assert [record["step"] for record in ours] == [record["step"] for record in theirs]
  for mine, expected in zip(ours, theirs):
    assert mine["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-4)


def process_pid(process_id: int, workdir: pathlib.Path) -> int:
  """The pid of process ``process_id`` of the run `launch/local.sh` started in ``workdir``."""
  pattern = f"--process_id={process_id} .*--workdir={workdir}"
  found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True, check=False).stdout.split()
  assert len(found) == 1, f"expected one process {process_id} of the run in {workdir}, found pids {found}"
  return int(found[0])


@pytest.mark.slow
@pytest.mark.parametrize("variant, signalled", [("async_dc", 1), ("dcs3gd", None)])
def test_sigterm_to_a_two_process_run_saves_exits_75_and_the_restart_resumes_exactly(
  variant, signalled, devices, tmp_path, compilation_cache
):
  """SIGTERM mid-run, to one process (``signalled``: a preemption notice may reach one host first) or to
  ``launch/local.sh``, which passes it to both: a checkpoint on every process at the same update, exit status
  75 (preempted) everywhere and from local.sh, exact resume.

  Timed checkpoints are off (one per hour, after the first), so the checkpoint
  at the preempted update can only come from the SIGTERM. A parameter-server run advances its
  update count by a whole block per block, which once made the processes miss
  JAX's preemption sync point and train on to the end.
  """
  workdir, log = tmp_path / "two_processes", tmp_path / "local_sh.log"
  environment = main_environment(compilation_cache)
  environment.pop("JAX_NUM_CPU_DEVICES")
  environment.update(LAUNCH_KILL_GRACE="60", LAUNCH_MODULE=str(PACED_MAIN))
  arguments = [
    f"--config={CONFIG_FILE}:{variant}",
    f"--config.num_epochs={EPOCHS}",
    "--config.checkpoint_every_seconds=3600",
    "--config.log_every_updates=1",
    f"--workdir={workdir}",
  ]

  def launch(seconds_per_block: str) -> subprocess.Popen:
    with open(log, "ab") as output:
      return subprocess.Popen(
        [str(LOCAL_SH), "2", *arguments],
        cwd=REPOSITORY_ROOT,
        env={**environment, "PACED_SECONDS_PER_BLOCK": seconds_per_block},
        stdout=output,
        stderr=subprocess.STDOUT,
      )

  first = launch("0.2")
  deadline = time.monotonic() + TIMEOUT
  while not (workdir / "metrics.jsonl").exists() or len(read_metrics(workdir)) < 3:  # training is under way
    if first.poll() is not None or time.monotonic() > deadline:
      first.kill()
      pytest.fail(f"the run ended or stalled before training:\n{log_tail(log, lines=60)}")
    time.sleep(0.05)
  if signalled is None:
    first.send_signal(signal.SIGTERM)  # local.sh passes it to both processes
  else:  # that process alone; the other learns it in a collective
    os.kill(process_pid(signalled, workdir), signal.SIGTERM)
  try:
    assert first.wait(timeout=TIMEOUT) == PREEMPTED_EXIT_STATUS, log_tail(log, lines=60)
  except subprocess.TimeoutExpired:
    first.kill()
    pytest.fail(f"the preempted run did not exit within {TIMEOUT} s:\n{log_tail(log, lines=60)}")
  preempted = read_summary(workdir)
  reference = train_and_evaluate(tiny_config(variant, num_epochs=EPOCHS), str(tmp_path / "one_process"))
  assert preempted["preempted"] and 0 < preempted["updates"] < reference["updates"], log_tail(log, lines=60)
  # The first block's checkpoint (orbax saves the first step it is asked about), then the SIGTERM's.
  assert complete_checkpoints(workdir)[-1] == preempted["updates"] > complete_checkpoints(workdir)[0]

  second = launch("0")
  assert second.wait(timeout=TIMEOUT) == 0, log_tail(log, lines=60)
  assert f"resumed from the checkpoint at update {preempted['updates']}" in log.read_text()
  resumed = read_summary(workdir)
  assert not resumed["preempted"] and resumed["updates"] == reference["updates"]
  if variant == "async_dc":  # DC-S3GD's gloo all-reduce sums in another order than one process does
    assert resumed["params_sha256"] == reference["params_sha256"]
