"""Delay compensation (DC-ASGD): a first-order correction of stale gradients.

A gradient ``g`` computed at stale weights ``w_bak`` is moved towards the
gradient at the current weights ``w`` by a Taylor step whose Hessian is
approximated by ``lambda * g * g`` (the diagonal of the outer product, unbiased
for the cross-entropy loss):

  g~ = g + lambda * g * g * (w - w_bak).

This module holds the pure correction (also used by `stalesgd.decentral`, where
the displacement is the consensus correction of DC-S3GD rather than
``w - w_bak``) and the optax transform `scale_by_delay_compensation` that a
parameter server applies; DC-ASGD-a's MeanSquare is in
`stalesgd.transforms._mean_square`.

References:
  Zheng et al., `Asynchronous Stochastic Gradient Descent with Delay
  Compensation <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from stalesgd import _validation as validation
from stalesgd.transforms import _contributions as contributions
from stalesgd.transforms import _hyperparameters as hyperparameters
from stalesgd.transforms import _mean_square as mean_square_lib

# Re-exported: stalesgd.transforms._delay_compensation.update_mean_square was its path before the split.


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
      "mean_square, or layerwise); got both."
    )
  contributions.check_same_tree(grads, displacement, name="displacement", reference_name="grads")
  if mean_square is not None:
    contributions.check_same_tree(grads, mean_square, name="mean_square", reference_name="grads")

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


def scale_by_delay_compensation(
  dc_lambda: optax.ScalarOrSchedule = 0.04,
  *,
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
    :math:`m = 0.95`), so the first corrections are several times the gradient
    (the README's DC-ASGD Table 1 section has the CIFAR-10 runs, where the
    uncorrected rule diverges and this one trains at M = 4). MeanSquare / W
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

  Stacks (see `stalesgd.transforms._contributions`): gradients and
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
        f"num_learners={num_learners!r} keeps one MeanSquare per learner and needs adaptive=True; got adaptive=False."
      )
    validation.check_integer("num_learners", num_learners, low=1, optional=True, builtin_only=True)
  if bias_correction and not adaptive:
    raise ValueError(
      "bias_correction=True divides DC-ASGD-a's MeanSquare by its blend weight and needs "
      "adaptive=True; got adaptive=False."
    )
  # A schedule or an array (inject_hyperparams passes arrays) is not checked.
  if validation.is_real(dc_lambda):
    validation.check_real("dc_lambda", dc_lambda, low=0, allow_inf=True, note="or a schedule")
  if validation.is_real(decay):
    validation.check_real("decay", decay, low=0, high=1, note="or a schedule")
  if validation.is_real(eps):
    validation.check_real("eps", eps, low=0, allow_inf=True, note="or a schedule")

  def init_fn(params):
    if not adaptive:
      return ScaleByDelayCompensationState(count=jnp.zeros([], jnp.int32), mean_square=None)
    leading = () if num_learners is None else (num_learners,)
    mean_square = jax.tree.map(lambda param: jnp.zeros(leading + jnp.shape(param), jnp.asarray(param).dtype), params)
    if bias_correction:
      return ScaleByDelayCompensationBiasCorrectedState(
        count=jnp.zeros([], jnp.int32), mean_square=mean_square, mean_square_weight=jnp.zeros(leading, jnp.float32)
      )
    return ScaleByDelayCompensationState(count=jnp.zeros([], jnp.int32), mean_square=mean_square)

  def update_fn(updates, state, params=None, *, stale_params=None, learner=None, **extra_args):
    count = optax.safe_increment(state.count)
    if stale_params is None:
      return updates, state._replace(count=count)
    if num_learners is None:
      learner = None
    else:
      mean_square_lib.check_learner(learner, num_learners)
    stack = contributions.Stack.of(
      updates, params, staleness=extra_args.get("staleness"), stale_params=stale_params, learner=learner
    )
    del extra_args
    grads = stack.stacked(updates)
    displacements = stack.displacements(params, stale_params)
    dc_lambda_now = hyperparameters.value_at(dc_lambda, state.count)
    eps_now = hyperparameters.value_at(eps, state.count)
    new_state, read_mean_square = state._replace(count=count), lambda learner: None
    if adaptive:
      new_state, read_mean_square = mean_square_lib.blend(
        new_state, grads, learner, num_learners, hyperparameters.value_at(decay, state.count)
      )

    def correct(grads, displacement, learner):  # g~_k = g_k + lambda_t g_k * g_k * (w - w_bak,k)
      return delay_compensated_gradient(
        grads, displacement, dc_lambda_now, mean_square=read_mean_square(learner), eps=eps_now, layerwise=layerwise
      )

    return stack.map(correct, grads, displacements, stack.stacked(learner)), new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
