"""`stalesgd.modulated_step`: the staleness rule scales an adaptive optimizer's step, by hand-computed values."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd

GRADIENT = {"w": jnp.array([0.5, -2.0], jnp.float32)}
PARAMS = {"w": jnp.zeros(2, jnp.float32)}


def _weighting(rule: str = "inverse", **options) -> optax.GradientTransformation:
  return optax.chain(stalesgd.scale_by_staleness(rule, **options), stalesgd.average_contributions())


def _first_step(tx, grads, **extra):
  updates, _ = tx.update(grads, tx.init(PARAMS), PARAMS, **extra)
  return np.asarray(updates["w"])


def test_alpha0_over_sigma_scales_adams_first_step_by_one_over_sigma():
  """Adam's first step is -lr g / (|g| + eps) (bias-corrected moments g and g^2); alpha_0/sigma at sigma = 4
  multiplies it by 1/4. Without the modulation on the step, Adam normalises the 1/4 away."""
  adam = optax.adam(0.1)
  fresh = _first_step(stalesgd.modulated_step(_weighting(), adam), GRADIENT, staleness=0)
  # -0.1 * g / (|g| + 1e-8), to the rounding of the float32 bias corrections 1 - 0.9 and 1 - 0.999
  np.testing.assert_allclose(fresh, [-0.1, 0.1], rtol=2e-5)
  stale = _first_step(stalesgd.modulated_step(_weighting(), adam), GRADIENT, staleness=4)
  np.testing.assert_array_equal(stale, fresh * np.float32(0.25))  # 0.25 g / 0.25 = g exactly
  on_the_gradient = _first_step(optax.chain(_weighting(), adam), GRADIENT, staleness=4)
  np.testing.assert_allclose(on_the_gradient, fresh, rtol=1e-6)  # the 1/4 is lost (but for eps)


def test_a_stack_keeps_its_relative_weights_before_the_average_and_equals_zhangs_sgd():
  """c = 2, sigma = (1, 3): weights 1 and 1/3, mean 2/3. For SGD the step is -alpha (1/c) sum_k s_k g_k
  (Zhang et al., eq. 2): -0.1 * (g_1 + g_2 / 3) / 2."""
  stacked = {"w": jnp.array([[0.5, -2.0], [3.0, 6.0]], jnp.float32)}
  step = _first_step(stalesgd.modulated_step(_weighting(), optax.sgd(0.1)), stacked, staleness=jnp.array([1, 3]))
  np.testing.assert_allclose(step, [-0.1 * (0.5 + 1.0) / 2, -0.1 * (-2.0 + 2.0) / 2], rtol=1e-6, atol=1e-7)
  # Adam sees the normalised average 0.75 g_1 + 0.25 g_2 = (1.125, 0): its first step -0.1 sign, times 2/3.
  adam_step = _first_step(stalesgd.modulated_step(_weighting(), optax.adam(0.1)), stacked, staleness=jnp.array([1, 3]))
  np.testing.assert_allclose(adam_step, [-0.1 * 2 / 3, 0.0], rtol=1e-5, atol=1e-7)


def test_every_contribution_dropped_applies_nothing_and_keeps_the_optimizers_state():
  tx = stalesgd.modulated_step(_weighting("threshold", max_staleness=2), optax.adam(0.1))
  state = tx.init(PARAMS)
  updates, new_state = tx.update(GRADIENT, state, PARAMS, staleness=5)
  np.testing.assert_array_equal(updates["w"], [0.0, 0.0])
  assert int(new_state.solver[0].count) == 0  # Adam did not count a step
  updates, new_state = tx.update(GRADIENT, new_state, PARAMS, staleness=1)
  assert int(new_state.solver[0].count) == 1 and np.all(np.asarray(updates["w"]) != 0)


def test_without_a_staleness_rule_it_is_the_plain_chain():
  tx = stalesgd.modulated_step(stalesgd.average_contributions(), optax.adam(0.1))
  np.testing.assert_array_equal(_first_step(tx, GRADIENT), _first_step(optax.adam(0.1), GRADIENT))


@pytest.mark.parametrize("sigma", [0, 2, 7])
def test_sgd_through_modulated_step_equals_the_papers_chain(sigma):
  papers = optax.chain(_weighting(), optax.sgd(0.05, momentum=0.9))
  ours = stalesgd.modulated_step(_weighting(), optax.sgd(0.05, momentum=0.9))
  np.testing.assert_allclose(
    _first_step(ours, GRADIENT, staleness=sigma), _first_step(papers, GRADIENT, staleness=sigma), rtol=1e-6
  )


def test_exponential_rule_with_an_infinite_rate_steps_on_fresh_gradients_and_skips_stale_ones():
  """e^(-inf sigma): weight 1 at sigma = 0 (Adam's first step, -0.1 sign(g)), 0 at sigma = 1 (nothing applied,
  Adam's count unchanged). Its weight at sigma = 0 was NaN (inf * 0) before the rule was fixed."""
  tx = stalesgd.modulated_step(_weighting("exponential", rate=float("inf")), optax.adam(0.1))
  state = tx.init(PARAMS)
  updates, state = tx.update(GRADIENT, state, PARAMS, staleness=0)
  np.testing.assert_allclose(updates["w"], [-0.1, 0.1], rtol=2e-5)
  assert int(state.solver[0].count) == 1
  updates, state = tx.update(GRADIENT, state, PARAMS, staleness=1)
  np.testing.assert_array_equal(updates["w"], [0.0, 0.0])
  assert int(state.solver[0].count) == 1
