"""The `Schedule` container: validation, statistics and exact npz round trips."""

from __future__ import annotations

import dataclasses
import doctest

import numpy as np
import pytest

from stalesgd.schedule import EventTrace, Schedule, TimingModel, simulate
from stalesgd.schedule import _protocols as protocols_module
from stalesgd.schedule import _schedule_arrays as schedule_module


def _tiny_schedule(**changes) -> Schedule:
  """Two updates of two contributions each, written by hand."""
  fields = dict(
    protocol="softsync",
    learners=3,
    learner=np.array([[0, 1], [2, 0]], dtype=np.int32),
    timestamp=np.array([[0, 0], [0, 1]]),
    batch_index=np.array([[0, 0], [0, 1]]),
    update_time=np.array([1.0, 2.0]),
    dropped_learner=np.array([1], dtype=np.int32),
    dropped_timestamp=np.array([0]),
    dropped_batch_index=np.array([1]),
    dropped_at_update=np.array([2]),
    learner_busy_time=np.array([2.0, 1.5, 1.0]),
    total_time=2.0,
    options={"protocol_options": {"n": 1}, "seed": 0},
  )
  fields.update(changes)
  return Schedule(**fields)


def _assert_identical(first: Schedule, second: Schedule) -> None:
  for field in dataclasses.fields(Schedule):
    left, right = getattr(first, field.name), getattr(second, field.name)
    if isinstance(left, np.ndarray):
      assert left.dtype == right.dtype, field.name
      np.testing.assert_array_equal(left, right, err_msg=field.name)
    elif isinstance(left, EventTrace):
      for name, values in left.as_arrays().items():
        np.testing.assert_array_equal(values, getattr(right, name), err_msg=f"events.{name}")
        assert values.dtype == getattr(right, name).dtype
    else:
      assert left == right, field.name


def test_statistics_of_a_hand_written_schedule():
  schedule = _tiny_schedule()
  np.testing.assert_array_equal(schedule.gradient_staleness, [0, 0, 1, 0])
  assert schedule.mean_staleness == 0.25
  np.testing.assert_array_equal(schedule.staleness_histogram(), [3, 1])
  assert schedule.fraction_staleness_above(0) == 0.25
  assert schedule.num_dropped == 1
  np.testing.assert_array_equal(schedule.dropped_staleness, [2])
  np.testing.assert_allclose(schedule.utilisation, [1.0, 0.75, 0.5])
  np.testing.assert_allclose(schedule.idle_time, [0.0, 0.5, 1.0])
  assert schedule.updates_per_second == 1.0
  assert schedule.gradients_per_second == 2.0


def test_integer_fields_are_converted_to_their_documented_dtypes():
  schedule = _tiny_schedule(learner=[[0, 1], [2, 0]], dropped_learner=[1])
  assert schedule.learner.dtype == np.int32 and schedule.dropped_learner.dtype == np.int32
  assert schedule.timestamp.dtype == np.int64 and schedule.update_time.dtype == np.float64


@pytest.mark.parametrize(
  "changes,message",
  [
    ({"learner": np.array([[0, 1], [3, 0]])}, r"learner must lie in \[0, learners=3\)"),
    ({"timestamp": np.array([[0, 1], [0, 1]])}, r"0 <= timestamp\[u\] <= u"),
    ({"timestamp": np.array([[0.0, 0.0], [0.0, 1.0]])}, r"timestamp must hold integers"),
    ({"batch_index": np.array([0, 0])}, r"batch_index must have 2 dimension"),
    ({"update_time": np.array([1.0])}, r"update_time must have shape \(2,\)"),
    ({"update_time": np.array([2.0, 1.0])}, r"update_time must be non-decreasing"),
    ({"dropped_at_update": np.array([2, 3])}, r"dropped_at_update must have shape \(1,\)"),
    ({"dropped_timestamp": np.array([3])}, r"dropped_timestamp <= dropped_at_update"),
    ({"learner_busy_time": np.zeros(2)}, r"learner_busy_time must have shape \(3,\)"),
    ({"learners": 0}, r"Schedule\.learners=0; allowed: an integer >= 1"),
  ],
)
def test_inconsistent_schedules_raise(changes, message):
  with pytest.raises(ValueError, match=message):
    _tiny_schedule(**changes)


@pytest.mark.parametrize("record_events", [False, True])
def test_save_and_load_round_trip_exactly(tmp_path, record_events):
  timing = TimingModel(jitter="straggler", straggler_prob=0.1, straggler_factor=3.0, latency=0.01)
  schedule = simulate(
    "drop_stale", learners=6, max_staleness=3, num_updates=300, seed=5, timing=timing, record_events=record_events
  )
  path = tmp_path / "run.schedule"  # no .npz suffix: the file is written at exactly this path
  schedule.save(path)
  loaded = Schedule.load(path)
  assert (loaded.events is not None) == record_events
  _assert_identical(schedule, loaded)


def test_a_loaded_schedule_replays_from_its_recorded_options(tmp_path):
  schedule = simulate(
    "softsync",
    learners=8,
    n=4,
    num_updates=200,
    seed=3,
    timing=TimingModel(speed_factor_sigma=0.3, bandwidth=1e6, model_bytes=10_000),
  )
  schedule.save(tmp_path / "run.npz")
  options = Schedule.load(tmp_path / "run.npz").options
  replay = simulate(
    schedule.protocol,
    learners=schedule.learners,
    num_updates=schedule.num_updates,
    seed=options["seed"],
    timing=TimingModel.from_dict(options["timing"]),
    **options["protocol_options"],
  )
  _assert_identical(schedule, replay)


def test_event_trace_is_time_ordered_and_counts_clocks():
  schedule = simulate("async", learners=3, num_updates=30, seed=0, record_events=True)
  trace = schedule.events
  assert np.all(np.diff(trace.time) >= 0)
  started = trace.counts_after_each_event(0, 3)
  assert started[-1].sum() == np.sum(trace.kind == 0)
  with pytest.raises(ValueError, match="equal lengths"):
    EventTrace(time=[0.0], kind=[0, 1], learner=[0], batch_index=[0], timestamp=[0])


def test_docstring_examples_run():
  for module in (schedule_module, protocols_module):
    failures, attempted = doctest.testmod(module, verbose=False)
    assert attempted > 0 and failures == 0, module.__name__
