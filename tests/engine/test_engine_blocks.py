"""Block planning, the ring buffer, and the engine's refusals."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd
from stalesgd import engine as engine_lib
from stalesgd import schedule as schedule_lib
from stalesgd.engine import _blocks
from stalesgd.engine import _ring_buffer as ring_buffer
from tests.helpers.engine_oracle import MODELS, Data


# First in the file: a planner loop that never ends fails here within seconds (a test failure) instead of hanging
# every test below until the run's timeout.
@pytest.mark.timeout(20)
def test_planning_a_small_schedule_ends():
  # `_hand_schedule` is defined below; it is looked up when this test runs.
  schedule = _hand_schedule(np.array([[0, 0], [0, 0], [2, 1]]), learner=[[0, 1], [0, 1], [1, 0]])
  for options in (
    {},
    {"rows_per_block": 1},
    {"distinct_learners": True},
    {"max_slots_per_device": None},
    {"boundaries": [1, 2]},  # a block that ends at a boundary: the next starts there and goes on
  ):
    plan = engine_lib.plan_blocks(schedule, **options)
    assert plan.block_starts[0] == 0 and plan.block_starts[-1] == 3


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
def _hand_schedule(timestamp, learner=None, **data) -> schedule_lib.Schedule:
  """A schedule given by its timestamps [U, c] (and learners; by default learner i in column i)."""
  timestamp = np.asarray(timestamp, np.int64)
  updates, contributions = timestamp.shape
  if learner is None:
    learner = np.broadcast_to(np.arange(contributions), timestamp.shape)
  learner = np.asarray(learner, np.int32)
  learners = int(learner.max()) + 1 if learner.size else 1
  empty = np.zeros(0, np.int64)
  return schedule_lib.Schedule(
    "hand",
    learners,
    learner,
    timestamp,
    np.zeros(timestamp.shape, np.int64),
    np.arange(updates, dtype=np.float64),
    empty.astype(np.int32),
    empty,
    empty,
    empty,
    np.zeros(learners),
    float(updates),
    **data,
  )


def test_fresh_updates_make_one_block_each_and_fill_their_slots():
  """Hardsync-like timestamps (update u reads w_u): 5 blocks of one update; c = 2 contributions in 2 slots on one
  device (the default), all applied; on 4 devices 4 slots a block, half of them applied."""
  schedule = _hand_schedule([[u, u] for u in range(5)])
  plan = engine_lib.plan_blocks(schedule)
  assert (plan.num_blocks, plan.rows_per_block, plan.slots_per_block) == (5, 1, 2)
  np.testing.assert_array_equal(plan.block_starts, [0, 1, 2, 3, 4, 5])
  assert plan.slot_utilisation == 1.0
  assert engine_lib.plan_blocks(_hand_schedule([[0, 0, 0]])).slots_per_block == 3  # one device by default
  wide = engine_lib.plan_blocks(schedule, num_devices=4)
  assert (wide.num_blocks, wide.slots_per_block, wide.slot_utilisation) == (5, 4, 0.5)
  for index in (-1, 5, 6):
    with pytest.raises(IndexError, match=rf"block index {index} out of range \[0, 5\)"):
      plan.block(index)
  with pytest.raises(dataclasses.FrozenInstanceError):
    plan.rows_per_block = 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    plan.block(0).num_updates = 2
  assert len({plan, engine_lib.plan_blocks(schedule)}) == 2  # plans hash and compare by identity (arrays inside)
  assert engine_lib.plan_blocks(_hand_schedule([[0]])).slot_utilisation == 1.0  # one slot, applied


@pytest.mark.parametrize("updates", [6, 9])
def test_updates_all_computed_at_the_first_weights_are_one_block(updates):
  """Every contribution read w_0: one block of all U updates is the cheapest plan (U c + 1 slots against
  ceil(U / R) (R c + 1) for any R < U), and its width is the longest block, reached at u0 = 0."""
  plan = engine_lib.plan_blocks(_hand_schedule(np.zeros((updates, 1))))
  assert (plan.rows_per_block, plan.num_blocks) == (updates, 1)


# Before the 50,000-update schedule below: a planner that scores too many widths, or advances its block ends one
# update a pass, fails here at once instead of running for hours there.
def test_widths_are_scored_up_to_the_longest_block_only(monkeypatch):
  """9 updates at w_0 (one block of 9 at most): the planner scores the widths 1..9, then cuts the plan: 10 greedy
  passes. Wider widths would give the same blocks with more padding (never cheaper): scoring them wastes time, and
  for long schedules without a slot bound it never ends (stopped here at the first pass too many)."""
  passes, greedy = [], _blocks._greedy_starts

  def counted(reach, rows, *boundaries):
    passes.append(rows)
    assert len(passes) <= 10, f"width {rows} scored: more than the 9 widths up to the longest block"
    return greedy(reach, rows, *boundaries)

  monkeypatch.setattr(_blocks, "_greedy_starts", counted)
  plan = engine_lib.plan_blocks(_hand_schedule(np.zeros((9, 1))), max_slots_per_device=None)
  assert plan.rows_per_block == 9 and passes == [*range(1, 10), 9]


def test_the_best_width_can_be_a_block_that_starts_late():
  """u0 alone (w_0), then G = 5 groups of 8 updates, group g computed at the weights of its first update 1 + 8 g.
  The longest block is 8, from u0 = 1; with c = 1 a width R costs (blocks) x (R + 1): R = 8 gives 6 x 9 = 54,
  R = 4 gives 11 x 5 = 55, R = 2 21 x 3 = 63, R = 1 41 x 2 = 82."""
  timestamp = [0] + [1 + 8 * (u // 8) for u in range(40)]
  plan = engine_lib.plan_blocks(_hand_schedule(np.asarray(timestamp)[:, None]))
  assert (plan.rows_per_block, plan.num_blocks) == (8, 6)
  # Two single updates, then 10 groups of 8: R = 8 costs 12 x 9 = 108 slots, R = 4 22 x 5 = 110, R = 2 42 x 3 = 126.
  timestamp = [0, 1] + [2 + 8 * (u // 8) for u in range(80)]
  plan = engine_lib.plan_blocks(_hand_schedule(np.asarray(timestamp)[:, None]))
  assert (plan.rows_per_block, plan.num_blocks) == (8, 12)


def test_the_slot_bound_caps_the_width():
  """16 updates of c = 2 at w_0 on 2 devices, at most 4 slots a device: at most (4 x 2) // 2 = 4 updates a block
  (4 blocks x 9 = 36 slots, below R = 3's 6 x 7 and R = 2's 8 x 5); unbounded, one block of 16 (33 slots)."""
  schedule = _hand_schedule(np.zeros((16, 2)))
  assert engine_lib.plan_blocks(schedule, num_devices=2, max_slots_per_device=4).rows_per_block == 4
  assert engine_lib.plan_blocks(schedule, num_devices=2, max_slots_per_device=None).rows_per_block == 16


def test_a_device_computes_at_most_32_slots_a_block_by_default():
  """c = 1 at w_0 on one device: 33 updates would be one block of 33 slots, over the default bound of 32, so the
  plan takes 3 blocks of 11 (36 slots; 2 of 17 tie at 36, the first width is kept); 64 updates take 2 of 32."""
  assert engine_lib.plan_blocks(_hand_schedule(np.zeros((33, 1)))).rows_per_block == 11
  assert engine_lib.plan_blocks(_hand_schedule(np.zeros((64, 1)))).rows_per_block == 32


def test_an_update_wider_than_the_slot_bound_gets_a_block_of_its_own():
  """c = 40 contributions on one device, over the 32-slot bound by themselves: one update a block (2 x 41 slots),
  though one block of both (81) would cost less."""
  assert engine_lib.plan_blocks(_hand_schedule(np.zeros((2, 40)))).rows_per_block == 1


def test_a_tie_in_cost_keeps_the_narrower_width():
  """Timestamps 0, 0, 2: blocks reach 2, 2, 3. R = 1: 3 blocks x 2 = 6 slots; R = 2: 2 blocks x 3 = 6. The plan
  must not change between a run and its resumption, so a tie is broken the same way every time: the first width."""
  assert engine_lib.plan_blocks(_hand_schedule(np.array([[0], [0], [2]]))).rows_per_block == 1
  # u0 alone, then 8 updates at w_1 (longest block 8): R = 1 18, R = 2 5 x 3 = 15, R = 3 4 x 4 = 16, R = 4
  # 3 x 5 = 15, R = 8 2 x 9 = 18 slots: R = 2, not the widest candidate.
  assert engine_lib.plan_blocks(_hand_schedule(np.array([[0]] + [[1]] * 8))).rows_per_block == 2


@pytest.mark.timeout(20)  # a width of 0 let through would loop forever: fail here, not hang
def test_an_empty_schedule_is_refused():
  with pytest.raises(ValueError, match=r"the schedule has no updates \(num_updates == 0\)"):
    engine_lib.plan_blocks(_hand_schedule(np.zeros((0, 2))))
  assert engine_lib.plan_blocks(_hand_schedule(np.zeros((1, 2)))).num_blocks == 1
  schedule = _hand_schedule(np.zeros((4, 1)))
  assert engine_lib.plan_blocks(schedule, rows_per_block=1).num_blocks == 4
  with pytest.raises(ValueError, match="rows_per_block must be >= 1, got 0"):
    engine_lib.plan_blocks(schedule, rows_per_block=0)
  with pytest.raises(ValueError, match="num_devices must be >= 1, got 0"):
    engine_lib.plan_blocks(schedule, num_devices=0)


def test_the_previous_update_of_each_updates_learners_by_hand():
  """Learners [[0, 1], [0, 2], [2, 3]]: update 1's learner 0 was in update 0 (its first contribution, position 0);
  update 2's learner 2 in update 1 (position 3): previous updates -1, 0, 1."""
  from stalesgd.engine._blocks import previous_update_of_learner

  schedule = _hand_schedule(np.zeros((3, 2)), learner=[[0, 1], [0, 2], [2, 3]])
  previous = previous_update_of_learner(schedule)
  assert previous.tolist() == [-1, 0, 1] and previous.dtype == np.int64


