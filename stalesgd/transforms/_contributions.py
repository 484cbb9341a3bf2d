"""Stacks of contributions: how a server applies several gradients in one update.

A parameter server that applies c gradients at once (Zhang et al., eq. 2)

  w <- w - (1/c) sum_k alpha(sigma_k) g_k

weights or corrects each gradient before the average. The transforms here
receive such an update as a *stack*:

* every gradient leaf has a leading axis of size c;
* ``staleness`` has shape [c] (a 1-D ``staleness`` is what marks a stack);
* ``stale_params`` is stacked likewise (each leaf has one more leading axis
  than the matching ``params`` leaf), and ``learner`` has shape [c];
* ``params`` stays unstacked: it is the server's current weights.

Per-contribution transforms (`scale_by_staleness`,
`scale_by_delay_compensation`, `scale_by_gap_aware`) weight or correct each
contribution independently, then update their state once with statistics of
the whole stack. The staleness and Gap-Aware statistics they read are those
from before the update; DC-ASGD-a's MeanSquare alone is blended with the
stack first and then read (the paper's order, see
`scale_by_delay_compensation`). They treat an
unstacked call as a stack of one (`Stack` does the stacking, the mapping over
contributions and the unstacking), so a stack of one gives bit-for-bit the
unstacked result. `average_contributions` then reduces the stack to its mean;
transforms after it in a chain (momentum, learning rate) see one gradient.

References:
  Zhang et al., `Staleness-aware Async-SGD for Distributed Deep Learning
  <https://arxiv.org/abs/1511.05950>`_, IJCAI 2016.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


def check_tree_structure(reference: Any, other: Any, *, name: str, reference_name: str) -> None:
  """Raises ValueError unless `other` has the tree structure of `reference`."""
  reference_structure = jax.tree.structure(reference)
  other_structure = jax.tree.structure(other)
  if reference_structure != other_structure:
    raise ValueError(
      f"{name} must have the tree structure of {reference_name}; got {other_structure}, expected {reference_structure}."
    )


def check_same_tree(reference: Any, other: Any, *, name: str, reference_name: str) -> None:
  """Raises ValueError unless `other` has the structure and leaf shapes of `reference`."""
  check_tree_structure(reference, other, name=name, reference_name=reference_name)
  for (path, reference_leaf), other_leaf in zip(jax.tree_util.tree_leaves_with_path(reference), jax.tree.leaves(other)):
    if jnp.shape(reference_leaf) != jnp.shape(other_leaf):
      raise ValueError(
        f"{name}{jax.tree_util.keystr(path)} has shape {jnp.shape(other_leaf)}; it must have the "
        f"shape of {reference_name}{jax.tree_util.keystr(path)}, {jnp.shape(reference_leaf)}."
      )


def _stack_size_of_vector(name: str, value: Any) -> int | None:
  """c for a per-contribution argument of shape [c], None for a scalar."""
  shape = jnp.shape(value)
  if len(shape) > 1:
    raise ValueError(f"{name} must be a scalar or have shape [c] for a stack of c contributions; got shape {shape}.")
  return shape[0] if shape else None


def _stack_size_of_stale_params(stale_params: Any, params: Any) -> int | None:
  if params is None:
    raise ValueError("params (the current weights) must be given with stale_params; got params=None.")
  check_tree_structure(params, stale_params, name="stale_params", reference_name="params")
  sizes = set()
  for (path, param), stale in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(stale_params)):
    param_shape, stale_shape = jnp.shape(param), jnp.shape(stale)
    if stale_shape == param_shape:
      sizes.add(None)
    elif len(stale_shape) == len(param_shape) + 1 and stale_shape[1:] == param_shape:
      sizes.add(stale_shape[0])
    else:
      raise ValueError(
        f"stale_params{jax.tree_util.keystr(path)} has shape {stale_shape}; allowed are the "
        f"shape of params{jax.tree_util.keystr(path)}, {param_shape}, or (c,) + {param_shape} "
        "for a stack of c contributions."
      )
  if len(sizes) > 1:
    raise ValueError(
      "stale_params mixes stacked and unstacked leaves (leading sizes "
      f"{sorted(sizes, key=str)}); stack every leaf or none."
    )
  return sizes.pop() if sizes else None


def contributions_in_stack(
  updates: Any,
  params: Any = None,
  *,
  staleness: Any = None,
  stale_params: Any = None,
  learner: Any = None,
) -> int | None:
  """The number c of stacked contributions, or None for a single gradient.

  Reads the stack size from a 1-D ``staleness``, from ``stale_params`` leaves
  with one more leading axis than ``params``, and from a 1-D ``learner``;
  whichever are given must agree, and every leaf of ``updates`` must then have
  a leading axis of size c. All checks use static shapes, so they run at trace
  time.

  Args:
    updates: The gradient pytree.
    params: The current (unstacked) weights; required with ``stale_params``.
    staleness: Optional scalar or [c] staleness.
    stale_params: Optional weights the gradients were computed at.
    learner: Optional scalar or [c] learner index.

  Returns:
    c, or None when the call is not a stack.

  Raises:
    ValueError: if the inputs disagree on the stack size or have bad shapes.
  """
  indications = {}
  if staleness is not None:
    indications["staleness"] = _stack_size_of_vector("staleness", staleness)
  if stale_params is not None:
    indications["stale_params"] = _stack_size_of_stale_params(stale_params, params)
  if learner is not None:
    indications["learner"] = _stack_size_of_vector("learner", learner)
  if len(set(indications.values())) > 1:
    described = ", ".join(
      f"{name}: {'unstacked' if size is None else f'stack of {size}'}" for name, size in indications.items()
    )
    raise ValueError(f"the extra arguments disagree on the stack of contributions ({described}).")
  stack_size = next(iter(indications.values()), None)
  _check_updates_shapes(updates, params, stack_size)
  return stack_size


def _check_updates_shapes(updates: Any, params: Any, stack_size: int | None) -> None:
  """Every update leaf must be its param's shape, with a leading axis of size c for a stack."""
  leading = () if stack_size is None else (stack_size,)
  if params is not None and jax.tree.structure(params) == jax.tree.structure(updates):
    for (path, leaf), param in zip(jax.tree_util.tree_leaves_with_path(updates), jax.tree.leaves(params)):
      if jnp.shape(leaf) != leading + jnp.shape(param):
        kind = "a single gradient" if stack_size is None else f"a stack of {stack_size}"
        raise ValueError(
          f"updates{jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}; for {kind} it must "
          f"be {leading + jnp.shape(param)} (params{jax.tree_util.keystr(path)} has shape "
          f"{jnp.shape(param)})."
        )
  elif stack_size is not None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(updates):
      if jnp.shape(leaf)[:1] != leading:
        raise ValueError(
          f"updates{jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}; a stack of "
          f"{stack_size} contributions needs a leading axis of size {stack_size}."
        )


