"""Ready-made optimizers for stale gradients: staleness-aware SGD and DC-ASGD.

Each is a chain of a per-contribution transform, `average_contributions` (which
reduces a stack of c gradients to their mean and is the identity otherwise),
and optax's SGD, ending like optax's aliases in the learning-rate scaling.
"""

from __future__ import annotations

import numbers
from typing import Any

import optax

from stalesgd import _validation as validation
from stalesgd.transforms import _contributions as contributions
from stalesgd.transforms import _delay_compensation as delay_compensation
from stalesgd.transforms import _staleness as staleness


def _server_sgd(
  learning_rate: optax.ScalarOrSchedule, momentum: Any, nesterov: bool
) -> optax.GradientTransformationExtraArgs:
  """optax.sgd, without a momentum buffer when momentum is the number 0.

  Raises:
    ValueError: for a momentum number outside [0, 1] (a schedule or None is not checked).
  """
  if validation.is_real(momentum):
    validation.check_real("momentum", momentum, low=0, high=1, note="or a schedule or None")
  if isinstance(momentum, numbers.Real) and momentum == 0:
    momentum = None
  return optax.sgd(learning_rate, momentum=momentum, nesterov=nesterov)


def staleness_aware_sgd(
  learning_rate: optax.ScalarOrSchedule,
  momentum: optax.ScalarOrSchedule | None = 0.0,
  *,
  nesterov: bool = False,
  rule: str = "inverse",
  mean_staleness: optax.ScalarOrSchedule | None = None,
  exponent: optax.ScalarOrSchedule = 0.5,
  rate: optax.ScalarOrSchedule = 0.5,
  max_staleness: optax.ScalarOrSchedule | None = None,
  hinge_slope: optax.ScalarOrSchedule = 1.0,
  normalize: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""SGD whose learning rate depends on each gradient's staleness.

  .. math::
    w \leftarrow w - \alpha_0 \, \mathrm{SGD}\Big(\frac{1}{c} \sum_{k=1}^{c} s(\sigma_k) \, g_k\Big)

  Zhang et al.'s eq. 2 with the per-gradient rate :math:`\alpha(\sigma) =
  \alpha_0 s(\sigma)`; with ``rule="inverse"``, :math:`s(\sigma) = 1/\sigma`
  (eq. 3). :math:`\mathrm{SGD}` is optax's momentum (identity when
  ``momentum`` is 0), applied on the server after the average. For the
  papers' weight decay, chain ``optax.add_decayed_weights(wd)`` *before* this
  optimizer: the decay term then joins each gradient before its staleness
  weight, so the modulated rate covers the whole step, as in Rudra's Caffe
  solver (docs/semantics.md; `stalesgd.training._optimizer` builds that solver exactly,
  with Caffe's learning rate inside the momentum buffer). The extra
  argument ``staleness`` is an int, or shape [c] for a stack of c gradients
  (leading axis c on every gradient leaf). Without ``staleness``, or with
  staleness 0, this is `optax.sgd` bit-for-bit.

  Args:
    learning_rate: :math:`\alpha_0`, the hardsync learning rate.
    momentum: Momentum decay; 0 keeps no momentum buffer.
    nesterov: Nesterov momentum.
    rule: The staleness rule (see `staleness_weight`).
    mean_staleness: Fixed :math:`\langle\sigma\rangle`, or None to track it.
    exponent: Exponent of ``"polynomial"``.
    rate: Rate of ``"exponential"``.
    max_staleness: Knee of ``"threshold"`` and ``"hinge"``.
    hinge_slope: Slope of ``"hinge"``.
    normalize: Make the weight at :math:`\langle\sigma\rangle` equal 1.

  Returns:
    An `optax.GradientTransformationExtraArgs`.

  Example:
    >>> import jax.numpy as jnp
    >>> import stalesgd
    >>> tx = stalesgd.staleness_aware_sgd(learning_rate=0.1)
    >>> params = jnp.array([1., 2.])
    >>> state = tx.init(params)
    >>> grads = jnp.array([3., 6.])
    >>> updates, state = tx.update(grads, state, params, staleness=3)
    >>> updates  # -0.1 * grads / 3
    Array([-0.1, -0.2], dtype=float32)

  References:
    Zhang et al., `Staleness-aware Async-SGD for Distributed Deep Learning
    <https://arxiv.org/abs/1511.05950>`_, IJCAI 2016.
  """
  return optax.chain(
    staleness.scale_by_staleness(
      rule,
      mean_staleness=mean_staleness,
      exponent=exponent,
      rate=rate,
      max_staleness=max_staleness,
      hinge_slope=hinge_slope,
      normalize=normalize,
    ),
    contributions.average_contributions(),
    _server_sgd(learning_rate, momentum, nesterov),
  )


def dc_asgd(
  learning_rate: optax.ScalarOrSchedule,
  dc_lambda: optax.ScalarOrSchedule = 0.04,
  *,
  adaptive: bool = False,
  momentum: optax.ScalarOrSchedule | None = 0.0,
  nesterov: bool = False,
  decay: optax.ScalarOrSchedule = 0.95,
  eps: optax.ScalarOrSchedule = 1e-7,
  layerwise: bool = False,
  num_learners: int | None = None,
  bias_correction: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""Asynchronous SGD with delay compensation (DC-ASGD-c, DC-ASGD-a).

  .. math::
    w \leftarrow w - \eta \, \mathrm{SGD}\Big(\frac{1}{c} \sum_{k=1}^{c}
    g_k + \lambda_t \, g_k \odot g_k \odot (w - w_{bak,k})\Big)

  with :math:`\lambda_t` constant (DC-ASGD-c), :math:`\lambda_0 /
  \sqrt{\mathrm{MeanSquare} + \epsilon}` (``adaptive``, DC-ASGD-a) or
  layer-wise; see `scale_by_delay_compensation` for the conventions. The extra
  argument ``stale_params`` holds the weights each gradient was computed at
  (``params`` are the current weights); for a stack, stack it and the
  gradients along a leading axis c. Without ``stale_params``, or with
  ``dc_lambda=0`` or ``stale_params=params``, this is `optax.sgd`.

  Args:
    learning_rate: :math:`\eta`.
    dc_lambda: :math:`\lambda_0` (paper: 0.04 for DC-ASGD-c, 2 for DC-ASGD-a).
    adaptive: DC-ASGD-a.
    momentum: Momentum decay; 0 keeps no momentum buffer.
    nesterov: Nesterov momentum.
    decay: MeanSquare decay :math:`m` (adaptive only).
    eps: :math:`\epsilon` (adaptive only).
    layerwise: Layer-wise :math:`\lambda`.
    num_learners: One MeanSquare per learner (adaptive only; pass ``learner``).
    bias_correction: Divide MeanSquare by its blend weight (adaptive only; an
      ablation, not the paper's rule: see `scale_by_delay_compensation`).

  Returns:
    An `optax.GradientTransformationExtraArgs`.

  Example:
    >>> import jax.numpy as jnp
    >>> import stalesgd
    >>> tx = stalesgd.dc_asgd(learning_rate=0.1, dc_lambda=0.5)
    >>> params = jnp.array([1., 1.])
    >>> state = tx.init(params)
    >>> grads, old = jnp.array([1., 2.]), jnp.array([0., 2.])
    >>> updates, state = tx.update(grads, state, params, staleness=3, stale_params=old)
    >>> updates  # -0.1 * (g + 0.5 * g * g * (params - old))
    Array([-0.15, -0.  ], dtype=float32)

  References:
    Zheng et al., `Asynchronous Stochastic Gradient Descent with Delay
    Compensation <https://arxiv.org/abs/1609.08326>`_, ICML 2017.
  """
  return optax.chain(
    delay_compensation.scale_by_delay_compensation(
      dc_lambda=dc_lambda,
      adaptive=adaptive,
      decay=decay,
      eps=eps,
      layerwise=layerwise,
      num_learners=num_learners,
      bias_correction=bias_correction,
    ),
    contributions.average_contributions(),
    _server_sgd(learning_rate, momentum, nesterov),
  )