def test_a_learner_twice_in_one_update_is_named_by_its_update():
  from stalesgd.engine._blocks import previous_update_of_learner

  with pytest.raises(ValueError, match="update 2 applies two contributions of one learner"):
    previous_update_of_learner(_hand_schedule(np.zeros((3, 2)), learner=[[0, 1], [2, 3], [4, 4]]))
  with pytest.raises(ValueError, match="update 1 applies two contributions of one learner"):  # the first of two
    previous_update_of_learner(_hand_schedule(np.zeros((3, 2)), learner=[[0, 1], [2, 2], [3, 3]]))


def test_a_run_resumes_only_at_a_block_start():
  """Blocks [0, 2), [2, 4), [4, 5) (timestamps 0, 0, 2, 2, 4): updates 0, 2, 4 and the end 5 are block starts,
  3 and 6 are not."""
  plan = engine_lib.plan_blocks(_hand_schedule(np.array([[0], [0], [2], [2], [4]])), rows_per_block=2)
  np.testing.assert_array_equal(plan.block_starts, [0, 2, 4, 5])
  assert [plan.block_of_update(update) for update in (0, 2, 4, 5)] == [0, 1, 2, 3]
  for update in (3, 6):
    with pytest.raises(ValueError, match=f"update={update} is not the first update of a block of this plan"):
      plan.block_of_update(update)
  many = engine_lib.plan_blocks(_hand_schedule(np.arange(300)[:, None]))  # 300 blocks: indices compared by value
  assert many.block_of_update(300) == 300
  with pytest.raises(ValueError, match="update=301 is not the first update of a block of this plan"):
    many.block_of_update(301)


