"""Delay compensation (DC-ASGD): hand-computed values of the pure functions and of the transform.

Exact reductions, stacks and errors: test_transforms_delay_compensation_reductions.py.
"""

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
    GRADS, PARAMS - STALE, 0.1, mean_square=jnp.array([1.0, 4.0]), eps=0.0
  )
  np.testing.assert_allclose(corrected, [1.0 + 0.1 / 1.0 * 1.0, 2.0 + 0.1 / 2.0 * -4.0], rtol=1e-7)


def test_layerwise_lambda_by_hand():
  grads = {"a": GRADS, "b": jnp.array([3.0])}
  displacement = {"a": PARAMS - STALE, "b": jnp.array([0.0])}
  corrected = stalesgd.delay_compensated_gradient(grads, displacement, 0.2, layerwise=True)
  # ||g|| = sqrt(5), ||g g D|| = sqrt(1 + 16): lambda = 0.2 sqrt(5 / 17).
  layer_lambda = 0.2 * math.sqrt(5.0) / math.sqrt(17.0)
  np.testing.assert_allclose(corrected["a"], [1.0 + layer_lambda, 2.0 - 4.0 * layer_lambda], rtol=1e-6)
  # The correction's norm is 0.2 ||g||.
  np.testing.assert_allclose(np.linalg.norm(corrected["a"] - GRADS), 0.2 * math.sqrt(5.0), rtol=1e-6)
  np.testing.assert_array_equal(corrected["b"], [3.0])  # zero denominator: no correction, no NaN


def test_update_mean_square_by_hand():
  updated = stalesgd.update_mean_square(jnp.array([1.0, 0.0], jnp.bfloat16), GRADS, 0.9)
  assert updated.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(updated, np.float32), [0.9 + 0.1, 0.4], rtol=1e-2)


def test_zero_gradient_with_zero_mean_square_stays_finite():
  corrected = stalesgd.delay_compensated_gradient(
    jnp.array([0.0, 2.0]), jnp.array([1.0, 1.0]), 1.0, mean_square=jnp.array([0.0, 4.0]), eps=0.0
  )
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
  np.testing.assert_allclose(first, [1.0 + 1.0 / math.sqrt(0.5), 2.0 - 4.0 / math.sqrt(2.0)], rtol=1e-6)
  # MeanSquare = 0.5 * (0.5, 2) + 0.5 * (4, 4) = (2.25, 3).
  np.testing.assert_allclose(second, [2.0 + 4.0 / 1.5, 2.0 - 4.0 / math.sqrt(3.0)], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square, [2.25, 3.0], rtol=1e-7)


@pytest.mark.slow
def test_dc_asgd_a_per_learner_three_steps_by_hand():
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=1.0, adaptive=True, decay=0.5, num_learners=2)
  state = transform.init(PARAMS)
  first, state = transform.update(GRADS, state, PARAMS, stale_params=STALE, learner=0)
  np.testing.assert_allclose(first, [1.0 + 1.0 / math.sqrt(0.5), 2.0 - 4.0 / math.sqrt(2.0)], rtol=1e-6)
  # Learner 1's MeanSquare starts from 0: 0.5 * (4, 4) = (2, 2).
  second, state = transform.update(GRADS_2, state, PARAMS_2, stale_params=STALE_2, learner=1)
  np.testing.assert_allclose(second, [2.0 + 4.0 / math.sqrt(2.0), 2.0 - 4.0 / math.sqrt(2.0)], rtol=1e-6)
  # Learner 0's MeanSquare was kept at (0.5, 2): now (2.25, 3).
  third, state = transform.update(GRADS_2, state, PARAMS_2, stale_params=STALE_2, learner=0)
  np.testing.assert_allclose(third, [2.0 + 4.0 / 1.5, 2.0 - 4.0 / math.sqrt(3.0)], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square, [[2.25, 3.0], [2.0, 2.0]], rtol=1e-7)


def test_bias_corrected_dc_asgd_a_two_steps_by_hand():
  transform = stalesgd.scale_by_delay_compensation(
    dc_lambda=2.0, adaptive=True, decay=0.5, eps=0.0, bias_correction=True
  )
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
    dc_lambda=2.0, adaptive=True, decay=lambda count: jnp.where(count == 0, 0.5, 0.25), eps=0.0, bias_correction=True
  )
  first, second, state = two_updates(transform)
  # Step 1 at m = 0.5: as in the two-step test, W = 0.5 and g~ = (3, -2).
  np.testing.assert_allclose(first, [3.0, -2.0], rtol=1e-6)
  # Step 2 at m = 0.25: MeanSquare = 0.25 * (0.5, 2) + 0.75 * (4, 4) = (3.125, 3.5),
  # W = 0.25 * 0.5 + 0.75 = 0.875, MeanSquare / W = (25 / 7, 4),
  # lambda = (2 / sqrt(25 / 7), 1) = (0.4 sqrt(7), 1): g~ = (2 + 1.6 sqrt(7), 2 - 4).
  np.testing.assert_allclose(second, [2.0 + 1.6 * math.sqrt(7.0), -2.0], rtol=1e-6)
  np.testing.assert_allclose(state.mean_square_weight, 0.875, rtol=1e-7)


