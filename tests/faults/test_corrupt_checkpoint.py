"""A damaged newest checkpoint: the restart falls back to the previous one with a warning, and ends exactly.

Damage comes in many forms (a truncated data file after a full disk, a bad
sector flipping one bit, a deleted piece); each must be caught when the
checkpoint is read back, never restored as wrong weights and never a crash:
`Checkpointer.restore` warns naming the step, sets the damaged step aside as
``<step>.unreadable`` and restores the next older one. A directory where
nothing can be read raises `CheckpointError` instead of starting from scratch.

(Damage orbax reads around, such as a deleted ``state/_METADATA`` whose tree it
takes from the restore target, restores the newest step: its checksums match.)

Two levels:

* `Checkpointer` on a small state, one case per kind of damage (fast);
* the training loop: the reference run's workdir (checkpoints at updates 8 and
  188, the final one) copied, its final checkpoint damaged, then the run
  restarted: it resumes from update 8 and ends with the reference's weights,
  records and TensorBoard scalars.

A flipped bit lands on a byte a restore reads (`flip_a_bit_a_restore_reads`):
the training loop's checkpoints hold data files and stretches no restore reads,
and where they lie changes from run to run, so a fixed offset may damage nothing.

Several kinds fail on the previous code: a flipped bit or overwritten bytes in
a data file were read back silently as other weights (orbax stores no checksum).
"""

from __future__ import annotations

import json
import logging
import pathlib
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd.training.checkpoint import Checkpointer, CheckpointError
from tests.helpers.fault_helpers import (
  assert_same_run,
  fault_config,
  flip_a_bit_a_restore_reads,
  leaf_arrays,
  state_files,
  train_in_process,
)
from tests.helpers.train_helpers import complete_checkpoints, read_metrics

CHECKPOINT_LOGGER = "stalesgd.training.checkpoint"


def small_state(step: int) -> dict:
  """A pytree like the trainer's (weights, an integer counter, a PRNG key) whose values depend on ``step``."""
  weights = np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32)
  return {
    "params": {"w": jnp.asarray(weights), "b": jnp.full((64,), float(step))},
    "step": jnp.asarray(step, jnp.int32),
    "key": jax.random.key(step),
  }