def test_required_boundaries_start_blocks_and_leave_the_width_alone():
  """Nine updates at w_0, 4 rows: greedy blocks [0, 4), [4, 8), [8, 9); boundaries 3 and 6 (and 0, 9, 12 and a
  repeat, which are ignored): [0, 3), [3, 6), [6, 9), still 4 rows wide."""
  schedule = _hand_schedule(np.zeros((9, 1)))
  np.testing.assert_array_equal(engine_lib.plan_blocks(schedule, rows_per_block=4).block_starts, [0, 4, 8, 9])
  cut = engine_lib.plan_blocks(schedule, rows_per_block=4, boundaries=[6, 3, 3, 0, 9, 12])
  np.testing.assert_array_equal(cut.block_starts, [0, 3, 6, 9])
  assert cut.rows_per_block == 4
  # A simulated async schedule, a boundary every 40 updates (the updates after which liu_toy evaluates): every one
  # starts a block, every block is valid, and the width is the one chosen without boundaries.
  schedule = schedule_lib.simulate("async", learners=16, num_updates=300, seed=1)
  free = engine_lib.plan_blocks(schedule, num_devices=8)
  boundaries = np.arange(40, 300, 40)
  assert not set(boundaries.tolist()) <= set(free.block_starts.tolist())
  cut = engine_lib.plan_blocks(schedule, num_devices=8, boundaries=boundaries)
  assert set(boundaries.tolist()) <= set(cut.block_starts.tolist())
  assert (cut.rows_per_block, cut.slots_per_block) == (free.rows_per_block, free.slots_per_block)
  assert cut.num_blocks <= free.num_blocks + boundaries.shape[0]
  _check_plan(cut)


