"""``launch/local.sh 2``: the whole training run on 2 processes x 4 CPU devices, preempted and resumed, equals 1
process x 8 run straight through.

Async DC-ASGD-a and DC-S3GD for a quarter epoch through ``stalesgd-train`` on two gloo processes
(tests/faults/test_kill_two_processes.py kills them instead of preempting them). The engine's server state is
sharded over parameters across both processes, and evaluation batches are split over all 8 devices. Async
DC-ASGD-a's final weights must be bit-identical to the same config run in this process on 8 devices (nothing in
the engine sums across devices in a different order; see tests/engine/test_engine_multiprocess.py), and so must
every logged number except the wall-clock ones; DC-S3GD's losses agree to float32 rounding (gloo's all-reduce adds
in another order). Only process 0 writes the workdir's files.
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
  reference_config = tiny_config(variant, num_epochs=EPOCHS)
  reference_config.log_every_updates = 1  # logging only: the same updates, every one of them logged
  reference_dir = tmp_path / "one_process"
  reference = train_and_evaluate(reference_config, str(reference_dir))
  assert preempted["preempted"] and 0 < preempted["updates"] < reference["updates"], log_tail(log, lines=60)
  # The first block's checkpoint (orbax saves the first step it is asked about), then the SIGTERM's.
  assert complete_checkpoints(workdir)[-1] == preempted["updates"] > complete_checkpoints(workdir)[0]

  second = launch("0")
  assert second.wait(timeout=TIMEOUT) == 0, log_tail(log, lines=60)
  assert f"resumed from the checkpoint at update {preempted['updates']}" in log.read_text()
  resumed = read_summary(workdir)
  assert not resumed["preempted"] and resumed["updates"] == reference["updates"]
  assert complete_checkpoints(workdir)[-1] == reference["updates"]
  assert len(list(pathlib.Path(workdir).glob("events.out.tfevents.*"))) == 2  # one per launch: process 1 wrote none
  ours, theirs = read_metrics(workdir), read_metrics(reference_dir)
  if variant == "async_dc":  # DC-S3GD's gloo all-reduce sums in another order than one process does
    assert resumed["params_sha256"] == reference["params_sha256"]
    strip = lambda record: {key: value for key, value in record.items() if key not in WALL_CLOCK_FIELDS}
    assert [strip(record) for record in ours] == [strip(record) for record in theirs]
  else:  # DC-S3GD's per-learner losses live on both processes: the loop must still log them
    assert [record["step"] for record in ours] == [record["step"] for record in theirs]
    for mine, expected in zip(ours, theirs):
      assert mine["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-4)
