"""Checkpoint formats: the committed fixture resumes, older formats migrate, what cannot be read is refused.

* ``tests/fixtures/checkpoint_format_2``: a finished tiny run's last checkpoint, written by the code of its day
  (``tests/fixtures/make_checkpoint_fixture.py``). The training loop resumes it with today's code, also once
  the format is bumped (as the next format change will), and reports the weights it was saved with.
* Format 1 (no recorded format; before `stalesgd.ScaleByStalenessState`'s ``applied_scale`` became
  ``lr_scale``) is written here as stalesgd 0.1 wrote it, with orbax directly, and read back migrated.
* A newer format, and a structure no migration explains, are refused naming the writer, and their files stay.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import stalesgd
from stalesgd.training import train_and_evaluate
from stalesgd.training.checkpoint import Checkpointer, CheckpointError, _format
from tests.fixtures.make_checkpoint_fixture import FIXTURE_FILE, FIXTURES, fixture_config

FORMAT_2_FIXTURE = FIXTURES / "checkpoint_format_2"


def _resume_fixture(fixture: pathlib.Path, tmp_path: pathlib.Path) -> tuple[dict, dict]:
  """Resumes a copy of a fixture run to its end; returns (the loop's summary, the fixture's facts)."""
  workdir = tmp_path / "run"
  shutil.copytree(fixture, workdir)
  facts = json.loads((workdir / FIXTURE_FILE).read_text())
  return train_and_evaluate(fixture_config(), str(workdir)), facts


@pytest.mark.slow
def test_the_committed_format_2_fixture_resumes_with_its_weights(tmp_path):
  summary, facts = _resume_fixture(FORMAT_2_FIXTURE, tmp_path)
  assert facts["checkpoint_format"] == 2
  assert not summary["preempted"]
  assert summary["updates"] == facts["updates"]
  assert summary["params_sha256"] == facts["params_sha256"]


@pytest.mark.slow
def test_the_fixture_still_resumes_after_the_format_is_bumped(tmp_path, monkeypatch):
  """What the next format change does: a new number and its migration (a rename this fixture does not hold)."""
  bumped = _format.FORMAT + 1
  monkeypatch.setattr(_format, "FORMAT", bumped)
  monkeypatch.setattr(
    _format, "MIGRATIONS", _format.MIGRATIONS + (_format.Migration(bumped, {"a_later_field": "its_new_name"}, "test"),)
  )
  summary, facts = _resume_fixture(FORMAT_2_FIXTURE, tmp_path)
  assert (summary["updates"], summary["params_sha256"]) == (facts["updates"], facts["params_sha256"])
  with Checkpointer(tmp_path / "new") as checkpointer:  # and a new save records the new format
    checkpointer.save(1, {"weights": jnp.ones(2)}, {"update": 1}, force=True)
  metadata = json.loads((tmp_path / "new" / "1" / "metadata" / "metadata").read_text())
  assert metadata[_format.FORMAT_KEY] == bumped
  assert metadata[_format.WRITER_KEY] == stalesgd.__version__


class _Format1StalenessState(NamedTuple):
  """`stalesgd.ScaleByStalenessState` as stalesgd 0.1 named its fields."""

  count: jax.Array
  mean_staleness: jax.Array
  contributions: jax.Array
  dropped: jax.Array
  applied_scale: jax.Array


def _todays_state():
  params = {"dense": {"kernel": jnp.arange(6.0).reshape(2, 3), "bias": jnp.array([0.5, -1.0])}}
  optimizer = optax.chain(stalesgd.scale_by_staleness("inverse"), optax.sgd(0.1, momentum=0.9))
  return {"params": params, "optimizer": optimizer.init(params)}


def _write_format_1(directory: pathlib.Path, step: int, state, metadata: dict) -> None:
  """A checkpoint as stalesgd 0.1 wrote it: orbax's two items, no format, writer or checksums."""
  with ocp.CheckpointManager(directory, item_names=("state", "metadata")) as manager:
    manager.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)),
    )


