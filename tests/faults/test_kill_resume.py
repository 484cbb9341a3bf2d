"""kill -9 at seeded-random moments, then a restart: the same final weights and records as one uninterrupted run.

A command-line run (``paced_main.py``: ``stalesgd-train`` with a pause before
every block, so that it is still training when the signal comes) is sent
SIGKILL several times in the same workdir, each time at a moment drawn from a
seeded `random.Random`: a random delay after the relaunched run's first
checkpoint of its own is complete. With ``checkpoint_every_seconds=1`` the
delays land between checkpoints (the work since the last one is lost and
done again), inside the asynchronous write of the next one (its temporary
directory must be ignored), or just after one. A last launch runs to the end.

Its ``summary.json`` digest of the final weights, ``metrics.jsonl`` (wall-clock
fields aside) and TensorBoard scalars must equal those of the uninterrupted
reference run; every relaunch must say which checkpoint it resumed from.

Two protocol families: async with DC-ASGD-a (a parameter-server run: ring
buffer, MeanSquare, momentum in the state) and DC-S3GD (decentralized: the
in-flight update queue and per-learner weights).

Plus the moment just before the first checkpoint is whole (a long first save
on a big model), emulated by removing the checkpoints of a finished run: the
restart starts from scratch and its records must not follow the dead run's.

Two processes: ``test_kill_two_processes.py`` (SIGTERM, then kill -9).
"""

from __future__ import annotations

import random
import shutil
import time

import pytest

from tests.helpers.fault_helpers import (
  assert_same_run,
  fault_config,
  npz_flags,
  train_in_process,
)
from tests.helpers.train_helpers import (
  complete_checkpoints,
  finish,
  log_tail,
  main_command,
  start_main,
  wait_for_checkpoint_after,
)

SECONDS_PER_BLOCK = 0.08
# Seconds after a launch's first checkpoint. The seeds below draw delays of 0.39-1.03 s. A launch waits for a
# checkpoint newer than the one it resumed from (up to ~1 s of checkpoint interval, ~13 blocks), then for the delay
# (up to ~13 blocks): at most ~25-30 blocks per launch, fewer than the 3-epoch run's ~84 blocks (~70 DC-S3GD steps)
# hold over its kills. (With one epoch, 28 blocks, a full-suite run once reached the end before its third kill.)
MAX_KILL_DELAY = 1.5
NUM_EPOCHS = 3.0
KILLS = {"async_dc": 3, "dcs3gd": 2}


@pytest.mark.slow
@pytest.mark.parametrize("variant, seed", [("async_dc", 12), ("dcs3gd", 13)])
def test_sigkill_at_random_moments_then_resume_ends_like_the_uninterrupted_run(
  variant, seed, tmp_path, compilation_cache, digits_npz, reference_run
):
  moments = random.Random(seed)
  workdir, log = tmp_path / "killed", tmp_path / "killed.log"
  command = main_command(
    workdir,
    variant,
    "--config.checkpoint_every_seconds=1",
    f"--config.num_epochs={NUM_EPOCHS}",
    *npz_flags(digits_npz),
    seconds_per_block=SECONDS_PER_BLOCK,
  )
  resumed_from = []
  for kill in range(KILLS[variant]):
    before = complete_checkpoints(workdir)
    if before:
      resumed_from.append(before[-1])
    process = start_main(command, log, compilation_cache)
    wait_for_checkpoint_after(workdir, before[-1] if before else -1, process, log)
    time.sleep(moments.uniform(0.0, MAX_KILL_DELAY))
    assert process.poll() is None, f"the run ended before kill {kill + 1}:\n{log_tail(log)}"
    process.kill()  # SIGKILL: no handler, no flush, no cleanup
    assert finish(process, log) < 0
    assert not (workdir / "summary.json").exists()
  resumed_from.append(complete_checkpoints(workdir)[-1])

  # The last launch is not killed: no pause per block.
  process = start_main(
    main_command(
      workdir,
      variant,
      "--config.checkpoint_every_seconds=1",
      f"--config.num_epochs={NUM_EPOCHS}",
      *npz_flags(digits_npz),
      seconds_per_block=0,
    ),
    log,
    compilation_cache,
  )
  try:
    reference, reference_dir = reference_run(variant, num_epochs=NUM_EPOCHS)  # meanwhile, in this process
  except BaseException:
    process.kill()
    raise
  assert finish(process, log) == 0, log_tail(log)
  text = log.read_text()
  for step in resumed_from:
    assert f"resumed from the checkpoint at update {step} in {workdir}" in text, log_tail(log)
  assert_same_run(workdir, reference, reference_dir)


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_was_whole_starts_over_with_clean_records(
  tmp_path, digits_npz, reference_run, capsys
):
  """What a SIGKILL leaves when it lands before the first (asynchronous) save is complete.

  The records and TensorBoard events written so far remain, with no checkpoint
  to resume from. The restart must train from scratch and rewrite them, not
  append a second copy (the previous code appended: 40 records instead of 20).
  """
  reference, reference_dir = reference_run("async_dc")
  workdir = tmp_path / "run"
  shutil.copytree(reference_dir, workdir)
  shutil.rmtree(workdir / "checkpoints")
  (workdir / "summary.json").unlink()
  train_in_process(fault_config("async_dc", digits_npz), workdir)
  assert "resumed from" not in capsys.readouterr().out
  assert_same_run(workdir, reference, reference_dir)
