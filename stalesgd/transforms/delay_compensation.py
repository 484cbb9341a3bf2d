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

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stalesgd.transforms import contributions
from stalesgd.transforms import hyperparameters
from stalesgd.transforms.moving_average import exponential_moving_average


def _check_same_tree(reference: Any, other: Any, *, name: str, reference_name: str) -> None:
  """Raises ValueError unless `other` has the structure and leaf shapes of `reference`."""
  contributions.check_tree_structure(reference, other, name=name, reference_name=reference_name)
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
    # Where g*g*D is 0 the gradient stays as it is, even if lambda is infinite (MeanSquare and
    # eps both 0 on a coordinate whose gradient is 0).
    compensated = jnp.where(correction == 0, grad, grad + leaf_lambda * correction)
    return compensated.astype(grad.dtype)

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
      lambda moment, grad: exponential_moving_average(moment, grad * grad, decay),
      mean_square, grads)


class ScaleByDelayCompensationState(NamedTuple):
  """State of `scale_by_delay_compensation`."""

  count: jax.Array  # Updates seen (int32); the argument of schedules.
  # DC-ASGD-a's MeanSquare: params' shapes, or [num_learners, ...] per learner; None if unused.
  mean_square: Any


class ScaleByDelayCompensationBiasCorrectedState(NamedTuple):
  """State of `scale_by_delay_compensation` with ``bias_correction=True``.

  A class of its own rather than a field of `ScaleByDelayCompensationState`:
  orbax restores by the tree's keys, so a field added there (even None) would
  make every checkpoint of the other modes written before it unreadable.
  """

  count: jax.Array  # Updates seen (int32); the argument of schedules.
  mean_square: Any  # As in ScaleByDelayCompensationState.
  mean_square_weight: jax.Array  # The MeanSquare's blend weight W (float32, [] or [num_learners]).


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


def _updated_mean_square(mean_square, weight, grads_stack, learner, num_learners, decay):
  """The MeanSquare and its weight W after this stack, what each contribution's lambda reads, and its vmap axis.

  Global: blended with the mean g*g over the stack, shared by every contribution
  (vmap axis None). Per learner: each contribution reads its learner's row (axis 0).
  With bias correction (``weight`` not None) W is blended alongside and the
  contributions read MeanSquare / W.
  """
  if num_learners is None:
    updated = jax.tree.map(
        lambda moment, grads: exponential_moving_average(
            moment, jnp.mean(grads * grads, axis=0), decay),
        mean_square, grads_stack)
    if weight is not None:
      weight = _blended_weight(weight, decay)
    return updated, weight, _bias_corrected(updated, weight), None
  learners = jnp.reshape(jnp.asarray(learner, jnp.int32), (-1,))
  arrivals = jax.ops.segment_sum(jnp.ones(learners.shape, jnp.float32), learners, num_learners)
  updated = _per_learner_mean_square(mean_square, grads_stack, learners, arrivals, decay)
  rows = jax.tree.map(lambda moment: moment[learners], updated)
  if weight is None:
    return updated, None, rows, 0
  weight = _blended_weight(weight, decay, present=arrivals > 0)
  return updated, weight, _bias_corrected(rows, weight[learners]), 0


def _check_learner_indices(learner: Any, num_learners: int) -> None:
  """Raises ValueError for a concrete ``learner`` outside [0, num_learners).

  A traced index cannot be checked; out of range, JAX would clamp the MeanSquare
  read and drop the write, silently.
  """
  if isinstance(learner, jax.core.Tracer):
    return
  indices = np.asarray(learner)
  if indices.size and (indices.min() < 0 or indices.max() >= num_learners):
    raise ValueError(
        f"learner must lie in [0, num_learners={num_learners}); got {indices.tolist()!r}.")