@pytest.mark.slow
def test_bias_corrected_per_learner_absent_learner_keeps_its_weight_by_hand():
  transform = stalesgd.scale_by_delay_compensation(
    dc_lambda=2.0, adaptive=True, decay=0.5, eps=0.0, num_learners=2, bias_correction=True
  )
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
  stacked, state = transform.update(
    jnp.stack([GRADS, GRADS]), state, PARAMS, stale_params=jnp.stack([STALE, STALE]), learner=jnp.array([1, 1])
  )
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
    ours, corrected_state = corrected.update(grads, corrected_state, params, stale_params=stale, learner=step % 3)
    theirs, uncorrected_state = uncorrected.update(
      grads, uncorrected_state, params, stale_params=stale, learner=step % 3
    )
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    jax.tree.map(np.testing.assert_array_equal, corrected_state.mean_square, uncorrected_state.mean_square)
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
  updates, _ = transform.update(GRADS, transform.init(PARAMS), PARAMS, staleness=3, stale_params=STALE)
  # -0.1 * (g + lambda * g * g * (params - old)) with g * g * D = (1, -4)
  np.testing.assert_allclose(updates, expected, rtol=1e-6, atol=1e-7)


def test_dc_asgd_alias_passes_bias_correction_by_hand():
  """First update of DC-ASGD-a: MeanSquare = (1-m) g*g; bias-corrected, divided by W = 1-m, it is g*g, so
  lambda = lambda0 / |g| and coordinate 0 (g = 1, D = 1) gets g + lambda0 g g D = 1.5; uncorrected, lambda =
  0.5 / sqrt(0.05 * 1) = 2.236 and it gets 3.236. Coordinate 1 has D = 0: g = 2 either way. Learning rate 0.1."""
  updates = {}
  for corrected in (False, True):
    tx = stalesgd.dc_asgd(learning_rate=0.1, dc_lambda=0.5, adaptive=True, decay=0.95, bias_correction=corrected)
    updates[corrected], _ = tx.update(GRADS, tx.init(PARAMS), PARAMS, staleness=1, stale_params=jnp.array([0.0, 1.0]))
  np.testing.assert_allclose(updates[True], [-0.15, -0.2], rtol=1e-6)
  np.testing.assert_allclose(updates[False], [-0.1 * (1 + 0.5 / math.sqrt(0.05)), -0.2], rtol=1e-6)


# ---------------------------------------------------------------- defaults and contracts, by hand


def test_layerwise_lambda_when_the_corrections_norm_is_below_one_by_hand():
  # g = 0.5, D = 1: g g D = 0.25 (norm below 1), lambda = 0.2 * 0.5 / 0.25 = 0.4, g~ = 0.5 + 0.4 * 0.25 = 0.6.
  corrected = stalesgd.delay_compensated_gradient(jnp.array([0.5]), jnp.array([1.0]), 0.2, layerwise=True)
  np.testing.assert_allclose(corrected, [0.6], rtol=1e-6)


def test_default_eps_is_1e_7_by_hand():
  # MeanSquare 0: lambda = 1e-4 / sqrt(0 + 1e-7) = 0.316227766..., g~ = 1 + lambda * 1 * 1 * 1.
  corrected = stalesgd.delay_compensated_gradient(
    jnp.array([1.0]), jnp.array([1.0]), 1e-4, mean_square=jnp.array([0.0])
  )
  np.testing.assert_allclose(corrected, [1.0 + 1e-4 / math.sqrt(1e-7)], rtol=1e-6)


def test_default_lambda_is_dc_asgds_0_04_by_hand():
  first, _, _ = two_updates(stalesgd.scale_by_delay_compensation())
  np.testing.assert_allclose(first, [1.0 + 0.04 * 1.0, 2.0 - 0.04 * 4.0], rtol=1e-7)


def test_options_after_the_three_operands_are_keyword_only():
  with pytest.raises(TypeError):
    stalesgd.delay_compensated_gradient(GRADS, PARAMS - STALE, 0.1, jnp.array([1.0, 4.0]))


