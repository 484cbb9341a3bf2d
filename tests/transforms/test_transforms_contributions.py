"""Stacks of contributions: detection, validation, and average_contributions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stalesgd
from stalesgd.transforms._contributions import Stack, check_same_tree, check_tree_structure

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


def test_the_stack_size_is_read_from_stale_params_leading_axis():
  # c = 4, not 3: the weight leaf's last axis is 3, so only its leading axis gives c.
  stale = jax.tree.map(jnp.zeros_like, stack(4))
  assert stalesgd.contributions_in_stack(stack(4), PARAMS, stale_params=stale) == 4


@pytest.mark.parametrize(
  "leaf, role",
  [(jnp.zeros((3, 2, 2)), "stale_params"), (jnp.zeros((3, 2, 4)), "stale_params"), (jnp.zeros((3, 2, 4)), "updates")],
)
def test_a_leaf_of_another_shape_than_its_param_is_refused(leaf, role):
  """(c,) + (2, 2) and (c,) + (2, 4) for a (2, 3) weight: smaller and larger shapes alike."""
  grads, stale = stack(3), jax.tree.map(jnp.zeros_like, stack(3))
  if role == "stale_params":
    stale = {**stale, "w": leaf}
  else:
    grads = {**grads, "w": leaf}
  with pytest.raises(ValueError, match=rf"{role}\['w'\] has shape \(3, 2, [24]\)"):
    stalesgd.contributions_in_stack(grads, PARAMS, stale_params=stale)


def test_updates_of_another_tree_than_params_get_only_the_leading_axis_checked():
  """As in a transform that sees part of the updates (its shapes are then not comparable leaf by leaf)."""
  params = {"a": jnp.zeros(5), "b": jnp.zeros(3)}
  assert stalesgd.contributions_in_stack({"b": jnp.zeros((2, 3))}, params, staleness=jnp.arange(2)) == 2
  assert stalesgd.contributions_in_stack({"b": jnp.zeros(3)}, params) is None


def test_stack_of_takes_params_by_keyword():
  assert Stack.of(stack(2), params=PARAMS, staleness=jnp.arange(2)).size == 2


def test_the_checks_name_the_mismatch_in_the_librarys_words():
  grads = stack(3)
  with pytest.raises(ValueError, match="stale_params must have the tree structure of params; got"):
    stalesgd.contributions_in_stack(grads, PARAMS, stale_params={"w": grads["w"]})
  # A stack larger than the other arguments say, with and without params to compare with.
  with pytest.raises(ValueError, match=r"a stack of 2 contributions needs a leading axis of size 2"):
    stalesgd.contributions_in_stack(grads, None, staleness=jnp.arange(2))
  # A smaller leaf than the reference's, which would broadcast silently.
  with pytest.raises(ValueError, match=r"displacement has shape \(1,\); it must have the shape of grads, \(2,\)"):
    stalesgd.delay_compensated_gradient(jnp.ones(2), jnp.ones(1), 0.1)


def test_contributions_in_stack_takes_its_operands_by_name_and_its_indications_only_by_name():
  grads = stack(3)
  assert stalesgd.contributions_in_stack(updates=grads, params=PARAMS, staleness=jnp.arange(3)) == 3
  with pytest.raises(TypeError):
    stalesgd.contributions_in_stack(grads, PARAMS, jnp.arange(3))


def test_check_same_tree_takes_the_names_only_by_keyword():
  check_same_tree(reference=PARAMS, other=PARAMS, name="a", reference_name="b")
  with pytest.raises(TypeError):
    check_same_tree(PARAMS, PARAMS, "a", "b")


def test_check_tree_structure_takes_the_names_only_by_keyword():
  check_tree_structure(PARAMS, PARAMS, name="a", reference_name="b")
  with pytest.raises(TypeError):
    check_tree_structure(PARAMS, PARAMS, "a", "b")


def test_an_unstacked_stale_leaf_of_a_smaller_shape_is_refused():
  with pytest.raises(ValueError, match=r"stale_params\['w'\] has shape \(2, 2\)"):
    stalesgd.contributions_in_stack(stack(1), PARAMS, stale_params={"w": jnp.zeros((2, 2)), "b": jnp.zeros(())})


def test_empty_trees_are_a_single_contribution():
  assert stalesgd.contributions_in_stack({}, {}, stale_params={}) is None


def test_average_contributions_takes_params_by_keyword_as_any_optax_update():
  transform = stalesgd.average_contributions()
  stale = jax.tree.map(jnp.zeros_like, stack(2))  # stale_params needs the params
  updates, _ = transform.update(stack(2), transform.init(PARAMS), params=PARAMS, stale_params=stale)
  np.testing.assert_allclose(updates["b"], jnp.mean(stack(2)["b"]), rtol=1e-6)


def test_unstacked_stale_params_of_numpy_arrays_are_a_single_contribution():
  # numpy's shape is a new tuple on every read: the comparison must be by value.
  stale = jax.tree.map(lambda leaf: np.zeros(np.shape(leaf), np.float32), PARAMS)
  assert stalesgd.contributions_in_stack(jax.tree.map(jnp.ones_like, PARAMS), PARAMS, stale_params=stale) is None
