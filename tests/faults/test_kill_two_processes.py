"""kill -9 in a 2-process run: the survivor exits with an error, and relaunching both resumes exactly.

Two ``stalesgd-train`` processes (``paced_main.py``, 4 host devices each,
gloo collectives, a 5 s heartbeat) train a `tiny_run_config` variant in one
workdir, started the way ``launch/local.sh 2`` starts them but without the
launcher, which would stop the survivor itself: here the survivor has to find
out on its own that its peer is gone, as on a cluster. Each round waits for a
checkpoint newer than the one the round resumed from, then for a seeded-random
delay, and sends SIGKILL:

* async DC-ASGD-a: to process 1 alone (a machine lost): process 0 must exit
  with a non-zero status within the heartbeat timeout plus a margin, saying
  why, and write no ``summary.json``;
* DC-S3GD: to both at once (the job killed). Killing either DC-S3GD process
  alone is tested in ``tests/distributed/test_multiprocess_dcs3gd.py``.

A last launch of both runs to the end. It must say which checkpoint it resumed
from, and end as the same config trained uninterrupted in one process on 8
devices: for async DC-ASGD-a, the same weights digest (the 2-process engine is
bit-identical to one process, see ``tests/training/test_train_multiprocess.py``)
and the same ``metrics.jsonl`` records (wall-clock fields aside) and
TensorBoard scalars, the test loss to float32 rounding (see
`assert_same_records`); for DC-S3GD, whose gloo all-reduce adds in another
order than one process does, the same updates and records with losses equal
to float32 rounding.
"""

from __future__ import annotations

import pathlib
import random
import subprocess
import time

import pytest

from tests.helpers.fault_helpers import npz_flags, without_wall_clock
from tests.helpers.train_helpers import (
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
HEARTBEAT_TIMEOUT = 5  # seconds; stalesgd-train's default is 100
SURVIVOR_MARGIN = 30.0  # seconds beyond the heartbeat timeout for the survivor to exit
SECONDS_PER_BLOCK = 0.08
MAX_KILL_DELAY = 1.5  # seconds after the round's first new checkpoint
NUM_EPOCHS = 3.0
# Which processes each round kills: (1,) a non-coordinator (found by the heartbeat), (0,) the coordinator,
# (0, 1) both.
# (tests/distributed/test_multiprocess_dcs3gd.py kills each process of a DC-S3GD run alone.)
ROUNDS = {"async_dc": ((1,),), "dcs3gd": ((0, 1),)}


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
def test_killed_processes_of_a_two_process_run_then_relaunching_both_resumes_exactly(
  variant, seed, tmp_path, compilation_cache, digits_npz, reference_run
):
  moments = random.Random(seed)
  workdir = tmp_path / "killed"
  for round_number, victims in enumerate(ROUNDS[variant]):
    logs = [tmp_path / f"round{round_number}_process{index}.log" for index in range(NUM_PROCESSES)]
    before = complete_checkpoints(workdir)
    processes = launch_both(workdir, variant, digits_npz, logs, compilation_cache, SECONDS_PER_BLOCK)
    try:
      wait_for_checkpoint_after(workdir, before[-1] if before else -1, processes[0], logs[0])
      time.sleep(moments.uniform(0.0, MAX_KILL_DELAY))
      for index, process in enumerate(processes):
        assert process.poll() is None, f"process {index} ended before its kill:\n{log_tail(logs[index])}"
      kill_round(processes, victims, logs)
    finally:
      for process in processes:
        if process.poll() is None:
          process.kill()
    assert not (workdir / "summary.json").exists()
    if before:
      assert_resumed_from(before[-1], workdir, logs[0])
  last_checkpoint = complete_checkpoints(workdir)[-1]

  logs = [tmp_path / f"last_process{index}.log" for index in range(NUM_PROCESSES)]
  processes = launch_both(workdir, variant, digits_npz, logs, compilation_cache, seconds_per_block=0)
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