def test_params_may_be_passed_by_keyword_as_to_any_optax_update():
  transform = stalesgd.scale_by_delay_compensation(dc_lambda=0.5)
  corrected, _ = transform.update(GRADS, transform.init(PARAMS), params=PARAMS, stale_params=STALE)
  np.testing.assert_allclose(corrected, [1.0 + 0.5, 2.0 - 0.5 * 4.0], rtol=1e-7)


def test_eps_and_num_learners_are_checked_before_anything_runs():
  with pytest.raises(ValueError, match=r"eps=-0\.5; allowed: a number >= 0 \(inf allowed\) or a schedule"):
    stalesgd.scale_by_delay_compensation(adaptive=True, eps=-0.5)
  for eps in (0.0, 0.5, 2.0, math.inf):  # 0 to inf, both included
    stalesgd.scale_by_delay_compensation(adaptive=True, eps=eps)
  with pytest.raises(ValueError, match="num_learners"):  # a Python int, not numpy's
    stalesgd.scale_by_delay_compensation(adaptive=True, num_learners=np.int64(2))


def test_update_mean_square_squares_each_gradient_by_hand():
  # m = 0.5: 0.5 * 1 + 0.5 * 3 * 3 = 5, 0.5 * 1 + 0.5 * 0.5 * 0.5 = 0.625 (g = 1 and 2 square like g ** g).
  updated = stalesgd.update_mean_square(jnp.array([1.0, 1.0]), jnp.array([3.0, 0.5]), 0.5)
  np.testing.assert_allclose(updated, [5.0, 0.625], rtol=1e-7)


def test_per_learner_mean_square_of_a_matrix_parameter_by_hand():
  """Learner 0's one contribution on a 2 x 2 weight: its MeanSquare row becomes 0.5 g*g (m = 0.5), learner 1's stays
  0; lambda = 1 / sqrt(0.5 g*g + 1e-7), so with D = 1, g~ = g + lambda g g = g (1 + sqrt(2)) to 1e-7."""
  grads = jnp.array([[1.0, 2.0], [3.0, 4.0]])
  params, stale = jnp.ones((2, 2)), jnp.zeros((2, 2))
  for bias_correction in (False, True):
    transform = stalesgd.scale_by_delay_compensation(
      dc_lambda=1.0, adaptive=True, decay=0.5, num_learners=2, bias_correction=bias_correction
    )
    corrected, state = transform.update(
      grads[None], transform.init(params), params, stale_params=stale[None], learner=jnp.array([0])
    )
    np.testing.assert_allclose(state.mean_square, [0.5 * grads * grads, np.zeros((2, 2))], rtol=1e-7)
    # Bias-corrected, W = (0.5, 0) and learner 0 reads MeanSquare / 0.5 = g*g: lambda = 1 / |g|, g~ = 2 g.
    factor = 2.0 if bias_correction else 1.0 + math.sqrt(2.0)
    np.testing.assert_allclose(corrected, [factor * grads], rtol=1e-6)


@pytest.mark.parametrize("learner", [-1, 7])
def test_a_learner_outside_the_rows_is_refused(learner):
  transform = stalesgd.scale_by_delay_compensation(adaptive=True, num_learners=3)
  with pytest.raises(ValueError, match=r"learner must lie in \[0, num_learners=3\)"):
    transform.update(GRADS, transform.init(PARAMS), PARAMS, stale_params=STALE, learner=learner)


def test_dc_asgds_defaults_by_hand():
  """lambda 0.04, no momentum: each update is -0.1 (g + 0.04 g g D) alone; with momentum 0.9, plain (not
  Nesterov) momentum: the second update is -0.1 (0.9 c1 + c2), c1 = (1.04, 1.84), c2 = (2.16, 1.84)."""
  first, second, state = two_updates(stalesgd.dc_asgd(0.1))
  np.testing.assert_allclose(first, [-0.104, -0.184], rtol=1e-6)
  np.testing.assert_allclose(second, [-0.216, -0.184], rtol=1e-6)
  is_trace = lambda node: isinstance(node, optax.TraceState)
  assert not any(is_trace(node) for node in jax.tree.leaves(state, is_leaf=is_trace))  # no buffer at 0
  _, second, _ = two_updates(stalesgd.dc_asgd(0.1, momentum=0.9))
  np.testing.assert_allclose(second, [-0.1 * (0.9 * 1.04 + 2.16), -0.1 * (0.9 * 1.84 + 1.84)], rtol=1e-6)
