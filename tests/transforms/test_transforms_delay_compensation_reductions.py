"""Delay compensation (DC-ASGD): exact reductions (to plain SGD, bit for bit), stacks of contributions, errors.

Hand-computed values: test_transforms_delay_compensation.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd

PARAMS = jnp.array([1.0, 1.0])
GRADS = jnp.array([1.0, 2.0])


# ---------------------------------------------------------------- exact reductions

MODES = {
  "constant": {"dc_lambda": 0.3},
  "adaptive": {"dc_lambda": 2.0, "adaptive": True},
  "per_learner": {"dc_lambda": 2.0, "adaptive": True, "num_learners": 3},
  "layerwise": {"dc_lambda": 0.2, "layerwise": True},
}


def sgd_trajectories(transform, reference, stale_of, steps=4):
  """Both optimizers from the same start; `stale_of(params)` gives the stale_params argument."""
  ours = theirs = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array(0.5)}
  our_state, their_state = transform.init(ours), reference.init(theirs)
  for step in range(steps):
    grads = jax.tree.map(lambda leaf: jnp.cos(leaf * (step + 1)), ours)
    our_updates, our_state = transform.update(
      grads, our_state, ours, stale_params=stale_of(ours), staleness=1, learner=step % 3
    )
    their_updates, their_state = reference.update(grads, their_state, theirs)
    ours = optax.apply_updates(ours, our_updates)
    theirs = optax.apply_updates(theirs, their_updates)
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_stale_params_equal_to_params_is_plain_sgd_bit_for_bit(mode):
  sgd_trajectories(
    stalesgd.dc_asgd(0.1, momentum=0.9, **MODES[mode]), optax.sgd(0.1, momentum=0.9), stale_of=lambda params: params
  )


@pytest.mark.parametrize("mode", ["constant", "adaptive", "per_learner"])
def test_zero_lambda_is_plain_sgd_bit_for_bit(mode):
  options = {**MODES[mode], "dc_lambda": 0.0}
  sgd_trajectories(
    stalesgd.dc_asgd(0.1, momentum=0.9, nesterov=True, **options),
    optax.sgd(0.1, momentum=0.9, nesterov=True),
    stale_of=lambda params: jax.tree.map(lambda leaf: leaf - 0.3, params),
  )


def test_correction_is_exact_when_the_hessian_equals_lambda_g_g():
  """On a diagonal quadratic with h = lambda * g_stale^2 the corrected gradient is the true one."""
  dc_lambda = 0.5
  curvature = jnp.array([2.0, 0.5, 8.0])
  optimum = jnp.array([0.3, -1.0, 2.0])
  # (stale - optimum)^2 = 1 / (lambda h) = (1, 4, 0.25), so lambda * g_stale^2 = h.
  stale = optimum + jnp.array([1.0, -2.0, 0.5])
  params = stale + jnp.array([0.7, -0.4, 1.1])
  gradient = jax.grad(lambda w: 0.5 * jnp.sum(curvature * (w - optimum) ** 2))
  np.testing.assert_allclose(dc_lambda * gradient(stale) ** 2, curvature, rtol=1e-6)
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=dc_lambda)
  corrected, _ = transform.update(gradient(stale), transform.init(params), params, stale_params=stale)
  np.testing.assert_allclose(corrected, gradient(params), rtol=1e-6)
  assert not np.allclose(gradient(stale), gradient(params), rtol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_the_correction_is_not_zero_when_the_weights_moved(mode):
  """Guards against the published bug that made w - w_bak always 0 (backup taken too late)."""
  transform = stalesgd.dc_asgd(0.1, **MODES[mode])
  params = jnp.array([1.0, -2.0, 3.0])
  state = transform.init(params)
  history = [params]
  for step in range(4):
    stale = history[max(0, step - 1)]  # staleness 1 after the first update
    grads = jnp.cos(stale)
    updates, state = transform.update(grads, state, params, stale_params=stale, learner=0)
    if step > 0:
      assert np.all(np.abs(np.asarray(updates) + 0.1 * np.asarray(grads)) > 1e-6)
    params = optax.apply_updates(params, updates)
    history.append(params)


# ---------------------------------------------------------------- stacks


def stacked_inputs():
  grads = jnp.array([[1.0, 2.0, -1.0], [0.5, -3.0, 2.0], [-2.0, 1.0, 0.25]])
  params = jnp.array([1.0, 1.0, 1.0])
  stale = jnp.array([[0.0, 2.0, 1.5], [0.5, 0.5, 1.0], [3.0, -1.0, 0.0]])
  return grads, params, stale


@pytest.mark.parametrize("mode", ["constant", "layerwise"])
def test_stack_equals_separate_calls_then_mean(mode):
  grads, params, stale = stacked_inputs()
  transform = optax.chain(stalesgd.scale_by_delay_compensation(**MODES[mode]), stalesgd.average_contributions())
  state = transform.init(params)
  stacked, _ = transform.update(grads, state, params, stale_params=stale)
  separate = [transform.update(grads[k], state, params, stale_params=stale[k])[0] for k in range(3)]
  np.testing.assert_allclose(stacked, np.mean(separate, axis=0), rtol=1e-6)


def test_adaptive_stack_uses_the_mean_square_updated_with_the_whole_stack():
  grads, params, stale = stacked_inputs()
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True, decay=0.9)
  state = transform.init(params)
  _, state = transform.update(grads[2], state, params, stale_params=params)  # MS = 0.1 g_2^2
  stacked, new_state = transform.update(grads, state, params, stale_params=stale)
  g, d = np.asarray(grads, np.float64), np.asarray(params - stale, np.float64)
  mean_square = 0.9 * 0.1 * g[2] ** 2 + 0.1 * np.mean(g**2, axis=0)
  expected = g + 2.0 / np.sqrt(mean_square + 1e-7) * g * g * d
  np.testing.assert_allclose(stacked, expected, rtol=1e-5)
  np.testing.assert_allclose(new_state.mean_square, mean_square, rtol=1e-6)


def test_per_learner_stack_blends_each_learner_with_its_own_contributions():
  grads, params, stale = stacked_inputs()
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=1.0, adaptive=True, decay=0.5, num_learners=3)
  stacked, state = transform.update(
    grads, transform.init(params), params, stale_params=stale, learner=jnp.array([0, 2, 0])
  )
  g, d = np.asarray(grads, np.float64), np.asarray(params - stale, np.float64)
  learner_0 = 0.5 * (g[0] ** 2 + g[2] ** 2) / 2
  learner_2 = 0.5 * g[1] ** 2
  np.testing.assert_allclose(state.mean_square, [learner_0, np.zeros(3), learner_2], rtol=1e-6)
  per_contribution = np.stack([learner_0, learner_2, learner_0])
  expected = g + 1.0 / np.sqrt(per_contribution + 1e-7) * g * g * d
  np.testing.assert_allclose(stacked, expected, rtol=1e-5)


# The transform's own options beyond dc_asgd's.
TRANSFORM_MODES = {
  **MODES,
  "bias_corrected": {"dc_lambda": 2.0, "adaptive": True, "bias_correction": True},
  "bias_corrected_per_learner": {"dc_lambda": 2.0, "adaptive": True, "num_learners": 3, "bias_correction": True},
}


@pytest.mark.parametrize("mode", TRANSFORM_MODES)
def test_stack_of_one_equals_the_unstacked_call_bit_for_bit(mode):
  grads, params, stale = stacked_inputs()
  transform = stalesgd.scale_by_delay_compensation(**TRANSFORM_MODES[mode])
  state = transform.init(params)
  single, single_state = transform.update(grads[1], state, params, stale_params=stale[1], learner=2)
  stacked, stacked_state = transform.update(grads[1:2], state, params, stale_params=stale[1:2], learner=jnp.array([2]))
  np.testing.assert_array_equal(single, stacked[0])
  jax.tree.map(np.testing.assert_array_equal, single_state, stacked_state)


# ---------------------------------------------------------------- errors


def test_factory_errors():
  with pytest.raises(ValueError, match="exclusive"):
    stalesgd.scale_by_delay_compensation(adaptive=True, layerwise=True)
  with pytest.raises(ValueError, match="needs adaptive=True"):
    stalesgd.scale_by_delay_compensation(num_learners=4)
  with pytest.raises(ValueError, match="num_learners=0; allowed: None or an integer >= 1"):
    stalesgd.scale_by_delay_compensation(adaptive=True, num_learners=0)
  with pytest.raises(ValueError, match=r"dc_lambda=-0\.1; allowed: a number >= 0 \(inf allowed\) or a schedule"):
    stalesgd.scale_by_delay_compensation(dc_lambda=-0.1)
  with pytest.raises(ValueError, match=r"decay=1\.5; allowed: a finite number >= 0 and <= 1 or a schedule"):
    stalesgd.scale_by_delay_compensation(adaptive=True, decay=1.5)


def test_update_errors():
  grads, params, stale = stacked_inputs()
  transform = stalesgd.scale_by_delay_compensation()
  state = transform.init(params)
  with pytest.raises(ValueError, match="params .* must be given with stale_params"):
    transform.update(grads[0], state, None, stale_params=stale[0])
  with pytest.raises(ValueError, match="tree structure of params"):
    transform.update(grads[0], state, params, stale_params={"w": stale[0]})
  with pytest.raises(ValueError, match=r"allowed are the shape of params"):
    transform.update(grads[0], state, params, stale_params=jnp.zeros(4))
  with pytest.raises(ValueError, match=r"for a stack of 3 it must be \(3, 3\)"):
    transform.update(grads[0], state, params, stale_params=stale)
  with pytest.raises(ValueError, match=r"for a single gradient it must be \(3,\)"):
    transform.update(grads, state, params, stale_params=stale[0])
  with pytest.raises(ValueError, match="disagree"):
    transform.update(grads, state, params, stale_params=stale, staleness=jnp.array([1, 2]))
  per_learner = stalesgd.scale_by_delay_compensation(adaptive=True, num_learners=3)
  with pytest.raises(ValueError, match="pass the extra argument learner"):
    per_learner.update(grads, per_learner.init(params), params, stale_params=stale)
  with pytest.raises(ValueError, match="disagree"):
    per_learner.update(grads, per_learner.init(params), params, stale_params=stale, learner=1)
  with pytest.raises(ValueError, match=r"learner must lie in \[0, num_learners=3\); got \[0, 3, 1\]"):
    per_learner.update(grads, per_learner.init(params), params, stale_params=stale, learner=jnp.array([0, 3, 1]))


def test_without_stale_params_it_is_the_identity():
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True)
  state = transform.init(PARAMS)
  updates, new_state = transform.update(GRADS, state, PARAMS, staleness=4)
  assert updates is GRADS
  np.testing.assert_array_equal(new_state.mean_square, state.mean_square)
