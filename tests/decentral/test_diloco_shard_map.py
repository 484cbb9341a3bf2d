"""Synchronous DiLoCo over a mesh (stalesgd/decentral/_diloco.py), one learner per host device (8).

The equations are those of tests/transforms/test_local_run.py (pinned there against numpy):
Delta_m = -(u_0 + ... + u_{H-1}) from theta; Delta_bar = pmean_m Delta_m; theta <- theta + OuterOpt(Delta_bar).
Here the sharded round is held to two other ways of running the same round:

* a Python loop over learners of the jitted one-learner `local_run`, the pseudo-gradients stacked, ``jnp.mean``
  over them and the jitted `outer_step`: every learner's pseudo-gradient, inner state and losses bit for bit (each
  device runs the one-learner program); the outer weights and outer state to rtol 1e-6 (atol 1e-7), because XLA
  compiles the outer step fused after the all-reduce in one program and alone in the other, and may contract its
  multiply-adds (beta v + Delta_bar, theta - eta (...)) into fused multiply-adds in one and not the other (observed:
  1 ulp in one or two entries from the second round; the all-reduce's mean itself equals ``jnp.mean``'s here);
* the vmapped one-device `diloco_round`: everything to rtol 1e-6 (atol 1e-7), because XLA:CPU compiles the
  vmapped program differently from the one-learner program (fused multiply-adds, batched dot products: see
  tests/transforms/test_local_run.py), so the last bits of an inner step can differ (observed after two rounds: at
  most 10 ulp, in an entry near zero, and at most a quarter of the tolerance).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stalesgd.decentral._diloco import sharded_diloco_round
from stalesgd.decentral._streaming import StreamingSettings, init_streaming, sharded_streaming_round
from stalesgd.parallel import LEARNERS_AXIS, learner_mesh
from stalesgd.transforms._local_run import diloco_round, init_inner_states, local_run, outer_step
from tests.helpers.local_run_reference import (
  assert_tree_close,
  assert_trees_equal,
  batch_stream,
  initial_params,
  learner_batches,
  least_squares,
)

STEPS, ROUNDS = 2, 2
INNER = optax.sgd(0.1, momentum=0.9)
OUTER = optax.sgd(0.7, momentum=0.9, nesterov=True)


def looped_round(params, outer_state, inner_states, batches, reset):
  """The round as a loop of the one-learner program: local runs, stack, jnp.mean, the outer step."""
  run = jax.jit(functools.partial(local_run, least_squares, INNER, reset_inner_state=reset))
  learners = jax.tree.leaves(batches)[0].shape[0]
  row = lambda tree, m: jax.tree.map(lambda leaf: leaf[m], tree)
  runs = [run(params, row(inner_states, m), row(batches, m)) for m in range(learners)]
  stack = lambda trees: jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)
  deltas = stack([one.pseudo_gradient for one in runs])
  mean = jax.tree.map(lambda leaf: jnp.mean(leaf, axis=0), deltas)
  params, outer_state = jax.jit(functools.partial(outer_step, OUTER))(params, outer_state, mean)
  return params, outer_state, stack([one.inner_state for one in runs]), deltas, jnp.stack([one.losses for one in runs])


def assert_trees_close_everywhere(actual, expected):
  for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reset", [False, True], ids=["kept", "reset"])
def test_sharded_round_equals_the_one_learner_loop_and_the_vmapped_round(devices, reset):
  """M = 8 (one per device), H = 2, momentum SGD inside, the paper's outer Nesterov, two rounds."""
  mesh = learner_mesh()
  learners = len(devices)
  params = initial_params()
  streams = [batch_stream(50 + m, ROUNDS * STEPS) for m in range(learners)]
  sharded = jax.jit(functools.partial(sharded_diloco_round, least_squares, INNER, OUTER, mesh, reset_inner_state=reset))
  vmapped = jax.jit(functools.partial(diloco_round, least_squares, INNER, OUTER, reset_inner_state=reset))
  first = (params, OUTER.init(params), init_inner_states(INNER, params, learners))
  sharded_state = looped_state = vmapped_state = first
  for r in range(ROUNDS):
    batches = learner_batches(streams, r, STEPS)
    out = sharded(*sharded_state, batches)
    looped = looped_round(*looped_state, batches, reset)
    close = vmapped(*vmapped_state, batches)
    assert_trees_equal(out.inner_states, looped[2])
    assert_trees_equal(out.pseudo_gradients, looped[3])
    np.testing.assert_array_equal(out.losses, looped[4])
    assert_tree_close(out.params, jax.tree.map(np.asarray, looped[0]))
    assert_trees_close_everywhere(out.outer_state, looped[1])
    for actual, expected in zip(out[:5], close[:5]):
      assert_trees_close_everywhere(actual, expected)
    sharded_state, looped_state, vmapped_state = out[:3], looped[:3], close[:3]
  # Where the state lives: the outer weights replicated, each learner's inner state on its device.
  assert out.params["w"].sharding.spec == jax.sharding.PartitionSpec()
  for leaf in jax.tree.leaves(out.inner_states):
    assert leaf.sharding.spec == jax.sharding.PartitionSpec(LEARNERS_AXIS)