def scale_by_delay_compensation(
    dc_lambda: optax.ScalarOrSchedule = 0.04,
    adaptive: bool = False,
    decay: optax.ScalarOrSchedule = 0.95,
    eps: optax.ScalarOrSchedule = 1e-7,
    layerwise: bool = False,
    num_learners: int | None = None,
    bias_correction: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""Delay compensation of DC-ASGD: corrects each gradient to the current weights.

  With :math:`w` = ``params`` (the current weights) and :math:`w_{bak}` =
  ``stale_params`` (the weights the gradient was computed at):

  .. math::
    \tilde g = g + \lambda_t \, g \odot g \odot (w - w_{bak}),

  * DC-ASGD-c (default): :math:`\lambda_t = \lambda_0` = ``dc_lambda``
    (the paper's CIFAR-10 value is 0.04).
  * DC-ASGD-a (``adaptive=True``):
    :math:`\mathrm{MeanSquare} \leftarrow m \, \mathrm{MeanSquare} + (1-m) g^2`,
    :math:`\lambda_t = \lambda_0 / \sqrt{\mathrm{MeanSquare} + \epsilon}`
    elementwise (paper: :math:`\lambda_0 = 2`, :math:`m = 0.95` on CIFAR-10).
    The MeanSquare is updated first and :math:`\lambda_t` computed from it, so
    it includes the current gradient (the order of the paper's update as
    docs/algorithms.md section 2 states it). It is one global state by
    default; with ``num_learners`` it is kept per learner (as Microsoft's
    implementation does; the paper does not say), with state leaves of shape
    [num_learners, ...] selected by the extra argument ``learner``. The
    MeanSquare starts at 0 with no bias correction, as in the authors'
    implementation (Microsoft Multiverso's ``DCASGDAUpdater``; the paper is
    silent), so the first :math:`\lambda_t` is
    :math:`\lambda_0 / \sqrt{(1-m) g^2 + \epsilon}`.
  * Bias-corrected MeanSquare (``bias_correction=True``, adaptive only): an
    **ablation, not the paper's rule**. A weight :math:`W`, starting at 0, gets
    the MeanSquare's blend applied to a 1, and the MeanSquare is divided by it
    (as Adam corrects its moments):

    .. math::
      W \leftarrow m W + (1-m), \qquad
      \lambda_t = \lambda_0 / \sqrt{\mathrm{MeanSquare} / W + \epsilon}.

    Why: with the zero start the first :math:`\lambda_t` is :math:`1/\sqrt{1-m}`
    times the value it settles to for gradients of a steady size (about 4.5 at
    :math:`m = 0.95`), and on CIFAR-10 with ResNet-20 at the paper's
    :math:`\eta = 0.5` the loss explodes within tens of updates. MeanSquare / W
    is a weighted mean of the :math:`g^2` seen so far (weights summing to 1)
    from the first update on. W follows a ``decay`` schedule (it gets the
    MeanSquare's :math:`m`); with ``num_learners`` it has shape [num_learners]
    and advances only for the learners in the stack, as their MeanSquare rows
    do. With :math:`m = 0`, W = 1 after the first blend and this is the
    uncorrected rule exactly.
  * Layer-wise (``layerwise=True``): per leaf,
    :math:`\lambda = \lambda_0 \|g\| / \|g \odot g \odot D\|`
    (see `delay_compensated_gradient`).

  Convention: :math:`w_{bak}` is exactly the weights the gradient was computed
  at, as in the paper, so the correction is the paper's at any staleness. MXNet's
  ``DCASGD`` differs: it uses the weights before the optimizer's previous step
  (exact only at staleness 1) and adds weight decay to g before squaring.

  Stacks (see `stalesgd.transforms.contributions`): gradients and
  ``stale_params`` with a leading axis of size c (and ``learner`` of shape [c])
  are corrected one contribution at a time against the unstacked ``params``.
  The MeanSquare is updated once per call with the mean of :math:`g_k^2` over
  the stack (per learner: over that learner's contributions), then used for all
  c corrections, so a stack of one is exactly the unstacked call.

  Without ``stale_params`` the gradients pass unchanged and only ``count``
  advances (pass ``stale_params=params`` for a fresh gradient that should still
  update the MeanSquare). ``learner`` must lie in [0, num_learners): a concrete
  index outside raises ValueError; under jit it cannot be checked.

  Args:
    dc_lambda: :math:`\lambda_0`.
    adaptive: DC-ASGD-a's MeanSquare normalisation.
    decay: :math:`m`, the MeanSquare's decay (adaptive only).
    eps: :math:`\epsilon` inside the square root (adaptive only).
    layerwise: The layer-wise :math:`\lambda` (excludes ``adaptive``).
    num_learners: Keep one MeanSquare per learner (adaptive only).
    bias_correction: Divide the MeanSquare by its blend weight W (adaptive
      only; an ablation, see above).

  Returns:
    An `optax.GradientTransformationExtraArgs` whose ``update`` takes the
    keyword-only extra arguments ``stale_params`` and, per learner, ``learner``.

  Raises:
    ValueError: for exclusive or inapplicable options, negative
      hyperparameters, ``stale_params`` that do not match ``params`` (or
      ``params`` with a leading stack axis), ``params=None`` with
      ``stale_params``, or a concrete ``learner`` outside [0, num_learners).

  Example:
    >>> import jax.numpy as jnp
    >>> import stalesgd
    >>> tx = stalesgd.scale_by_delay_compensation(dc_lambda=0.5)
    >>> params = jnp.array([1., 1.])
    >>> state = tx.init(params)
    >>> grads, stale = jnp.array([1., 2.]), jnp.array([0., 2.])
    >>> updates, state = tx.update(grads, state, params, stale_params=stale)
    >>> updates  # g + 0.5 * g * g * (params - stale)
    Array([1.5, 0. ], dtype=float32)

  References:
    Zheng et al., `Asynchronous Stochastic Gradient Descent with Delay
    Compensation <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
  """
  if adaptive and layerwise:
    raise ValueError("adaptive=True and layerwise=True are exclusive lambda modes; got both.")
  if num_learners is not None:
    if not adaptive:
      raise ValueError(
          f"num_learners={num_learners!r} keeps one MeanSquare per learner and needs "
          "adaptive=True; got adaptive=False.")
    if not isinstance(num_learners, int) or num_learners < 1:
      raise ValueError(f"num_learners must be a positive int or None; got {num_learners!r}.")
  if bias_correction and not adaptive:
    raise ValueError(
        "bias_correction=True divides DC-ASGD-a's MeanSquare by its blend weight and needs "
        "adaptive=True; got adaptive=False.")
  hyperparameters.check_nonnegative("dc_lambda", dc_lambda)
  hyperparameters.check_in_unit_interval("decay", decay)
  hyperparameters.check_nonnegative("eps", eps)

  def init_fn(params):
    if not adaptive:
      return ScaleByDelayCompensationState(count=jnp.zeros([], jnp.int32), mean_square=None)
    leading = () if num_learners is None else (num_learners,)
    mean_square = jax.tree.map(
        lambda param: jnp.zeros(leading + jnp.shape(param), jnp.asarray(param).dtype), params)
    if bias_correction:
      return ScaleByDelayCompensationBiasCorrectedState(
          count=jnp.zeros([], jnp.int32), mean_square=mean_square,
          mean_square_weight=jnp.zeros(leading, jnp.float32))
    return ScaleByDelayCompensationState(count=jnp.zeros([], jnp.int32), mean_square=mean_square)

  def update_fn(updates, state, params=None, *, stale_params=None, learner=None, **extra_args):
    count = optax.safe_increment(state.count)
    if stale_params is None:
      return updates, state._replace(count=count)
    if num_learners is not None:
      if learner is None:
        raise ValueError(
            f"num_learners={num_learners} keeps a MeanSquare per learner: pass the extra argument "
            "learner (int, or shape [c] for a stack); got None.")
      _check_learner_indices(learner, num_learners)
    stack_size = contributions.contributions_in_stack(
        updates, params, staleness=extra_args.get("staleness"), stale_params=stale_params,
        learner=learner if num_learners is not None else None)
    del extra_args
    grads_stack = contributions.as_stack(updates, stack_size)
    stale_stack = contributions.as_stack(stale_params, stack_size)
    displacements = jax.tree.map(lambda param, stale: param - stale, params, stale_stack)
    dc_lambda_now = hyperparameters.value_at(dc_lambda, state.count)
    eps_now = hyperparameters.value_at(eps, state.count)
    new_state = state._replace(count=count)
    contribution_mean_square, mean_square_axis = None, None
    if adaptive:
      weight = state.mean_square_weight if bias_correction else None
      mean_square, weight, contribution_mean_square, mean_square_axis = _updated_mean_square(
          state.mean_square, weight, grads_stack, learner, num_learners,
          hyperparameters.value_at(decay, state.count))
      new_state = new_state._replace(mean_square=mean_square)
      if bias_correction:
        new_state = new_state._replace(mean_square_weight=weight)

    def correct(grads, displacement, leaf_mean_square):
      return delay_compensated_gradient(
          grads, displacement, dc_lambda_now, mean_square=leaf_mean_square, eps=eps_now,
          layerwise=layerwise)

    corrected = jax.vmap(correct, in_axes=(0, 0, mean_square_axis))(
        grads_stack, displacements, contribution_mean_square)
    return contributions.from_stack(corrected, stack_size), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
