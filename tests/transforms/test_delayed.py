"""stalesgd.delayed: a gradient applied tau calls later, with its own weights; equal to the engine's round robin."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd
from stalesgd import engine as engine_lib
from stalesgd import schedule as schedule_lib
from stalesgd.parallel import _sharding as sharding_lib
from tests.helpers.engine_oracle import MODELS, Data, max_relative_error

TOLERANCE = 1e-5  # the engine tests' float32 tolerance: the same arithmetic, fused differently by XLA
LEARNING_RATE = 0.05


def _server_optimizer() -> optax.GradientTransformation:
  """alpha0/sigma and DC-ASGD-a together, so both staleness and stale_params matter."""
  return optax.chain(
    stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True, decay=0.95),
    stalesgd.scale_by_staleness("inverse"),
    stalesgd.average_contributions(),
    optax.sgd(LEARNING_RATE, momentum=0.9),
  )


def _probe() -> optax.GradientTransformationExtraArgs:
  """An inner transform whose update shows what it was given: -(g + 100 staleness + 1000 stale_w); counts calls."""

  def update(grads, count, params=None, *, staleness, stale_params, **extra):
    del params, extra
    return {"w": -(grads["w"] + 100.0 * staleness + 1000.0 * stale_params["w"])}, count + 1

  return optax.GradientTransformationExtraArgs(lambda params: jnp.zeros((), jnp.int32), update)


def test_each_gradient_is_applied_tau_calls_later_with_its_own_weights_by_hand():
  tx = stalesgd.delayed(_probe(), staleness=2)
  params = {"w": jnp.float32(0.5)}
  state = tx.init(params)
  grads = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
  # Worked by hand (tau = 2): calls 0, 1 apply nothing; call t >= 2 applies g_{t-2}, computed at w_{t-2}, with
  # staleness min(t - 2, 2):
  #   call 2: -(1 + 0 + 1000 * 0.5)        = -501     w = -500.5
  #   call 3: -(2 + 100 + 1000 * 0.5)      = -602     w = -1102.5
  #   call 4: -(4 + 200 + 1000 * 0.5)      = -704     w = -1806.5
  #   call 5: -(8 + 200 + 1000 * -500.5)   = 500292   w = 498485.5
  expected_updates = [0.0, 0.0, -501.0, -602.0, -704.0, 500292.0]
  expected_weights = [0.5, 0.5, -500.5, -1102.5, -1806.5, 498485.5]
  for call, grad in enumerate(grads):
    updates, state = tx.update({"w": jnp.float32(grad)}, state, params)
    params = optax.apply_updates(params, updates)
    assert float(updates["w"]) == expected_updates[call], call
    assert float(params["w"]) == expected_weights[call], call
  assert int(state.inner_state) == 4  # the inner transform advanced only on the 4 applied gradients
  assert int(state.count) == 6


def test_zero_delay_is_the_inner_transform_itself():
  inner = optax.chain(stalesgd.scale_by_staleness("inverse"), optax.sgd(0.1, momentum=0.9))
  tx = stalesgd.delayed(inner, staleness=0)
  params, reference = {"w": jnp.arange(3.0)}, {"w": jnp.arange(3.0)}
  state, reference_state = tx.init(params), inner.init(reference)
  for step in range(4):
    grads = {"w": jnp.full(3, 0.5 * step + 1.0)}
    updates, state = tx.update(grads, state, params)
    expected, reference_state = inner.update(grads, reference_state, reference)
    np.testing.assert_array_equal(updates["w"], expected["w"])
    params, reference = optax.apply_updates(params, updates), optax.apply_updates(reference, expected)
    assert int(state.count) == step + 1  # the calls are counted at tau = 0 too


def test_bad_delays_are_refused():
  for staleness in (-1, 1.5, True):
    with pytest.raises(ValueError, match="staleness=.*allowed: an integer >= 0"):
      stalesgd.delayed(optax.sgd(0.1), staleness=staleness)
  with pytest.raises(ValueError, match="needs params"):
    tx = stalesgd.delayed(optax.sgd(0.1), staleness=1)
    tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))


@pytest.mark.slow
@pytest.mark.parametrize("tau", [1, 3])
def test_a_users_loop_with_delayed_equals_the_engines_round_robin_async(tau):
  learners, num_updates = tau + 1, 60
  timing = schedule_lib.TimingModel(jitter="deterministic")
  schedule = schedule_lib.simulate("async", learners=learners, num_updates=num_updates, seed=0, timing=timing)
  # The deterministic schedule is round robin: update u applies learner (u mod lambda)'s (u div lambda)-th
  # gradient with staleness min(u, tau).
  updates = np.arange(num_updates)
  np.testing.assert_array_equal(schedule.learner[:, 0], updates % learners)
  np.testing.assert_array_equal(schedule.batch_index[:, 0], updates // learners)
  np.testing.assert_array_equal(schedule.staleness[:, 0], np.minimum(updates, tau))

  loss_fn, init_params, input_shape = MODELS["mlp"]
  data = Data(input_shape)

  engine = engine_lib.Engine(loss_fn, _server_optimizer(), mesh=sharding_lib.learner_mesh())
  plan = engine.plan(schedule)
  expected = engine.run(engine.init(init_params(), plan), plan, data).params

  tx = stalesgd.delayed(_server_optimizer(), staleness=tau)
  gradient = jax.jit(jax.grad(loss_fn))
  step = jax.jit(lambda grads, state, params: tx.update(grads, state, params))
  params = jax.tree.map(jnp.asarray, init_params())
  state = tx.init(params)
  for t in range(num_updates + tau):  # the loop's t-th batch: learner (t mod lambda)'s batch (t div lambda)
    batch = jax.tree.map(lambda leaf: leaf[0], data(np.array([t % learners]), np.array([t // learners])))
    updates_t, state = step(gradient(params, batch), state, params)
    params = optax.apply_updates(params, updates_t)
  assert max_relative_error(params, expected) <= TOLERANCE


# Per-gradient delays (max_delay=D, delay=d_s at each call): g_s is due at call s + d_s; the due gradients form one
# stack. The example below has calls with none due (0, 2) and calls with two due (3, 5):
#   call:      0    1    2    3    4    5
#   delay d_s: 1    2    2    0    1    0
#   due at:    1    3    4    3    5    5
#   applies:   -    g0   -    g1,g3  g2   g4,g5
# A gradient's staleness is U(t) - U(s), the updates applied before its own call t minus those applied before its
# arrival s: g0: 0 - 0; g1: 1 - 0 (call 1's update came after w_1 was read); g3: 1 - 1; g2: 2 - 1; g4: 3 - 2; g5: 0.
DELAYS = [1, 2, 2, 0, 1, 0]


@pytest.mark.slow
def test_per_gradient_delays_by_hand_with_sgd():
  inner = optax.chain(stalesgd.scale_by_staleness("constant"), stalesgd.average_contributions(), optax.sgd(0.5))
  tx = stalesgd.delayed(inner, max_delay=2)
  params = {"w": jnp.array([1.0, 2.0, 3.0])}
  state = tx.init(params)
  grads = [[2, 0, 0], [0, 4, 0], [0, 0, 6], [2, 2, 2], [4, 0, 0], [0, 0, 2]]
  # w <- w - 0.5 * mean(due gradients):
  #   call 1: -0.5 * g0             = [-1, 0, 0]           w = [0, 2, 3]
  #   call 3: -0.5 * (g1 + g3) / 2  = [-0.5, -1.5, -0.5]   w = [-0.5, 0.5, 2.5]
  #   call 4: -0.5 * g2             = [0, 0, -3]           w = [-0.5, 0.5, -0.5]
  #   call 5: -0.5 * (g4 + g5) / 2  = [-1, 0, -0.5]        w = [-1.5, 0.5, -1]
  expected_weights = [[1, 2, 3], [0, 2, 3], [0, 2, 3], [-0.5, 0.5, 2.5], [-0.5, 0.5, -0.5], [-1.5, 0.5, -1]]
  for call, (grad, delay) in enumerate(zip(grads, DELAYS)):
    updates, state = tx.update({"w": jnp.array(grad, jnp.float32)}, state, params, delay=delay)
    params = optax.apply_updates(params, updates)
    np.testing.assert_array_equal(params["w"], expected_weights[call], err_msg=f"call {call}")
  staleness_state = state.inner_state[0]
  assert int(staleness_state.count) == 4  # inner advanced on calls 1, 3, 4, 5 only
  assert int(staleness_state.contributions) == 6  # 6 real gradients, no empty slots
  assert float(staleness_state.mean_staleness) == 0.5  # stalenesses 0, 1, 0, 1, 1, 0
  assert int(state.applied) == 4 and int(state.count) == 6


def _stack_probe() -> optax.GradientTransformationExtraArgs:
  """Like `_probe` for a stack: the mean over the stack of -(g + 100 staleness + 1000 stale_w)."""

  def update(grads, count, params=None, *, staleness, stale_params, **extra):
    del params, extra
    return {"w": -jnp.mean(grads["w"] + 100.0 * staleness + 1000.0 * stale_params["w"])}, count + 1

  return optax.GradientTransformationExtraArgs(lambda params: jnp.zeros((), jnp.int32), update)


def test_per_gradient_delays_pass_each_gradients_staleness_and_weights_by_hand():
  tx = stalesgd.delayed(_stack_probe(), max_delay=2)
  state = tx.init({"w": jnp.float32(0.0)})
  # The loop's weights at call t are t (any weights do: the wrapper only stores them); g_t = 2^t.
  #   call 1: g0 (w 0, sigma 0):                         -(1)                             = -1
  #   call 3: g1 (w 1, sigma 1), g3 (w 3, sigma 0):      -((2+100+1000) + (8+3000)) / 2   = -2055
  #   call 4: g2 (w 2, sigma 1):                         -(4+100+2000)                    = -2104
  #   call 5: g4 (w 4, sigma 1), g5 (w 5, sigma 0):      -((16+100+4000) + (32+5000)) / 2 = -4574
  expected = [0.0, -1.0, 0.0, -2055.0, -2104.0, -4574.0]
  for call, delay in enumerate(DELAYS):
    params = {"w": jnp.float32(call)}
    updates, state = tx.update({"w": jnp.float32(2.0**call)}, state, params, delay=delay)
    assert float(updates["w"]) == expected[call], call
  assert int(state.inner_state) == 4


def test_gradients_due_together_reach_the_inner_transform_oldest_first():
  """An inner update that weighs the i-th gradient of its stack by 10^i shows the order. With `DELAYS`, call 3 has
  g1 (arrived at call 1, g1 = 2) and g3 (arrived at call 3 in slot 0, g3 = 8) due: oldest first, -(2 + 10 x 8) =
  -82 (slot order would give -(8 + 10 x 2) = -28); call 5 has g4 = 16 then g5 = 32: -(16 + 320)."""

  def update(grads, count, params=None, **extra):
    del params, extra
    return {"w": -jnp.sum(grads["w"] * 10.0 ** jnp.arange(grads["w"].shape[0]))}, count + 1

  tx = stalesgd.delayed(optax.GradientTransformationExtraArgs(lambda p: jnp.zeros((), jnp.int32), update), max_delay=2)
  state = tx.init({"w": jnp.float32(0.0)})
  expected = [0.0, -1.0, 0.0, -82.0, -4.0, -336.0]
  for call, delay in enumerate(DELAYS):
    updates, state = tx.update({"w": jnp.float32(2.0**call)}, state, {"w": jnp.float32(0.0)}, delay=delay)
    assert float(updates["w"]) == expected[call], call

  # 40 calls of random delays in [0, 3], g_t = t + 1, against the rule written out.
  tx = stalesgd.delayed(optax.GradientTransformationExtraArgs(lambda p: jnp.zeros((), jnp.int32), update), max_delay=3)
  delays = np.random.default_rng(0).integers(0, 4, size=40)
  _check_against_the_rule(tx, update, delays)
  # max_delay = 7: at call 12 the gradients of calls 5, 6, 7, 8 (slots 5, 6, 7, 0: the ring wrapped) and 12 are due.
  wrapped = stalesgd.delayed(
    optax.GradientTransformationExtraArgs(lambda p: jnp.zeros((), jnp.int32), update), max_delay=7
  )
  _check_against_the_rule(wrapped, update, [12 - call if 5 <= call <= 8 else 0 for call in range(13)])


def _check_against_the_rule(tx, update, delays):
  """g_t = t + 1 with ``delays``, against the rule written out: at call t the gradients whose arrival + delay is t,
  in arrival order, weighted 10^i by ``update``."""
  state = tx.init({"w": jnp.float32(0.0)})
  step = jax.jit(lambda grads, state, delay: tx.update(grads, state, {"w": jnp.float32(0.0)}, delay=delay))
  for call, delay in enumerate(delays):
    due = [arrival + 1 for arrival in range(call + 1) if arrival + delays[arrival] == call]
    updates, state = step({"w": jnp.float32(call + 1)}, state, jnp.int32(delay))
    assert float(updates["w"]) == -sum(g * 10.0**i for i, g in enumerate(due)), call


@pytest.mark.slow
@pytest.mark.parametrize("tau, max_delay", [(0, 0), (2, 2), (2, 4)])
def test_per_gradient_delays_all_equal_to_tau_are_the_fixed_delay_bit_for_bit(tau, max_delay):
  fixed = stalesgd.delayed(_server_optimizer(), staleness=tau)
  per_gradient = stalesgd.delayed(_server_optimizer(), max_delay=max_delay)
  fixed_step = jax.jit(fixed.update)
  per_gradient_step = jax.jit(
    lambda grads, state, params, delay: per_gradient.update(grads, state, params, delay=delay)
  )
  loss = lambda params, x: jnp.sum((params["w"] * x - 1.0) ** 2)
  params = reference = {"w": jnp.array([0.5, -1.0, 2.0])}
  state, reference_state = per_gradient.init(params), fixed.init(reference)
  for call in range(12):
    x = jnp.array([1.0, 0.5, -0.25]) * (1 + call % 3)
    updates, state = per_gradient_step(jax.grad(loss)(params, x), state, params, jnp.int32(tau))  # a traced delay
    expected, reference_state = fixed_step(jax.grad(loss)(reference, x), reference_state, reference)
    np.testing.assert_array_equal(updates["w"], expected["w"], err_msg=f"call {call}")
    params, reference = optax.apply_updates(params, updates), optax.apply_updates(reference, expected)


def test_bad_per_gradient_delays_are_refused():
  for options in ({}, {"staleness": 1, "max_delay": 2}):
    with pytest.raises(ValueError, match="allowed: exactly one of them"):
      stalesgd.delayed(optax.sgd(0.1), **options)
  for max_delay in (-1, 2.0, True):
    with pytest.raises(ValueError, match="max_delay=.*allowed: an integer >= 0"):
      stalesgd.delayed(optax.sgd(0.1), max_delay=max_delay)
  params = {"w": jnp.ones(2)}
  tx = stalesgd.delayed(optax.chain(stalesgd.average_contributions(), optax.sgd(0.1)), max_delay=2)
  for delay in (None, 3, -1, 1.0, True, jnp.array([1, 1])):
    with pytest.raises(ValueError, match=r"allowed: an integer scalar in \[0, max_delay=2\]"):
      tx.update(params, tx.init(params), params, delay=delay)
  with pytest.raises(ValueError, match="delay=1 was passed to delayed.staleness=2.*max_delay=D"):
    fixed = stalesgd.delayed(optax.sgd(0.1), staleness=2)
    fixed.update(params, fixed.init(params), params, delay=1)
  with pytest.raises(ValueError, match=r"average_contributions\(\) in inner"):
    unreduced = stalesgd.delayed(optax.sgd(0.1), max_delay=1)
    unreduced.update(params, unreduced.init(params), params, delay=0)
  reduced = stalesgd.delayed(optax.chain(stalesgd.average_contributions(), optax.sgd(1.0)), max_delay=1)
  host = {"w": np.zeros(3, np.float32)}  # NumPy weights: their shape is another tuple than the update's, equal
  np.testing.assert_array_equal(reduced.update({"w": np.ones(3)}, reduced.init(host), host, delay=0)[0]["w"], -1.0)
  # Stacks of (1, 5) and (2, 5) sort before the weights' (5,), stacks of (1, 1) and (2, 1) after (1,): all differ.
  for weights in ({"w": jnp.ones(5)}, {"w": jnp.ones(1)}):
    with pytest.raises(ValueError, match=r"average_contributions\(\) in inner"):
      unreduced.update(weights, unreduced.init(weights), weights, delay=0)
  with pytest.raises(TypeError):  # the delay by keyword only
    tx.update(params, tx.init(params), params, 1)
  with pytest.raises(TypeError):  # and the wrapper's options
    stalesgd.delayed(optax.sgd(0.1), 1)
  for options in ({"staleness": np.int64(2)}, {"max_delay": np.int64(1)}):  # the static sizes are Python ints
    with pytest.raises(ValueError, match="allowed: a Python int >= 0"):
      stalesgd.delayed(optax.sgd(0.1), **options)


def test_a_traced_delay_out_of_range_is_clipped_into_it():
  """Under jit the delay cannot be checked: -1 is applied as 0 (at once) and 5 as max_delay = 2."""
  tx = stalesgd.delayed(optax.chain(stalesgd.average_contributions(), optax.sgd(1.0)), max_delay=2)
  step = jax.jit(lambda grads, state, delay: tx.update(grads, state, {"w": jnp.zeros(1)}, delay=delay))
  state = tx.init({"w": jnp.zeros(1)})
  applied = []
  for call, delay in enumerate([-1, 5, 0, 0, 0]):
    updates, state = step({"w": jnp.full(1, float(call + 1))}, state, jnp.int32(delay))
    applied.append(float(updates["w"][0]))
  # call 0: g0 at once; call 1: g1 waits 2 calls (due at 3, with g3); calls 2 and 4: their own gradients.
  assert applied == [-1.0, 0.0, -3.0, -3.0, -5.0]


@pytest.mark.parametrize("max_delay", [1, 2, 3])
def test_per_gradient_delays_keep_max_delay_plus_one_pending_gradients(max_delay):
  """D + 1 slots: a gradient may wait D calls, and the one of this call is written before any is applied."""
  tx = stalesgd.delayed(optax.chain(stalesgd.average_contributions(), optax.sgd(0.1)), max_delay=max_delay)
  state = tx.init({"w": jnp.ones(4)})
  assert state.pending_grads["w"].shape == (max_delay + 1, 4) and state.due_call.shape == (max_delay + 1,)