def truncate_data(checkpoint: pathlib.Path) -> None:
  path = state_files(checkpoint)[0]
  with open(path, "r+b") as file:
    file.truncate(path.stat().st_size // 2)


def overwrite_data(checkpoint: pathlib.Path) -> None:
  path = state_files(checkpoint)[0]
  with open(path, "r+b") as file:
    file.seek(path.stat().st_size // 2)
    file.write(np.random.default_rng(0).bytes(64))


def change_metadata_value(checkpoint: pathlib.Path) -> None:
  """Still valid JSON, one number changed (only the checksum written with it tells)."""
  path = checkpoint / "metadata" / "metadata"
  metadata = json.loads(path.read_text())
  metadata["update"] += 1
  path.write_text(json.dumps(metadata))


def delete(relative: str):
  def damage(checkpoint: pathlib.Path) -> None:
    target = checkpoint / relative
    shutil.rmtree(target) if target.is_dir() else target.unlink()

  damage.__name__ = f"delete {relative}"
  return damage


def truncate(relative: str):
  def damage(checkpoint: pathlib.Path) -> None:
    with open(checkpoint / relative, "r+b") as file:
      file.truncate(5)

  damage.__name__ = f"truncate {relative}"
  return damage


DAMAGE = {
  "data_truncated": truncate_data,
  "data_overwritten": overwrite_data,
  "data_bit_flipped": flip_a_bit_a_restore_reads,
  "array_index_deleted": delete("state/manifest.ocdbt"),
  "state_item_deleted": delete("state"),
  "metadata_truncated": truncate("metadata/metadata"),
  "metadata_value_changed": change_metadata_value,
  "metadata_item_deleted": delete("metadata"),
}


def save_two_steps(directory: pathlib.Path) -> None:
  with Checkpointer(directory) as checkpointer:
    for step in (1, 2):
      assert checkpointer.save(step, small_state(step), {"update": step})
    checkpointer.wait()


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_with_a_warning(damage, tmp_path, caplog):
  save_two_steps(tmp_path)
  DAMAGE[damage](tmp_path / "2")
  with caplog.at_level(logging.WARNING, logger=CHECKPOINT_LOGGER), Checkpointer(tmp_path) as checkpointer:
    restored = checkpointer.restore(small_state(0))
    assert restored is not None, "a damaged checkpoint must not look like no checkpoint (a restart from scratch)"
    state, metadata = restored
    assert metadata == {"update": 1}
    assert all(np.array_equal(got, expected) for got, expected in zip(leaf_arrays(state), leaf_arrays(small_state(1))))
    warnings = [record.getMessage() for record in caplog.records if record.name == CHECKPOINT_LOGGER]
    assert any(f"checkpoint 2 in {tmp_path} is unreadable" in warning for warning in warnings), warnings
    # Set aside, so that it is no longer the latest and a new save of step 2 is not skipped.
    assert checkpointer.all_steps() == [1] and (tmp_path / "2.unreadable").is_dir()
    assert checkpointer.save(2, small_state(22), {"update": 2})
    checkpointer.wait()
  with Checkpointer(tmp_path) as reopened:
    state, metadata = reopened.restore(small_state(0))
  assert metadata == {"update": 2}
  assert all(np.array_equal(got, expected) for got, expected in zip(leaf_arrays(state), leaf_arrays(small_state(22))))


def test_when_no_checkpoint_can_be_read_restore_raises_instead_of_starting_from_scratch(tmp_path, caplog):
  save_two_steps(tmp_path)
  flip_a_bit_a_restore_reads(tmp_path / "2")
  delete("metadata")(tmp_path / "1")
  directory = re.escape(str(tmp_path))
  with caplog.at_level(logging.WARNING, logger=CHECKPOINT_LOGGER), Checkpointer(tmp_path) as checkpointer:
    with pytest.raises(CheckpointError, match=rf"no checkpoint in {directory} can be read \(step 2: .*; step 1: "):
      checkpointer.restore(small_state(0))
    with pytest.raises(CheckpointError, match=rf"checkpoint 2 in {directory} cannot be read"):
      checkpointer.restore(small_state(0), step=2)
  assert sorted(path.name for path in tmp_path.iterdir()) == ["1", "2"]  # nothing renamed when nothing is readable


def _copy_of(reference_dir: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
  workdir = tmp_path / "run"
  shutil.copytree(reference_dir, workdir)
  assert complete_checkpoints(workdir) == [8, 188]  # the first block's checkpoint and the final one
  return workdir


@pytest.mark.slow
def test_a_run_whose_final_checkpoint_is_damaged_resumes_from_the_previous_and_ends_exactly(
  tmp_path, digits_npz, reference_run, caplog, capsys
):
  reference, reference_dir = reference_run("async_dc")
  workdir = _copy_of(reference_dir, tmp_path)
  flip_a_bit_a_restore_reads(workdir / "checkpoints" / "188")
  with caplog.at_level(logging.WARNING, logger=CHECKPOINT_LOGGER):
    train_in_process(fault_config("async_dc", digits_npz), workdir)
  warnings = [record.getMessage() for record in caplog.records if record.name == CHECKPOINT_LOGGER]
  assert any(f"checkpoint 188 in {workdir / 'checkpoints'} is unreadable" in warning for warning in warnings)
  assert f"resumed from the checkpoint at update 8 in {workdir}" in capsys.readouterr().out
  assert_same_run(workdir, reference, reference_dir)
  assert complete_checkpoints(workdir)[-1] == 188 and (workdir / "checkpoints" / "188.unreadable").is_dir()


@pytest.mark.slow
def test_a_run_whose_checkpoints_are_all_damaged_refuses_to_start_again(tmp_path, digits_npz, reference_run):
  _, reference_dir = reference_run("async_dc")
  workdir = _copy_of(reference_dir, tmp_path)
  for step in (8, 188):
    flip_a_bit_a_restore_reads(workdir / "checkpoints" / str(step))
  records, summary = read_metrics(workdir), (workdir / "summary.json").read_text()
  with pytest.raises(CheckpointError, match=r"no checkpoint in .*checkpoints can be read \(step 188: .*step 8: "):
    train_in_process(fault_config("async_dc", digits_npz), workdir)
  assert read_metrics(workdir) == records and (workdir / "summary.json").read_text() == summary
  assert complete_checkpoints(workdir) == [8, 188]
