"""DC-ASGD-a's MeanSquare: the running mean of g * g that sets the adaptive lambda.

  MeanSquare <- m * MeanSquare + (1 - m) * g * g,   lambda_t = lambda0 / sqrt(MeanSquare + eps).

`update_mean_square` is the pure rule (also used by `stalesgd.decentral`);
`blend` updates the state of `scale_by_delay_compensation` with a stack of
gradients: one global MeanSquare, or one row per learner, optionally divided by
its blend weight W (the bias-corrected ablation).

References:
  Zheng et al., `Asynchronous Stochastic Gradient Descent with Delay
  Compensation <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stalesgd.transforms import _contributions as contributions
from stalesgd.transforms._moving_average import exponential_moving_average


def update_mean_square(mean_square: Any, grads: Any, decay: Any) -> Any:
  r"""DC-ASGD-a's running mean square of the gradients.

  .. math::
    \mathrm{MeanSquare} \leftarrow m \cdot \mathrm{MeanSquare} + (1 - m) \, g \odot g

  Args:
    mean_square: Pytree of the current mean squares (keeps its dtype).
    grads: Gradient pytree of the same structure and shapes.
    decay: :math:`m` (the paper uses 0.95 on CIFAR-10 and 0 on ImageNet).

  Returns:
    The updated mean-square pytree, in the dtype of ``mean_square``.

  Example:
    >>> import jax.numpy as jnp
    >>> from stalesgd.transforms import update_mean_square
    >>> update_mean_square(jnp.array([1., 0.]), jnp.array([2., 3.]), 0.5)
    Array([2.5, 4.5], dtype=float32)

  References:
    Zheng et al., `Asynchronous Stochastic Gradient Descent with Delay
    Compensation <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
  """
  contributions.check_same_tree(mean_square, grads, name="grads", reference_name="mean_square")
  return jax.tree.map(lambda moment, grad: exponential_moving_average(moment, grad * grad, decay), mean_square, grads)


def blend(
  state: Any, grads: Any, learner: Any, num_learners: int | None, decay: Any
) -> tuple[Any, Callable[[Any], Any]]:
  """The state's MeanSquare (and W) after a stack of gradients, and what each contribution reads.

  Global (``num_learners`` None): blended with the mean g*g over the stack.
  Per learner: each learner's row is blended with the mean g*g of its
  contributions; learners absent from the stack keep theirs. With bias
  correction (the state has ``mean_square_weight``) W is blended alongside,
  W <- m W + (1 - m), and the contributions read MeanSquare / W.

  Args:
    state: A state with ``mean_square`` (and ``mean_square_weight`` with bias correction).
    grads: The stack of gradients (leading axis c).
    learner: int [c] learner of each contribution (per learner), or None.
    num_learners: The number of MeanSquare rows, or None for one global MeanSquare.
    decay: m.

  Returns:
    The updated state, and ``read(learner_k)``: the MeanSquare contribution k's
    lambda uses (its learner's row per learner, the global one otherwise).
  """
  weight = getattr(state, "mean_square_weight", None)
  if num_learners is None:
    moments = jax.tree.map(
      lambda moment, grads: exponential_moving_average(moment, jnp.mean(grads * grads, axis=0), decay),
      state.mean_square,
      grads,
    )
    if weight is not None:
      weight = _blended_weight(weight, decay)
    shared = _bias_corrected(moments, weight)
    read = lambda learner: shared
  else:
    learners = jnp.reshape(jnp.asarray(learner, jnp.int32), (-1,))
    arrivals = jax.ops.segment_sum(jnp.ones(learners.shape, jnp.float32), learners, num_learners)
    moments = _per_learner_mean_square(state.mean_square, grads, learners, arrivals, decay)
    if weight is not None:
      weight = _blended_weight(weight, decay, present=arrivals > 0)
    read = lambda learner: _bias_corrected(
      jax.tree.map(lambda moment: moment[learner], moments), None if weight is None else weight[learner]
    )
  if weight is None:
    return state._replace(mean_square=moments), read
  return state._replace(mean_square=moments, mean_square_weight=weight), read


def _broadcast_rows(rows: jax.Array, leaf: jax.Array) -> jax.Array:
  """``rows`` (shape [] or [k]) reshaped to broadcast along the leading axis of ``leaf``."""
  return jnp.reshape(rows, jnp.shape(rows) + (1,) * (leaf.ndim - jnp.ndim(rows)))


def _per_learner_mean_square(mean_square, grads_stack, learners, arrivals, decay):
  """Blends each learner's MeanSquare with the mean g*g of its contributions in the stack.

  ``learners`` is int32 [c], ``arrivals`` float32 [num_learners] (contributions
  per learner in the stack). Learners absent from the stack keep their MeanSquare.
  """
  num_learners = arrivals.shape[0]

  def blend_leaf(moment, grads):
    squares = jax.ops.segment_sum(grads * grads, learners, num_learners)
    mean_squares = squares / _broadcast_rows(jnp.maximum(arrivals, 1.0), moment)
    present = _broadcast_rows(arrivals > 0, moment)
    return jnp.where(present, exponential_moving_average(moment, mean_squares, decay), moment)

  return jax.tree.map(blend_leaf, mean_square, grads_stack)


def _blended_weight(weight, decay, present=None):
  """The bias correction's W <- m W + (1 - m) * 1: the MeanSquare's blend applied to a 1.

  Per learner (``present``, bool [num_learners]) only the learners in the stack advance.
  """
  blended = exponential_moving_average(weight, jnp.ones_like(weight), decay)
  return blended if present is None else jnp.where(present, blended, weight)


def _bias_corrected(mean_square, weight):
  """MeanSquare / W, in MeanSquare's dtype (``weight`` [] or one per leading row); as it is for None.

  Where W = 0 (decay 1 from the start, nothing blended in yet) MeanSquare is 0
  as well and is returned as it is, not 0 / 0.
  """
  if weight is None:
    return mean_square

  def correct(moment):
    rows = _broadcast_rows(weight, moment)
    positive = rows > 0
    return jnp.where(positive, moment / jnp.where(positive, rows, 1.0), moment).astype(moment.dtype)

  return jax.tree.map(correct, mean_square)


def check_learner(learner: Any, num_learners: int) -> None:
  """Raises ValueError for a missing ``learner`` or a concrete one outside [0, num_learners).

  A traced index cannot be checked; out of range, JAX would clamp the MeanSquare
  read and drop the write, silently.
  """
  if learner is None:
    raise ValueError(
      f"num_learners={num_learners} keeps a MeanSquare per learner: pass the extra argument "
      "learner (int, or shape [c] for a stack); got None."
    )
  if isinstance(learner, jax.core.Tracer):
    return
  indices = np.asarray(learner)
  if indices.size and (indices.min() < 0 or indices.max() >= num_learners):
    raise ValueError(f"learner must lie in [0, num_learners={num_learners}); got {indices.tolist()!r}.")
