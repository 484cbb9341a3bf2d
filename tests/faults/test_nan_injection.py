"""A NaN injected at a chosen update: the run stops naming that update, and its last checkpoint is good.

The NaN enters where a real one would, through the data: one pixel of the
mini-batch whose gradient the server applies at update u (drawn with a seeded
`random.Random`) is NaN. The schedule (the reference run's ``schedule.npz``)
says which learner's k-th batch that is, and the training split's batches come
from a `stalesgd.data.LearnerBatches` subclass that poisons exactly that one;
nothing in the library is changed for the test. Updates before u never see it
(a gradient is computed from weights of its own timestamp, never later ones).

The run must raise `TrainingDiverged` with ``update == u``; it must log only
finite losses and write no summary; every checkpoint it started must be whole
and hold finite weights from before u; and resuming from the last one without
the NaN must end exactly like the uninterrupted run, which shows that the
checkpoint holds the state of an update before u, not just some finite numbers.
"""

from __future__ import annotations

import pathlib
import random
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from stalesgd import data as data_lib
from stalesgd.schedule import Schedule
from stalesgd.training import _runners as runners
from stalesgd.training._loop import TrainingDiverged
from tests.helpers.fault_helpers import assert_same_run, fault_config, train_in_process
from tests.helpers.train_helpers import complete_checkpoints, read_metrics

SECONDS_PER_BLOCK = 0.05  # so that a timed checkpoint (every second) falls between the first block's and u


@pytest.mark.slow
def test_a_nan_at_a_chosen_update_stops_the_run_naming_it_and_the_last_checkpoint_holds_earlier_weights(
  tmp_path, digits_npz, reference_run, monkeypatch, capsys
):
  reference, reference_dir = reference_run("async_dc")
  schedule = Schedule.load(reference_dir / "schedule.npz")
  assert schedule.contributions_per_update == 1  # async: one gradient per update
  update = random.Random(21).randrange(100, reference["updates"] - 8)
  learner, k = int(schedule.learner[update, 0]), int(schedule.batch_index[update, 0])
  assert np.count_nonzero((schedule.learner == learner) & (schedule.batch_index == k)) == 1

  class PoisonedBatches(data_lib.LearnerBatches):
    """The training batches, with one NaN pixel in learner ``learner``'s k-th."""

    def __call__(self, learner_ids, ks):
      batch = super().__call__(learner_ids, ks)
      hit = (np.asarray(learner_ids) == learner) & (np.asarray(ks) == k)
      if hit.any():
        batch["image"] = batch["image"].copy()
        batch["image"][hit, 0, 0, 0, 0] = np.nan
      return batch

  unpaced_step = runners.ParameterServerRunner.step

  def paced_step(self, state, block):
    time.sleep(SECONDS_PER_BLOCK)
    return unpaced_step(self, state, block)

  workdir = tmp_path / "run"
  config = fault_config("async_dc", digits_npz, checkpoint_every_seconds=1)
  monkeypatch.setattr(data_lib, "LearnerBatches", PoisonedBatches)
  monkeypatch.setattr(runners.ParameterServerRunner, "step", paced_step)
  with pytest.raises(TrainingDiverged, match=rf"the training loss became nan at update {update} \(epoch ") as error:
    train_in_process(config, workdir)
  monkeypatch.undo()
  assert error.value.update == update

  records = read_metrics(workdir)
  assert records and all(np.isfinite(record["train_loss"]) for record in records)
  assert records[-1]["step"] <= update
  assert not (workdir / "summary.json").exists()
  leftovers = [path.name for path in (workdir / "checkpoints").iterdir() if not path.name.isdigit()]
  assert leftovers == []  # every save that was started is complete
  saved = complete_checkpoints(workdir)
  assert saved and saved[-1] <= update
  state = ocp.StandardCheckpointer().restore(pathlib.Path(workdir) / "checkpoints" / str(saved[-1]) / "state")
  assert int(state["step"]) == saved[-1]
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    assert np.all(np.isfinite(np.asarray(leaf))), jax.tree_util.keystr(path)

  capsys.readouterr()
  train_in_process(fault_config("async_dc", digits_npz), workdir)
  assert f"resumed from the checkpoint at update {saved[-1]} in {workdir}" in capsys.readouterr().out
  assert_same_run(workdir, reference, reference_dir)
