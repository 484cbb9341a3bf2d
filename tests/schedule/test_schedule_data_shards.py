"""Data shards handed to local runs (the asynchronous DiLoCo notebook's ``sample_data``) and runs cut at equal
applied inner steps (its ``finished``), checked by hand and by the rule's defining property."""

from __future__ import annotations

import io

import numpy as np
import pytest

from stalesgd.schedule import Schedule, TimingModel, simulate
from stalesgd.schedule._parameter_server import LeastVisitedShards

STEADY = TimingModel(compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 2.0))


def test_each_run_takes_a_least_visited_shard_at_the_offset_its_earlier_runs_reached():
  shards, taken_steps = LeastVisitedShards(3, seed=5), [0, 0, 0]
  visits = [0, 0, 0]
  rng = np.random.default_rng(0)
  for _ in range(300):
    steps = int(rng.integers(1, 6))
    shard, offset = shards.take(steps)
    assert visits[shard] == min(visits)  # never a shard visited more often than another
    assert offset == taken_steps[shard]  # where the shard's earlier runs stopped
    visits[shard] += 1
    taken_steps[shard] += steps


def test_ties_are_drawn_uniformly_and_from_the_seed():
  first = [LeastVisitedShards(4, seed=seed).take(1)[0] for seed in range(4000)]
  counts = np.bincount(first, minlength=4)
  assert counts.min() > 880 and counts.max() < 1120, counts  # 1000 each; 4 sigma is about 110
  assert [LeastVisitedShards(4, seed=7).take(1) for _ in range(2)] == [(first[7], 0)] * 2


def test_ties_come_from_the_seeds_third_stream_apart_from_the_timing_models_two():
  """The timing model draws from spawn keys (0,) and (1,); the shards' ties from (2,): a first tie among 4 shards
  is integers(4) of that stream."""
  for seed in range(20):
    expected = int(np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2,))).integers(4))
    assert LeastVisitedShards(4, seed=seed).take(1)[0] == expected


def test_only_ties_draw_from_the_stream():
  """2 shards taken in pairs: the first of each pair is a tie (a draw of integers(2)), the second has one
  candidate, the other shard (no draw); so the pairs' first shards are the stream's successive draws."""
  shards = LeastVisitedShards(2, seed=11)
  stream = np.random.default_rng(np.random.SeedSequence(11, spawn_key=(2,)))
  for _ in range(20):
    first = int(stream.integers(2))
    assert [shards.take(1)[0], shards.take(1)[0]] == [first, 1 - first]


def test_ties_stay_uniform_after_many_visits():
  """Visit counts above 256 (Python's cached small ints): two shards tied at every other take still split the
  first take of each pair evenly (equal counts, not the same int object)."""
  shards = LeastVisitedShards(2, seed=3)
  for _ in range(600):  # 300 visits each
    shards.take(1)
  firsts = []
  for _ in range(1000):
    firsts.append(shards.take(1)[0])
    shards.take(1)
  assert 400 < firsts.count(0) < 600  # 500 expected; 6 sigma is about 95


def test_hardsync_rounds_visit_every_shard_once_at_offsets_of_whole_rounds():
  schedule = simulate("hardsync", learners=2, num_updates=5, seed=0, timing=STEADY, local_steps=3, data_shards=2)
  assert schedule.data_offset.tolist() == [[0, 0], [3, 3], [6, 6], [9, 9], [12, 12]]
  assert all(sorted(row) == [0, 1] for row in schedule.data_stream.tolist())
  assert schedule.options["data_shards"] == 2


