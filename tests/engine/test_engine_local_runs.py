"""Contributions of H local steps in the engine, against a numpy parameter server written from the equations.

The reference (`tests.helpers.local_run_reference.numpy_parameter_server`) walks the schedule one update at a
time in float64, each contribution a local run of momentum SGD on least squares, and never calls stalesgd. The
engine runs float32, its gradients fused by XLA; RTOL/ATOL below bound that difference after the stated number
of updates (measured: about 1e-7 relative; the bound leaves two orders of magnitude).
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import stalesgd
from stalesgd import engine as engine_lib
from stalesgd import schedule as schedule_lib
from stalesgd.engine._blocks import previous_update_of_learner
from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.schedule._durations import StepDurations
from tests.helpers.local_run_reference import (
  assert_tree_close,
  batch_stream,
  initial_params,
  least_squares,
  numpy_diloco,
  numpy_parameter_server,
  stream_batch_fn,
)

RTOL, ATOL = 2e-5, 2e-6
INNER_ETA, INNER_BETA, SERVER_ETA, SERVER_BETA = 0.1, 0.5, 0.7, 0.9
UNEQUAL = schedule_lib.TimingModel(speed_factors=(1.0, 1.7, 2.9), jitter="lognormal", jitter_sigma=0.3)


def server_optimizer():
  return optax.chain(stalesgd.average_contributions(), optax.sgd(SERVER_ETA, momentum=SERVER_BETA))


def run_engine(schedule, streams, steps, *, inner, reset=False, devices=None):
  mesh = sharding_lib.learner_mesh(devices=devices)
  engine = engine_lib.Engine(
    least_squares, server_optimizer(), mesh=mesh, local_steps=steps, inner_optimizer=inner, reset_inner_state=reset
  )
  plan = engine.plan(schedule)
  state = engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(streams))
  assert int(state.step) == schedule.num_updates
  return plan, state


def streams_for(learners, steps, num_updates):
  return [batch_stream(seed=10 + m, steps=steps * num_updates + steps) for m in range(learners)]


@pytest.mark.parametrize("devices", [1, 8], ids=["1-device", "8-devices"])
def test_async_local_runs_with_kept_momentum_equal_the_numpy_server(devices):
  """The non-degenerate case: H = 3, 3 learners at unequal jittered speeds (staleness > 0), inner momentum kept
  across a learner's contributions, server momentum, 60 updates, on 1 and 8 devices."""
  steps, updates = 3, 60
  schedule = schedule_lib.simulate("async", learners=3, num_updates=updates, seed=4, timing=UNEQUAL, local_steps=steps)
  assert schedule.staleness_of(0, updates).max() >= 2
  streams = streams_for(3, steps, updates)
  plan, state = run_engine(
    schedule, streams, steps, inner=optax.sgd(INNER_ETA, momentum=INNER_BETA), devices=jax.devices()[:devices]
  )
  expected = numpy_parameter_server(
    initial_params(), schedule, streams, steps, INNER_ETA, INNER_BETA, SERVER_ETA, SERVER_BETA, reset=False
  )
  assert_tree_close(jax.device_get(state.params), expected[-1], rtol=RTOL, atol=ATOL)
  assert plan.num_blocks < updates  # blocks of several updates: the kept states really cross block boundaries


def test_reset_inner_state_starts_every_local_run_from_a_fresh_state():
  steps, updates = 2, 40
  schedule = schedule_lib.simulate("async", learners=3, num_updates=updates, seed=1, timing=UNEQUAL, local_steps=steps)
  streams = streams_for(3, steps, updates)
  _, state = run_engine(schedule, streams, steps, inner=optax.sgd(INNER_ETA, momentum=INNER_BETA), reset=True)
  assert state.inner_states == ()  # nothing to keep, nothing stored or checkpointed
  expected = numpy_parameter_server(
    initial_params(), schedule, streams, steps, INNER_ETA, INNER_BETA, SERVER_ETA, SERVER_BETA, reset=True
  )
  assert_tree_close(jax.device_get(state.params), expected[-1], rtol=RTOL, atol=ATOL)
  kept = numpy_parameter_server(
    initial_params(), schedule, streams, steps, INNER_ETA, INNER_BETA, SERVER_ETA, SERVER_BETA, reset=False
  )
  assert not np.allclose(kept[-1]["w"], expected[-1]["w"], rtol=1e-3)  # the option matters on this schedule


