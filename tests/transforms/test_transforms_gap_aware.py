"""scale_by_gap_aware: hand-computed penalties, reductions, stacks and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd
from stalesgd.transforms import _gap_aware as gap_aware

ONES = jnp.array([1.0, 1.0])


def three_updates(stale_at_third):
  """Weights (0, 0) -> (0.1, 0) -> (0.4, 0); a fresh first update, then two stale ones."""
  transform = stalesgd.scale_by_gap_aware(decay=0.5)
  params_0, params_1, params_2 = jnp.array([0.0, 0.0]), jnp.array([0.1, 0.0]), jnp.array([0.4, 0.0])
  state = transform.init(params_0)
  first, state = transform.update(ONES, state, params_0, stale_params=params_0)
  second, state = transform.update(ONES, state, params_1, stale_params=jnp.array([-0.1, 0.0]))
  third, state = transform.update(ONES, state, params_2, stale_params=stale_at_third)
  return first, second, third, state


def test_three_steps_by_hand():
  first, second, third, state = three_updates(stale_at_third=jnp.array([0.0, 0.0]))
  np.testing.assert_array_equal(first, ONES)
  # EMA of steps 0.5 * 0.1 = 0.05, bias-corrected by 1 - 0.5: C = 0.1; Gap 0.2 / 0.1 = 2.
  np.testing.assert_allclose(second, [1.0 / 3.0, 1.0], rtol=1e-6)
  # EMA 0.5 * 0.05 + 0.5 * 0.3 = 0.175, corrected by 1 - 0.25: C = 7/30; Gap 0.4 / C = 12/7.
  np.testing.assert_allclose(third, [7.0 / 19.0, 1.0], rtol=1e-6)
  np.testing.assert_allclose(state.step_size, [0.175, 0.0], rtol=1e-6)
  assert int(state.observed_steps) == 2


def test_a_gap_on_a_coordinate_that_never_moved_is_penalised_heavily():
  _, _, third, _ = three_updates(stale_at_third=jnp.array([0.0, 1e-3]))
  assert float(third[1]) < 1e-8  # Gap 1e-3 / min_step_size 1e-12


def test_first_update_has_no_scale_and_no_penalty():
  transform = stalesgd.scale_by_gap_aware()
  params = jnp.array([0.0, 0.0])
  updates, _ = transform.update(ONES, transform.init(params), params, stale_params=jnp.array([5.0, -5.0]))
  np.testing.assert_array_equal(updates, ONES)


def test_stale_params_equal_to_params_is_plain_sgd_bit_for_bit():
  transform = optax.chain(stalesgd.scale_by_gap_aware(), optax.sgd(0.1, momentum=0.9))
  reference = optax.sgd(0.1, momentum=0.9)
  ours = theirs = jnp.array([1.0, -2.0, 3.0])
  our_state, their_state = transform.init(ours), reference.init(theirs)
  for step in range(4):
    grads = jnp.sin(ours * (step + 1))
    our_updates, our_state = transform.update(grads, our_state, ours, stale_params=ours)
    their_updates, their_state = reference.update(grads, their_state, theirs)
    ours = optax.apply_updates(ours, our_updates)
    theirs = optax.apply_updates(theirs, their_updates)
    np.testing.assert_array_equal(ours, theirs)


def moved_state():
  transform = stalesgd.scale_by_gap_aware(decay=0.9)
  params = jnp.array([0.0, 0.0, 0.0])
  state = transform.init(params)
  for step in range(3):
    params = params + jnp.array([0.1, -0.2, 0.05]) * (step + 1)
    _, state = transform.update(ONES[:1].repeat(3), state, params)
  return transform, state, params


def test_stack_equals_separate_calls_and_a_stack_of_one_is_exact():
  transform, state, params = moved_state()
  grads = jnp.array([[1.0, 2.0, -1.0], [0.5, -3.0, 2.0]])
  stale = jnp.array([params - 0.3, params + jnp.array([0.0, 0.1, -1.0])])
  stacked, stacked_state = transform.update(grads, state, params, stale_params=stale)
  for k in range(2):
    single, single_state = transform.update(grads[k], state, params, stale_params=stale[k])
    np.testing.assert_allclose(single, stacked[k], rtol=1e-6)
    jax.tree.map(np.testing.assert_array_equal, single_state, stacked_state)
  one, one_state = transform.update(grads[:1], state, params, stale_params=stale[:1])
  np.testing.assert_array_equal(one[0], transform.update(grads[0], state, params, stale_params=stale[0])[0])
  jax.tree.map(np.testing.assert_array_equal, one_state, stacked_state)


def test_without_stale_params_gradients_pass_but_steps_are_tracked():
  transform, state, params = moved_state()
  grads = jnp.array([1.0, 2.0, 3.0])
  updates, new_state = transform.update(grads, state, params + 1.0)
  assert updates is grads
  assert int(new_state.observed_steps) == int(state.observed_steps) + 1


def test_errors():
  with pytest.raises(ValueError, match=r"decay=1\.0; allowed: a finite number >= 0 and < 1 or a schedule$"):
    stalesgd.scale_by_gap_aware(decay=1.0)
  with pytest.raises(ValueError, match=r"decay=np\.float32\(1\.0\); allowed: a finite number >= 0 and < 1"):
    stalesgd.scale_by_gap_aware(decay=np.float32(1.0))  # numpy scalars are checked too
  with pytest.raises(ValueError, match=r"min_step_size=-1\.0; allowed: a number >= 0 \(inf allowed\) or a schedule"):
    stalesgd.scale_by_gap_aware(min_step_size=-1.0)
  transform = stalesgd.scale_by_gap_aware()
  with pytest.raises(ValueError, match="params .* must be given with stale_params"):
    transform.update(ONES, transform.init(ONES), None, stale_params=ONES)


def test_params_may_be_given_by_name_and_stale_params_only_by_name():
  """optax's convention, update(updates, state, params=None, **extra_args): params may be named, and the extra
  argument stale_params is keyword-only (a fourth positional argument is refused, not taken for it)."""
  transform = stalesgd.scale_by_gap_aware(decay=0.5)
  params = jnp.array([0.0, 0.0])
  by_name, state = transform.update(ONES, transform.init(params), params=params, stale_params=params)
  np.testing.assert_array_equal(by_name, ONES)
  assert int(state.count) == 1
  with pytest.raises(TypeError):
    transform.update(ONES, transform.init(params), params, params)


def test_the_update_count_saturates_so_every_reachable_count_folds_in_the_step():
  """The count starts at 0 and goes through optax.safe_increment, which stops at int32's largest value instead
  of wrapping to a negative count: every update after the first folds its step into C. Steps of 0.1 with decay
  0.5: EMA 0.05, 0.075, 0.0875."""
  transform = stalesgd.scale_by_gap_aware(decay=0.5)
  params = jnp.array([0.0, 0.0])
  state = transform.init(params)._replace(count=jnp.asarray(np.iinfo(np.int32).max - 1, jnp.int32))
  for _ in range(3):
    params = params + jnp.array([0.1, 0.0])
    _, state = transform.update(ONES, state, params)
  assert int(state.count) == np.iinfo(np.int32).max
  assert int(state.observed_steps) == 3
  np.testing.assert_allclose(state.step_size, [0.0875, 0.0], rtol=1e-6)


def test_before_any_observed_step_c_is_infinite_whatever_the_ema_decay_and_floor():
  """C = inf (no penalty) at observed_steps = 0 on random inputs: the bias correction's stand-in value there
  only keeps the unused branch finite."""
  rng = np.random.default_rng(0)
  for _ in range(5):
    step_size = {
      "a": jnp.asarray(rng.uniform(0, 2, (3,)), jnp.float32),
      "b": jnp.asarray(rng.uniform(0, 2), jnp.float32),
    }
    decay, floor = float(rng.uniform(0, 1)), float(rng.uniform(0, 1e-3))
    typical = gap_aware._typical_step(step_size, jnp.asarray(0, jnp.int32), decay, floor)
    assert all(np.all(np.isinf(np.asarray(leaf))) for leaf in jax.tree.leaves(typical))