def test_async_offsets_follow_the_order_runs_start_in():
  """1 shard, H = 2, learners at 1 and 2 s per step (runs of 2 and 4 s). Runs start at 0 s (learner 0 on the
  shard's steps 0-1, learner 1 on 2-3), 2 s (learner 0: 4-5), 4 s (learner 1 first, its finish was queued first:
  6-7; then learner 0: 8-9), 6 s (learner 0: 10-11). Arrivals, in order: learner 0 at 2 s, 1 and 0 at 4 s, 0 at
  6 s, 1 and 0 at 8 s."""
  schedule = simulate("async", learners=2, num_updates=6, seed=0, timing=STEADY, local_steps=2, data_shards=1)
  assert schedule.learner[:, 0].tolist() == [0, 1, 0, 0, 1, 0]
  assert schedule.data_offset[:, 0].tolist() == [0, 2, 4, 8, 6, 10]
  assert set(schedule.data_stream.ravel().tolist()) == {0}


def test_a_run_ends_at_the_first_update_whose_applied_inner_steps_reach_the_budget():
  """Dynamic H_m = 4, 2 (speeds 1 and 2, H = 4): arrivals learner 0 at 4 s (4 steps), learner 1 at 4 s (2: 6 in
  all), learner 0 at 8 s (10 >= 10): 3 updates, although 100 were allowed."""
  schedule = simulate(
    "async", learners=2, num_updates=100, seed=0, timing=STEADY, local_steps=4, dynamic_min_steps=1, inner_steps=10
  )
  assert schedule.options["learner_local_steps"] == [4, 2]
  assert (schedule.num_updates, schedule.learner[:, 0].tolist()) == (3, [0, 1, 0])
  assert schedule.update_time.tolist() == [4.0, 4.0, 8.0]
  # A budget of 9 is passed, not met, by the third update's 10 steps: the run still ends there, and says so.
  reports = []
  overshot = simulate(
    "async",
    learners=2,
    num_updates=100,
    seed=0,
    timing=STEADY,
    local_steps=4,
    dynamic_min_steps=1,
    inner_steps=9,
    progress=lambda done, total: reports.append((done, total)),
  )
  assert overshot.num_updates == 3 and reports[-1] == (3, 3)
  # A budget of 7: 4 and 6 steps fall short, the third update's 10 reach it.
  seven = simulate(
    "async", learners=2, num_updates=100, seed=0, timing=STEADY, local_steps=4, dynamic_min_steps=1, inner_steps=7
  )
  assert seven.num_updates == 3
  capped = simulate("async", learners=2, num_updates=2, seed=0, timing=STEADY, local_steps=4, inner_steps=10)
  assert capped.num_updates == 2  # num_updates stays an upper bound


@pytest.mark.parametrize("name", ["data_shards", "inner_steps"])
def test_the_options_are_refused_for_all_reduce_protocols_and_below_zero(name):
  with pytest.raises(ValueError, match=f"{name}=1 with protocol='s3gd'; allowed: 0"):
    simulate("s3gd", learners=2, num_updates=3, seed=0, **{name: 1})
  with pytest.raises(ValueError, match=f"{name}=-1; allowed: an integer >= 0"):
    simulate("async", learners=2, num_updates=3, seed=0, **{name: -1})


def test_shard_columns_survive_save_and_load_and_come_in_pairs():
  schedule = simulate("async", learners=2, num_updates=8, seed=0, timing=STEADY, local_steps=2, data_shards=2)
  buffer = io.BytesIO()
  schedule.save(buffer)
  buffer.seek(0)
  loaded = Schedule.load(buffer)
  np.testing.assert_array_equal(loaded.data_stream, schedule.data_stream)
  np.testing.assert_array_equal(loaded.data_offset, schedule.data_offset)
  without = simulate("async", learners=2, num_updates=8, seed=0, timing=STEADY, local_steps=2)
  assert without.data_stream is None and without.data_offset is None
  with pytest.raises(ValueError, match="given together or not at all"):
    Schedule(**{**_fields(schedule), "data_offset": None})


def _fields(schedule):
  names = (
    "protocol learners learner timestamp batch_index update_time dropped_learner dropped_timestamp "
    "dropped_batch_index dropped_at_update learner_busy_time total_time options data_stream data_offset"
  ).split()
  return {name: getattr(schedule, name) for name in names}
