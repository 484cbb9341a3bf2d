"""The contract every transform and chain of stalesgd.transforms keeps (optax's alias-test style).

Each registry entry is run through the same checks: convergence on a quadratic
with and without stale inputs, no retrace on a second jitted update, unknown
extra arguments, optax wrappers, dtypes, state structure, None leaves, chains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd

CURVATURE = {"w": jnp.array([1.0, 2.0, 1.0]), "b": jnp.array(1.5)}
OPTIMUM = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(-1.0)}
DELAY = 2
LEARNING_RATE = 0.1


@dataclasses.dataclass(frozen=True)
class Entry:
  """A transform under test: its factory, keyword arguments, and whether it is a full optimizer."""

  name: str
  factory: Callable[..., optax.GradientTransformationExtraArgs]
  kwargs: dict[str, Any]
  optimizer: bool = False
  static_args: tuple[str, ...] = ()

  def build(self) -> optax.GradientTransformationExtraArgs:
    return self.factory(**self.kwargs)

  def optimizer_from(self, transform) -> optax.GradientTransformationExtraArgs:
    if self.optimizer:
      return transform
    return optax.chain(transform, optax.scale_by_learning_rate(LEARNING_RATE))


REGISTRY = [
  Entry("staleness_inverse", stalesgd.scale_by_staleness, {"rule": "inverse"}),
  Entry("staleness_inverse_mean_tracked", stalesgd.scale_by_staleness, {"rule": "inverse_mean"}),
  Entry("staleness_inverse_mean_given", stalesgd.scale_by_staleness, {"rule": "inverse_mean", "mean_staleness": 2.0}),
  Entry("staleness_polynomial", stalesgd.scale_by_staleness, {"rule": "polynomial", "exponent": 0.5}),
  Entry("staleness_polynomial_normalized", stalesgd.scale_by_staleness, {"rule": "polynomial", "normalize": True}),
  Entry(
    "staleness_exponential_scheduled",
    stalesgd.scale_by_staleness,
    {"rule": "exponential", "rate": optax.linear_schedule(0.1, 0.3, 10)},
  ),
  Entry("staleness_threshold", stalesgd.scale_by_staleness, {"rule": "threshold", "max_staleness": 3}),
  Entry("staleness_hinge", stalesgd.scale_by_staleness, {"rule": "hinge", "max_staleness": 1, "hinge_slope": 0.5}),
  Entry("staleness_constant", stalesgd.scale_by_staleness, {"rule": "constant"}),
  Entry("dc_constant", stalesgd.scale_by_delay_compensation, {"dc_lambda": 0.04}),
  # DC-ASGD-a's correction is about dc_lambda * |g| * D: the paper's 2.0 overshoots the
  # curvature of this quadratic (|g| up to 4) and diverges; 1.0 stays below it.
  Entry("dc_adaptive", stalesgd.scale_by_delay_compensation, {"dc_lambda": 1.0, "adaptive": True, "decay": 0.95}),
  Entry(
    "dc_adaptive_per_learner",
    stalesgd.scale_by_delay_compensation,
    {"dc_lambda": 1.0, "adaptive": True, "num_learners": 3},
    static_args=("num_learners",),
  ),
  Entry("dc_layerwise", stalesgd.scale_by_delay_compensation, {"dc_lambda": 0.2, "layerwise": True}),
  Entry("gap_aware", stalesgd.scale_by_gap_aware, {"decay": 0.9}),
  Entry("average_contributions", stalesgd.average_contributions, {}),
  Entry(
    "staleness_aware_sgd",
    stalesgd.staleness_aware_sgd,
    {"learning_rate": LEARNING_RATE, "momentum": 0.5, "nesterov": True},
    optimizer=True,
  ),
  Entry(
    "staleness_aware_sgd_polynomial",
    stalesgd.staleness_aware_sgd,
    {"learning_rate": LEARNING_RATE, "rule": "polynomial", "exponent": 1.0},
    optimizer=True,
  ),
  Entry("dc_asgd", stalesgd.dc_asgd, {"learning_rate": LEARNING_RATE, "momentum": 0.5}, optimizer=True),
  Entry(
    "delayed_nesterov",
    stalesgd.delayed_nesterov,
    {"learning_rate": LEARNING_RATE, "momentum": 0.5, "buffer_size": 2, "activation": 0.5},
    optimizer=True,
    static_args=("buffer_size",),
  ),
  Entry(
    "dc_asgd_adaptive",
    stalesgd.dc_asgd,
    {"learning_rate": optax.exponential_decay(LEARNING_RATE, 100, 0.5), "dc_lambda": 1.0, "adaptive": True},
    optimizer=True,
  ),
]
IDS = [entry.name for entry in REGISTRY]


def loss(params):
  return sum(
    0.5 * jnp.sum(curvature * (param - optimum) ** 2)
    for curvature, param, optimum in zip(jax.tree.leaves(CURVATURE), jax.tree.leaves(params), jax.tree.leaves(OPTIMUM))
  )


def initial_params(dtype=jnp.float32):
  return {"w": jnp.array([0.0, 0.0, 3.0], dtype), "b": jnp.array(2.0, dtype)}


def stale_inputs(params, dtype=jnp.float32):
  """Extra arguments of one stale gradient, computed at weights a little off `params`."""
  stale = jax.tree.map(lambda leaf: (leaf - 0.25).astype(dtype), params)
  return stale, {"staleness": 2, "stale_params": stale, "learner": 1}


def assert_trees_equal_shape_and_dtype(first, second):
  assert jax.tree.structure(first) == jax.tree.structure(second)
  for left, right in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
    assert jnp.shape(left) == jnp.shape(right)
    assert jnp.asarray(left).dtype == jnp.asarray(right).dtype


def run_delayed_descent(optimizer, steps, use_extra_args):
  """Async SGD on the quadratic: each gradient is computed at the weights DELAY updates old.

  The history of weights is a ring of DELAY + 1 entries carried through one jitted scan.
  """
  params = initial_params()
  history = jax.tree.map(lambda leaf: jnp.stack([leaf] * (DELAY + 1)), params)

  def step(carry, step_index):
    params, state, history = carry
    if use_extra_args:
      staleness = jnp.minimum(step_index, DELAY)
      stale = jax.tree.map(lambda ring: ring[(step_index - staleness) % (DELAY + 1)], history)
      updates, state = optimizer.update(
        jax.grad(loss)(stale), state, params, staleness=staleness, stale_params=stale, learner=step_index % 3
      )
    else:
      updates, state = optimizer.update(jax.grad(loss)(params), state, params)
    params = optax.apply_updates(params, updates)
    history = jax.tree.map(lambda ring, leaf: ring.at[(step_index + 1) % (DELAY + 1)].set(leaf), history, params)
    return (params, state, history), None

  (final, _, _), _ = jax.jit(lambda carry: jax.lax.scan(step, carry, jnp.arange(steps)))(
    (params, optimizer.init(params), history)
  )
  return final


@pytest.mark.slow
@pytest.mark.parametrize("use_extra_args", [False, True], ids=["fresh", "stale"])
@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_converges_on_a_quadratic(entry, use_extra_args):
  final = run_delayed_descent(entry.optimizer_from(entry.build()), 150, use_extra_args)
  assert float(loss(final)) < 1e-3 * float(loss(initial_params()))


@pytest.mark.slow
@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_jitted_update_matches_eager_and_does_not_retrace(entry, dtype=jnp.bfloat16):
  """In bfloat16, where a state whose dtype drifts would show as a retrace on the second call.

  The float32 case is covered by the MultiSteps test, which also counts traces.
  """
  transform = entry.build()
  traces = []

  @jax.jit
  def update(grads, state, params, stale):
    traces.append(1)
    return transform.update(grads, state, params, staleness=2, stale_params=stale, learner=1)

  params = initial_params(dtype)
  stale, extra_args = stale_inputs(params, dtype)
  grads = jax.tree.map(lambda leaf: leaf.astype(dtype), jax.grad(loss)(stale))
  initial_state = jitted_state = eager_state = transform.init(params)
  for _ in range(3):
    jitted_updates, jitted_state = update(grads, jitted_state, params, stale)
    eager_updates, eager_state = transform.update(grads, eager_state, params, **extra_args)
    tolerance = 1e-6 if dtype == jnp.float32 else 1e-2
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(
        np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tolerance, atol=tolerance
      ),
      jitted_updates,
      eager_updates,
    )
  assert len(traces) == 1
  assert_trees_equal_shape_and_dtype(initial_state, jitted_state)


@pytest.mark.slow
@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_accepts_unknown_extra_args(entry):
  transform = entry.build()
  params = initial_params()
  stale, extra_args = stale_inputs(params)
  state = transform.init(params)
  grads = jax.grad(loss)(stale)
  expected, _ = transform.update(grads, state, params, **extra_args)
  updates, _ = transform.update(grads, state, params, **extra_args, not_a_known_argument=7)
  jax.tree.map(np.testing.assert_array_equal, updates, expected)


@pytest.mark.slow
@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_inject_hyperparams_gives_the_same_updates(entry):
  injected = optax.inject_hyperparams(entry.factory, static_args=entry.static_args)(**entry.kwargs)
  plain = entry.build()
  params = initial_params()
  stale, extra_args = stale_inputs(params)
  grads = jax.grad(loss)(stale)
  injected_state, plain_state = injected.init(params), plain.init(params)
  for _ in range(2):
    injected_updates, injected_state = injected.update(grads, injected_state, params, **extra_args)
    plain_updates, plain_state = plain.update(grads, plain_state, params, **extra_args)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), injected_updates, plain_updates)


@pytest.mark.slow
@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_multi_steps_accumulates_with_extra_args_without_retrace(entry):
  transform = optax.MultiSteps(entry.build(), every_k_schedule=2)
  params = initial_params()
  stale, extra_args = stale_inputs(params)
  grads = jax.grad(loss)(stale)
  state = transform.init(params)
  traces = []

  @jax.jit
  def update(grads, state):
    traces.append(1)
    return transform.update(grads, state, params, **extra_args)

  first, state = update(grads, state)
  second, state = update(grads, state)
  assert len(traces) == 1
  assert all(float(jnp.max(jnp.abs(leaf))) == 0 for leaf in jax.tree.leaves(first))
  reference, _ = entry.build().update(grads, entry.build().init(params), params, **extra_args)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), second, reference)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_preserves_dtype_and_state_structure(entry, dtype):
  transform = entry.build()
  params = initial_params(dtype)
  stale, extra_args = stale_inputs(params, dtype)
  grads = jax.tree.map(lambda leaf: leaf.astype(dtype), jax.grad(loss)(stale))
  initial_state = transform.init(params)
  for extra in (extra_args, {}):
    updates, state = transform.update(grads, initial_state, params, **extra)
    assert all(leaf.dtype == dtype for leaf in jax.tree.leaves(updates))
    assert_trees_equal_shape_and_dtype(initial_state, state)


@pytest.mark.slow
@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_tolerates_none_leaves(entry):
  transform = entry.build()
  params = {**initial_params(), "frozen": None}
  stale = {**stale_inputs(initial_params())[0], "frozen": None}
  grads = {**jax.grad(loss)(stale_inputs(initial_params())[0]), "frozen": None}
  state = transform.init(params)
  updates, _ = transform.update(grads, state, params, staleness=2, stale_params=stale, learner=1)
  assert updates["frozen"] is None
  updates, _ = transform.update(grads, state, params)
  assert updates["frozen"] is None


@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_works_inside_optax_chain(entry):
  chained = optax.chain(optax.clip_by_global_norm(100.0), entry.build(), optax.scale(1.0))
  alone = entry.build()
  params = initial_params()
  stale, extra_args = stale_inputs(params)
  grads = jax.grad(loss)(stale)
  for extra in (extra_args, {}):
    chained_updates, _ = chained.update(grads, chained.init(params), params, **extra)
    alone_updates, _ = alone.update(grads, alone.init(params), params, **extra)
    jax.tree.map(np.testing.assert_array_equal, chained_updates, alone_updates)


@pytest.mark.parametrize("entry", REGISTRY, ids=IDS)
def test_works_inside_optax_masked(entry):
  """With mask_compatible_extra_args, optax.masked masks stale_params like params."""
  masked = optax.masked(entry.build(), {"w": True, "b": False}, mask_compatible_extra_args=True)
  alone = entry.build()
  params = initial_params()
  stale, extra_args = stale_inputs(params)
  grads = jax.grad(loss)(stale)
  updates, _ = masked.update(grads, masked.init(params), params, **extra_args)
  only_w, _ = alone.update(
    {"w": grads["w"]},
    alone.init({"w": params["w"]}),
    {"w": params["w"]},
    **{**extra_args, "stale_params": {"w": stale["w"]}},
  )
  np.testing.assert_array_equal(updates["w"], only_w["w"])
  np.testing.assert_array_equal(updates["b"], grads["b"])
