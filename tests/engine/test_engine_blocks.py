"""Block planning, the ring buffer, and the engine's refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd
from stalesgd import engine as engine_lib
from stalesgd import schedule as schedule_lib
from stalesgd.engine import _ring_buffer as ring_buffer
from tests.helpers.engine_oracle import MODELS, Data


def _check_plan(plan):
  schedule = plan.schedule
  starts = plan.block_starts
  assert starts[0] == 0 and starts[-1] == schedule.num_updates
  assert np.all(np.diff(starts) >= 1) and np.all(np.diff(starts) <= plan.rows_per_block)
  assert plan.slots_per_block >= plan.rows_per_block * schedule.contributions_per_update
  for index in range(plan.num_blocks):
    block = plan.block(index)
    # Every contribution of the block was computed at weights that exist when the block starts.
    assert block.timestamp[block.row_valid].max() <= block.first_update
    real = slice(0, block.num_updates)
    updates = slice(block.first_update, block.first_update + block.num_updates)
    np.testing.assert_array_equal(block.learner[real], schedule.learner[updates])
    assert np.all(block.staleness[~block.row_valid] == 0)


@pytest.mark.parametrize(
  "protocol, options",
  [("async", {}), ("softsync", {"n": 4}), ("hardsync", {}), ("ssp", {"s": 3}), ("drop_stale", {"max_staleness": 5})],
)
@pytest.mark.parametrize("devices", [1, 8])
def test_blocks_only_read_existing_weights_and_cover_the_schedule(protocol, options, devices):
  schedule = schedule_lib.simulate(protocol, learners=16, num_updates=300, seed=1, **options)
  plan = engine_lib.plan_blocks(schedule, num_devices=devices)
  assert plan.slots_per_block % devices == 0
  _check_plan(plan)


def test_async_blocks_match_the_cluster_concurrency():
  """With lambda identical learners, a block holds about lambda gradients, so the
  emulator's parallelism equals the emulated cluster's."""
  timing = schedule_lib.TimingModel(jitter="deterministic")
  schedule = schedule_lib.simulate("async", learners=32, num_updates=2000, seed=0, timing=timing)
  plan = engine_lib.plan_blocks(schedule, num_devices=8)
  assert plan.slots_per_block == 32
  assert plan.slot_utilisation > 0.95


def test_explicit_rows_per_block_is_respected():
  schedule = schedule_lib.simulate("async", learners=8, num_updates=100, seed=0)
  plan = engine_lib.plan_blocks(schedule, num_devices=8, rows_per_block=3)
  assert plan.rows_per_block == 3 and plan.slots_per_block == 8
  _check_plan(plan)


@pytest.mark.slow
def test_ring_buffer_reads_what_was_written():
  params = {"a": jnp.zeros((2,)), "b": jnp.zeros((3, 1))}
  ring = ring_buffer.ring_init(params, depth=4)
  for timestamp in range(1, 7):
    ring = ring_buffer.ring_write(ring, timestamp, jax.tree_util.tree_map(lambda p: p + timestamp, params))
  read = ring_buffer.ring_read(ring, jnp.asarray([3, 6, 5]))
  np.testing.assert_array_equal(read["a"][:, 0], [3.0, 6.0, 5.0])
  assert ring_buffer.ring_depth(ring) == 4
  assert ring_buffer.ring_bytes(ring) == 4 * 5 * 4


def test_ring_buffer_keeps_the_last_depth_versions_over_many_wraps():
  # depth 3, not a power of two, written 10 times (more than 2 depth): slot t mod 3 holds w_t.
  params = {"a": jnp.zeros((2,)), "b": jnp.zeros((3, 1))}
  ring = ring_buffer.ring_init(params, depth=3)
  for timestamp in range(1, 11):
    ring = ring_buffer.ring_write(ring, timestamp, jax.tree_util.tree_map(lambda p: p + timestamp, params))
    read = ring_buffer.ring_read(ring, jnp.asarray([timestamp, max(timestamp - 2, 0), max(timestamp - 1, 0)]))
    expected = [timestamp, max(timestamp - 2, 0), max(timestamp - 1, 0)]
    np.testing.assert_array_equal(read["a"][:, 0], expected)
    np.testing.assert_array_equal(read["b"][:, 2, 0], expected)
  np.testing.assert_array_equal(ring.weights["a"][:, 0], [9.0, 10.0, 8.0])  # slots 0, 1, 2: w_9, w_10, w_8
  # A ring of depth 1 (hardsync) holds the newest version only; depth 0 holds none and is refused.
  single = ring_buffer.ring_write(ring_buffer.ring_init(params, depth=1), 5, {"a": jnp.ones((2,)), "b": params["b"]})
  assert ring_buffer.ring_depth(single) == 1
  np.testing.assert_array_equal(ring_buffer.ring_read(single, jnp.asarray([5]))["a"], [[1.0, 1.0]])
  with pytest.raises(ValueError, match="ring depth must be >= 1, got 0"):
    ring_buffer.ring_init(params, depth=0)


def _engine(optimizer=None):
  loss_fn, _, _ = MODELS["mlp"]
  optimizer = optimizer or optax.chain(stalesgd.average_contributions(), optax.sgd(0.1))
  return engine_lib.Engine(loss_fn, optimizer)


def test_ring_depth_defaults_to_max_staleness_plus_one():
  schedule = schedule_lib.simulate("async", learners=8, num_updates=100, seed=0)
  engine = _engine()
  plan = engine.plan(schedule)
  state = engine.init(MODELS["mlp"][1](), plan)
  assert ring_buffer.ring_depth(state.ring) == schedule.max_staleness + 1


def test_a_ring_too_shallow_for_the_schedule_is_refused():
  schedule = schedule_lib.simulate("async", learners=8, num_updates=100, seed=0)
  engine = _engine()
  plan = engine.plan(schedule)
  with pytest.raises(ValueError, match=r"ring_depth=3.*ring_depth >= "):
    engine.init(MODELS["mlp"][1](), plan, ring_depth=3)


def test_a_state_whose_ring_is_too_shallow_for_a_block_is_refused():
  """A state built for a fresher schedule never silently reads overwritten weights."""
  engine = _engine()
  fresh = engine.plan(schedule_lib.simulate("softsync", learners=8, n=1, num_updates=50, seed=0))
  stale = engine.plan(schedule_lib.simulate("async", learners=8, num_updates=50, seed=0))
  state = engine.init(MODELS["mlp"][1](), fresh)
  with pytest.raises(ValueError, match="ring_depth"):
    engine.step(state, stale, stale.num_blocks - 1, Data((6,)))


def test_an_optimizer_that_does_not_reduce_the_stack_is_refused_before_compiling():
  engine = _engine(optax.sgd(0.1))
  plan = engine.plan(schedule_lib.simulate("softsync", learners=4, n=2, num_updates=10, seed=0))
  with pytest.raises(ValueError, match="average_contributions"):
    engine.init(MODELS["mlp"][1](), plan)


def test_bad_arguments_are_refused():
  loss_fn = MODELS["mlp"][0]
  with pytest.raises(ValueError, match="gradient_strategy"):
    engine_lib.Engine(loss_fn, optax.sgd(0.1), gradient_strategy="loop")
  with pytest.raises(ValueError, match="axis_name"):
    engine_lib.Engine(loss_fn, optax.sgd(0.1), axis_name="workers")
  schedule = schedule_lib.simulate("async", learners=4, num_updates=10, seed=0)
  with pytest.raises(ValueError, match="rows_per_block"):
    engine_lib.plan_blocks(schedule, rows_per_block=0)
  plan = engine_lib.plan_blocks(schedule)
  inside_a_block = next(u for u in range(schedule.num_updates) if u not in set(plan.block_starts.tolist()))
  with pytest.raises(ValueError, match="resume"):
    plan.block_of_update(inside_a_block)


@pytest.mark.slow
def test_metrics_report_losses_and_the_applied_learning_rate_scale():
  schedule = schedule_lib.simulate("async", learners=4, num_updates=40, seed=0)
  loss_fn, init_params, input_shape = MODELS["mlp"]
  engine = engine_lib.Engine(loss_fn, stalesgd.staleness_aware_sgd(0.1, rule="inverse"))
  plan = engine.plan(schedule)
  state = engine.init(init_params(), plan)
  for index, state, metrics in engine.iterate(state, plan, Data(input_shape)):
    block = plan.block(index)
    sigma = block.staleness[: block.num_updates, 0]
    expected = np.where(sigma > 0, 1.0 / np.maximum(sigma, 1), 1.0)
    np.testing.assert_allclose(np.asarray(metrics.lr_scale)[: block.num_updates], expected, rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(metrics.loss)))


def test_on_cpu_the_engine_unrolls_at_most_four_gradients_per_device_and_block():
  # 128 deterministic learners could fill blocks of 128 slots; unrolled on XLA:CPU, 4 per device ran fastest.
  timing = schedule_lib.TimingModel(jitter="deterministic")
  schedule = schedule_lib.simulate("async", learners=128, num_updates=1000, seed=0, timing=timing)
  loss_fn, _, _ = MODELS["mlp"]
  optimizer = optax.chain(stalesgd.average_contributions(), optax.sgd(0.1))
  unrolled = engine_lib.Engine(loss_fn, optimizer, gradient_strategy="unroll").plan(schedule)
  assert unrolled.slots_per_block <= engine_lib.UNROLLED_SLOTS_PER_DEVICE * 8 == 32
  batched = engine_lib.Engine(loss_fn, optimizer, gradient_strategy="vmap").plan(schedule)
  assert batched.slots_per_block > 32
  _check_plan(unrolled)