def test_one_local_step_of_inner_sgd_is_todays_run_at_the_inner_rate():
  """H = 1, inner SGD(eta) without momentum, the server's SGD at rate 1 without momentum = today's engine with
  SGD(eta): Delta = eta g, so theta - 1 * mean(eta g) = theta - eta mean(g); within float32 rounding (the
  product eta g is rounded once more)."""
  schedule = schedule_lib.simulate("softsync", learners=4, n=2, num_updates=50, seed=2, timing=UNEQUAL.__class__())
  streams = streams_for(4, 1, 50)
  mesh = sharding_lib.learner_mesh()
  results = []
  for server, inner in ((optax.sgd(INNER_ETA), None), (optax.sgd(1.0), optax.sgd(INNER_ETA))):
    engine = engine_lib.Engine(
      least_squares, optax.chain(stalesgd.average_contributions(), server), mesh=mesh, inner_optimizer=inner
    )
    plan = engine.plan(schedule)
    results.append(
      jax.device_get(engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(streams)).params)
    )
  for key in results[0]:
    np.testing.assert_allclose(results[1][key], results[0][key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_hardsync_local_runs_are_synchronous_diloco():
  """hardsync with H = 3 and inner SGD, the server's SGD(1) without momentum = DiLoCo with outer SGD(1): the
  engine's weights after each update equal numpy DiLoCo rounds (every learner from the same theta)."""
  steps, rounds, learners = 3, 6, 3
  schedule = schedule_lib.simulate("hardsync", learners=learners, num_updates=rounds, seed=0, local_steps=steps)
  streams = streams_for(learners, steps, rounds)
  mesh = sharding_lib.learner_mesh()
  engine = engine_lib.Engine(
    least_squares,
    optax.chain(stalesgd.average_contributions(), optax.sgd(1.0)),
    mesh=mesh,
    local_steps=steps,
    inner_optimizer=optax.sgd(INNER_ETA),
  )
  plan = engine.plan(schedule)
  state = engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(streams))
  # Hardsync's learner m makes its r-th contribution in round r: its batches r H .. r H + H - 1, as DiLoCo's.
  assert (np.sort(schedule.batch_index, axis=1) == np.arange(rounds)[:, None]).all()
  expected = numpy_diloco(initial_params(), streams, rounds, steps, INNER_ETA, 1.0, 0.0)[-1][0]  # outer SGD(1)
  assert_tree_close(jax.device_get(state.params), expected, rtol=RTOL, atol=ATOL)


def test_a_block_never_holds_two_contributions_of_a_learner_that_keeps_its_inner_state():
  # 2-softsync of 4 learners: a learner's next local run may start from the weights its previous one did.
  schedule = schedule_lib.simulate("softsync", learners=4, n=2, num_updates=200, seed=0, local_steps=2)
  free = engine_lib.plan_blocks(schedule, num_devices=1)
  distinct = engine_lib.plan_blocks(schedule, num_devices=1, distinct_learners=True)
  assert distinct.num_blocks > free.num_blocks  # the constraint binds on this schedule
  for index in range(distinct.num_blocks):
    block = distinct.block(index)
    learners = block.learner[: block.num_updates].reshape(-1)
    assert len(set(learners.tolist())) == learners.size
  stateful = engine_lib.Engine(least_squares, server_optimizer(), inner_optimizer=optax.sgd(0.1, momentum=0.5))
  stateless = engine_lib.Engine(least_squares, server_optimizer(), inner_optimizer=optax.sgd(0.1))
  reset = engine_lib.Engine(
    least_squares, server_optimizer(), inner_optimizer=optax.adam(0.1), reset_inner_state=True, local_steps=2
  )
  assert stateful.keeps_inner_states and not stateless.keeps_inner_states and not reset.keeps_inner_states


def test_a_learner_twice_in_one_update_is_refused_when_it_keeps_its_state():
  class Twice:
    learner = np.array([[0, 0], [1, 0]], np.int32)
    contributions_per_update = 2
    num_updates = 2

  with pytest.raises(ValueError, match="update 0 applies two contributions of one learner"):
    previous_update_of_learner(Twice)


def test_a_contribution_lasts_the_sum_of_its_h_step_times():
  timing = schedule_lib.TimingModel(jitter="lognormal", jitter_sigma=0.5, speed_factors=(1.0, 2.0))
  one = StepDurations(timing, 2, seed=3)
  three = StepDurations(timing, 2, seed=3, local_steps=3)
  for learner in (0, 1):
    steps = one.first(learner, 12)
    by_hand = [steps[0] + steps[1] + steps[2], steps[3] + steps[4] + steps[5], steps[6] + steps[7] + steps[8]]
    np.testing.assert_array_equal(three.first(learner, 3), np.asarray(by_hand))
  with pytest.raises(ValueError, match="local_steps"):
    schedule_lib.simulate("dcs3gd", learners=2, num_updates=5, seed=0, local_steps=2)


def test_dropped_contributions_are_refused_when_learners_keep_their_inner_state():
  schedule = schedule_lib.simulate("backup", learners=4, backup=1, num_updates=20, seed=0, local_steps=2)
  assert schedule.dropped_learner.size
  kept = engine_lib.Engine(
    least_squares, server_optimizer(), local_steps=2, inner_optimizer=optax.sgd(0.1, momentum=0.5)
  )
  with pytest.raises(ValueError, match="drops .* contributions"):
    kept.plan(schedule)
  stateless = engine_lib.Engine(least_squares, server_optimizer(), local_steps=2, inner_optimizer=optax.sgd(0.1))
  stateless.plan(schedule)


def test_dynamic_local_updates_give_slower_learners_fewer_steps_and_equal_the_numpy_server():
  """H_m = max(floor(H v_m / v_max), H_min) with speeds 1, 1/1.7, 1/2.9 and H = 6, H_min = 2: floor(6), floor(3.53),
  floor(2.07) = 6, 3, 2 steps; contributions last H_m step times; the engine against the numpy server."""
  steps, updates = 6, 45
  schedule = schedule_lib.simulate(
    "async", learners=3, num_updates=updates, seed=4, timing=UNEQUAL, local_steps=steps, dynamic_min_steps=2
  )
  assert schedule.options["learner_local_steps"] == [6, 3, 2]
  streams = streams_for(3, steps, updates)
  mesh = sharding_lib.learner_mesh()
  engine = engine_lib.Engine(
    least_squares,
    server_optimizer(),
    mesh=mesh,
    local_steps=steps,
    inner_optimizer=optax.sgd(INNER_ETA, momentum=INNER_BETA),
    learner_local_steps=np.array([6, 3, 2]),
  )
  plan = engine.plan(schedule)
  state = engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(streams))
  expected = numpy_parameter_server(
    initial_params(), schedule, streams, [6, 3, 2], INNER_ETA, INNER_BETA, SERVER_ETA, SERVER_BETA, reset=False
  )
  assert_tree_close(jax.device_get(state.params), expected[-1], rtol=RTOL, atol=ATOL)
  with pytest.raises(ValueError, match="learner_local_steps"):
    engine_lib.Engine(least_squares, server_optimizer(), local_steps=steps).plan(schedule)


