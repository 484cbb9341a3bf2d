"""``protocol='diloco'`` through the training stack: the reductions that tie it to the other protocols, and resume.

Each run is the tiny MLP of `tests.helpers.tiny_run_config` (8 learners on the 8 host devices, mu = 8), built by
`build_run` and stepped block by block, so the comparisons see the weights themselves. Tolerances: the programs
differ (a vmapped or sharded local run against the engine's unrolled slots, a pmean against the server's mean of
a stack), so XLA rounds differently; after 8 rounds of float32 the measured differences are about 1e-7 relative.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from stalesgd.training import build_run, validate_config
from stalesgd.training.checkpoint import Checkpointer
from tests.helpers.train_helpers import tiny_config

RTOL, ATOL = 1e-5, 1e-6
INNER_RATE = 0.02


def train(config, *, stop: int | None = None, state=None, inputs=None):
  validate_config(config, num_devices=jax.device_count())
  inputs = inputs or build_run(config, jax.sharding.Mesh(np.array(jax.devices()), ("learners",)))
  runner = inputs.runner
  state = runner.init(inputs.params) if state is None else state
  start = runner.updates_done(state)
  stop = len(runner.block_starts) - 1 if stop is None else stop
  for block in range(runner.block_at(start), stop):
    state, _ = runner.step(state, block)
  return inputs, state


def weights(inputs, state):
  return jax.tree.map(np.asarray, jax.device_get(inputs.runner.params(state)))


def assert_close(actual, expected):
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=jax.tree_util.keystr(path))


def diloco_config(local_steps, **outer):
  config = tiny_config(
    "hardsync", protocol="diloco", local_steps=local_steps, learning_rate=INNER_RATE, momentum=0.0, num_epochs=0.5
  )
  for field, value in outer.items():
    config.outer[field] = value
  return config


def test_hardsync_with_local_runs_and_diloco_give_the_same_weights():
  """Parameter-server hardsync, H = 3, inner SGD(0.02), server SGD(1) without momentum = diloco, H = 3, inner
  SGD(0.02), outer SGD(1) without momentum: both apply theta - mean_m Delta_m after every round."""
  server = tiny_config("hardsync", local_steps=3, learning_rate=1.0, momentum=0.0, num_epochs=0.5)
  server.inner.learning_rate = INNER_RATE
  ps_inputs, ps_state = train(server)
  dl_inputs, dl_state = train(diloco_config(3, learning_rate=1.0, momentum=0.0, nesterov=False))
  assert ps_inputs.schedule.num_updates == dl_inputs.schedule.num_updates >= 3
  assert_close(weights(dl_inputs, dl_state), weights(ps_inputs, ps_state))


def test_diloco_with_one_local_step_and_unit_outer_sgd_is_synchronous_allreduce_sgd():
  allreduce = tiny_config("hardsync", protocol="allreduce_sync", learning_rate=INNER_RATE, momentum=0.0, num_epochs=0.5)
  ar_inputs, ar_state = train(allreduce)
  dl_inputs, dl_state = train(diloco_config(1, learning_rate=1.0, momentum=0.0, nesterov=False))
  assert_close(weights(dl_inputs, dl_state), weights(ar_inputs, ar_state))


def test_the_outer_step_is_applied_to_the_mean_pseudo_gradient():
  """Outer SGD at rate 2 without momentum moves twice as far from theta_0 as rate 1 after one round."""
  one_inputs, one = train(diloco_config(2, learning_rate=1.0, momentum=0.0, nesterov=False), stop=1)
  two_inputs, two = train(diloco_config(2, learning_rate=2.0, momentum=0.0, nesterov=False), stop=1)
  start = jax.tree.map(np.asarray, one_inputs.params)
  moved_once = jax.tree.map(lambda w, w0: w - w0, weights(one_inputs, one), start)
  moved_twice = jax.tree.map(lambda w, w0: w - w0, weights(two_inputs, two), start)
  assert_close(moved_twice, jax.tree.map(lambda d: 2 * d, moved_once))


@pytest.mark.parametrize(
  "reset, streaming",
  [(False, False), (True, False), (False, True)],
  ids=["kept-inner-state", "reset-inner-state", "streaming-carried-sync"],
)
def test_a_diloco_run_restored_from_a_checkpoint_continues_with_the_same_bits(reset, streaming, tmp_path):
  config = diloco_config(2)
  config.momentum, config.outer.reset_inner_state = 0.9, reset  # inner momentum: a state worth keeping
  if streaming:  # P = 2, tau = 1: the round-end sync's pseudo-gradients are carried, unreduced, into the checkpoint
    config.protocol, config.outer.fragments, config.outer.delay = "streaming_diloco", 2, 1
  inputs, whole = train(config)
  _, half = train(config, stop=3, inputs=inputs)
  with Checkpointer(tmp_path / "checkpoints") as checkpointer:
    checkpointer.save(3, half, {}, force=True)
    checkpointer.wait()
    restored, _ = checkpointer.restore(jax.tree.map(lambda leaf: leaf, inputs.runner.init(inputs.params)))
  assert int(restored.step) == 3
  assert bool(jax.tree.leaves(restored.unreduced)) == streaming
  _, resumed = train(config, state=restored, inputs=inputs)
  for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(whole), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
