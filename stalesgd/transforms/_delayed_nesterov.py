r"""Delayed Nesterov: the outer optimizer of asynchronous local SGD (Liu et al., arXiv 2401.09135).

An asynchronous outer loop applies each learner's pseudo-gradient as it arrives; Nesterov momentum updated at
every arrival amplifies stale directions. Delayed Nesterov updates the momentum only once every N applications,
with their mean, and in between applies each pseudo-gradient with a fraction c of the momentum. For the t-th
pseudo-gradient :math:`g_t` (t = 0, 1, ...; after the staleness weight, if any), a buffer
:math:`\Delta` and momentum :math:`m` (both 0 at first):

.. math::
  \Delta \leftarrow \Delta + g_t; \quad
  \text{if } (t+1) \bmod N = 0: \;
    m \leftarrow \beta m + \Delta / N, \;
    d_t = (1 - cN + c)\, \beta m + g_t / N, \;
    \Delta \leftarrow 0; \quad
  \text{else: } d_t = c\, \beta m + g_t / N

and the step is :math:`\theta \leftarrow \theta - \eta\, d_t` (`delayed_nesterov`; `scale_by_delayed_nesterov`
returns :math:`d_t`). With N = 1 and c = 0 it is Nesterov SGD, :math:`m \leftarrow \beta m + g_t`,
:math:`d_t = \beta m + g_t` (`optax.sgd(eta, beta, nesterov=True)`).

Source: the paper's algorithm as HALoS (Kim et al., ICML 2025) implements it in ``src/halos/opt.py``
(``DelayedNesterovOptimizer``, citing arXiv 2401.09135); the paper's own text was not checked here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from stalesgd import _validation as validation


class DelayedNesterovState(NamedTuple):
  """State of `scale_by_delayed_nesterov`.

  Attributes:
    count: t, the pseudo-gradients applied so far (int32).
    momentum: m, updated once every ``buffer_size`` applications.
    buffer: Delta, the sum of the pseudo-gradients since the last momentum update.
  """

  count: jax.Array
  momentum: Any
  buffer: Any


def scale_by_delayed_nesterov(
  momentum: float = 0.9, buffer_size: int = 1, activation: float = 0.0
) -> optax.GradientTransformation:
  r"""The direction :math:`d_t` of delayed Nesterov (see the module docstring for the equation and source).

  Args:
    momentum: :math:`\beta`.
    buffer_size: N >= 1, the applications between momentum updates (a Python int: static, so
      `optax.inject_hyperparams` must name it in ``static_args``).
    activation: c in [0, 1], the share of the momentum applied between its updates.

  Returns:
    A transformation whose update is :math:`d_t` (chain `optax.scale_by_learning_rate` for the step).

  Raises:
    ValueError: naming the argument, for ``buffer_size`` < 1 or not an int, or momentum / activation outside
      [0, 1].
  """
  validation.check_integer("buffer_size", buffer_size, low=1, builtin_only=True)
  for name, value in (("momentum", momentum), ("activation", activation)):  # arrays (inject_hyperparams) pass
    if isinstance(value, bool) or validation.is_real(value):
      validation.check_real(name, value, low=0, high=1)

  def init(params):
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return DelayedNesterovState(count=jnp.zeros([], jnp.int32), momentum=zeros, buffer=zeros)

  def update(updates, state, params=None):
    del params
    size = buffer_size
    beta, c = momentum, activation
    at_update = (state.count + 1) % size == 0
    buffer = jax.tree_util.tree_map(lambda delta, g: delta + g, state.buffer, updates)
    new_momentum = jax.tree_util.tree_map(
      lambda m, delta: jnp.where(at_update, beta * m + delta / size, m), state.momentum, buffer
    )
    direction = jax.tree_util.tree_map(
      lambda m, g: jnp.where(at_update, (1 - c * size + c) * beta * m, c * beta * m) + g / size,
      new_momentum,
      updates,
    )
    buffer = jax.tree_util.tree_map(lambda delta: jnp.where(at_update, jnp.zeros_like(delta), delta), buffer)
    return direction, DelayedNesterovState(state.count + 1, new_momentum, buffer)

  return optax.GradientTransformation(init, update)


def delayed_nesterov(
  learning_rate: optax.ScalarOrSchedule, momentum: float = 0.9, buffer_size: int = 1, activation: float = 0.0
) -> optax.GradientTransformation:
  r"""Delayed Nesterov as an optimizer: :math:`\theta \leftarrow \theta - \eta d_t` (module docstring).

  Example::

    >>> import jax.numpy as jnp, stalesgd
    >>> tx = stalesgd.delayed_nesterov(0.7, momentum=0.9, buffer_size=2, activation=0.5)
    >>> params = {"w": jnp.zeros(2)}
    >>> updates, state = tx.update({"w": jnp.ones(2)}, tx.init(params))
    >>> updates["w"]  # t = 0 is not a momentum update: -0.7 (0.5 * 0.9 * 0 + 1 / 2)
    Array([-0.35, -0.35], dtype=float32)
  """
  return optax.chain(
    scale_by_delayed_nesterov(momentum=momentum, buffer_size=buffer_size, activation=activation),
    optax.scale_by_learning_rate(learning_rate),
  )
