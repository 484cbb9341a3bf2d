"""Stacks of contributions: detection, validation, and average_contributions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stalesgd

PARAMS = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(())}


def stack(count, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 2)
  return {
    "w": jax.random.normal(keys[0], (count, 2, 3)).astype(dtype),
    "b": jax.random.normal(keys[1], (count,)).astype(dtype),
  }


def test_average_of_a_stack_by_hand():
  transform = stalesgd.average_contributions()
  grads = {"w": jnp.array([[1.0, 2.0], [3.0, 10.0]]), "b": jnp.array([4.0, -2.0])}
  updates, _ = transform.update(grads, transform.init(None), staleness=jnp.array([0, 5]))
  np.testing.assert_array_equal(updates["w"], [2.0, 6.0])
  np.testing.assert_array_equal(updates["b"], 1.0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_stack_of_one_returns_exactly_its_gradient(dtype):
  transform = stalesgd.average_contributions()
  grads = stack(1, dtype)
  updates, _ = transform.update(grads, transform.init(PARAMS), PARAMS, staleness=jnp.array([3]))
  for averaged, single in zip(jax.tree.leaves(updates), jax.tree.leaves(grads)):
    assert averaged.dtype == dtype
    np.testing.assert_array_equal(np.asarray(averaged, np.float32), np.asarray(single[0], np.float32))


def test_unstacked_gradients_pass_unchanged():
  transform = stalesgd.average_contributions()
  grads = jax.tree.map(lambda leaf: leaf[0], stack(1))
  updates, _ = transform.update(grads, transform.init(PARAMS), PARAMS, staleness=4)
  assert updates is grads
  updates, _ = transform.update(grads, transform.init(PARAMS), PARAMS)
  assert updates is grads


def test_stack_detected_from_stale_params():
  transform = stalesgd.average_contributions()
  grads = stack(3)
  stale = jax.tree.map(jnp.zeros_like, grads)
  updates, _ = transform.update(grads, transform.init(PARAMS), PARAMS, stale_params=stale)
  np.testing.assert_allclose(updates["b"], jnp.mean(grads["b"]), rtol=1e-6)


def test_contributions_in_stack_reads_every_indication():
  grads = stack(3)
  stale = jax.tree.map(jnp.zeros_like, grads)
  assert stalesgd.contributions_in_stack(grads, PARAMS, staleness=jnp.arange(3)) == 3
  assert stalesgd.contributions_in_stack(grads, PARAMS, stale_params=stale, learner=jnp.arange(3)) == 3
  single = jax.tree.map(lambda leaf: leaf[0], grads)
  assert stalesgd.contributions_in_stack(single, PARAMS, staleness=2, stale_params=PARAMS, learner=0) is None
  assert stalesgd.contributions_in_stack(single, PARAMS) is None


def test_inconsistent_inputs_raise():
  grads = stack(3)
  stale = jax.tree.map(jnp.zeros_like, grads)
  with pytest.raises(ValueError, match="disagree .*staleness: stack of 2.*stale_params: stack of 3"):
    stalesgd.contributions_in_stack(grads, PARAMS, staleness=jnp.arange(2), stale_params=stale)
  with pytest.raises(ValueError, match="mixes stacked and unstacked"):
    stalesgd.contributions_in_stack(grads, PARAMS, stale_params={"w": stale["w"], "b": PARAMS["b"]})
  with pytest.raises(ValueError, match="learner must be a scalar or have shape"):
    stalesgd.contributions_in_stack(grads, PARAMS, learner=jnp.zeros((3, 1), jnp.int32))
  with pytest.raises(ValueError, match=r"updates\['b'\] has shape \(3,\); for a stack of 4"):
    stalesgd.contributions_in_stack(grads, PARAMS, staleness=jnp.arange(4))
  with pytest.raises(ValueError, match="leading axis of size 4"):
    stalesgd.contributions_in_stack(grads, None, staleness=jnp.arange(4))
