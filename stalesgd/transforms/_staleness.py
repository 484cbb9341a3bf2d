"""Staleness-dependent scaling of gradients (staleness-aware learning rates).

A gradient computed at timestamp j and applied by server update u has
staleness sigma = u - j >= 0 (`stalesgd.schedule.Schedule.staleness_of`).
Scaling it by a weight s(sigma) <= 1 modulates the learning rate per
gradient: Zhang et al.'s alpha0 / sigma, Rudra's protocol-level
alpha0 / <sigma>, FedBuff's 1 / sqrt(1 + sigma), and the drop-stale threshold.
`staleness_weight` holds the rules as one pure function that the rest of the
package reuses; `scale_by_staleness` is the optax transform.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from stalesgd import _validation as validation
from stalesgd.transforms import _contributions as contributions
from stalesgd.transforms import _hyperparameters as hyperparameters

RULES = ("inverse", "inverse_mean", "polynomial", "exponential", "threshold", "hinge", "constant")
_RULES_WITH_MAX_STALENESS = ("threshold", "hinge")


def _check_rule(rule: str, max_staleness: Any) -> None:
  validation.check_choice("rule", rule, RULES)
  if rule in _RULES_WITH_MAX_STALENESS and max_staleness is None:
    raise ValueError(f"rule={rule!r} needs max_staleness (the largest staleness kept at weight 1).")


def _weight(rule, staleness, mean_staleness, exponent, rate, max_staleness, hinge_slope):
  """The unnormalised weight s(sigma) of `rule`, in float32."""
  staleness = jnp.asarray(staleness, jnp.float32)
  if rule == "constant":
    return jnp.ones_like(staleness)
  if rule == "inverse":
    # 1/sigma for sigma >= 1 and 1 at sigma = 0; max(., 1) extends it to fractional sigma.
    return 1.0 / jnp.maximum(staleness, 1.0)
  if rule == "inverse_mean":
    mean = jnp.asarray(mean_staleness, jnp.float32)
    return jnp.broadcast_to(1.0 / jnp.maximum(mean, 1.0), staleness.shape)
  if rule == "polynomial":
    return jnp.power(1.0 + staleness, -jnp.asarray(exponent, jnp.float32))
  if rule == "exponential":
    # e^(-b sigma) is 1 at sigma = 0 for every b, inf included (b = inf keeps only fresh gradients, as its
    # limit does); the product inf * 0 would make that NaN.
    return jnp.where(staleness == 0, 1.0, jnp.exp(-jnp.asarray(rate, jnp.float32) * staleness))
  kept = staleness <= max_staleness
  if rule == "threshold":
    return kept.astype(jnp.float32)
  # hinge
  beyond = jnp.maximum(staleness - max_staleness, 0.0)
  return jnp.where(kept, 1.0, 1.0 / (hinge_slope * beyond + 1.0))


def staleness_weight(
  rule: str,
  staleness: Any,
  *,
  mean_staleness: Any = None,
  exponent: Any = 0.5,
  rate: Any = 0.5,
  max_staleness: Any = None,
  hinge_slope: Any = 1.0,
  normalize: bool = False,
) -> jax.Array:
  r"""The weight :math:`s(\sigma)` that scales a gradient of staleness :math:`\sigma`.

  Rules (:math:`\langle\sigma\rangle` is ``mean_staleness``):

  * ``"inverse"``: :math:`1/\sigma` for :math:`\sigma > 0`, 1 at :math:`\sigma = 0`
    (Zhang et al., eq. 3; computed as :math:`1/\max(\sigma, 1)`).
  * ``"inverse_mean"``: :math:`1/\langle\sigma\rangle`, and 1 for
    :math:`\langle\sigma\rangle < 1`, the same for every gradient (Rudra's
    protocol-level rate :math:`\alpha_0/\langle\sigma\rangle`; *reconstructed*
    from the paper's abstract and secondary summaries).
  * ``"polynomial"``: :math:`(1 + \sigma)^{-a}`, :math:`a` = ``exponent``
    (FedBuff / FLSim, default :math:`a = 0.5`).
  * ``"exponential"``: :math:`e^{-b\sigma}`, :math:`b` = ``rate`` (1 at
    :math:`\sigma = 0` for every :math:`b`, :math:`b = \infty` included).
  * ``"threshold"``: 1 for :math:`\sigma \le \sigma_{max}`, else 0: the
    gradient is dropped (TensorFlow's DropStaleGradientOptimizer).
  * ``"hinge"``: 1 for :math:`\sigma \le \sigma_{max}`, else
    :math:`1/(h(\sigma - \sigma_{max}) + 1)`, :math:`h` = ``hinge_slope``
    (FedAsync's hinge, with :math:`\sigma_{max}` as its knee).
  * ``"constant"``: 1.

  With ``normalize``, the weight is divided by the rule's weight at
  :math:`\langle\sigma\rangle`, so that :math:`s(\langle\sigma\rangle) = 1`
  (FLSim's normalisation); where that weight is 0 (threshold rule with
  :math:`\langle\sigma\rangle > \sigma_{max}`) the weight is left unnormalised.

  Args:
    rule: One of `RULES`.
    staleness: Staleness, any shape (non-negative).
    mean_staleness: :math:`\langle\sigma\rangle`; required by ``"inverse_mean"``
      and by ``normalize``.
    exponent: :math:`a` of ``"polynomial"``.
    rate: :math:`b` of ``"exponential"``.
    max_staleness: :math:`\sigma_{max}` of ``"threshold"`` and ``"hinge"``.
    hinge_slope: :math:`h` of ``"hinge"``.
    normalize: Divide by the weight at ``mean_staleness``.

  Returns:
    float32 weights of the shape of ``staleness``.

  Raises:
    ValueError: for an unknown rule or a missing rule option.

  Example:
    >>> from stalesgd.transforms import staleness_weight
    >>> staleness_weight("inverse", [0, 1, 4])
    Array([1.  , 1.  , 0.25], dtype=float32)

  References:
    Zhang et al., `Staleness-aware Async-SGD for Distributed Deep Learning
    <https://arxiv.org/abs/1511.05950>`_, IJCAI 2016.
    Gupta et al., `Model Accuracy and Runtime Tradeoff in Distributed Deep
    Learning: A Systematic Study <https://arxiv.org/abs/1509.04210>`_, ICDM 2016.
    Nguyen et al., `Federated Learning with Buffered Asynchronous Aggregation
    <https://arxiv.org/abs/2106.06639>`_, AISTATS 2022.
    Xie et al., `Asynchronous Federated Optimization
    <https://arxiv.org/abs/1903.03934>`_, 2019.
  """
  _check_rule(rule, max_staleness)
  if mean_staleness is None and (rule == "inverse_mean" or normalize):
    raise ValueError(f"mean_staleness is required with rule={rule!r} and normalize={normalize}; got None.")
  options = (mean_staleness, exponent, rate, max_staleness, hinge_slope)
  weight = _weight(rule, staleness, *options)
  if not normalize:
    return weight
  weight_at_mean = _weight(rule, mean_staleness, *options)
  positive = weight_at_mean > 0
  return weight / jnp.where(positive, weight_at_mean, 1.0)


class ScaleByStalenessState(NamedTuple):
  """State of `scale_by_staleness`."""

  count: jax.Array  # Updates seen (int32); the argument of schedules.
  mean_staleness: jax.Array  # Running mean of every staleness observed so far (float32).
  contributions: jax.Array  # Number of staleness values in that mean (int32).
  dropped: jax.Array  # Gradients dropped by the threshold rule so far (int32).
  lr_scale: jax.Array  # Mean weight applied at the last update (float32); see `lr_scale`.


def scale_by_staleness(
  rule: str = "inverse",
  *,
  mean_staleness: optax.ScalarOrSchedule | None = None,
  exponent: optax.ScalarOrSchedule = 0.5,
  rate: optax.ScalarOrSchedule = 0.5,
  max_staleness: optax.ScalarOrSchedule | None = None,
  hinge_slope: optax.ScalarOrSchedule = 1.0,
  normalize: bool = False,
) -> optax.GradientTransformationExtraArgs:
  r"""Scales each gradient by a weight of its staleness.

  .. math::
    u = s(\sigma) \, g,

  with :math:`s` one of the rules of `staleness_weight`, and, for a stack of c
  contributions (see `stalesgd.transforms._contributions`),
  :math:`u_k = s(\sigma_k) g_k` for each k; follow with
  `average_contributions` to get Zhang et al.'s eq. 2,
  :math:`\frac{1}{c}\sum_k s(\sigma_k) g_k`.

  :math:`\langle\sigma\rangle` (for ``"inverse_mean"`` and ``normalize``) is
  ``mean_staleness`` when given, otherwise the running mean of every staleness
  observed before this update (0, hence weight 1, at the first update). The
  state is updated once per call: the running mean absorbs all c stalenesses,
  ``dropped`` counts the contributions the threshold rule zeroed, and
  ``lr_scale`` is the mean weight applied, :math:`\frac{1}{c}\sum_k s(\sigma_k)`
  (read it with `lr_scale`).

  The per-step input is the keyword-only extra argument ``staleness`` (an int
  scalar, or shape [c] for a stack). Without it the gradients pass unchanged
  (bit-for-bit) and ``lr_scale`` is 1. A dropped gradient becomes exactly
  0 even if it holds inf or NaN.

  Args:
    rule: One of ``"inverse"``, ``"inverse_mean"``, ``"polynomial"``,
      ``"exponential"``, ``"threshold"``, ``"hinge"``, ``"constant"``.
    mean_staleness: Fixed :math:`\langle\sigma\rangle` (e.g. n for
      n-softsync); None tracks it.
    exponent: :math:`a` of ``"polynomial"``.
    rate: :math:`b` of ``"exponential"``.
    max_staleness: :math:`\sigma_{max}` of ``"threshold"`` and ``"hinge"``.
    hinge_slope: :math:`h` of ``"hinge"``.
    normalize: Divide by the weight at :math:`\langle\sigma\rangle` so it is 1.

  Returns:
    An `optax.GradientTransformationExtraArgs`.

  Raises:
    ValueError: for an unknown rule, a missing ``max_staleness``, or a
      negative hyperparameter.

  Example:
    >>> import jax.numpy as jnp
    >>> import stalesgd
    >>> tx = stalesgd.scale_by_staleness("inverse")
    >>> state = tx.init(jnp.zeros(2))
    >>> updates, state = tx.update(jnp.array([3., 6.]), state, staleness=3)
    >>> updates
    Array([1., 2.], dtype=float32)

  References:
    Zhang et al. (eq. 2) and the sources of the rules, listed in `staleness_weight`.
  """
  _check_rule(rule, max_staleness)
  for name, value in (
    ("mean_staleness", mean_staleness),
    ("exponent", exponent),
    ("rate", rate),
    ("max_staleness", max_staleness),
    ("hinge_slope", hinge_slope),
  ):
    if validation.is_real(value):  # a schedule or an array (inject_hyperparams passes arrays) is not checked
      validation.check_real(name, value, low=0, allow_inf=True, note="or a schedule")

  def init_fn(params):
    del params
    return ScaleByStalenessState(
      count=jnp.zeros([], jnp.int32),
      mean_staleness=jnp.zeros([], jnp.float32),
      contributions=jnp.zeros([], jnp.int32),
      dropped=jnp.zeros([], jnp.int32),
      lr_scale=jnp.ones([], jnp.float32),
    )

  def update_fn(updates, state, params=None, *, staleness=None, **extra_args):
    del extra_args
    count = optax.safe_increment(state.count)
    if staleness is None:
      return updates, state._replace(count=count, lr_scale=jnp.ones([], jnp.float32))
    stack = contributions.Stack.of(updates, params, staleness=staleness)
    sigma = stack.stacked(jnp.asarray(staleness, jnp.float32))
    options = {
      name: hyperparameters.value_at(value, state.count)
      for name, value in (
        ("exponent", exponent),
        ("rate", rate),
        ("max_staleness", max_staleness),
        ("hinge_slope", hinge_slope),
      )
    }
    mean = state.mean_staleness if mean_staleness is None else hyperparameters.value_at(mean_staleness, state.count)
    weights = staleness_weight(rule, sigma, mean_staleness=mean, normalize=normalize, **options)
    scaled = stack.map(_scale, stack.stacked(updates), weights)  # u_k = s(sigma_k) g_k
    observed = state.contributions + sigma.size
    new_state = ScaleByStalenessState(
      count=count,
      mean_staleness=state.mean_staleness + (jnp.sum(sigma) - sigma.size * state.mean_staleness) / observed,
      contributions=observed,
      dropped=state.dropped + _drops(rule, sigma, options["max_staleness"]),
      lr_scale=jnp.mean(weights),
    )
    return scaled, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _scale(grads: Any, weight: jax.Array) -> Any:
  """s(sigma) g for one contribution (where, not a product: a dropped inf/NaN gradient becomes 0)."""
  return jax.tree.map(lambda leaf: jnp.where(weight == 0, 0, leaf * weight).astype(leaf.dtype), grads)


def _drops(rule: str, stalenesses: jax.Array, max_staleness: Any) -> jax.Array:
  """How many of `stalenesses` the rule drops (only the threshold rule drops)."""
  if rule != "threshold":
    return jnp.zeros([], jnp.int32)
  return jnp.sum(stalenesses > max_staleness).astype(jnp.int32)


def lr_scale(opt_state: Any) -> jax.Array:
  r"""The learning-rate scale that the staleness transforms in ``opt_state`` last applied.

  .. math::
    \mathrm{lr\_scale} = \prod_{j} \frac{1}{c} \sum_{k=1}^{c} s_j(\sigma_k),

  the product, over every `scale_by_staleness` state j in the tree, of the mean
  weight it applied to the c contributions of the last update (1 for a
  transform called without ``staleness``). With equal gradients
  :math:`g_k = g` it is the factor by which the staleness rules scaled the
  update :math:`\frac{1}{c}\sum_k s(\sigma_k) g_k`. The engine reports it
  per update as the ``lr_scale`` metric.

  Args:
    opt_state: An optimizer state (any pytree, e.g. of `optax.chain` or
      `optax.inject_hyperparams`).

  Returns:
    A float32 scalar; 1 if the state holds no `ScaleByStalenessState`.

  Example:
    >>> import jax.numpy as jnp
    >>> import stalesgd
    >>> tx = stalesgd.staleness_aware_sgd(learning_rate=0.1)
    >>> state = tx.init(jnp.zeros(2))
    >>> _, state = tx.update(jnp.ones((2, 2)), state, staleness=jnp.array([1, 4]))
    >>> stalesgd.lr_scale(state)  # (1/1 + 1/4) / 2
    Array(0.625, dtype=float32)
  """
  scale = jnp.float32(1.0)
  is_state = lambda node: isinstance(node, ScaleByStalenessState)
  for state in jax.tree.leaves(opt_state, is_leaf=is_state):
    if is_state(state):
      scale = scale * jnp.asarray(state.lr_scale, jnp.float32)
  return scale
