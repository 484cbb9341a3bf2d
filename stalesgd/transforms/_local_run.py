r"""Local runs: contributions of H inner steps, and DiLoCo's synchronous outer step on top of them.

**A local run.** Learner m pulls the outer weights :math:`\theta_j` (outer version j) and runs H steps of its
inner optimizer (any optax transformation) from them, step i on its i-th mini-batch of the round:

.. math::
  \theta_{m,0} = \theta_j, \quad
  u_i, s_{i+1} = \mathrm{InnerOpt}(\nabla L(\theta_{m,i}; b_i), s_i, \theta_{m,i}), \quad
  \theta_{m,i+1} = \theta_{m,i} + u_i \quad (i = 0, \dots, H - 1)

and contributes the pseudo-gradient

.. math::
  \Delta_m = \theta_j - \theta_{m,H} = -\textstyle\sum_{i=0}^{H-1} u_i,

accumulated as minus the sum of its inner updates (a running sum from -0, negated at the end), never as the
difference of two weights: with H = 1 and inner SGD at rate 1 without state, :math:`u_0 = -g` and
:math:`\Delta = -((-0) + (-g)) = g` bit for bit (signed zeros included), so a contribution of one local step
is today's gradient. The per-step loss is :math:`L(\theta_{m,i}; b_i)`, at the weights the gradient is taken at.
The inner state :math:`s_0` is the state the learner kept from its previous round (DiLoCo, Douillard et al.,
arXiv 2311.08105: each worker keeps its inner AdamW; the paper's text on the inner state was not checked here) or
``InnerOpt.init(theta_j)`` when ``reset_inner_state`` is set (DeepMind's asynchronous DiLoCo notebook re-creates
the inner optimizer for every local run). The H steps are one ``jax.lax.scan`` over the leading axis of the
batches, or the same step written out H times (``unroll=True``): the code path is the same for every H, H = 1
included.

**Data order.** The caller passes the round's batches, a pytree whose leaves have a leading axis of size H.
Learner m's i-th inner step overall reads its i-th mini-batch: round r of learner m reads its batches
r H, ..., r H + H - 1 (with H = 1, batch r in round r, today's order).

**DiLoCo's synchronous outer step** (Douillard et al., arXiv 2311.08105, Algorithm 1): M learners each run a
local run from the same :math:`\theta`, and

.. math::
  \bar\Delta = \tfrac{1}{M} \textstyle\sum_m \Delta_m, \quad
  \theta \leftarrow \theta + \mathrm{OuterOpt}(\bar\Delta),

OuterOpt any optax transformation applied to :math:`\bar\Delta` as if it were a gradient; the paper's is
Nesterov SGD at rate 0.7 with momentum 0.9, ``optax.sgd(0.7, momentum=0.9, nesterov=True)``, whose update is
:math:`v \leftarrow \beta v + \bar\Delta`, :math:`\theta \leftarrow \theta - \eta(\beta v + \bar\Delta)`.
`diloco_round` does one such round for M learners on one device (``jax.vmap`` over a leading learners axis);
``stalesgd.decentral._diloco`` does it over a mesh with one learner per device. With M = 1 and outer SGD at rate 1
without momentum it is the inner optimizer alone, run for H steps.

Why in the transforms layer: the two programs that run local runs, the parameter-server engine
(``stalesgd.engine``) and the decentralized programs (``stalesgd.decentral``), may both import from here (the
engine may not import ``stalesgd.decentral``, which sits below it, docs/design.md), and like the transforms it
needs nothing but jax and optax and knows nothing of either program, so a user's own loop can call it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from stalesgd import _validation as validation

LossFn = Callable[[Any, Any], Any]


class LocalRun(NamedTuple):
  r"""What one learner's local run returns (`local_run`).

  Attributes:
    pseudo_gradient: :math:`\Delta_m = -\sum_i u_i`, the same structure and dtypes as the weights.
    params: :math:`\theta_{m,H}`, the learner's weights after its H steps.
    inner_state: the inner optimizer's state after the H steps.
    losses: ``[H]``, :math:`L(\theta_{m,i}; b_i)` for i = 0, ..., H - 1.
    aux: the loss function's auxiliary output stacked over the H steps (``[H, ...]`` leaves), or None without
      ``has_aux``.
  """

  pseudo_gradient: Any
  params: Any
  inner_state: Any
  losses: jax.Array
  aux: Any


class DiLoCoRound(NamedTuple):
  r"""What one synchronous DiLoCo round returns (`diloco_round`).

  Attributes:
    params: the outer weights after the outer step.
    outer_state: the outer optimizer's state after it.
    inner_states: every learner's inner state after its local run (leaves ``[M, ...]``).
    pseudo_gradients: every learner's :math:`\Delta_m` (leaves ``[M, ...]``); their mean is what OuterOpt took.
    losses: ``[M, H]``, each learner's per-step losses.
    aux: the loss function's auxiliary output, leaves ``[M, H, ...]``, or None without ``has_aux``.
  """

  params: Any
  outer_state: Any
  inner_states: Any
  pseudo_gradients: Any
  losses: jax.Array
  aux: Any


def local_steps(batches: Any) -> int:
  """H, the leading axis shared by every leaf of a round's batches.

  Raises:
    ValueError: naming ``batches``, when a leaf is a scalar, the leaves' leading axes differ, or it is 0.
  """
  sizes = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else 0 for leaf in jax.tree.leaves(batches)}
  if len(sizes) != 1 or 0 in sizes:
    shapes = [jnp.shape(leaf) for leaf in jax.tree.leaves(batches)]
    validation.reject("batches", shapes, "leaves sharing a leading axis of size H >= 1 (one mini-batch per step)")
  return sizes.pop()


def local_run(
  loss_fn: LossFn,
  inner_optimizer: optax.GradientTransformation,
  params: Any,
  inner_state: Any,
  batches: Any,
  *,
  reset_inner_state: bool = False,
  has_aux: bool = False,
  unroll: int | bool = 1,
  active_steps: Any = None,
  step_scales: Any = None,
) -> LocalRun:
  r"""One learner's local run of H inner steps from ``params`` (module docstring: the equations and sources).

  Pure and jit-able (the optimizer, loss and options are static; jit with them bound, e.g. by
  ``functools.partial``). It maps with ``jax.vmap`` over a leading learners axis of ``params``, ``inner_state``
  and ``batches``, and runs inside ``jax.shard_map`` with that axis sharded; there, weights that are replicated
  over the mesh axis must be cast to device-varying first (``jax.lax.pcast(params, axis, to="varying")``), or the
  gradient with respect to them comes back summed over the axis.

  Example::

    >>> import jax.numpy as jnp, optax
    >>> loss = lambda w, b: 0.5 * (w - b) ** 2  # gradient w - b
    >>> inner, theta = optax.sgd(0.5), jnp.float32(0)
    >>> run = local_run(loss, inner, theta, inner.init(theta), jnp.array([2.0, 4.0, -2.0]))  # H = 3
    >>> run.pseudo_gradient  # w: 0 -> 1 -> 2.5 -> 0.25, so Delta = 0 - 0.25
    Array(-0.25, dtype=float32)
    >>> run.losses
    Array([ 2.   ,  4.5  , 10.125], dtype=float32)

  Args:
    loss_fn: ``loss_fn(params, batch) -> loss`` (a scalar), or ``(loss, aux)`` with ``has_aux``, for one
      mini-batch.
    inner_optimizer: the learner's inner optimizer, any optax transformation; ``update`` receives the weights.
    params: :math:`\theta_j`, the outer weights the run starts from.
    inner_state: :math:`s_0`, the learner's inner state kept from its previous run (``inner_optimizer.init``
      for the first); ignored, and may be None, with ``reset_inner_state``.
    batches: the round's H mini-batches, a pytree whose leaves have a leading axis of size H (module
      docstring, *Data order*).
    reset_inner_state: start from ``inner_optimizer.init(params)`` instead of ``inner_state``.
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``.
    active_steps: None (every step), or H_m <= H (an int or a traced int32 scalar): only steps i < H_m are taken;
      the others leave the weights, the inner state and the sum unchanged, and ``losses`` holds 0 for them
      (dynamic local updates: a slower learner runs fewer steps of one program's H).
    step_scales: None, or ``[H]`` factors s_i: step i's update is :math:`s_i u_i` (weights and sum alike; the
      inner state is InnerOpt's own). For an optimizer whose rate is its last factor (optax's SGD, Adam, AdamW:
      ``scale_by_learning_rate`` last) built at rate :math:`\eta`, :math:`s_i = \eta_i / \eta` runs step i at
      rate :math:`\eta_i`: a schedule the caller keys to anything, e.g. a data shard's step count.
    unroll: ``jax.lax.scan``'s ``unroll``; True runs the H steps as straight-line code, without a loop (the
      same equations, and for H = 1 the very program of one gradient step, bit for bit; docs/design.md measured
      unrolled code faster for convolutions on the CPU).

  Returns:
    A `LocalRun`: :math:`\Delta_m`, :math:`\theta_{m,H}`, the inner state after the run, the per-step losses and
    aux. :math:`\Delta_m` is summed in each weight leaf's dtype.

  Raises:
    ValueError: naming the argument, when ``reset_inner_state`` or ``has_aux`` is not a bool, or the batches do
      not share a leading axis of size H >= 1.
  """
  validation.check_bool("reset_inner_state", reset_inner_state)
  validation.check_bool("has_aux", has_aux)
  local_steps(batches)
  if reset_inner_state:
    inner_state = inner_optimizer.init(params)
  value_and_grad = jax.value_and_grad(loss_fn, has_aux=has_aux)

  def inner_step(carry, inputs):
    batch, index = inputs
    weights, state, update_sum = carry
    value, grads = value_and_grad(weights, batch)
    loss, aux = value if has_aux else (value, None)
    updates, new_state = inner_optimizer.update(grads, state, weights)
    if step_scales is not None:
      updates = jax.tree.map(lambda update: (update * step_scales[index]).astype(update.dtype), updates)
    new_weights = optax.apply_updates(weights, updates)
    new_sum = jax.tree.map(lambda total, update: (total + update).astype(total.dtype), update_sum, updates)
    if active_steps is None:
      return (new_weights, new_state, new_sum), (loss, aux)
    active = index < active_steps
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(active, n, o), new, old)
    carry = (keep(new_weights, weights), keep(new_state, state), keep(new_sum, update_sum))
    return carry, (jnp.where(active, loss, 0.0), aux)

  # -0.0 is the exact additive identity (-0 + x = x for every x, signed zeros included), so with H = 1 the sum
  # is u_0 itself, bit for bit.
  start = (params, inner_state, jax.tree.map(lambda leaf: jnp.full_like(leaf, -0.0), params))
  if unroll is True:
    # Fully unrolled as straight-line code, not as a scan with unroll=True: a scan is still a loop for XLA, which
    # then compiles the gradient differently (other fusions, other roundings) than the same steps outside one.
    carry, outputs = start, []
    for step in range(local_steps(batches)):
      carry, output = inner_step(carry, (jax.tree.map(lambda leaf, i=step: leaf[i], batches), step))
      outputs.append(output)
    (weights, state, update_sum) = carry
    losses, aux = jax.tree.map(lambda *leaves: jnp.stack(leaves), *outputs)
  else:
    indices = jnp.arange(local_steps(batches))
    (weights, state, update_sum), (losses, aux) = jax.lax.scan(inner_step, start, (batches, indices), unroll=unroll)
  return LocalRun(jax.tree.map(jnp.negative, update_sum), weights, state, losses, aux)


def agreement(total_squared_norm: jax.Array, squared_norm_of_mean: jax.Array, learners: int) -> jax.Array:
  r"""How much M pseudo-gradients agree, from the sum of their squared norms and their mean's squared norm, without
  gathering them:

  .. math::
    a = \frac{\sum_{m \ne k} \Delta_m \cdot \Delta_k}{(M - 1) \sum_m \|\Delta_m\|^2}
      = \frac{M^2 \|\bar\Delta\|^2 - \sum_m \|\Delta_m\|^2}{(M - 1) \sum_m \|\Delta_m\|^2}

  the mean pairwise dot product over the mean squared norm: 1 for identical pseudo-gradients, 0 for orthogonal
  ones, -1/(M - 1) when they cancel (the mean pairwise cosine when all norms are equal). 1 for M = 1 or all zero.
  """
  total = total_squared_norm
  if learners == 1:
    return jnp.float32(1.0)
  value = (learners**2 * squared_norm_of_mean - total) / ((learners - 1) * total)
  return jnp.where(total > 0, value, 1.0)


def init_inner_states(inner_optimizer: optax.GradientTransformation, params: Any, num_learners: int) -> Any:
  """Every learner's first inner state, ``inner_optimizer.init(params)`` stacked on a leading axis of M.

  Raises:
    ValueError: naming ``num_learners``, when it is not an integer >= 1.
  """
  validation.check_integer("num_learners", num_learners, low=1)
  state = inner_optimizer.init(params)
  return jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (num_learners,) + jnp.shape(leaf)), state)


def outer_step(
  outer_optimizer: optax.GradientTransformation, params: Any, outer_state: Any, mean_pseudo_gradient: Any
) -> tuple[Any, Any]:
  r"""DiLoCo's outer step: :math:`\theta \leftarrow \theta + \mathrm{OuterOpt}(\bar\Delta)`, as (params, state).

  ``outer_optimizer.update`` receives :math:`\bar\Delta` as the gradient and :math:`\theta` as the weights.
  """
  updates, outer_state = outer_optimizer.update(mean_pseudo_gradient, outer_state, params)
  return optax.apply_updates(params, updates), outer_state


def diloco_round(
  loss_fn: LossFn,
  inner_optimizer: optax.GradientTransformation,
  outer_optimizer: optax.GradientTransformation,
  params: Any,
  outer_state: Any,
  inner_states: Any,
  batches: Any,
  *,
  reset_inner_state: bool = False,
  has_aux: bool = False,
  unroll: int | bool = 1,
) -> DiLoCoRound:
  r"""One synchronous DiLoCo round of M learners on one device (Douillard et al., arXiv 2311.08105, Algorithm 1).

  Every learner m runs `local_run` from the same :math:`\theta` on its own batches (``jax.vmap`` over the
  learners axis), then

  .. math::
    \bar\Delta = \tfrac{1}{M} \textstyle\sum_m \Delta_m, \quad
    \theta \leftarrow \theta + \mathrm{OuterOpt}(\bar\Delta)

  with the paper's OuterOpt ``optax.sgd(0.7, momentum=0.9, nesterov=True)``. Pure and jit-able with the loss,
  optimizers and options bound.

  Example::

    >>> import jax.numpy as jnp, optax
    >>> loss = lambda w, b: 0.5 * (w - b) ** 2
    >>> inner, outer = optax.sgd(0.5), optax.sgd(1.0)
    >>> theta = jnp.float32(0)
    >>> batches = jnp.array([[2.0, 4.0], [-2.0, 0.0]])  # [M = 2, H = 2]
    >>> out = diloco_round(loss, inner, outer, theta, outer.init(theta), init_inner_states(inner, theta, 2), batches)
    >>> out.pseudo_gradients  # learner 0: 0 -> 1 -> 2.5; learner 1: 0 -> -1 -> -0.5
    Array([-2.5,  0.5], dtype=float32)
    >>> out.params  # 0 - 1.0 * mean(-2.5, 0.5)
    Array(1., dtype=float32)

  Args:
    loss_fn: as `local_run`'s.
    inner_optimizer: every learner's inner optimizer.
    outer_optimizer: OuterOpt, any optax transformation, fed :math:`\bar\Delta` as a gradient.
    params: :math:`\theta`, the outer weights.
    outer_state: OuterOpt's state (``outer_optimizer.init(params)`` at first).
    inner_states: every learner's inner state, leaves ``[M, ...]`` (`init_inner_states` at first); ignored, and
      may be None, with ``reset_inner_state``.
    batches: every learner's batches for this round, leaves ``[M, H, ...]``: row m is learner m's batches
      r H, ..., r H + H - 1 in round r.
    reset_inner_state: as `local_run`'s.
    has_aux: as `local_run`'s.
    unroll: as `local_run`'s.

  Returns:
    A `DiLoCoRound`: the new outer weights and state, the learners' inner states, pseudo-gradients, losses and
    aux.
  """
  run = jax.vmap(
    lambda state, learner_batches: local_run(
      loss_fn,
      inner_optimizer,
      params,
      state,
      learner_batches,
      reset_inner_state=reset_inner_state,
      has_aux=has_aux,
      unroll=unroll,
    )
  )(inner_states, batches)
  mean = jax.tree.map(lambda delta: jnp.mean(delta, axis=0), run.pseudo_gradient)
  params, outer_state = outer_step(outer_optimizer, params, outer_state, mean)
  return DiLoCoRound(params, outer_state, run.inner_state, run.pseudo_gradient, run.losses, run.aux)
