r"""`modulated_step`: the staleness rule's learning-rate modulation on any optimizer's *step*.

Zhang et al. modulate SGD's learning rate per gradient (eq. 2),

.. math::
  u = -\frac{\alpha}{c} \sum_{k=1}^{c} s(\sigma_k)\, g_k
    = -\alpha\, \bar s \cdot \frac{1}{c} \sum_{k=1}^{c} \frac{s(\sigma_k)}{\bar s}\, g_k,
  \qquad \bar s = \frac{1}{c} \sum_{k=1}^{c} s(\sigma_k).

For SGD it makes no difference whether the weights act on the gradients or the step. An adaptive optimizer
A (Adam, LAMB, RMSProp, ...) normalises its input, so a scale on the gradient is lost: with c = 1 Adam's step
would not change at all. `modulated_step` keeps the two roles apart:

.. math::
  u = \bar s \cdot A\Big(\frac{1}{c} \sum_{k=1}^{c} \frac{s(\sigma_k)}{\bar s}\, \tilde g_k\Big),

* ``weighting`` computes :math:`\frac{1}{c}\sum_k s(\sigma_k) \tilde g_k` (delay compensation, weight decay,
  `scale_by_staleness`, Gap-Aware, then `average_contributions`): within a stack the weights still act
  before the average;
* :math:`\bar s` is `lr_scale` of ``weighting``'s state (the mean weight the staleness rules applied; 1
  without one); the average is divided by it before A and A's step is multiplied by it: the rule sets the
  step size;
* with :math:`\bar s = 0` (every contribution dropped by the threshold rule) nothing is applied and A's state
  does not advance.

For plain SGD (A = -alpha g) this equals the chain ``weighting`` then A to float rounding.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from stalesgd.transforms._staleness import lr_scale


class ModulatedStepState(NamedTuple):
  """State of `modulated_step`: the weighting chain's and the optimizer's."""

  weighting: Any
  solver: Any


def modulated_step(
  weighting: optax.GradientTransformation, solver: optax.GradientTransformation
) -> optax.GradientTransformationExtraArgs:
  r"""The staleness rule's scale :math:`\bar s` on ``solver``'s step, not on its input (module docstring).

  Args:
    weighting: the per-contribution part, ending in `average_contributions`; its extra arguments
      (``staleness``, ``stale_params``, ``learner``) come from the caller.
    solver: any optax optimizer (e.g. ``optax.adam(1e-3)``), called with the normalised average and
      ``params``.

  Returns:
    An `optax.GradientTransformationExtraArgs` whose update is :math:`\bar s \cdot A(\cdot)`.

  Example::

    tx = stalesgd.modulated_step(
      optax.chain(stalesgd.scale_by_staleness("inverse"), stalesgd.average_contributions()), optax.adam(1e-3)
    )
    updates, state = tx.update(grads, state, params, staleness=4)  # Adam's step times 1/4
  """
  weighting = optax.with_extra_args_support(weighting)

  def init_fn(params):
    return ModulatedStepState(weighting.init(params), solver.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    averaged, weighting_state = weighting.update(updates, state.weighting, params, **extra_args)
    scale = lr_scale(weighting_state)

    def step(solver_state):
      normalised = jax.tree.map(lambda leaf: (leaf / scale).astype(leaf.dtype), averaged)
      out, solver_state = solver.update(normalised, solver_state, params)
      return jax.tree.map(lambda leaf: (leaf * scale).astype(leaf.dtype), out), solver_state

    def nothing(solver_state):
      return jax.tree.map(jnp.zeros_like, averaged), solver_state

    out, solver_state = jax.lax.cond(scale > 0, step, nothing, state.solver)
    return out, ModulatedStepState(weighting_state, solver_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
