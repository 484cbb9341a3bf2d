"""A DC-S3GD state saved and restored mid-run continues exactly like the uninterrupted run."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from test_dcs3gd import initial_params, loss_fn, make_batches

from stalesgd.decentral import DCS3GD, DCS3GDSettings, settings_for_protocol
from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.training.checkpoint import Checkpointer


@pytest.mark.slow
@pytest.mark.parametrize(
  "config",
  [
    DCS3GDSettings(staleness=2, dc_lambda=0.1, lambda_mode="adaptive"),  # queue and MeanSquare
    settings_for_protocol("allreduce_sync"),  # no queue, no MeanSquare (None fields)
  ],
  ids=["adaptive-S2", "allreduce_sync"],
)
def test_resume_from_checkpoint_is_bit_identical(config, devices, tmp_path):
  mesh = sharding_lib.learner_mesh()
  trainer = DCS3GD(loss_fn, optax.sgd(0.1, momentum=0.9), config, mesh)
  batches = make_batches(len(devices), steps=4)
  feed = lambda row: sharding_lib.stack_learners(lambda learner: row[learner], mesh)

  uninterrupted = trainer.init(initial_params())
  for row in batches:
    uninterrupted, _ = trainer.step(uninterrupted, feed(row))

  state = trainer.init(initial_params())
  for row in batches[:2]:
    state, _ = trainer.step(state, feed(row))
  with Checkpointer(tmp_path) as checkpointer:
    checkpointer.save(2, state, {"next_step": 2}, force=True)
    checkpointer.wait()
    restored, metadata = checkpointer.restore(trainer.abstract_state(initial_params()))
  assert metadata == {"next_step": 2}
  assert jax.tree.map(lambda leaf: leaf.sharding, restored) == jax.tree.map(lambda leaf: leaf.sharding, state)
  for row in batches[2:]:
    restored, _ = trainer.step(restored, feed(row))
  for actual, expected in zip(jax.tree.leaves(restored), jax.tree.leaves(uninterrupted)):
    np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))