def test_a_format_1_checkpoint_with_applied_scale_is_read_as_lr_scale(tmp_path):
  today = _todays_state()
  staleness_state, momentum_state = today["optimizer"]
  old_staleness = _Format1StalenessState(
    count=jnp.int32(7),
    mean_staleness=jnp.float32(2.5),
    contributions=jnp.int32(14),
    dropped=jnp.int32(1),
    applied_scale=jnp.float32(0.25),
  )
  momentum = jax.tree.map(lambda leaf: leaf + 3.0, momentum_state)
  _write_format_1(tmp_path, 5, {"params": today["params"], "optimizer": (old_staleness, momentum)}, {"update": 5})

  restored = Checkpointer(tmp_path).restore(today)
  assert restored is not None
  state, metadata = restored
  assert metadata == {"update": 5}
  assert jax.tree.structure(state) == jax.tree.structure(today)
  staleness = state["optimizer"][0]
  assert isinstance(staleness, stalesgd.ScaleByStalenessState)
  assert (int(staleness.count), float(staleness.mean_staleness), int(staleness.contributions)) == (7, 2.5, 14)
  assert (int(staleness.dropped), float(staleness.lr_scale)) == (1, 0.25)
  for ours, saved in zip(jax.tree.leaves(state["optimizer"][1]), jax.tree.leaves(momentum)):
    np.testing.assert_array_equal(ours, saved)
  np.testing.assert_array_equal(state["params"]["dense"]["kernel"], today["params"]["dense"]["kernel"])


def test_a_newer_format_is_refused_naming_its_writer_and_kept(tmp_path, monkeypatch):
  newer = _format.FORMAT + 7
  with monkeypatch.context() as future:
    future.setattr(_format, "FORMAT", newer)
    with Checkpointer(tmp_path) as checkpointer:
      checkpointer.save(3, {"weights": jnp.ones(2)}, {"update": 3}, force=True)
  with pytest.raises(
    CheckpointError,
    match=rf"checkpoint 3 in .*, written by stalesgd {stalesgd.__version__} \(checkpoint format {newer}\), "
    rf"cannot be read by stalesgd .*checkpoint format {newer} is newer than this version's {_format.FORMAT}",
  ):
    Checkpointer(tmp_path).restore({"weights": jnp.zeros(2)})
  assert sorted(entry.name for entry in tmp_path.iterdir()) == ["3"]


def test_a_format_1_checkpoint_no_migration_explains_is_refused_naming_its_era(tmp_path):
  _write_format_1(tmp_path, 2, {"weights": jnp.ones(2), "extra": jnp.ones(1)}, {"update": 2})
  with pytest.raises(
    CheckpointError,
    match=r"written by a stalesgd version before checkpoints recorded their format \(0\.2\.0 or earlier; format "
    r"1\), holds a state of another structure than this run's \(keys only in the checkpoint: \['extra'\]; only "
    r"in this run: \[\]\), and no migration of format 1 to 2 explains it",
  ):
    Checkpointer(tmp_path).restore({"weights": jnp.zeros(2)})
  assert sorted(entry.name for entry in tmp_path.iterdir()) == ["2"]


def test_migrations_are_chosen_by_the_saved_format():
  assert [migration.to_format for migration in _format.migrations_from(1)] == [2]
  assert _format.migrations_from(2) == ()
  assert _format.migrated_path(("opt", "0", "applied_scale"), _format.migrations_from(1)) == ("opt", "0", "lr_scale")
  assert _format.migrated_path(("opt", "0", "applied_scale"), ()) == ("opt", "0", "applied_scale")
  assert _format.saved_format({}) == 1 and _format.saved_format({_format.FORMAT_KEY: 2}) == 2
  with pytest.raises(ValueError, match="checkpoint format 3 is newer than this version's 2"):
    _format.migrations_from(3)