def test_the_required_boundaries_are_the_distinct_updates_strictly_inside_the_schedule():
  """0 and the end are always block starts, and a boundary outside [0, 9] is none: kept are 1, 3 and 6, once."""
  np.testing.assert_array_equal(_blocks._required_boundaries([6, 3, 3, 0, -2, 9, 12, 1], 9), [1, 3, 6])
  np.testing.assert_array_equal(_blocks._required_boundaries(np.array([[4], [2]]), 5), [2, 4])


def test_a_boundary_after_every_update_gives_blocks_of_one_update():
  """300 updates at w_0 (one block of 300 rows without boundaries), a boundary after each of updates 1-299: 300
  blocks of one row, past the first 256 boundaries (where Python's small ints stop being shared objects)."""
  schedule = _hand_schedule(np.zeros((300, 1)))
  plan = engine_lib.plan_blocks(schedule, rows_per_block=300, boundaries=np.arange(1, 300))
  np.testing.assert_array_equal(plan.block_starts, np.arange(301))
  assert plan.rows_per_block == 300


def test_a_plan_splits_at_any_update_so_an_older_plans_checkpoint_resumes():
  """Blocks [0, 2), [2, 4), [4, 5): split at 3 (inside [2, 4), where a checkpoint of another plan may be) gives
  [2, 3), [3, 4) and leaves the rest; split at a block start is the plan itself; outside [0, 5] is refused."""
  plan = engine_lib.plan_blocks(_hand_schedule(np.array([[0], [0], [2], [2], [4]])), rows_per_block=2)
  split = plan.split_at(3)
  np.testing.assert_array_equal(split.block_starts, [0, 2, 3, 4, 5])
  np.testing.assert_array_equal(plan.block_starts, [0, 2, 4, 5])  # a new plan: this one unchanged
  assert split.block_of_update(3) == 2 and (split.rows_per_block, split.slots_per_block) == (2, 2)
  _check_plan(split)
  assert plan.split_at(2) is plan and plan.split_at(5) is plan and plan.split_at(0) is plan
  for update in (-1, 6):
    with pytest.raises(ValueError, match=rf"update={update} is outside this plan's updates \[0, 5\]"):
      plan.split_at(update)
  schedule = schedule_lib.simulate("async", learners=16, num_updates=300, seed=1)
  plan = engine_lib.plan_blocks(schedule)
  for update in range(300):  # any update of a simulated schedule: the split plan's blocks are valid
    if update not in set(plan.block_starts.tolist()):
      _check_plan(plan.split_at(update))


