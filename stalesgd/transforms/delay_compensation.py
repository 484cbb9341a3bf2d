"""Delay compensation (DC-ASGD): a first-order correction of stale gradients.

A gradient ``g`` computed at stale weights ``w_bak`` is moved towards the
gradient at the current weights ``w`` by a Taylor step whose Hessian is
approximated by ``lambda * g * g`` (the diagonal of the outer product, unbiased
for the cross-entropy loss):

  g~ = g + lambda * g * g * (w - w_bak).

This module holds the pure functions (also used by `stalesgd.decentral`, where
the displacement is the consensus correction of DC-S3GD rather than
``w - w_bak``) and the optax transform `scale_by_delay_compensation` that a
parameter server applies.

References:
  Zheng et al., `Asynchronous Stochastic Gradient Descent with Delay
  Compensation <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def _check_same_tree(reference: Any, other: Any, *, name: str, reference_name: str) -> None:
  """Raises ValueError unless `other` has the structure and leaf shapes of `reference`."""
  reference_structure = jax.tree.structure(reference)
  other_structure = jax.tree.structure(other)
  if reference_structure != other_structure:
    raise ValueError(
        f"{name} must have the tree structure of {reference_name}; got {other_structure}, "
        f"expected {reference_structure}.")
  for (path, reference_leaf), other_leaf in zip(
      jax.tree_util.tree_leaves_with_path(reference), jax.tree.leaves(other)):
    if jnp.shape(reference_leaf) != jnp.shape(other_leaf):
      raise ValueError(
          f"{name}{jax.tree_util.keystr(path)} has shape {jnp.shape(other_leaf)}; it must have the "
          f"shape of {reference_name}{jax.tree_util.keystr(path)}, {jnp.shape(reference_leaf)}.")


def _at_least_float32(leaf: jax.Array) -> jax.Array:
  """Upcasts half-precision leaves so that norms and squares do not overflow."""
  return leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32))


def _norm(leaf: jax.Array) -> jax.Array:
  return jnp.sqrt(jnp.sum(jnp.square(_at_least_float32(leaf))))


def _layerwise_lambda(grad: jax.Array, correction: jax.Array, dc_lambda: Any) -> jax.Array:
  """lambda_layer = dc_lambda * ||g|| / ||g*g*D||, and 0 where the denominator is 0."""
  correction_norm = _norm(correction)
  positive = correction_norm > 0
  safe_norm = jnp.where(positive, correction_norm, 1.0)
  return jnp.where(positive, dc_lambda * _norm(grad) / safe_norm, 0.0)


def delay_compensated_gradient(
    grads: Any,
    displacement: Any,
    dc_lambda: Any,
    *,
    mean_square: Any = None,
    eps: float = 1e-7,
    layerwise: bool = False,
) -> Any:
  r"""Corrects gradients computed at stale weights towards the current weights.

  Leafwise, with :math:`D` the displacement (current minus stale weights):

  .. math::
    \tilde g = g + \lambda \, g \odot g \odot D,

  where :math:`\lambda` is

  * ``dc_lambda`` (DC-ASGD-c) by default;
  * :math:`\lambda_0 / \sqrt{\mathrm{MeanSquare} + \epsilon}` elementwise when
    ``mean_square`` is given (DC-ASGD-a);
  * :math:`\lambda_0 \|g\| / \|g \odot g \odot D\|` per leaf when ``layerwise``
    (so that the correction's norm is :math:`\lambda_0 \|g\|`; the correction
    is 0 where :math:`g \odot g \odot D = 0`). The layer-wise rule is
    attributed to DC-S3GD by a secondary source (docs/algorithms.md section 3);
    it is offered here as that source describes it.

  The result has the dtype of ``grads``; products are formed in the promoted
  dtype of the operands (so bfloat16 gradients are corrected with float32
  displacements at float32 precision) and cast back. With ``dc_lambda = 0`` or
  ``displacement = 0`` the gradients come back unchanged.

  Args:
    grads: Gradient pytree :math:`g` (computed at the stale weights).
    displacement: Pytree of the same structure and shapes, :math:`D = w - w_{bak}`.
    dc_lambda: The variance-control parameter :math:`\lambda_0` (scalar).
    mean_square: Optional pytree of the same structure and shapes holding the
      running mean square of the gradients (see `update_mean_square`); selects
      DC-ASGD-a.
    eps: :math:`\epsilon` added to ``mean_square`` before the square root.
    layerwise: Selects the layer-wise :math:`\lambda`; excludes ``mean_square``.

  Returns:
    The corrected gradient pytree :math:`\tilde g`.

  Raises:
    ValueError: if the trees do not match, or both ``mean_square`` and
      ``layerwise`` are given.

  Example:
    >>> import jax.numpy as jnp
    >>> from stalesgd.transforms import delay_compensated_gradient
    >>> delay_compensated_gradient(jnp.array([1., 2.]), jnp.array([0.5, -1.]), 0.1)
    Array([1.05, 1.6 ], dtype=float32)

  References:
    Zheng et al., `Asynchronous Stochastic Gradient Descent with Delay
    Compensation <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
  """
  if layerwise and mean_square is not None:
    raise ValueError(
        "layerwise=True and mean_square are exclusive lambda modes (constant, adaptive with "
        "mean_square, or layerwise); got both.")
  _check_same_tree(grads, displacement, name="displacement", reference_name="grads")
  if mean_square is not None:
    _check_same_tree(grads, mean_square, name="mean_square", reference_name="grads")

  def compensate(grad, leaf_displacement, leaf_mean_square=None):
    correction = grad * grad * leaf_displacement
    if leaf_mean_square is not None:
      leaf_lambda = dc_lambda / jnp.sqrt(leaf_mean_square + eps)
    elif layerwise:
      leaf_lambda = _layerwise_lambda(grad, correction, dc_lambda)
    else:
      leaf_lambda = dc_lambda
    return (grad + leaf_lambda * correction).astype(grad.dtype)

  if mean_square is None:
    return jax.tree.map(compensate, grads, displacement)
  return jax.tree.map(compensate, grads, displacement, mean_square)


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
  _check_same_tree(mean_square, grads, name="grads", reference_name="mean_square")
  return jax.tree.map(
      lambda moment, grad: _blend(moment, grad * grad, decay), mean_square, grads)


def _blend(moment: jax.Array, observation: jax.Array, decay: Any) -> jax.Array:
  """Exponential moving average step, kept in the dtype of `moment`."""
  return (decay * moment + (1 - decay) * observation).astype(moment.dtype)
