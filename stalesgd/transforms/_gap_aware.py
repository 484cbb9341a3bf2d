"""Gap-Aware: penalise each coordinate of a stale gradient by how far its weight moved.

Staleness counts updates; the Gap measures how far the weights actually moved
while the gradient was in flight, in units of a typical step, coordinate by
coordinate. A coordinate that barely moved keeps its gradient; one that moved
many typical steps has its gradient divided accordingly.

References:
  Barkai, Hakimi, Schuster, `Gap Aware Mitigation of Gradient Staleness
  <https://arxiv.org/abs/1909.10802>`_, ICLR 2020.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from stalesgd import _validation as validation
from stalesgd.transforms import _contributions as contributions
from stalesgd.transforms import _hyperparameters as hyperparameters
from stalesgd.transforms._moving_average import exponential_moving_average


class ScaleByGapAwareState(NamedTuple):
  """State of `scale_by_gap_aware`."""

  count: jax.Array  # Updates seen (int32); the argument of schedules.
  previous_params: Any  # The params passed at the previous update (at init: the initial params).
  step_size: Any  # EMA of |params_t - params_{t-1}| per coordinate, before bias correction.
  observed_steps: jax.Array  # Number of steps folded into step_size (int32).


def _typical_step(step_size: Any, observed_steps: jax.Array, decay: Any, min_step_size: Any) -> Any:
  """C: the bias-corrected EMA of the step sizes, floored at `min_step_size`.

  Before any step has been observed C is infinite: no penalty without a scale.
  """
  observed = observed_steps > 0
  correction = 1 - jnp.power(jnp.asarray(decay, jnp.float32), observed_steps)
  safe_correction = jnp.where(observed, correction, 1.0)

  def corrected(step):
    wide = step.astype(jnp.promote_types(step.dtype, jnp.float32))
    return jnp.where(observed, jnp.maximum(wide / safe_correction, min_step_size), jnp.inf)

  return jax.tree.map(corrected, step_size)


def _penalise(grad: jax.Array, displacement: jax.Array, step: jax.Array) -> jax.Array:
  """g / (1 + Gap) for one leaf, Gap = |w - w_stale| / C.

  The Gap is formed in float32 at least, so that the floor of C does not underflow in half precision.
  """
  wide = jnp.promote_types(step.dtype, jnp.float32)
  gap = jnp.abs(displacement).astype(wide) / step.astype(wide)
  return (grad / (1 + gap)).astype(grad.dtype)


def scale_by_gap_aware(
  decay: optax.ScalarOrSchedule = 0.99,
  *,
  min_step_size: optax.ScalarOrSchedule = 1e-12,
) -> optax.GradientTransformationExtraArgs:
  r"""Divides each gradient coordinate by one plus its Gap.

  .. math::
    \tilde g = \frac{g}{1 + |w - w_{stale}| / C},

  elementwise, with :math:`w` = ``params`` (current weights), :math:`w_{stale}`
  = ``stale_params`` (the weights the gradient was computed at), and :math:`C`
  the typical per-step movement of each coordinate.

  Choice of :math:`C` (the paper leaves room here; this is ours): the
  exponential moving average, with decay ``decay`` and Adam-style bias
  correction, of :math:`|w_t - w_{t-1}|` between consecutive calls, i.e. of
  the server's actual steps whatever the optimizer after this transform does
  (momentum, learning-rate schedules). The step observed at update t is the one
  that led to ``params``, so :math:`C` includes it. Where a coordinate has not
  moved yet, :math:`C` is floored at ``min_step_size``, which makes any Gap on
  it a large penalty. Before the first observed step (the first update after
  ``init``) there is no scale and no penalty. The state holds a copy of the
  previous params and the EMA: two extra copies of the weights.

  Stacks (see `stalesgd.transforms._contributions`): with ``stale_params``
  stacked along a leading axis of size c, contribution k is divided by its own
  Gap :math:`|w - w_{stale,k}|`; :math:`C` does not depend on the gradients, so
  a stack equals c separate calls. The step EMA is updated whenever ``params``
  is given, so :math:`C` is ready once stale gradients arrive; without
  ``stale_params`` the gradients pass unchanged.

  Args:
    decay: Decay of the step-size EMA, in [0, 1).
    min_step_size: Floor of :math:`C`.

  Returns:
    An `optax.GradientTransformationExtraArgs` taking the keyword-only extra
    argument ``stale_params``.

  Raises:
    ValueError: for a ``decay`` outside [0, 1), a negative ``min_step_size``,
      ``stale_params`` that do not match ``params`` (or ``params`` with a leading
      stack axis), or ``params=None`` with ``stale_params``.

  Example:
    >>> import jax.numpy as jnp
    >>> import stalesgd
    >>> tx = stalesgd.scale_by_gap_aware(decay=0.5)
    >>> params = jnp.array([0., 0.])
    >>> state = tx.init(params)
    >>> _, state = tx.update(jnp.ones(2), state, params)  # a fresh gradient
    >>> params = jnp.array([0.1, 0.])  # the server stepped: C = (0.1, floor)
    >>> stale = jnp.array([-0.1, 0.])
    >>> updates, state = tx.update(jnp.ones(2), state, params, stale_params=stale)
    >>> updates  # Gap (0.2 / 0.1, 0): divide by (3, 1)
    Array([0.33333334, 1.        ], dtype=float32)

  References:
    Barkai, Hakimi, Schuster, `Gap Aware Mitigation of Gradient Staleness
    <https://arxiv.org/abs/1909.10802>`_, ICLR 2020.
  """
  # A schedule or an array (inject_hyperparams passes arrays) is not checked.
  if validation.is_real(decay):
    validation.check_real("decay", decay, low=0, high=1, high_open=True, note="or a schedule")
  if validation.is_real(min_step_size):
    validation.check_real("min_step_size", min_step_size, low=0, allow_inf=True, note="or a schedule")

  def init_fn(params):
    return ScaleByGapAwareState(
      count=jnp.zeros([], jnp.int32),
      previous_params=jax.tree.map(jnp.asarray, params),
      step_size=optax.tree.zeros_like(params),
      observed_steps=jnp.zeros([], jnp.int32),
    )

  def update_fn(updates, state, params=None, *, stale_params=None, **extra_args):
    count = optax.safe_increment(state.count)
    stack = contributions.Stack.of(updates, params, staleness=extra_args.get("staleness"), stale_params=stale_params)
    del extra_args
    if params is None:
      return updates, state._replace(count=count)
    decay_now = hyperparameters.value_at(decay, state.count)
    # Before the first update the params have not stepped yet: nothing to observe.
    stepped = state.count > 0
    step_size = jax.tree.map(
      lambda ema, param, previous: jnp.where(
        stepped, exponential_moving_average(ema, jnp.abs(param - previous), decay_now), ema
      ),
      state.step_size,
      params,
      state.previous_params,
    )
    observed_steps = state.observed_steps + stepped.astype(jnp.int32)
    new_state = ScaleByGapAwareState(
      count=count,
      previous_params=jax.tree.map(jnp.asarray, params),
      step_size=step_size,
      observed_steps=observed_steps,
    )
    if stale_params is None:
      return updates, new_state
    typical_step = _typical_step(
      step_size, observed_steps, decay_now, hyperparameters.value_at(min_step_size, state.count)
    )

    def penalise(grads, displacement):  # g~_k = g_k / (1 + |w - w_stale,k| / C)
      return jax.tree.map(_penalise, grads, displacement, typical_step)

    penalised = stack.map(penalise, stack.stacked(updates), stack.displacements(params, stale_params))
    return penalised, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