class Stack(NamedTuple):
  """The contributions of one call: ``size`` = c for a stack, None for a single gradient.

  A single gradient is handled as a stack of one, so a transform writes its
  equation once, for contribution k, and gets the unstacked result bit for bit
  from a stack of one:

  * `Stack.of` reads c from the call's arguments (`contributions_in_stack`);
  * `Stack.stacked` gives an argument its leading axis of size c (adds one of
    size 1 to an unstacked argument); statistics of the whole stack (a state
    update) are computed on it, and `Stack.displacements` on ``stale_params``;
  * `Stack.map` applies the per-contribution equation to each k and returns
    the result in the call's layout (stacked for a stack, unstacked otherwise).
  """

  size: int | None

  @classmethod
  def of(
    cls, updates: Any, params: Any = None, *, staleness: Any = None, stale_params: Any = None, learner: Any = None
  ) -> Stack:
    """The stack of a call; see `contributions_in_stack` for the arguments and the checks."""
    return cls(contributions_in_stack(updates, params, staleness=staleness, stale_params=stale_params, learner=learner))

  def stacked(self, tree: Any) -> Any:
    """`tree` with a leading contributions axis (one of size 1 is added for an unstacked call)."""
    if self.size is not None:
      return tree
    return jax.tree.map(lambda leaf: jnp.expand_dims(leaf, 0), tree)

  def displacements(self, params: Any, stale_params: Any) -> Any:
    """w - w_stale,k, stacked: how far the weights moved since gradient k was computed."""
    return jax.tree.map(lambda param, stale: param - stale, params, self.stacked(stale_params))

  def map(self, fn: Callable[..., Any], *stacked: Any) -> Any:
    """``fn`` applied to each contribution, in the call's layout.

    Args:
      fn: The equation for one contribution k; called (under `jax.vmap`) with
        the k-th slice of each of ``stacked``. Values it closes over are shared
        by every contribution (the current params, a global statistic).
      *stacked: Pytrees with a leading contributions axis (see `stacked`), or None.

    Returns:
      ``fn``'s results stacked along a leading axis of size c, or, for an
      unstacked call, its single result without that axis.
    """
    mapped = jax.vmap(fn)(*stacked)
    if self.size is not None:
      return mapped
    return jax.tree.map(lambda leaf: jnp.squeeze(leaf, 0), mapped)


def average_contributions() -> optax.GradientTransformationExtraArgs:
  r"""Reduces a stack of contributions to their mean; the identity otherwise.

  .. math::
    u = \frac{1}{c} \sum_{k=1}^{c} g_k

  This separates the per-contribution part of a chain (staleness weights, delay
  compensation) from the server part (momentum, learning rate), as in Zhang et
  al., eq. 2. A stack is signaled by a 1-D ``staleness`` extra argument, or by
  ``stale_params`` leaves with one more leading axis than ``params`` (see the
  module docstring). Dropped contributions (weight 0) still count in c, as the
  equation says. Dtypes are preserved; a stack of one returns exactly its single
  gradient.

  Returns:
    An `optax.GradientTransformationExtraArgs` with an empty state.

  Example:
    >>> import jax.numpy as jnp
    >>> import stalesgd
    >>> tx = stalesgd.average_contributions()
    >>> grads = jnp.array([[1., 2.], [3., 6.]])
    >>> updates, _ = tx.update(grads, tx.init(None), staleness=jnp.array([0, 1]))
    >>> updates
    Array([2., 4.], dtype=float32)

  References:
    Zhang et al., `Staleness-aware Async-SGD for Distributed Deep Learning
    <https://arxiv.org/abs/1511.05950>`_, IJCAI 2016.
  """

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None, *, staleness=None, stale_params=None, learner=None, **extra_args):
    del extra_args
    stack = Stack.of(updates, params, staleness=staleness, stale_params=stale_params, learner=learner)
    if stack.size is None:
      return updates, state
    averaged = jax.tree.map(lambda leaf: jnp.mean(leaf, axis=0).astype(leaf.dtype), updates)
    return averaged, state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
