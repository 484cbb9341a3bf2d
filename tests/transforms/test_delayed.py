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


def test_bad_delays_are_refused():
  for staleness in (-1, 1.5, True):
    with pytest.raises(ValueError, match="staleness=.*allowed: an integer >= 0"):
      stalesgd.delayed(optax.sgd(0.1), staleness=staleness)
  with pytest.raises(ValueError, match="needs params"):
    tx = stalesgd.delayed(optax.sgd(0.1), staleness=1)
    tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))


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

  def optimizer():  # alpha0/sigma and DC-ASGD-a together, so both staleness and stale_params matter
    return optax.chain(
      stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True, decay=0.95),
      stalesgd.scale_by_staleness("inverse"),
      stalesgd.average_contributions(),
      optax.sgd(LEARNING_RATE, momentum=0.9),
    )

  engine = engine_lib.Engine(loss_fn, optimizer(), mesh=sharding_lib.learner_mesh())
  plan = engine.plan(schedule)
  expected = engine.run(engine.init(init_params(), plan), plan, data).params

  tx = stalesgd.delayed(optimizer(), staleness=tau)
  gradient = jax.jit(jax.grad(loss_fn))
  step = jax.jit(lambda grads, state, params: tx.update(grads, state, params))
  params = jax.tree.map(jnp.asarray, init_params())
  state = tx.init(params)
  for t in range(num_updates + tau):  # the loop's t-th batch: learner (t mod lambda)'s batch (t div lambda)
    batch = jax.tree.map(lambda leaf: leaf[0], data(np.array([t % learners]), np.array([t // learners])))
    updates_t, state = step(gradient(params, batch), state, params)
    params = optax.apply_updates(params, updates_t)
  assert max_relative_error(params, expected) <= TOLERANCE
