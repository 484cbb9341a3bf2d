"""A 2-process run preempted, then killed, then relaunched ends as the same run uninterrupted in one process.

Two ``stalesgd-train`` processes (``paced_main.py``, 4 host devices each, gloo collectives) train a
`tiny_run_config` variant on the npz digits in one workdir, through three launches:

1. **SIGTERM** (preemption), the run started by ``launch/local.sh 2``: async DC-ASGD-a's goes to process 1 alone
   (a preemption notice may reach one host first; process 0 learns it in a collective), DC-S3GD's to local.sh,
   which passes it to both. Timed checkpoints are off (one per hour, after the first block's), so the checkpoint
   at the preempted update can only come from the SIGTERM. Every process saves at the same update, and they and
   local.sh exit with status 75 (preempted). A parameter-server run advances its update count by a whole block
   per block, which once made the processes miss JAX's preemption sync point and train on to the end.
2. **SIGKILL**, the processes started the way local.sh starts them but without the launcher, which would stop the
   survivor itself (here the survivor has to find out on its own that its peer is gone, as on a cluster), with a
   5 s heartbeat and a checkpoint every second. After the first checkpoint beyond the one the launch resumed from,
   and a seeded-random delay: async DC-ASGD-a's process 1 alone (a machine lost): process 0 must exit with a
   non-zero status within the heartbeat timeout plus a margin, saying why, and write no ``summary.json``;
   DC-S3GD's both at once (the job killed). Killing either DC-S3GD process alone is tested in
   ``tests/distributed/test_multiprocess_dcs3gd.py``.
3. A last launch of both runs to the end. Each launch must say which checkpoint it resumed from, and the run must
   end as the same config trained uninterrupted in one process on 8 devices: for async DC-ASGD-a the same weights
   digest (the engine's server state is sharded over parameters across both processes, and nothing in it sums
   across devices in another order; see tests/engine/test_engine_multiprocess.py) and the same ``metrics.jsonl``
   records (wall-clock fields aside) and TensorBoard scalars, the test loss to float32 rounding (see
   `assert_same_records`); for DC-S3GD, whose gloo all-reduce adds in another order than one process does, the
   same updates and records with losses equal to float32 rounding. Only process 0 writes the workdir's files.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import time

import pytest

from stalesgd.training._loop import PREEMPTED_EXIT_STATUS
from tests.helpers.fault_helpers import npz_flags, without_wall_clock
from tests.helpers.train_helpers import (
  CONFIG_FILE,
  PACED_MAIN,
  REPOSITORY_ROOT,
  WALL_CLOCK_FIELDS,
  complete_checkpoints,
  event_scalars,
  finish,
  log_tail,
  main_command,
  main_environment,
  multiprocess_harness,
  read_metrics,
  read_summary,
  wait_for_checkpoint_after,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

NUM_PROCESSES = 2
LOCAL_SH = REPOSITORY_ROOT / "launch" / "local.sh"
HEARTBEAT_TIMEOUT = 5  # seconds; stalesgd-train's default is 100
SURVIVOR_MARGIN = 30.0  # seconds beyond the heartbeat timeout for the survivor to exit
PREEMPTED_SECONDS_PER_BLOCK = 0.2  # the SIGTERM round: slow enough to be signalled a few blocks in
SECONDS_PER_BLOCK = 0.08
MAX_KILL_DELAY = 1.5  # seconds after the round's first new checkpoint
NUM_EPOCHS = 3.0
# Who gets the SIGTERM: process 1 alone, or local.sh (which passes it to both); which processes get the SIGKILL:
# (1,) a non-coordinator (found by the heartbeat), (0, 1) both.
SIGTERM_TO = {"async_dc": 1, "dcs3gd": None}
SIGKILL_TO = {"async_dc": (1,), "dcs3gd": (0, 1)}


def launch_both(
  workdir: pathlib.Path,
  variant: str,
  digits_npz: pathlib.Path,
  logs: list[pathlib.Path],
  compilation_cache: pathlib.Path,
  seconds_per_block: float,
) -> list[subprocess.Popen]:
  """Both processes of one launch, each logging to its own file."""
  port = multiprocess_harness.free_port()
  environment = main_environment(compilation_cache, devices_per_process=8 // NUM_PROCESSES)
  command = main_command(
    workdir,
    variant,
    "--config.checkpoint_every_seconds=1",
    f"--config.num_epochs={NUM_EPOCHS}",
    *npz_flags(digits_npz),
    seconds_per_block=seconds_per_block,
  )
  processes = []
  for process_id, log in enumerate(logs):
    with open(log, "ab") as output:
      processes.append(
        subprocess.Popen(
          command
          + [
            f"--coordinator_address=127.0.0.1:{port}",
            f"--num_processes={NUM_PROCESSES}",
            f"--process_id={process_id}",
            f"--heartbeat_timeout={HEARTBEAT_TIMEOUT}",
          ],
          cwd=REPOSITORY_ROOT,
          env=environment,
          stdout=output,
          stderr=subprocess.STDOUT,
          start_new_session=True,
        )
      )
  return processes


def process_pid(process_id: int, workdir: pathlib.Path) -> int:
  """The pid of process ``process_id`` of the run `launch/local.sh` started in ``workdir``."""
  pattern = f"--process_id={process_id} .*--workdir={workdir}"
  found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True, check=False).stdout.split()
  assert len(found) == 1, f"expected one process {process_id} of the run in {workdir}, found pids {found}"
  return int(found[0])


def preempt_round(
  workdir: pathlib.Path, variant: str, digits_npz: pathlib.Path, log: pathlib.Path, compilation_cache: pathlib.Path
) -> tuple[int, int]:
  """`launch/local.sh 2` started, SIGTERM mid-run (`SIGTERM_TO`): exit status 75 from local.sh, a checkpoint at
  the preempted update, a preempted summary. Returns that update and process 0's pid."""
  environment = main_environment(compilation_cache)
  environment.pop("JAX_NUM_CPU_DEVICES")  # local.sh sets it
  environment.update(
    LAUNCH_KILL_GRACE="60", LAUNCH_MODULE=PACED_MAIN, PACED_SECONDS_PER_BLOCK=str(PREEMPTED_SECONDS_PER_BLOCK)
  )
  arguments = [
    f"--config={CONFIG_FILE}:{variant}",
    f"--config.num_epochs={NUM_EPOCHS}",
    "--config.checkpoint_every_seconds=3600",
    *npz_flags(digits_npz),
    f"--workdir={workdir}",
  ]
  with open(log, "ab") as output:
    launcher = subprocess.Popen(
      [str(LOCAL_SH), str(NUM_PROCESSES), *arguments],
      cwd=REPOSITORY_ROOT,
      env=environment,
      stdout=output,
      stderr=subprocess.STDOUT,
      start_new_session=True,
    )
  try:
    first = wait_for_checkpoint_after(workdir, -1, launcher, log)  # the first block's: training is under way
    writer = process_pid(0, workdir)
    time.sleep(3 * PREEMPTED_SECONDS_PER_BLOCK)
    if SIGTERM_TO[variant] is None:
      launcher.send_signal(signal.SIGTERM)  # local.sh passes it to both processes
    else:  # that process alone; the other learns it in a collective
      os.kill(process_pid(SIGTERM_TO[variant], workdir), signal.SIGTERM)
    assert finish(launcher, log, what="the preempted run") == PREEMPTED_EXIT_STATUS, log_tail(log, lines=60)
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
  preempted = read_summary(workdir)
  assert preempted["preempted"] and preempted["updates"] > first, log_tail(log, lines=60)
  # The first block's checkpoint (orbax saves the first step it is asked about), then the SIGTERM's.
  assert complete_checkpoints(workdir) == [first, preempted["updates"]]
  return preempted["updates"], writer