def test_aux_comes_back_per_learner_and_step(devices):
  """With has_aux, aux has leaves [M, H, ...]: here the mean residual at theta_{m,i}, as the loop gives it."""
  mesh = learner_mesh()
  params = initial_params()
  batches = learner_batches([batch_stream(60 + m, STEPS) for m in range(len(devices))], 0, STEPS)

  def loss_with_aux(p, batch):
    x, y = batch
    residual = x @ p["w"] + p["b"] - y
    return 0.5 * jnp.mean(residual**2), jnp.mean(residual)

  run = jax.jit(functools.partial(sharded_diloco_round, loss_with_aux, INNER, OUTER, mesh, has_aux=True))
  out = run(params, OUTER.init(params), init_inner_states(INNER, params, len(devices)), batches)
  single = jax.jit(functools.partial(local_run, loss_with_aux, INNER, has_aux=True))
  for m in range(len(devices)):
    expected = single(params, INNER.init(params), jax.tree.map(lambda leaf, m=m: leaf[m], batches))
    np.testing.assert_array_equal(out.aux[m], expected.aux)


def test_a_learners_axis_that_is_not_one_per_device_is_refused(devices):
  mesh = learner_mesh()
  params = initial_params()
  batches = learner_batches([batch_stream(m, STEPS) for m in range(len(devices) // 2)], 0, STEPS)
  states = init_inner_states(INNER, params, len(devices))
  with pytest.raises(ValueError, match=r"batches=\[\(4, 2, 4, 3\), \(4, 2, 4\)\]; allowed: leaves with a leading"):
    sharded_diloco_round(least_squares, INNER, OUTER, mesh, params, OUTER.init(params), states, batches)
  with pytest.raises(ValueError, match=r"axis_name='peers'; allowed: an axis of the mesh"):
    sharded_diloco_round(
      least_squares, INNER, OUTER, mesh, params, OUTER.init(params), states, batches, axis_name="peers"
    )


@pytest.mark.parametrize("reset", [False, True], ids=["kept", "reset"])
def test_the_streaming_round_at_one_fragment_without_delay_is_this_round(devices, reset):
  """The training stack runs `diloco` as streaming DiLoCo's corner (P = 1, tau = 0, alpha = 0,
  `stalesgd.training._diloco_runner`); this round, written without fragments or copies of theta per learner, must
  give its weights and states: to rtol 1e-6 (atol 1e-7), the two programs fuse the outer step differently."""
  mesh = learner_mesh()
  learners = len(devices)
  params = initial_params()
  settings = StreamingSettings(local_steps=STEPS)
  streams = [batch_stream(70 + m, ROUNDS * STEPS) for m in range(learners)]
  plain = jax.jit(functools.partial(sharded_diloco_round, least_squares, INNER, OUTER, mesh, reset_inner_state=reset))
  streaming = jax.jit(
    functools.partial(sharded_streaming_round, least_squares, INNER, OUTER, mesh, settings, reset_inner_state=reset)
  )
  state = (params, OUTER.init(params), init_inner_states(INNER, params, learners))
  fragments = init_streaming(INNER, OUTER, params, learners, settings, reset_inner_state=reset)
  for r in range(ROUNDS):
    batches = learner_batches(streams, r, STEPS)
    out, fragments = plain(*state, batches), streaming(fragments, batches).state
    state = out[:3]
    for m in range(learners):
      row = lambda tree, m=m: jax.tree.map(lambda leaf: leaf[m], tree)
      assert_trees_close_everywhere(row(fragments.outer_params), out.params)
      assert_trees_close_everywhere(row(fragments.local_params), out.params)  # alpha = 0: every copy restarts
      assert_trees_close_everywhere(row(fragments.outer_states[0]), out.outer_state)
    if not reset:
      assert_trees_close_everywhere(fragments.inner_states, out.inner_states)