def test_distinct_learners_end_a_block_before_a_learners_second_contribution():
  """All contributions read w_0; learners [[0, 1], [2, 3], [3, 4], [5, 6]]: learner 3 is in updates 1 and 2, so a
  block holding update 2 must start after update 1: the reach is 2, 2, 4, 4 (4, 4, 4, 4 without the constraint)."""
  from stalesgd.engine._blocks import unbounded_block_ends

  schedule = _hand_schedule(np.zeros((4, 2)), learner=[[0, 1], [2, 3], [3, 4], [5, 6]])
  assert unbounded_block_ends(schedule).tolist() == [4, 4, 4, 4]
  assert unbounded_block_ends(schedule, distinct_learners=True).tolist() == [2, 2, 4, 4]
  # Learner 1 in updates 0 and 1: a block holding update 1 starts after update 0.
  schedule = _hand_schedule(np.zeros((3, 2)), learner=[[0, 1], [1, 2], [3, 4]])
  assert unbounded_block_ends(schedule, distinct_learners=True).tolist() == [1, 3, 3]
  # The planner keeps blocks of distinct learners only when asked (off by default).
  np.testing.assert_array_equal(engine_lib.plan_blocks(schedule, rows_per_block=2).block_starts, [0, 2, 3])
  distinct = engine_lib.plan_blocks(schedule, rows_per_block=2, distinct_learners=True)
  np.testing.assert_array_equal(distinct.block_starts, [0, 1, 3])
  with pytest.raises(TypeError):
    unbounded_block_ends(schedule, True)
  with pytest.raises(TypeError):
    engine_lib.plan_blocks(schedule, 1)


def test_block_ends_take_as_many_passes_as_the_longest_block(monkeypatch):
  """All starts advance together, one update a pass, from u0 + 1: 1,000 fresh updates (longest block 1) take one
  pass and blocks of 8 (every 8th update fresh) 8, not a pass per update (a 10^6-update schedule must plan fast)."""
  from stalesgd.engine._blocks import unbounded_block_ends

  passes, flatnonzero = [], np.flatnonzero
  monkeypatch.setattr(np, "flatnonzero", lambda array: passes.append(1) or flatnonzero(array))
  assert unbounded_block_ends(_hand_schedule(np.arange(1_000)[:, None])).tolist() == list(range(1, 1_001))
  assert len(passes) == 1
  passes.clear()
  ends = unbounded_block_ends(_hand_schedule((np.arange(1_000) // 8 * 8)[:, None]))
  assert ends[0] == 8 and ends[7] == 8 and ends[8] == 16 and len(passes) <= 8


def test_the_width_is_scored_on_the_first_50000_updates():
  """c = 2: 9,999 single-update blocks, then 20,000 pairs, then a pair split by the 50,000-update prefix. Scored
  on the prefix, width 1 costs 50,000 x 3 = 150,000 slots and width 2 (9,999 + 20,000 + 1 blocks) x 5 = 150,000:
  a tie, kept at 1. One update more or less in the prefix would tip it to width 2 (150,003 against 150,000;
  149,997 against 149,995)."""
  timestamp = np.arange(50_001)
  timestamp[10_000::2] -= 1  # the second of each pair reads the weights of the first
  plan = engine_lib.plan_blocks(_hand_schedule(np.repeat(timestamp[:, None], 2, axis=1)), max_slots_per_device=None)
  assert plan.rows_per_block == 1


def test_a_blocks_data_shards_are_the_schedules_padded_with_zeros():
  """With data shards each slot carries its local run's shard and offset: the block's rows flattened, then zeros
  for the padding slots (c = 2 on 4 devices: 2 padding slots a one-update block)."""
  stream, offset = np.array([[1, 0], [0, 1]]), np.array([[0, 0], [1, 1]])
  schedule = _hand_schedule([[0, 0], [1, 1]], data_stream=stream, data_offset=offset)
  block = engine_lib.plan_blocks(schedule, num_devices=4).block(1)
  np.testing.assert_array_equal(block.slot_data_stream, [0, 1, 0, 0])
  np.testing.assert_array_equal(block.slot_data_offset, [1, 1, 0, 0])


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