def kill_round(processes: list[subprocess.Popen], victims: tuple[int, ...], logs: list[pathlib.Path]) -> None:
  """SIGKILL to ``victims``; every other process must then exit non-zero on its own, naming the cause."""
  for victim in victims:
    processes[victim].kill()
  killed_at = time.monotonic()
  for index, process in enumerate(processes):
    if index in victims:
      assert finish(process, logs[index], what=f"killed process {index}") < 0
      continue
    status = finish(process, logs[index], HEARTBEAT_TIMEOUT + SURVIVOR_MARGIN, f"survivor process {index}")
    survived_for = time.monotonic() - killed_at
    assert status != 0, f"survivor process {index} exited 0 after its peer died:\n{log_tail(logs[index])}"
    text = logs[index].read_text(errors="replace")
    assert any(
      cause in text
      for cause in ("distributed service detected fatal errors", "heartbeat", "Connection reset", "Gloo", "gloo")
    ), log_tail(logs[index], lines=60)
    assert survived_for < HEARTBEAT_TIMEOUT + SURVIVOR_MARGIN


def assert_resumed_from(step: int, workdir: pathlib.Path, log: pathlib.Path) -> None:
  assert f"resumed from the checkpoint at update {step} in {workdir}" in log.read_text(), log_tail(log)


