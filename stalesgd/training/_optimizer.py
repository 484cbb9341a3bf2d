r"""The optimizer of a run, built from its config: the papers' solver, exactly.

For parameter-server protocols this is the *server* optimizer the engine calls
with a stack of c contributions (see `stalesgd.transforms._contributions`). It
is Rudra's server, a Caffe SGD solver whose learning rate the staleness rule
modulates per gradient (docs/semantics.md, "What the learning rate covers"):

.. math::
  v \leftarrow \mu_m v + \alpha_t\, m_{lr} \odot \frac{1}{c} \sum_{k=1}^{c}
    s(\sigma_k)\, q_k\big(\tilde g_k + wd\, m_{wd} \odot w\big), \qquad
  w \leftarrow w - v

* :math:`\tilde g_k` is the loss gradient after delay compensation
  (DC-ASGD: :math:`g_k + \lambda_t g_k \odot g_k \odot (w - w_{bak,k})`); the
  correction sees the loss gradient only, as in the DC-ASGD paper's pseudo-code.
* :math:`wd\, m_{wd} \odot w` is weight decay at the server's current weights,
  with Caffe's per-layer ``decay_mult``; it is added to every contribution
  *before* the staleness weight, so the modulated rate covers the whole step of
  the gradient, as it does in a Caffe solver whose rate is changed.
* :math:`s(\sigma_k)` is the staleness rule's weight and :math:`q_k` Gap-Aware's
  per-coordinate penalty (both 1 when off).
* :math:`m_{lr}` is Caffe's per-layer ``lr_mult``, :math:`\alpha_t` the
  learning rate :math:`\alpha_0` times ``lr_decay_factor`` per decay boundary
  passed, :math:`\mu_m` the momentum. The learning rate enters the momentum
  buffer (Caffe's order, also MXNet's): a decay step changes new
  contributions only, not what the buffer already holds. With Nesterov the step
  is Caffe's NesterovSolver, :math:`(1+\mu_m) v_{new} - \mu_m v_{old}`.

``weight_decay_placement="unmodulated"`` is an ablation, not a paper's rule:
weight decay is added once after the staleness-weighted average, at the full
rate :math:`\alpha_t` (this library's behaviour before docs/semantics.md).

For decentralized protocols the same solver is each learner's local optimizer,
without the per-contribution part: DC-S3GD applies its correction itself.

``config.optimizer`` other than ``"sgd"`` (Adam, LAMB, a user's factory;
`stalesgd.training._solvers`) replaces the Caffe solver A; the staleness weights
still act on each contribution before the average, but their mean
:math:`\bar s` and ``lr_mult`` scale A's *step*, which an adaptive optimizer
would otherwise normalise away (`stalesgd.modulated_step`):

.. math::
  u = \bar s\, m_{lr} \odot A\Big(\frac{1}{c} \sum_{k=1}^{c}
    \frac{s(\sigma_k)}{\bar s}\, q_k \big(\tilde g_k + wd\, m_{wd} \odot w\big)\Big)
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from stalesgd import _validation as validation
from stalesgd import transforms
from stalesgd.models import ModelSpec
from stalesgd.training import _solvers as solvers
from stalesgd.training._config_readers import dc_lambda, is_decentralized
from stalesgd.training._run_config import DELAY_COMPENSATIONS, WEIGHT_DECAY_PLACEMENTS
from stalesgd.training._solvers import CAFFE_SGD


def scale_per_parameter(multipliers: Any) -> optax.GradientTransformation:
  """u <- m (.) u with a fixed pytree ``multipliers`` shaped like the updates (Caffe ``lr_mult``)."""

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map(lambda u, m: u * m, updates, multipliers), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def add_weight_decay(weight_decay: float, multipliers: Any | None = None) -> optax.GradientTransformation:
  """u <- u + weight_decay * m (.) w: L2 regularisation with per-parameter ``decay_mult`` m.

  ``w`` is ``params``, the current weights. A stack of contributions (a leading
  axis c on every update leaf) gets the same term added to each contribution,
  by broadcasting.
  """

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("add_weight_decay needs params (the current weights)")
    if multipliers is None:
      decay = jax.tree_util.tree_map(lambda w: weight_decay * w, params)
    else:
      decay = jax.tree_util.tree_map(lambda w, m: (weight_decay * m) * w, params, multipliers)
    return jax.tree_util.tree_map(lambda u, d: (u + d).astype(u.dtype), updates, decay), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def caffe_sgd(
  learning_rate: optax.ScalarOrSchedule, momentum: Any = 0.0, nesterov: bool = False
) -> optax.GradientTransformation:
  r"""Caffe's SGD solver: the learning rate is applied before the momentum buffer.

  .. math::
    v_t = \mu\, v_{t-1} + \alpha_t\, g_t, \qquad u_t = -v_t

  and, with ``nesterov``, :math:`u_t = -\big((1+\mu) v_t - \mu v_{t-1}\big) =
  -(\alpha_t g_t + \mu v_t)` (Caffe's NesterovSolver). For a constant rate this
  equals `optax.sgd`; across a decay step the buffer keeps the old rate's
  contributions, as Caffe's does, where `optax.sgd` rescales them. Momentum 0
  keeps no buffer.
  """
  steps = [optax.scale_by_learning_rate(learning_rate)]
  if not (isinstance(momentum, numbers.Real) and momentum == 0):
    steps.append(optax.trace(decay=momentum, nesterov=nesterov))
  return optax.chain(*steps)


def warmup_updates(config: ml_collections.ConfigDict, updates_per_epoch: float) -> int:
  """W: the updates of the warm-up, ``warmup_epochs`` of applied samples rounded (at least 1 when on, 0 off)."""
  if config.warmup_epochs <= 0:
    return 0
  return max(1, int(round(config.warmup_epochs * updates_per_epoch)))


def learning_rate_schedule(config: ml_collections.ConfigDict, updates_per_epoch: float) -> optax.Schedule:
  r"""alpha_0, multiplied by ``lr_decay_factor`` at each of ``lr_decay_epochs``, after an optional warm-up.

  Boundaries are epochs of applied samples converted to server updates
  (`stalesgd.training.updates_per_epoch`); the rate of update u (counted from 0)
  is decayed once u >= the boundary.

  Warm-up (Goyal et al. 2017, arXiv 1706.02677, Sec. 2.2 "gradual warmup"):
  with ``warmup_epochs`` > 0 the first W = round(warmup_epochs x updates per
  epoch) updates take

  .. math::
    \alpha_u = \alpha_{start} + (\alpha_0 - \alpha_{start})\, u / W, \qquad u = 0, \dots, W - 1,

  with :math:`\alpha_{start}` = ``warmup_learning_rate`` (the small-batch
  rate), and update W onwards the decay schedule (the warm-up ends before the
  first decay, `validate_config`).

  Raises:
    ValueError: if two decay epochs fall on the same update (each must decay
      once, and a dict of boundaries would silently keep only one).
  """
  updates = [int(round(epoch * updates_per_epoch)) for epoch in sorted(config.lr_decay_epochs)]
  if len(set(updates)) < len(updates):
    raise ValueError(
      f"config.lr_decay_epochs={tuple(config.lr_decay_epochs)!r} falls on server updates {updates} "
      f"({updates_per_epoch:g} updates per epoch); allowed: epochs at distinct updates"
    )
  decayed = optax.piecewise_constant_schedule(
    config.learning_rate, {update: config.lr_decay_factor for update in updates}
  )
  warmup = warmup_updates(config, updates_per_epoch)
  if warmup == 0:
    return decayed
  start, end = config.warmup_learning_rate, config.learning_rate

  def schedule(count):
    ramp = start + (end - start) * jnp.asarray(count, jnp.float32) / warmup
    return jnp.where(count < warmup, ramp, decayed(count))

  return schedule


def delay_compensation_transforms(config: ml_collections.ConfigDict) -> list[optax.GradientTransformation]:
  """DC-ASGD's correction of each contribution's loss gradient ([] when off).

  Raises:
    ValueError: naming ``config.delay_compensation`` and the allowed modes, for any other mode (a config that did
      not go through `validate_config` must not fall through to the constant correction).
  """
  validation.check_choice("config.delay_compensation", config.delay_compensation, DELAY_COMPENSATIONS)
  if config.delay_compensation == "none":
    return []
  return [
    transforms.scale_by_delay_compensation(
      dc_lambda=dc_lambda(config),
      adaptive=config.delay_compensation == "adaptive",
      decay=config.dc_decay,
      layerwise=config.delay_compensation == "layerwise",
      num_learners=config.learners if config.dc_per_learner_mean_square else None,
      bias_correction=config.dc_mean_square_bias_correction,
    )
  ]


def staleness_modulation_transforms(config: ml_collections.ConfigDict) -> list[optax.GradientTransformation]:
  """The staleness weight and Gap-Aware's penalty of each contribution ([] when off)."""
  parts = []
  if config.staleness_rule != "none":
    parts.append(
      transforms.scale_by_staleness(
        config.staleness_rule,
        mean_staleness=config.staleness_mean,
        exponent=config.staleness_exponent,
        rate=config.staleness_decay,
        max_staleness=config.staleness_threshold,
        normalize=config.staleness_normalize,
      )
    )
  if config.gap_aware:
    parts.append(transforms.scale_by_gap_aware())
  return parts


def build_optimizer(
  config: ml_collections.ConfigDict, *, model: ModelSpec, params: Any, updates_per_epoch: float
) -> optax.GradientTransformation:
  """The run's optimizer (server optimizer, or local optimizer for decentralized protocols).

  See the module docstring for the equation. Parameter-server chain:
  delay compensation -> weight decay -> staleness weight -> Gap-Aware ->
  average over the c contributions -> ``lr_mult`` -> Caffe SGD with momentum
  (with ``weight_decay_placement="unmodulated"``, weight decay moves after the
  average). With another ``config.optimizer`` (`stalesgd.training._solvers`)
  the staleness modulation and ``lr_mult`` act on that solver's step
  (`stalesgd.modulated_step`): u = s_bar * m_lr * A((1/c) sum_k (s_k / s_bar) g~_k).
  """
  decay = []
  if config.weight_decay > 0:
    decay.append(
      add_weight_decay(
        config.weight_decay, model.weight_decay_multipliers(params) if config.model_multipliers else None
      )
    )
  lr_mult = [scale_per_parameter(model.learning_rate_multipliers(params))] if config.model_multipliers else []
  schedule = learning_rate_schedule(config, updates_per_epoch)
  correct, modulate = delay_compensation_transforms(config), staleness_modulation_transforms(config)
  average = [transforms.average_contributions()]
  if config.optimizer != CAFFE_SGD:
    solver = solvers.build_solver(
      config.optimizer,
      schedule,
      dict(config.optimizer_options.items()),
      momentum=config.momentum,
      nesterov=config.nesterov,
    )
    if is_decentralized(config):
      return optax.chain(*decay, solver, *lr_mult)
    return transforms.modulated_step(optax.chain(*correct, *decay, *modulate, *average), optax.chain(solver, *lr_mult))
  solver = [*lr_mult, caffe_sgd(schedule, momentum=config.momentum, nesterov=config.nesterov)]
  if is_decentralized(config):
    return optax.chain(*decay, *solver)
  if config.weight_decay_placement == "modulated":
    return optax.chain(*correct, *decay, *modulate, *average, *solver)
  if config.weight_decay_placement == "unmodulated":
    return optax.chain(*correct, *modulate, *average, *decay, *solver)
  validation.reject("config.weight_decay_placement", config.weight_decay_placement, f"one of {WEIGHT_DECAY_PLACEMENTS}")