def test_dynamic_local_updates_at_equal_speeds_are_fixed_h_bit_for_bit():
  steps, updates = 3, 30
  equal = schedule_lib.TimingModel(jitter="lognormal", jitter_sigma=0.3)
  fixed = schedule_lib.simulate("async", learners=3, num_updates=updates, seed=2, timing=equal, local_steps=steps)
  dynamic = schedule_lib.simulate(
    "async", learners=3, num_updates=updates, seed=2, timing=equal, local_steps=steps, dynamic_min_steps=1
  )
  np.testing.assert_array_equal(dynamic.update_time, fixed.update_time)
  streams = streams_for(3, steps, updates)
  results = []
  for schedule, per_learner in ((fixed, None), (dynamic, np.array([3, 3, 3]))):
    engine = engine_lib.Engine(
      least_squares,
      server_optimizer(),
      local_steps=steps,
      inner_optimizer=optax.sgd(INNER_ETA),
      learner_local_steps=per_learner,
    )
    plan = engine.plan(schedule)
    results.append(
      jax.device_get(engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(streams)).params)
    )
  for key in results[0]:
    np.testing.assert_array_equal(results[1][key], results[0][key])


def test_local_run_diagnostics_are_the_pseudo_gradients_norms_and_agreement():
  """hardsync, H = 3, M = 3: per update, the mean of ||Delta_m|| and (M^2 ||mean Delta||^2 - sum ||Delta_m||^2) /
  ((M - 1) sum ||Delta_m||^2), against numpy DiLoCo's pseudo-gradients (outer SGD(1) = the server's SGD(1))."""
  steps, rounds, learners = 3, 6, 3
  schedule = schedule_lib.simulate("hardsync", learners=learners, num_updates=rounds, seed=0, local_steps=steps)
  streams = streams_for(learners, steps, rounds)
  engine = engine_lib.Engine(
    least_squares,
    optax.chain(stalesgd.average_contributions(), optax.sgd(1.0)),
    mesh=sharding_lib.learner_mesh(),
    local_steps=steps,
    inner_optimizer=optax.sgd(INNER_ETA),
  )
  plan = engine.plan(schedule)
  state = engine.init(initial_params(), plan)
  norms, agreements = [], []
  for _, state, metrics in engine.iterate(state, plan, stream_batch_fn(streams)):
    assert metrics.diagnostics is not None, "H = 3 reports diagnostics"
    norms.append(np.asarray(metrics.diagnostics["pseudo_gradient_norm"]))
    agreements.append(np.asarray(metrics.diagnostics["pseudo_gradient_agreement"]))
  norms, agreements = np.concatenate(norms)[:rounds], np.concatenate(agreements)[:rounds]
  history = numpy_diloco(initial_params(), streams, rounds, steps, INNER_ETA, 1.0, 0.0)
  for r, (_, deltas, _) in enumerate(history):
    squares = [sum(float(np.sum(delta[k] ** 2)) for k in delta) for delta in deltas]
    mean = {k: np.mean([delta[k] for delta in deltas], axis=0) for k in deltas[0]}
    mean_square = sum(float(np.sum(mean[k] ** 2)) for k in mean)
    np.testing.assert_allclose(norms[r], np.mean(np.sqrt(squares)), rtol=1e-5)
    expected = (learners**2 * mean_square - sum(squares)) / ((learners - 1) * sum(squares))
    np.testing.assert_allclose(agreements[r], expected, rtol=1e-4, atol=1e-6)
  # One local step: the block is today's, without diagnostics.
  single = engine_lib.Engine(least_squares, server_optimizer(), mesh=sharding_lib.learner_mesh())
  single_schedule = schedule_lib.simulate("hardsync", learners=learners, num_updates=2, seed=0)
  single_plan = single.plan(single_schedule)
  _, metrics = single.step(single.init(initial_params(), single_plan), single_plan, 0, stream_batch_fn(streams))
  assert metrics.diagnostics is None