@pytest.mark.slow
@pytest.mark.parametrize("variant, seed", [("async_dc", 21), ("dcs3gd", 22)])
def test_a_two_process_run_preempted_then_killed_then_relaunched_resumes_exactly(
  variant, seed, tmp_path, compilation_cache, digits_npz, reference_run
):
  workdir = tmp_path / "two_processes"
  preempted, first_writer = preempt_round(
    workdir, variant, digits_npz, tmp_path / "preempted_local_sh.log", compilation_cache
  )
  preempted_summary = (workdir / "summary.json").read_bytes()

  logs = [tmp_path / f"killed_process{index}.log" for index in range(NUM_PROCESSES)]
  processes = launch_both(workdir, variant, digits_npz, logs, compilation_cache, SECONDS_PER_BLOCK)
  writers = {first_writer, processes[0].pid}
  try:
    wait_for_checkpoint_after(workdir, preempted, processes[0], logs[0])
    time.sleep(random.Random(seed).uniform(0.0, MAX_KILL_DELAY))
    for index, process in enumerate(processes):
      assert process.poll() is None, f"process {index} ended before its kill:\n{log_tail(logs[index])}"
    kill_round(processes, SIGKILL_TO[variant], logs)
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
  # The killed launch wrote no summary: the preempted launch's is there or gone, never another.
  assert not (workdir / "summary.json").exists() or (workdir / "summary.json").read_bytes() == preempted_summary
  assert_resumed_from(preempted, workdir, logs[0])
  last_checkpoint = complete_checkpoints(workdir)[-1]

  logs = [tmp_path / f"last_process{index}.log" for index in range(NUM_PROCESSES)]
  processes = launch_both(workdir, variant, digits_npz, logs, compilation_cache, seconds_per_block=0)
  writers.add(processes[0].pid)
  try:
    reference, reference_dir = reference_run(variant, num_epochs=NUM_EPOCHS)  # meanwhile, in this process
  except BaseException:
    for process in processes:
      process.kill()
    raise
  for index, process in enumerate(processes):
    assert finish(process, logs[index], what=f"process {index}") == 0, log_tail(logs[index])
  assert_resumed_from(last_checkpoint, workdir, logs[0])
  summary = read_summary(workdir)
  assert not summary["preempted"] and summary["updates"] == reference["updates"]
  assert complete_checkpoints(workdir)[-1] == reference["updates"]
  # Only process 0 writes TensorBoard events (files named events.out.tfevents.<time>.<host>.<pid>.<n>), each launch
  # from its first record on: the last launch's at least (the others may stop before theirs).
  event_pids = {int(path.name.split(".")[-2]) for path in workdir.glob("events.out.tfevents.*")}
  assert processes[0].pid in event_pids and event_pids <= writers, (event_pids, writers)
  if variant == "async_dc":  # DC-S3GD's gloo all-reduce adds in another order than one process does
    assert summary["params_sha256"] == reference["params_sha256"]
  assert_same_records(workdir, reference_dir, exact=variant == "async_dc")


def assert_same_records(workdir: pathlib.Path, reference_dir: pathlib.Path, *, exact: bool) -> None:
  """metrics.jsonl and the TensorBoard scalars (what TensorBoard shows) of both runs, wall-clock fields aside.

  With ``exact``, every number is equal but the test loss, which is summed over the evaluation batches of both
  processes through gloo, in another order than one process adds them (equal to float32 rounding); otherwise
  (DC-S3GD) the training losses and the correction diagnostics too.
  """
  # DC-S3GD's correction_ratio and displacement_norm are means over learners, also summed in another order.
  rounded = ("test_loss",) if exact else ("test_loss", "train_loss", "correction_ratio", "displacement_norm")
  ours, theirs = without_wall_clock(read_metrics(workdir)), without_wall_clock(read_metrics(reference_dir))
  assert [record["step"] for record in ours] == [record["step"] for record in theirs]
  for mine, expected in zip(ours, theirs):
    assert {key: value for key, value in mine.items() if key not in rounded} == {
      key: value for key, value in expected.items() if key not in rounded
    }, mine["step"]
    for field in rounded:
      if field in expected:
        assert mine[field] == pytest.approx(expected[field], rel=1e-5), (field, mine["step"])
  shown = lambda directory: {
    tag: points for tag, points in event_scalars(directory, apply_purges=True).items() if tag not in WALL_CLOCK_FIELDS
  }
  ours, theirs = shown(workdir), shown(reference_dir)
  assert ours.keys() == theirs.keys()
  for tag in theirs:
    assert [step for step, _ in ours[tag]] == [step for step, _ in theirs[tag]], tag
    assert [value for _, value in ours[tag]] == pytest.approx([value for _, value in theirs[tag]], rel=1e-5), tag
    if exact and tag not in rounded:
      assert ours[tag] == theirs[tag], tag
