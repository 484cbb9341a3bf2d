"""scale_by_staleness, staleness_weight, staleness_aware_sgd: hand-computed values, reductions."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd

GRADS = jnp.array([2.0, -4.0])


def run_steps(transform, stalenesses, grads=GRADS):
  """Updates of `transform` for one gradient per staleness, and the final state."""
  state = transform.init(jnp.zeros_like(grads))
  updates = []
  for staleness in stalenesses:
    update, state = transform.update(grads, state, staleness=staleness)
    updates.append(np.asarray(update))
  return np.stack(updates), state


# Weights worked out by hand for the staleness sequence of each case.
HAND_COMPUTED = [
  ("inverse", {}, [0, 2, 4], [1.0, 1 / 2, 1 / 4]),
  # <sigma> before each update: 0 (weight 1), then 2 (1/2), then (2 + 4) / 2 = 3 (1/3).
  ("inverse_mean", {}, [2, 4, 0], [1.0, 1 / 2, 1 / 3]),
  ("inverse_mean", {"mean_staleness": 4.0}, [0, 9, 1], [1 / 4, 1 / 4, 1 / 4]),
  ("inverse_mean", {"mean_staleness": 0.5}, [0, 3], [1.0, 1.0]),
  ("polynomial", {"exponent": 0.5}, [3, 8, 0], [1 / 2, 1 / 3, 1.0]),
  ("polynomial", {"exponent": 1.0}, [1, 3], [1 / 2, 1 / 4]),
  ("exponential", {"rate": math.log(2.0)}, [1, 3, 0], [1 / 2, 1 / 8, 1.0]),
  ("threshold", {"max_staleness": 2}, [1, 3, 2], [1.0, 0.0, 1.0]),
  # 1 / (0.5 * (sigma - 2) + 1) beyond the knee at 2.
  ("hinge", {"max_staleness": 2, "hinge_slope": 0.5}, [4, 1, 8], [1 / 2, 1.0, 1 / 4]),
  ("constant", {}, [0, 7, 30], [1.0, 1.0, 1.0]),
  # Normalised by (1 + 3)^-1/2 = 1/2, the weight at <sigma> = 3.
  ("polynomial", {"mean_staleness": 3.0, "normalize": True}, [0, 3, 8], [2.0, 1.0, 2 / 3]),
  # Tracked <sigma>: 0 (weight at it 1), then 2 (weight 1/2), then 2 again.
  ("inverse", {"normalize": True}, [2, 2, 4], [1 / 2, 1.0, 1 / 2]),
]


@pytest.mark.parametrize(
  "rule, options, stalenesses, weights", HAND_COMPUTED, ids=[f"{case[0]}-{i}" for i, case in enumerate(HAND_COMPUTED)]
)
def test_hand_computed_weights_over_three_steps(rule, options, stalenesses, weights):
  updates, state = run_steps(stalesgd.scale_by_staleness(rule, **options), stalenesses)
  np.testing.assert_allclose(updates, np.outer(weights, GRADS), rtol=1e-6)
  assert int(state.count) == len(stalenesses)
  np.testing.assert_allclose(float(state.lr_scale), weights[-1], rtol=1e-6)


def test_staleness_weight_is_the_same_rule_as_the_transform():
  stalenesses = jnp.arange(6)
  np.testing.assert_allclose(
    stalesgd.staleness_weight("inverse", stalenesses), [1, 1, 1 / 2, 1 / 3, 1 / 4, 1 / 5], rtol=1e-7
  )
  np.testing.assert_allclose(
    stalesgd.staleness_weight("threshold", stalenesses, max_staleness=3, normalize=True, mean_staleness=5.0),
    [1, 1, 1, 1, 0, 0],
  )  # the weight at <sigma> is 0: left unnormalised


# Each rule option's default, by hand at staleness 3, for staleness_weight, scale_by_staleness and
# staleness_aware_sgd alike (each function has its own defaults): (rule, options, weight, rtol of float32).
DEFAULT_OPTION_CASES = [
  ("polynomial", {}, 0.5, 1e-7),  # (1 + 3)^-0.5: exponent 0.5
  ("exponential", {}, math.exp(-1.5), 1e-6),  # e^(-0.5 * 3): rate 0.5
  ("hinge", {"max_staleness": 1}, 1.0 / 3.0, 1e-7),  # 1 / (1 * (3 - 1) + 1): hinge_slope 1
]


@pytest.mark.parametrize("rule, options, weight, rtol", DEFAULT_OPTION_CASES)
def test_staleness_weights_default_options_by_hand(rule, options, weight, rtol):
  np.testing.assert_allclose(stalesgd.staleness_weight(rule, [3.0], **options), [weight], rtol=rtol)


@pytest.mark.parametrize("rule, options, weight", [case[:3] for case in DEFAULT_OPTION_CASES])
def test_scale_by_stalenesss_default_options_by_hand(rule, options, weight):
  transform = stalesgd.scale_by_staleness(rule, **options)
  updates, _ = transform.update(jnp.array([3.0, 6.0]), transform.init(jnp.zeros(2)), staleness=3)
  np.testing.assert_allclose(updates, [weight * 3.0, weight * 6.0], rtol=1e-6)


def test_the_hinge_at_a_fractional_staleness_past_its_knee():
  """sigma = 1.5, sigma_max = 1, h = 1: 1 / (1 x 0.5 + 1) = 2/3 (the inverse rule, too, takes fractional sigma)."""
  np.testing.assert_allclose(stalesgd.staleness_weight("hinge", [1.5], max_staleness=1), [2 / 3], rtol=1e-7)


def test_a_rule_named_by_a_string_built_at_run_time_is_still_checked():
  """A rule read from a config is equal to, not the same object as, the literal: inverse_mean still needs its
  mean."""
  rule = "".join(["inverse", "_mean"])
  with pytest.raises(ValueError, match="mean_staleness is required"):
    stalesgd.staleness_weight(rule, [1.0])


@pytest.mark.parametrize("rule", stalesgd.STALENESS_RULES)
def test_a_rule_named_by_a_string_built_at_run_time_gives_the_literals_weights(rule):
  built = "".join(list(rule))  # equal, another object
  # (A knee at 1 would make the hinge 1/sigma, the inverse rule's weights.)
  options = {"mean_staleness": 2.0, "max_staleness": 2}
  stalenesses = jnp.array([0.0, 1.0, 3.0, 4.0])
  np.testing.assert_array_equal(
    stalesgd.staleness_weight(built, stalenesses, **options), stalesgd.staleness_weight(rule, stalenesses, **options)
  )


def test_a_threshold_named_by_a_string_built_at_run_time_counts_its_drops():
  transform = stalesgd.scale_by_staleness("".join(["thresh", "old"]), max_staleness=2)
  _, state = transform.update(GRADS, transform.init(GRADS), staleness=3)
  assert int(state.dropped) == 1
  _, state = transform.update(jnp.stack([GRADS] * 3), state, staleness=jnp.array([0, 4, 5]))
  assert int(state.dropped) == 3  # two more in one update
  _, state = transform.update(GRADS, state, staleness=0)
  assert int(state.dropped) == 3  # none


def test_staleness_is_a_keyword_only_argument_and_so_are_the_rules_options():
  transform = stalesgd.scale_by_staleness("inverse")
  with pytest.raises(TypeError):
    transform.update(GRADS, transform.init(GRADS), None, 3)
  with pytest.raises(TypeError):
    stalesgd.staleness_weight("inverse_mean", [1.0], 2.0)  # mean_staleness by position


def test_lr_scale_is_the_product_of_every_staleness_states_mean_weight():
  """One transform: (1/1 + 1/4) / 2 = 0.625; chained with a second (inverse_mean at <sigma> = 2: 1/2): 0.3125."""
  one = stalesgd.scale_by_staleness("inverse")
  _, state = one.update(jnp.ones((2, 2)), one.init(jnp.zeros(2)), staleness=jnp.array([1, 4]))
  assert float(stalesgd.lr_scale(state)) == 0.625
  two = optax.chain(one, stalesgd.scale_by_staleness("inverse_mean", mean_staleness=2.0))
  _, state = two.update(jnp.ones((2, 2)), two.init(jnp.zeros(2)), staleness=jnp.array([1, 4]))
  assert float(stalesgd.lr_scale(state)) == 0.3125


def test_lr_scale_is_one_without_a_staleness_transform():
  assert float(stalesgd.lr_scale(optax.sgd(0.1).init(jnp.zeros(2)))) == 1.0
  assert float(stalesgd.lr_scale(())) == 1.0


def test_threshold_counts_drops_and_zeroes_non_finite_dropped_gradients():
  transform = stalesgd.scale_by_staleness("threshold", max_staleness=2)
  state = transform.init(GRADS)
  _, state = transform.update(GRADS, state, staleness=3)
  assert int(state.dropped) == 1  # 3 > 2
  stack = jnp.array([[1.0, 1.0], [jnp.inf, jnp.nan], [3.0, 3.0]])
  updates, state = transform.update(stack, state, staleness=jnp.array([1, 5, 2]))
  np.testing.assert_array_equal(updates, [[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]])
  assert int(state.dropped) == 2
  np.testing.assert_allclose(float(state.lr_scale), 2 / 3, rtol=1e-6)


def test_running_mean_absorbs_every_staleness_of_a_stack():
  transform = stalesgd.scale_by_staleness("inverse_mean")
  state = transform.init(GRADS)
  stack = jnp.stack([GRADS] * 3)
  updates, state = transform.update(stack, state, staleness=jnp.array([1, 2, 3]))
  np.testing.assert_allclose(updates, stack)  # <sigma> was 0 before this update
  _, state = transform.update(GRADS, state, staleness=5)
  np.testing.assert_allclose(float(state.mean_staleness), (1 + 2 + 3 + 5) / 4, rtol=1e-7)
  assert int(state.contributions) == 4
  updates, _ = transform.update(GRADS, state, staleness=0)
  np.testing.assert_allclose(updates, GRADS / 2.75, rtol=1e-6)


def test_scheduled_exponent_follows_the_update_count():
  transform = stalesgd.scale_by_staleness("polynomial", exponent=lambda count: count + 1.0)
  updates, _ = run_steps(transform, [1, 1, 1])
  np.testing.assert_allclose(updates, np.outer([1 / 2, 1 / 4, 1 / 8], GRADS), rtol=1e-6)


def test_without_staleness_it_is_the_identity_bit_for_bit():
  transform = stalesgd.scale_by_staleness("polynomial", normalize=True, mean_staleness=3.0)
  grads = jnp.array([0.1, -3.3e-8, 7.0], jnp.bfloat16)
  updates, state = transform.update(grads, transform.init(grads))
  assert updates is grads
  assert float(state.lr_scale) == 1.0


@pytest.mark.parametrize("rule", stalesgd.STALENESS_RULES)
def test_stack_equals_separate_calls_then_mean(rule):
  options = {"max_staleness": 2} if rule in ("threshold", "hinge") else {}
  transform = optax.chain(stalesgd.scale_by_staleness(rule, **options), stalesgd.average_contributions())
  grads = jnp.array([[1.0, 2.0], [-3.0, 0.5], [4.0, 4.0]])
  stalenesses = jnp.array([0, 3, 1])
  state = transform.init(grads[0])
  _, state = transform.update(grads[0], state, staleness=2)  # a non-trivial state
  stacked, _ = transform.update(grads, state, staleness=stalenesses)
  separate = [transform.update(grads[k], state, staleness=stalenesses[k])[0] for k in range(3)]
  np.testing.assert_allclose(stacked, np.mean(separate, axis=0), rtol=1e-6)


@pytest.mark.parametrize("rule", stalesgd.STALENESS_RULES)
def test_stack_of_one_equals_the_unstacked_call_bit_for_bit(rule):
  options = {"max_staleness": 2} if rule in ("threshold", "hinge") else {}
  transform = stalesgd.scale_by_staleness(rule, **options)
  grads = {"w": jnp.array([1.0, 2.0, -3.0]), "b": jnp.array(0.7)}
  state = transform.init(grads)
  single, single_state = transform.update(grads, state, staleness=3)
  stacked, stacked_state = transform.update(
    jax.tree.map(lambda leaf: leaf[None], grads), state, staleness=jnp.array([3])
  )
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b[0]), single, stacked)
  jax.tree.map(np.testing.assert_array_equal, single_state, stacked_state)


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_staleness_zero_is_plain_sgd_bit_for_bit(momentum, nesterov):
  params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array(0.5)}
  reference = optax.sgd(0.1, momentum=momentum or None, nesterov=nesterov)
  for rule in ("inverse", "polynomial", "inverse_mean"):
    transform = stalesgd.staleness_aware_sgd(0.1, momentum=momentum, nesterov=nesterov, rule=rule)
    ours, theirs = params, params
    our_state, their_state = transform.init(params), reference.init(params)
    for step in range(4):
      grads = jax.tree.map(lambda leaf: jnp.sin(leaf * (step + 1)), ours)
      our_updates, our_state = transform.update(grads, our_state, ours, staleness=0)
      their_updates, their_state = reference.update(grads, their_state, theirs)
      ours = optax.apply_updates(ours, our_updates)
      theirs = optax.apply_updates(theirs, their_updates)
      jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def test_done_when_staleness_aware_sgd_numbers():
  transform = stalesgd.staleness_aware_sgd(learning_rate=0.1, momentum=0.5)
  params = jnp.array([1.0, 2.0])
  old = jnp.array([0.0, 0.0])
  state = transform.init(params)
  updates, state = transform.update(jnp.array([3.0, 6.0]), state, params, staleness=3, stale_params=old)
  np.testing.assert_allclose(updates, [-0.1, -0.2], rtol=1e-6)  # -0.1 * g / 3
  updates, state = transform.update(jnp.array([4.0, 4.0]), state, params, staleness=2, stale_params=old)
  # momentum: m = g/2 + 0.5 * m_prev = (2, 2) + (0.5, 1); update = -0.1 * m
  np.testing.assert_allclose(updates, [-0.25, -0.3], rtol=1e-6)


def test_zhang_eq2_on_a_stack():
  transform = stalesgd.staleness_aware_sgd(learning_rate=1.0)
  grads = jnp.array([[2.0], [6.0], [8.0]])
  updates, _ = transform.update(grads, transform.init(grads[0]), staleness=jnp.array([0, 2, 4]))
  np.testing.assert_allclose(updates, [-(2.0 + 3.0 + 2.0) / 3], rtol=1e-6)


@pytest.mark.parametrize(
  "factory_kwargs, message",
  [
    ({"rule": "inverse_square"}, r"rule='inverse_square'; allowed: one of \('inverse', "),
    ({"rule": "threshold"}, "needs max_staleness"),
    ({"rule": "hinge"}, "needs max_staleness"),
    ({"rule": "polynomial", "exponent": -1.0}, r"exponent=-1\.0; allowed: a number >= 0 \(inf allowed\) or a schedule"),
    ({"rule": "inverse_mean", "mean_staleness": -2.0}, r"mean_staleness=-2\.0; allowed: a number >= 0"),
  ],
)
def test_bad_factory_arguments_raise(factory_kwargs, message):
  with pytest.raises(ValueError, match=message):
    stalesgd.scale_by_staleness(**factory_kwargs)


def test_bad_staleness_shapes_raise():
  transform = stalesgd.scale_by_staleness()
  state = transform.init(GRADS)
  with pytest.raises(ValueError, match="staleness must be a scalar or have shape"):
    transform.update(GRADS, state, staleness=jnp.zeros((2, 2), jnp.int32))
  with pytest.raises(ValueError, match="leading axis of size 3"):
    transform.update(GRADS, state, staleness=jnp.zeros(3, jnp.int32))
  with pytest.raises(ValueError, match="mean_staleness is required"):
    stalesgd.staleness_weight("inverse_mean", 3)


# Every rule's hyperparameters at ordinary and edge values (0, 1, large, inf), and stalenesses from 0 to int32's
# largest: the weights, hence `lr_scale` (their mean, which `modulated_step` divides by and tests with > 0), are
# never negative, NaN or infinite.
EDGE_VALUES = {
  "exponent": (0.0, 0.5, 1.0, 100.0, math.inf),
  "rate": (0.0, math.log(2.0), 1.0, 100.0, math.inf),
  "max_staleness": (0.0, 1.0, 3.0, math.inf),
  "hinge_slope": (0.0, 0.5, 1e38, math.inf),
  # 87 and 100 put e^(-sigma) at <sigma> near and below float32's smallest normal number.
  "mean_staleness": (0.0, 0.5, 3.0, 87.0, 100.0, 1e6, math.inf),
}
READS = {
  "inverse": (),
  "inverse_mean": (),
  "polynomial": ("exponent",),
  "exponential": ("rate",),
  "threshold": ("max_staleness",),
  "hinge": ("max_staleness", "hinge_slope"),
  "constant": (),
}
# One staleness per call, then a stack of three; the running mean goes from 0 up to about 2^31 and back.
STALENESS_SEQUENCE = (0, 1, 2, 7, 100, 2**31 - 1, 0, jnp.array([0, 3, 2**20]), 5)


def _lr_scales_and_updates(rule, normalize, columns):
  """lr_scale and the updates of unit gradients after each call of STALENESS_SEQUENCE, one row per grid point."""

  def run(options):
    tx = stalesgd.scale_by_staleness(rule, normalize=normalize, **options)
    state = tx.init(jnp.zeros(2))
    scales, updates = [], []
    for staleness in STALENESS_SEQUENCE:
      grads = jnp.ones((jnp.size(staleness), 2)) if jnp.ndim(staleness) else jnp.ones(2)
      update, state = tx.update(grads, state, staleness=staleness)
      scales.append(stalesgd.lr_scale(state))
      updates.append(jnp.ravel(update))
    return jnp.stack(scales), jnp.concatenate(updates)

  return jax.jit(jax.vmap(run))(columns)


@pytest.mark.parametrize("tracked_mean", [True, False], ids=["running-mean", "fixed-mean"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("rule", stalesgd.transforms._staleness.RULES)
def test_lr_scale_is_non_negative_and_finite_for_every_rule_on_a_grid_of_edge_values(rule, normalize, tracked_mean):
  names = READS[rule] + (() if tracked_mean else ("mean_staleness",))
  grid = list(itertools.product(*(EDGE_VALUES[name] for name in names)))
  columns = {name: jnp.array([point[i] for point in grid], jnp.float32) for i, name in enumerate(names)}
  if not columns:  # a rule without hyperparameters and the running mean: one grid point
    columns = {"hinge_slope": jnp.ones(1, jnp.float32)}
  scales, updates = map(np.asarray, _lr_scales_and_updates(rule, normalize, columns))
  assert scales.shape == (len(grid), len(STALENESS_SEQUENCE))
  assert np.all(np.isfinite(scales)) and np.all(scales >= 0)
  assert np.all(np.isfinite(updates)) and np.all(updates >= 0)  # the weights themselves (unit gradients)


def test_exponential_rule_with_an_infinite_rate_keeps_fresh_gradients_only():
  """e^(-b sigma) at b = inf: 1 at sigma = 0 (not inf * 0 = NaN), 0 beyond; normalised at <sigma> = 2 it is left
  unnormalised (its weight there is 0)."""
  for normalize in (False, True):
    weights = stalesgd.staleness_weight(
      "exponential", jnp.array([0, 1, 5]), rate=math.inf, mean_staleness=2.0, normalize=normalize
    )
    np.testing.assert_array_equal(weights, [1.0, 0.0, 0.0])
  updates, state = run_steps(stalesgd.scale_by_staleness("exponential", rate=math.inf), [0, 3, 0])
  np.testing.assert_array_equal(updates, np.outer([1.0, 0.0, 1.0], GRADS))
  assert float(state.lr_scale) == 1.0


# ---------------------------------------------------------------- the alias's defaults, by hand


def _has_momentum_buffer(state) -> bool:
  is_trace = lambda node: isinstance(node, optax.TraceState)
  return any(is_trace(node) for node in jax.tree.leaves(state, is_leaf=is_trace))


@pytest.mark.parametrize("rule, options, weight", [case[:3] for case in DEFAULT_OPTION_CASES])
def test_staleness_aware_sgds_default_rule_options_by_hand(rule, options, weight):
  tx = stalesgd.staleness_aware_sgd(0.1, rule=rule, **options)
  updates, _ = tx.update(jnp.array([3.0, 6.0]), tx.init(jnp.zeros(2)), staleness=3)
  np.testing.assert_allclose(updates, [-0.1 * weight * 3.0, -0.1 * weight * 6.0], rtol=1e-6)


def test_staleness_aware_sgd_keeps_no_momentum_by_default_and_no_buffer_at_zero():
  tx = stalesgd.staleness_aware_sgd(0.1)
  state = tx.init(jnp.zeros(2))
  assert not _has_momentum_buffer(state) and not _has_momentum_buffer(stalesgd.staleness_aware_sgd(0.1, 0).init(0.0))
  assert _has_momentum_buffer(stalesgd.staleness_aware_sgd(0.1, 0.9).init(jnp.zeros(2)))
  _, state = tx.update(jnp.array([3.0, 6.0]), state, staleness=1)
  second, _ = tx.update(jnp.array([1.0, 2.0]), state, staleness=2)
  np.testing.assert_allclose(second, [-0.1 * 1.0 / 2, -0.1 * 2.0 / 2], rtol=1e-7)  # the first left nothing behind


@pytest.mark.parametrize("alias", [stalesgd.staleness_aware_sgd, stalesgd.dc_asgd])
def test_the_aliases_refuse_a_momentum_outside_0_to_1(alias):
  for momentum in (-0.5, 1.5, math.nan):
    with pytest.raises(ValueError, match=r"momentum=.*; allowed: a finite number >= 0 and <= 1 or a schedule or None"):
      alias(0.1, momentum=momentum)
  for momentum in (0, 0.0, 0.9, 1.0, None, optax.constant_schedule(0.9)):
    alias(0.1, momentum=momentum)
