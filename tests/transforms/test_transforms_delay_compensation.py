"""Delay compensation (DC-ASGD): hand-computed values, exact reductions, stacks, errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd

PARAMS = jnp.array([1.0, 1.0])
STALE = jnp.array([0.0, 2.0])  # displacement D = PARAMS - STALE = (1, -1)
GRADS = jnp.array([1.0, 2.0])  # g * g * D = (1, -4)

# Second step of the multi-step cases: D = (1, -1) again, g = (2, 2), g * g * D = (4, -4).
PARAMS_2 = jnp.array([2.0, 0.0])
STALE_2 = jnp.array([1.0, 1.0])
GRADS_2 = jnp.array([2.0, 2.0])


# ---------------------------------------------------------------- pure functions


def test_constant_lambda_by_hand():
  corrected = stalesgd.delay_compensated_gradient(GRADS, PARAMS - STALE, 0.5)
  np.testing.assert_allclose(corrected, [1.0 + 0.5 * 1.0, 2.0 + 0.5 * -4.0], rtol=1e-7)


def test_mean_square_lambda_by_hand():
  corrected = stalesgd.delay_compensated_gradient(
      GRADS, PARAMS - STALE, 0.1, mean_square=jnp.array([1.0, 4.0]), eps=0.0)
  np.testing.assert_allclose(corrected, [1.0 + 0.1 / 1.0 * 1.0, 2.0 + 0.1 / 2.0 * -4.0], rtol=1e-7)


def test_layerwise_lambda_by_hand():
  grads = {"a": GRADS, "b": jnp.array([3.0])}
  displacement = {"a": PARAMS - STALE, "b": jnp.array([0.0])}
  corrected = stalesgd.delay_compensated_gradient(grads, displacement, 0.2, layerwise=True)
  # ||g|| = sqrt(5), ||g g D|| = sqrt(1 + 16): lambda = 0.2 sqrt(5 / 17).
  layer_lambda = 0.2 * math.sqrt(5.0) / math.sqrt(17.0)
  np.testing.assert_allclose(corrected["a"], [1.0 + layer_lambda, 2.0 - 4.0 * layer_lambda],
                             rtol=1e-6)
  # The correction's norm is 0.2 ||g||.
  np.testing.assert_allclose(np.linalg.norm(corrected["a"] - GRADS), 0.2 * math.sqrt(5.0),
                             rtol=1e-6)
  np.testing.assert_array_equal(corrected["b"], [3.0])  # zero denominator: no correction, no NaN


def test_update_mean_square_by_hand():
  updated = stalesgd.update_mean_square(jnp.array([1.0, 0.0], jnp.bfloat16), GRADS, 0.9)
  assert updated.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(updated, np.float32), [0.9 + 0.1, 0.4], rtol=1e-2)


def test_zero_gradient_with_zero_mean_square_stays_finite():
  corrected = stalesgd.delay_compensated_gradient(
      jnp.array([0.0, 2.0]), jnp.array([1.0, 1.0]), 1.0, mean_square=jnp.array([0.0, 4.0]),
      eps=0.0)
  np.testing.assert_array_equal(corrected, [0.0, 2.0 + 1.0 / 2.0 * 4.0])


def test_bfloat16_gradients_keep_their_dtype():
  corrected = stalesgd.delay_compensated_gradient(GRADS.astype(jnp.bfloat16), PARAMS - STALE, 0.5)
  assert corrected.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(corrected, np.float32), [1.5, 0.0])


def test_pure_function_errors():
  with pytest.raises(ValueError, match="exclusive"):
    stalesgd.delay_compensated_gradient(GRADS, GRADS, 0.1, mean_square=GRADS, layerwise=True)
  with pytest.raises(ValueError, match=r"displacement has shape \(3,\)"):
    stalesgd.delay_compensated_gradient(GRADS, jnp.zeros(3), 0.1)
  with pytest.raises(ValueError, match="tree structure"):
    stalesgd.delay_compensated_gradient({"a": GRADS}, {"b": GRADS}, 0.1)


# ---------------------------------------------------------------- the transform by hand


def two_updates(transform, learners=(None, None)):
  state = transform.init(PARAMS)
  extra = {} if learners[0] is None else {"learner": learners[0]}
  first, state = transform.update(GRADS, state, PARAMS, stale_params=STALE, **extra)
  extra = {} if learners[1] is None else {"learner": learners[1]}
  second, state = transform.update(GRADS_2, state, PARAMS_2, stale_params=STALE_2, **extra)
  return first, second, state


def test_dc_asgd_c_two_steps_by_hand():
  first, second, _ = two_updates(stalesgd.scale_by_delay_compensation(dc_lambda=0.5))
  np.testing.assert_allclose(first, [1.0 + 0.5, 2.0 - 0.5 * 4.0], rtol=1e-7)
  np.testing.assert_allclose(second, [2.0 + 0.5 * 4.0, 2.0 - 0.5 * 4.0], rtol=1e-7)


def test_dc_asgd_a_two_steps_by_hand():
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=1.0, adaptive=True, decay=0.5)
  first, second, state = two_updates(transform)
  # MeanSquare = 0.5 * 0 + 0.5 * (1, 4) = (0.5, 2) includes the current gradient.
  np.testing.assert_allclose(first, [1.0 + 1.0 / math.sqrt(0.5), 2.0 - 4.0 / math.sqrt(2.0)],
                             rtol=1e-6)
  # MeanSquare = 0.5 * (0.5, 2) + 0.5 * (4, 4) = (2.25, 3).
  np.testing.assert_allclose(second, [2.0 + 4.0 / 1.5, 2.0 - 4.0 / math.sqrt(3.0)], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square, [2.25, 3.0], rtol=1e-7)


def test_dc_asgd_a_per_learner_three_steps_by_hand():
  transform = stalesgd.scale_by_delay_compensation(
      dc_lambda=1.0, adaptive=True, decay=0.5, num_learners=2)
  state = transform.init(PARAMS)
  first, state = transform.update(GRADS, state, PARAMS, stale_params=STALE, learner=0)
  np.testing.assert_allclose(first, [1.0 + 1.0 / math.sqrt(0.5), 2.0 - 4.0 / math.sqrt(2.0)],
                             rtol=1e-6)
  # Learner 1's MeanSquare starts from 0: 0.5 * (4, 4) = (2, 2).
  second, state = transform.update(GRADS_2, state, PARAMS_2, stale_params=STALE_2, learner=1)
  np.testing.assert_allclose(second, [2.0 + 4.0 / math.sqrt(2.0), 2.0 - 4.0 / math.sqrt(2.0)],
                             rtol=1e-6)
  # Learner 0's MeanSquare was kept at (0.5, 2): now (2.25, 3).
  third, state = transform.update(GRADS_2, state, PARAMS_2, stale_params=STALE_2, learner=0)
  np.testing.assert_allclose(third, [2.0 + 4.0 / 1.5, 2.0 - 4.0 / math.sqrt(3.0)], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square, [[2.25, 3.0], [2.0, 2.0]], rtol=1e-7)


def test_bias_corrected_dc_asgd_a_two_steps_by_hand():
  transform = stalesgd.scale_by_delay_compensation(
      dc_lambda=2.0, adaptive=True, decay=0.5, eps=0.0, bias_correction=True)
  first, second, state = two_updates(transform)
  # Step 1, g = (1, 2), g g D = (1, -4): MeanSquare = 0.5 * 0 + 0.5 * (1, 4) = (0.5, 2),
  # W = 0.5 * 0 + 0.5 * 1 = 0.5, MeanSquare / W = (1, 4), lambda = 2 / sqrt(1, 4) = (2, 1):
  # g~ = (1 + 2 * 1, 2 + 1 * -4) = (3, -2).
  np.testing.assert_allclose(first, [3.0, -2.0], rtol=1e-6)
  # Step 2, g = (2, 2), g g D = (4, -4): MeanSquare = 0.5 * (0.5, 2) + 0.5 * (4, 4) = (2.25, 3),
  # W = 0.5 * 0.5 + 0.5 = 0.75, MeanSquare / W = (3, 4), lambda = (2 / sqrt(3), 1):
  # g~ = (2 + 8 / sqrt(3), 2 - 4).
  np.testing.assert_allclose(second, [2.0 + 8.0 / math.sqrt(3.0), -2.0], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square, [2.25, 3.0], rtol=1e-7)  # not divided in the state
  np.testing.assert_allclose(state.mean_square_weight, 0.75, rtol=1e-7)


def test_bias_corrected_decay_schedule_by_hand():
  transform = stalesgd.scale_by_delay_compensation(
      dc_lambda=2.0, adaptive=True, decay=lambda count: jnp.where(count == 0, 0.5, 0.25), eps=0.0,
      bias_correction=True)
  first, second, state = two_updates(transform)
  # Step 1 at m = 0.5: as in the two-step test, W = 0.5 and g~ = (3, -2).
  np.testing.assert_allclose(first, [3.0, -2.0], rtol=1e-6)
  # Step 2 at m = 0.25: MeanSquare = 0.25 * (0.5, 2) + 0.75 * (4, 4) = (3.125, 3.5),
  # W = 0.25 * 0.5 + 0.75 = 0.875, MeanSquare / W = (25 / 7, 4),
  # lambda = (2 / sqrt(25 / 7), 1) = (0.4 sqrt(7), 1): g~ = (2 + 1.6 sqrt(7), 2 - 4).
  np.testing.assert_allclose(second, [2.0 + 1.6 * math.sqrt(7.0), -2.0], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square_weight, 0.875, rtol=1e-7)


def test_bias_corrected_per_learner_absent_learner_keeps_its_weight_by_hand():
  transform = stalesgd.scale_by_delay_compensation(
      dc_lambda=2.0, adaptive=True, decay=0.5, eps=0.0, num_learners=2, bias_correction=True)
  state = transform.init(PARAMS)
  np.testing.assert_array_equal(state.mean_square_weight, [0.0, 0.0])
  # Learner 0, g = (1, 2): its MeanSquare (0.5, 2) and W 0.5, as in the global case: g~ = (3, -2).
  first, state = transform.update(GRADS, state, PARAMS, stale_params=STALE, learner=0)
  np.testing.assert_allclose(first, [3.0, -2.0], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square_weight, [0.5, 0.0], rtol=1e-7)
  # Learner 1, g = (2, 2), g g D = (4, -4): MeanSquare 0.5 * (4, 4) = (2, 2), W 0.5, so
  # MeanSquare / W = (4, 4), lambda = 1: g~ = (2 + 4, 2 - 4). Learner 0's W stays 0.5.
  second, state = transform.update(GRADS_2, state, PARAMS_2, stale_params=STALE_2, learner=1)
  np.testing.assert_allclose(second, [6.0, -2.0], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square_weight, [0.5, 0.5], rtol=1e-7)
  # Learner 0 again, g = (2, 2): MeanSquare (2.25, 3), W 0.5 * 0.5 + 0.5 = 0.75 (0.875 had its W
  # advanced while absent), MeanSquare / W = (3, 4): g~ = (2 + 8 / sqrt(3), -2).
  third, state = transform.update(GRADS_2, state, PARAMS_2, stale_params=STALE_2, learner=0)
  np.testing.assert_allclose(third, [2.0 + 8.0 / math.sqrt(3.0), -2.0], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square_weight, [0.75, 0.5], rtol=1e-7)
  # A stack of two from learner 1, both g = (1, 2) with D = (1, -1): its MeanSquare blends once with
  # the mean g^2 = (1, 4): 0.5 * (2, 2) + 0.5 * (1, 4) = (1.5, 3), and its W once: 0.75 (not 0.875);
  # MeanSquare / W = (2, 4), lambda = (sqrt(2), 1): each g~ = (1 + sqrt(2), 2 - 4).
  stacked, state = transform.update(jnp.stack([GRADS, GRADS]), state, PARAMS,
                                    stale_params=jnp.stack([STALE, STALE]), learner=jnp.array([1, 1]))
  np.testing.assert_allclose(stacked, [[1.0 + math.sqrt(2.0), -2.0]] * 2, rtol=1e-6)
  np.testing.assert_allclose(state.mean_square_weight, [0.75, 0.75], rtol=1e-7)
  np.testing.assert_allclose(state.mean_square, [[2.25, 3.0], [1.5, 3.0]], rtol=1e-7)


@pytest.mark.parametrize("num_learners", [None, 3])
def test_bias_correction_at_decay_zero_is_the_uncorrected_rule_bit_for_bit(num_learners):
  """With m = 0, W = 0 * W + 1 = 1 after the first blend: MeanSquare / 1 is MeanSquare."""
  options = {"dc_lambda": 2.0, "adaptive": True, "decay": 0.0, "num_learners": num_learners}
  corrected = stalesgd.scale_by_delay_compensation(bias_correction=True, **options)
  uncorrected = stalesgd.scale_by_delay_compensation(**options)
  params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array(0.5)}
  corrected_state, uncorrected_state = corrected.init(params), uncorrected.init(params)
  # The other modes' state keeps its fields: orbax restores by the tree's keys, so an added field
  # (even None) would make their earlier checkpoints unreadable.
  assert type(uncorrected_state) is stalesgd.ScaleByDelayCompensationState
  assert uncorrected_state._fields == ("count", "mean_square")
  assert corrected_state._fields == ("count", "mean_square", "mean_square_weight")
  for step in range(4):
    grads = jax.tree.map(lambda leaf: jnp.cos(leaf * (step + 1)), params)
    stale = jax.tree.map(lambda leaf: leaf - 0.3 * (step + 1), params)
    ours, corrected_state = corrected.update(grads, corrected_state, params, stale_params=stale,
                                             learner=step % 3)
    theirs, uncorrected_state = uncorrected.update(grads, uncorrected_state, params,
                                                   stale_params=stale, learner=step % 3)
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    jax.tree.map(np.testing.assert_array_equal, corrected_state.mean_square,
                 uncorrected_state.mean_square)
    params = jax.tree.map(lambda param, update: param - 0.1 * update, params, ours)
  np.testing.assert_array_equal(corrected_state.mean_square_weight, 1.0)  # every learner sent


def test_bias_correction_at_decay_one_reads_the_zero_mean_square_not_zero_over_zero():
  """m = 1 blends nothing in: W and MeanSquare stay 0, and lambda is lambda0 / sqrt(eps) as without W."""
  options = {"dc_lambda": 2.0, "adaptive": True, "decay": 1.0}
  first, _, state = two_updates(stalesgd.scale_by_delay_compensation(bias_correction=True, **options))
  reference, _, _ = two_updates(stalesgd.scale_by_delay_compensation(**options))
  np.testing.assert_array_equal(state.mean_square_weight, 0.0)
  assert np.all(np.isfinite(first))
  np.testing.assert_array_equal(first, reference)


def test_bias_correction_needs_adaptive():
  with pytest.raises(ValueError, match=r"bias_correction=True .* needs adaptive=True; got adaptive=False"):
    stalesgd.scale_by_delay_compensation(bias_correction=True)
  with pytest.raises(ValueError, match=r"bias_correction=True .* needs adaptive=True"):
    stalesgd.scale_by_delay_compensation(layerwise=True, bias_correction=True)


def test_layerwise_transform_by_hand():
  first, _, _ = two_updates(stalesgd.scale_by_delay_compensation(dc_lambda=0.2, layerwise=True))
  layer_lambda = 0.2 * math.sqrt(5.0) / math.sqrt(17.0)
  np.testing.assert_allclose(first, [1.0 + layer_lambda, 2.0 - 4.0 * layer_lambda], rtol=1e-6)


def test_scheduled_lambda_follows_the_update_count():
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=lambda count: 0.5 * count)
  first, second, _ = two_updates(transform)
  np.testing.assert_array_equal(first, GRADS)  # lambda 0 at count 0
  np.testing.assert_allclose(second, [2.0 + 0.5 * 4.0, 2.0 - 0.5 * 4.0], rtol=1e-7)


@pytest.mark.parametrize("dc_lambda, expected", [(0.04, [-0.104, -0.184]), (0.5, [-0.15, 0.0])])
def test_done_when_dc_asgd_numbers(dc_lambda, expected):
  transform = stalesgd.dc_asgd(0.1, dc_lambda=dc_lambda)
  updates, _ = transform.update(GRADS, transform.init(PARAMS), PARAMS, staleness=3,
                                stale_params=STALE)
  # -0.1 * (g + lambda * g * g * (params - old)) with g * g * D = (1, -4)
  np.testing.assert_allclose(updates, expected, rtol=1e-6, atol=1e-7)


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
    our_updates, our_state = transform.update(grads, our_state, ours, stale_params=stale_of(ours),
                                              staleness=1, learner=step % 3)
    their_updates, their_state = reference.update(grads, their_state, theirs)
    ours = optax.apply_updates(ours, our_updates)
    theirs = optax.apply_updates(theirs, their_updates)
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)


@pytest.mark.parametrize("mode", MODES)
def test_stale_params_equal_to_params_is_plain_sgd_bit_for_bit(mode):
  sgd_trajectories(stalesgd.dc_asgd(0.1, momentum=0.9, **MODES[mode]),
                   optax.sgd(0.1, momentum=0.9), stale_of=lambda params: params)


@pytest.mark.parametrize("mode", ["constant", "adaptive", "per_learner"])
def test_zero_lambda_is_plain_sgd_bit_for_bit(mode):
  options = {**MODES[mode], "dc_lambda": 0.0}
  sgd_trajectories(stalesgd.dc_asgd(0.1, momentum=0.9, nesterov=True, **options),
                   optax.sgd(0.1, momentum=0.9, nesterov=True),
                   stale_of=lambda params: jax.tree.map(lambda leaf: leaf - 0.3, params))


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
  corrected, _ = transform.update(gradient(stale), transform.init(params), params,
                                  stale_params=stale)
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
  transform = optax.chain(stalesgd.scale_by_delay_compensation(**MODES[mode]),
                          stalesgd.average_contributions())
  state = transform.init(params)
  stacked, _ = transform.update(grads, state, params, stale_params=stale)
  separate = [transform.update(grads[k], state, params, stale_params=stale[k])[0]
              for k in range(3)]
  np.testing.assert_allclose(stacked, np.mean(separate, axis=0), rtol=1e-6)


def test_adaptive_stack_uses_the_mean_square_updated_with_the_whole_stack():
  grads, params, stale = stacked_inputs()
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True, decay=0.9)
  state = transform.init(params)
  _, state = transform.update(grads[2], state, params, stale_params=params)  # MS = 0.1 g_2^2
  stacked, new_state = transform.update(grads, state, params, stale_params=stale)
  g, d = np.asarray(grads, np.float64), np.asarray(params - stale, np.float64)
  mean_square = 0.9 * 0.1 * g[2] ** 2 + 0.1 * np.mean(g ** 2, axis=0)
  expected = g + 2.0 / np.sqrt(mean_square + 1e-7) * g * g * d
  np.testing.assert_allclose(stacked, expected, rtol=1e-5)
  np.testing.assert_allclose(new_state.mean_square, mean_square, rtol=1e-6)


def test_per_learner_stack_blends_each_learner_with_its_own_contributions():
  grads, params, stale = stacked_inputs()
  transform = stalesgd.scale_by_delay_compensation(
      dc_lambda=1.0, adaptive=True, decay=0.5, num_learners=3)
  stacked, state = transform.update(grads, transform.init(params), params, stale_params=stale,
                                    learner=jnp.array([0, 2, 0]))
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
    "bias_corrected_per_learner": {"dc_lambda": 2.0, "adaptive": True, "num_learners": 3,
                                   "bias_correction": True},
}


@pytest.mark.parametrize("mode", TRANSFORM_MODES)
def test_stack_of_one_equals_the_unstacked_call_bit_for_bit(mode):
  grads, params, stale = stacked_inputs()
  transform = stalesgd.scale_by_delay_compensation(**TRANSFORM_MODES[mode])
  state = transform.init(params)
  single, single_state = transform.update(grads[1], state, params, stale_params=stale[1],
                                          learner=2)
  stacked, stacked_state = transform.update(grads[1:2], state, params, stale_params=stale[1:2],
                                            learner=jnp.array([2]))
  np.testing.assert_array_equal(single, stacked[0])
  jax.tree.map(np.testing.assert_array_equal, single_state, stacked_state)


# ---------------------------------------------------------------- errors


def test_factory_errors():
  with pytest.raises(ValueError, match="exclusive"):
    stalesgd.scale_by_delay_compensation(adaptive=True, layerwise=True)
  with pytest.raises(ValueError, match="needs adaptive=True"):
    stalesgd.scale_by_delay_compensation(num_learners=4)
  with pytest.raises(ValueError, match="num_learners must be a positive int"):
    stalesgd.scale_by_delay_compensation(adaptive=True, num_learners=0)
  with pytest.raises(ValueError, match="dc_lambda must be >= 0"):
    stalesgd.scale_by_delay_compensation(dc_lambda=-0.1)
  with pytest.raises(ValueError, match=r"decay must lie in \[0, 1\]"):
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
    per_learner.update(grads, per_learner.init(params), params, stale_params=stale,
                       learner=jnp.array([0, 3, 1]))


def test_without_stale_params_it_is_the_identity():
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True)
  state = transform.init(PARAMS)
  updates, new_state = transform.update(GRADS, state, PARAMS, staleness=4)
  assert updates is GRADS
  np.testing.assert_array_equal(new_state.mean_square, state.mean_square)
