"""Local runs that read data shards and run a rate keyed to the shard's step count, against numpy written from the
equations (the asynchronous DiLoCo notebook's setting: a starting run takes the least-visited shard and reads its
next H_m mini-batches; inner step i of a run from the shard's step o runs at eta s(o + i)).

The reference walks the schedule one update at a time in float64 and never calls stalesgd: it takes the shard and
offset of each contribution from the schedule (the simulator's output, an input of both sides), reads rows
o, ..., o + H_m - 1 of that shard's stream, and steps plain SGD at eta s(o + i). RTOL and ATOL as in
tests/engine/test_engine_local_runs.py.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import stalesgd
from stalesgd import engine as engine_lib
from stalesgd import schedule as schedule_lib
from stalesgd.parallel import _sharding as sharding_lib
from tests.helpers.local_run_reference import (
  as_float64,
  assert_tree_close,
  batch_stream,
  initial_params,
  least_squares,
  numpy_loss_and_gradient,
  stream_batch_fn,
)

RTOL, ATOL = 2e-5, 2e-6
INNER_ETA, SERVER_ETA, SERVER_BETA = 0.1, 0.5, 0.9
UNEQUAL = schedule_lib.TimingModel(speed_factors=(1.0, 1.7, 2.9), jitter="lognormal", jitter_sigma=0.3)


def keyed_scale(offsets, steps):
  """s(n) = 1 / (1 + n / 10) of each step's place n = offset + i in its shard (any function of n will do)."""
  return 1.0 / (1.0 + (np.asarray(offsets)[:, None] + np.arange(steps)) / 10.0)


def numpy_sharded_server(params, schedule, shard_streams, per_learner):
  history = [as_float64(params)]
  velocity = {k: np.zeros_like(v) for k, v in history[0].items()}
  for update in range(schedule.num_updates):
    deltas = []
    for slot in range(schedule.contributions_per_update):
      learner = int(schedule.learner[update, slot])
      shard, offset = int(schedule.data_stream[update, slot]), int(schedule.data_offset[update, slot])
      weights = dict(history[int(schedule.timestamp[update, slot])])
      start = dict(weights)
      x, y = shard_streams[shard]
      for i in range(int(per_learner[learner])):
        _, grads = numpy_loss_and_gradient(weights, (x[offset + i], y[offset + i]))
        rate = INNER_ETA / (1.0 + (offset + i) / 10.0)
        weights = {k: weights[k] - rate * grads[k] for k in weights}
      deltas.append({k: start[k] - weights[k] for k in start})
    mean = {k: np.mean([delta[k] for delta in deltas], axis=0) for k in history[0]}
    velocity = {k: mean[k] + SERVER_BETA * velocity[k] for k in mean}
    history.append({k: history[-1][k] - SERVER_ETA * velocity[k] for k in mean})
  return history


@pytest.mark.parametrize("devices", [1, 8], ids=["1-device", "8-devices"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed-H", "dynamic-H"])
def test_shards_and_a_keyed_rate_equal_the_numpy_server(devices, dynamic):
  """3 learners at unequal jittered speeds, 2 shards, H = 4 (dynamic: H_m = 4, 2, 1), async, 50 updates."""
  steps, updates, shards = 4, 50, 2
  schedule = schedule_lib.simulate(
    "async",
    learners=3,
    num_updates=updates,
    seed=3,
    timing=UNEQUAL,
    local_steps=steps,
    dynamic_min_steps=1 if dynamic else 0,
    data_shards=shards,
  )
  per_learner = np.asarray(schedule.options.get("learner_local_steps", [steps] * 3))
  assert schedule.staleness_of(0, updates).max() >= 2 and set(schedule.data_stream.ravel()) == {0, 1}
  if dynamic:
    assert per_learner.tolist() == [4, 2, 1]
  shard_streams = [batch_stream(seed=40 + s, steps=steps * updates) for s in range(shards)]
  engine = engine_lib.Engine(
    least_squares,
    optax.chain(stalesgd.average_contributions(), optax.sgd(SERVER_ETA, momentum=SERVER_BETA)),
    mesh=sharding_lib.learner_mesh(devices=jax.devices()[:devices]),
    local_steps=steps,
    inner_optimizer=optax.sgd(INNER_ETA),
    learner_local_steps=per_learner if dynamic else None,
    inner_step_scale=keyed_scale,
  )
  plan = engine.plan(schedule)
  state = engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(shard_streams))
  expected = numpy_sharded_server(initial_params(), schedule, shard_streams, per_learner)
  assert_tree_close(jax.device_get(state.params), expected[-1], rtol=RTOL, atol=ATOL)


def test_unit_step_factors_are_the_program_without_factors_bit_for_bit():
  schedule = schedule_lib.simulate("async", learners=3, num_updates=30, seed=1, timing=UNEQUAL, local_steps=3)
  streams = [batch_stream(seed=10 + m, steps=3 * 30 + 3) for m in range(3)]
  results = []
  for scale in (None, lambda offsets, steps: np.ones((len(offsets), steps))):
    engine = engine_lib.Engine(
      least_squares,
      optax.chain(stalesgd.average_contributions(), optax.sgd(SERVER_ETA)),
      local_steps=3,
      inner_optimizer=optax.sgd(INNER_ETA),
      inner_step_scale=scale,
    )
    plan = engine.plan(schedule)
    results.append(jax.device_get(engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(streams))))
  for key in ("w", "b"):
    np.testing.assert_array_equal(results[1].params[key], results[0].params[key])


def test_a_fresh_adam_under_dynamic_steps_runs_on_eight_devices_as_on_one():
  """A re-created AdamW (its count the same on every device) under masked dynamic steps: once a tracing error
  (the scan's carry must be device-varying); now the same weights on 8 devices as on 1."""
  schedule = schedule_lib.simulate(
    "async", learners=3, num_updates=24, seed=2, timing=UNEQUAL, local_steps=3, dynamic_min_steps=1, data_shards=3
  )
  per_learner = np.asarray(schedule.options["learner_local_steps"])
  streams = [batch_stream(seed=20 + s, steps=3 * 24) for s in range(3)]
  results = []
  for devices in (1, 8):
    engine = engine_lib.Engine(
      least_squares,
      optax.chain(stalesgd.average_contributions(), optax.sgd(SERVER_ETA)),
      mesh=sharding_lib.learner_mesh(devices=jax.devices()[:devices]),
      local_steps=3,
      inner_optimizer=optax.adamw(0.01, weight_decay=1e-3),
      reset_inner_state=True,
      learner_local_steps=per_learner,
    )
    plan = engine.plan(schedule)
    results.append(jax.device_get(engine.run(engine.init(initial_params(), plan), plan, stream_batch_fn(streams))))
  assert_tree_close(results[1].params, as_float64(results[0].params), rtol=1e-6, atol=1e-7)
