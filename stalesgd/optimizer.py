"""The optimizer of a run, built from its config.

For parameter-server protocols this is the *server* optimizer the engine calls
with a stack of c contributions (see `stalesgd.transforms.contributions`):

    per-contribution part:  scale_by_delay_compensation -> scale_by_staleness -> scale_by_gap_aware
    average_contributions()
    server part:            + weight decay (x per-layer decay multipliers)
                            x per-layer learning-rate multipliers
                            SGD with momentum, learning rate alpha_0 x step decay

Weight decay is added on the server at the current weights, after the average,
as a Caffe solver does (so DC corrects the loss gradient only; MXNet's DCASGD
instead adds weight decay before squaring). The learning-rate multipliers scale
the gradient before momentum, as Caffe's ``lr_mult`` does; optax then applies
momentum and the (decayed) learning rate, which equals Caffe's order for a
constant rate and differs only in how the momentum buffer straddles a decay step.

For decentralized protocols it is each worker's local optimizer (the server
part alone): DC-S3GD applies its correction itself.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax

from stalesgd import transforms
from stalesgd.config import DECENTRALIZED_PROTOCOLS
from stalesgd.models import ModelSpec


def scale_per_parameter(multipliers: Any) -> optax.GradientTransformation:
  """u <- m (.) u with a fixed pytree ``multipliers`` shaped like the updates (Caffe ``lr_mult``)."""

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map(lambda u, m: u * m, updates, multipliers), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def add_weight_decay(weight_decay: float, multipliers: Any | None = None) -> optax.GradientTransformation:
  """u <- u + weight_decay * m (.) w: L2 regularisation with per-parameter ``decay_mult`` m."""

  def update(updates, state, params=None):
    if params is None:
      raise ValueError("add_weight_decay needs params (the current weights)")
    if multipliers is None:
      decayed = jax.tree_util.tree_map(lambda u, w: u + weight_decay * w, updates, params)
    else:
      decayed = jax.tree_util.tree_map(lambda u, w, m: u + (weight_decay * m) * w, updates, params, multipliers)
    return decayed, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def learning_rate_schedule(config: ml_collections.ConfigDict, updates_per_epoch: float) -> optax.Schedule:
  """alpha_0, multiplied by ``lr_decay_factor`` at each of ``lr_decay_epochs``."""
  boundaries = {int(round(epoch * updates_per_epoch)): config.lr_decay_factor
                for epoch in sorted(config.lr_decay_epochs)}
  return optax.piecewise_constant_schedule(config.learning_rate, boundaries)


def per_contribution_transforms(config: ml_collections.ConfigDict) -> list[optax.GradientTransformation]:
  """The transforms a parameter server applies to each contribution before the average."""
  # Delay compensation first: it estimates the gradient at the current weights
  # from the raw stale gradient (its g*g term is not meant to see a rescaled g);
  # the staleness weight then scales the corrected gradient.
  parts = []
  if config.delay_compensation != "none":
    parts.append(transforms.scale_by_delay_compensation(
        dc_lambda=config.dc_lambda, adaptive=config.delay_compensation == "adaptive",
        decay=config.dc_decay, layerwise=config.delay_compensation == "layerwise",
        num_learners=config.learners if config.dc_per_learner_mean_square else None))
  if config.staleness_rule != "none":
    parts.append(transforms.scale_by_staleness(
        config.staleness_rule, mean_staleness=config.staleness_mean, exponent=config.staleness_exponent,
        decay=config.staleness_decay, max_staleness=config.staleness_threshold,
        normalize=config.staleness_normalize))
  if config.gap_aware:
    parts.append(transforms.scale_by_gap_aware())
  return parts


def build_optimizer(config: ml_collections.ConfigDict, *, model: ModelSpec, params: Any,
                    updates_per_epoch: float) -> optax.GradientTransformation:
  """The run's optimizer (server optimizer, or local optimizer for decentralized protocols)."""
  server = []
  if config.weight_decay > 0:
    server.append(add_weight_decay(config.weight_decay,
                                   model.weight_decay_multipliers(params) if config.model_multipliers else None))
  if config.model_multipliers:
    server.append(scale_per_parameter(model.learning_rate_multipliers(params)))
  momentum = config.momentum if config.momentum > 0 else None
  server.append(optax.sgd(learning_rate_schedule(config, updates_per_epoch), momentum=momentum,
                          nesterov=config.nesterov))
  if config.protocol in DECENTRALIZED_PROTOCOLS:
    return optax.chain(*server)
  return optax.chain(*per_contribution_transforms(config), transforms.average_contributions(), *server)
