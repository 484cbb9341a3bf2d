"""Exact resume of ``stalesgd-train``: SIGKILL, then SIGTERM, then completion, equals one uninterrupted run.

One command-line run (``--config.checkpoint_every_seconds=1``) is interrupted
twice in the same workdir:

1. SIGKILL as soon as a complete checkpoint exists (the kill may land in the
   middle of the next, asynchronous, save);
2. restarted, it resumes from the latest checkpoint; SIGTERM once it has saved
   a newer one: it saves again and exits with status 0, its summary says
   ``preempted``;
3. restarted again, it runs to the end.

The final weights' digest must equal that of the same config run without
interruption (bit-identical weights), and ``metrics.jsonl`` must read like an
uninterrupted run's: strictly increasing steps ending at the last update, every
step the uninterrupted run logged, and identical evaluations.

Three runs: async with DC-ASGD-a (the state holds the ring buffer of past
weights, DC's MeanSquare and the momentum), DC-S3GD (the state holds the
queue of in-flight updates and per-learner weights) and async with local runs
of at most H = 3 steps (the state holds every learner's inner momentum), dynamic
local updates on 4 data shards (the schedule the resumed run reads holds the
shards' progress; its evaluations follow the examples applied). The runs go through
``paced_main.py`` (a pause before every block) so each phase is still running
when its signal is sent.
"""

from __future__ import annotations

import pathlib
import signal

import pytest

from stalesgd.training._loop import PREEMPTED_EXIT_STATUS, train_and_evaluate
from tests.helpers.train_helpers import (
  WALL_CLOCK_FIELDS,
  complete_checkpoints,
  evaluation_records,
  event_scalars,
  finish,
  log_tail,
  main_command,
  read_metrics,
  read_summary,
  start_main,
  tiny_config,
  wait_for_checkpoint_after,
)

SECONDS_PER_BLOCK = 0.1
EVALUATION_FIELDS = ("test_accuracy", "test_loss", "train_accuracy")


def without_wall_clock(record: dict) -> dict:
  return {field: value for field, value in record.items() if field not in WALL_CLOCK_FIELDS}


def read_event_scalars(workdir: pathlib.Path) -> dict:
  """TensorBoard scalars as TensorBoard shows them (purged steps dropped), wall-clock tags aside."""
  return {
    tag: values for tag, values in event_scalars(workdir, apply_purges=True).items() if tag not in WALL_CLOCK_FIELDS
  }


# A parameter-server run (async with local runs: the engine's path of every parameter-server protocol, with inner
# states) and a decentralized one; async DC-ASGD-a's kills and resume are tests/faults/test_kill_resume.py's and
# test_kill_two_processes.py's (with a SIGTERM to 2 processes).
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dcs3gd", "async_local"])
def test_killed_then_preempted_run_ends_with_the_uninterrupted_weights(variant, tmp_path, compilation_cache):
  workdir, log = tmp_path / "interrupted", tmp_path / "interrupted.log"
  command = main_command(workdir, variant, "--config.checkpoint_every_seconds=1", seconds_per_block=SECONDS_PER_BLOCK)

  # 1. SIGKILL once a checkpoint exists.
  process = start_main(command, log, compilation_cache)
  wait_for_checkpoint_after(workdir, 0, process, log)
  process.send_signal(signal.SIGKILL)
  assert finish(process, log) == -signal.SIGKILL
  killed_at = complete_checkpoints(workdir)[-1]
  assert not (workdir / "summary.json").exists()

  # 2. Resume; SIGTERM once a newer checkpoint exists: save, exit 75 (preempted), preempted in the summary.
  process = start_main(command, log, compilation_cache)
  wait_for_checkpoint_after(workdir, killed_at, process, log)
  process.send_signal(signal.SIGTERM)
  assert finish(process, log) == PREEMPTED_EXIT_STATUS, log_tail(log)
  assert f"resumed from the checkpoint at update {killed_at}" in log.read_text()
  preempted = read_summary(workdir)
  assert preempted["preempted"] and killed_at < preempted["updates"]
  assert complete_checkpoints(workdir)[-1] == preempted["updates"]

  # 3. Resume and finish; meanwhile, the same config uninterrupted in this process.
  process = start_main(command, log, compilation_cache)
  reference_dir = tmp_path / "uninterrupted"
  try:
    reference = train_and_evaluate(tiny_config(variant), str(reference_dir))
  except BaseException:
    process.kill()
    raise
  total_updates = reference["updates"]
  assert preempted["updates"] < total_updates
  assert finish(process, log) == 0, log_tail(log)
  assert f"resumed from the checkpoint at update {preempted['updates']}" in log.read_text()
  resumed = read_summary(workdir)
  assert not resumed["preempted"] and resumed["updates"] == total_updates
  assert resumed["params_sha256"] == reference["params_sha256"]
  assert resumed["test_accuracy"] == reference["test_accuracy"]

  records, reference_records = read_metrics(workdir), read_metrics(reference_dir)
  steps = [record["step"] for record in records]
  assert all(earlier < later for earlier, later in zip(steps, steps[1:])), steps
  assert steps[-1] == total_updates
  # Every record, wall-clock fields aside, is the uninterrupted run's: checkpoints add none.
  assert [without_wall_clock(record) for record in records] == [
    without_wall_clock(record) for record in reference_records
  ]
  assert read_event_scalars(workdir) == read_event_scalars(reference_dir)
  evaluations = [
    {field: record[field] for field in ("step",) + EVALUATION_FIELDS} for record in evaluation_records(records)
  ]
  assert evaluations == [
    {field: record[field] for field in ("step",) + EVALUATION_FIELDS}
    for record in evaluation_records(reference_records)
  ]
  if variant == "async_local":
    # Dynamic local updates apply mu H_m <= mu H examples per contribution: the evaluations (every 0.25 epoch)
    # follow the examples applied, one in each quarter epoch up to the last update's (84 updates: 0.29, 0.52,
    # 0.77 and 1.01 epochs), not the nominal c mu H per update (then at 0.19, 0.38, ...: six evaluations).
    epochs = [record["epoch"] for record in evaluation_records(reference_records)]
    assert [int(epoch / 0.25) for epoch in epochs] == [1, 2, 3, 4], epochs
