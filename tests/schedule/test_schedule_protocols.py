"""Staleness patterns and invariants of every protocol `simulate` offers."""

from __future__ import annotations

import numpy as np
import pytest

from stalesgd.schedule import PROTOCOLS, TimingModel, contributions_per_update, simulate
from stalesgd.schedule import _events as events_lib
from stalesgd.schedule._durations import StepDurations
from stalesgd.schedule._parameter_server import run_parameter_server
from stalesgd.schedule._softsync import ArrivalOrderServer
from stalesgd.schedule._ssp import StaleSynchronousServer
from tests.helpers.schedule_helpers import count_arrivals

DETERMINISTIC = TimingModel(jitter="deterministic")
ZHANG_LEARNERS = 30


def _arrival_times(schedule) -> dict[tuple[int, int], float]:
  """(learner, batch_index) -> time the server received that gradient."""
  trace = schedule.events
  arrivals = trace.kind == events_lib.ARRIVE
  return {
    (int(learner), int(batch)): float(time)
    for learner, batch, time in zip(trace.learner[arrivals], trace.batch_index[arrivals], trace.time[arrivals])
  }


# First in the file (and the file first in the schedule's test commands): a simulation loop that never ends fails
# these guards at once, where any later test would hang instead of failing.
def test_the_event_loop_takes_no_arrival_once_the_last_update_is_made():
  """300 updates (past CPython's cached small ints) of 1-softsync with 3 learners: exactly 300 arrivals."""
  server = ArrivalOrderServer(3, n=3)
  arrivals = count_arrivals(server, most=300)
  schedule = run_parameter_server(server, protocol="async", num_updates=300, timing=TimingModel(), seed=0, options={})
  assert schedule.num_updates == 300 and len(arrivals) == 300


class _NeverUpdates(ArrivalOrderServer):
  def receive(self, learner, timestamp, batch_index):
    return (learner,)


def test_a_server_that_never_updates_is_stopped_at_its_bound_of_arrivals():
  """c + learners = 1 + 3 arrivals without an update are allowed; the 5th stops the loop."""
  server = _NeverUpdates(3, n=3)
  arrivals = count_arrivals(server, most=5)
  with pytest.raises(RuntimeError, match="5 gradients arrived after update 0"):
    run_parameter_server(server, protocol="toy", num_updates=3, timing=TimingModel(), seed=0, options={})
  assert len(arrivals) == 5


def test_hardsync_has_zero_staleness_and_every_learner_in_every_update():
  schedule = simulate("hardsync", learners=12, num_updates=500, seed=0)
  assert schedule.contributions_per_update == 12
  assert np.all(schedule.gradient_staleness == 0)
  np.testing.assert_array_equal(np.sort(schedule.learner, axis=1), np.broadcast_to(np.arange(12), (500, 12)))
  np.testing.assert_array_equal(schedule.batch_index, np.broadcast_to(np.arange(500)[:, None], (500, 12)))


def test_hardsync_rounds_match_the_closed_form():
  # With free communication every round starts when the previous update is
  # applied, lasts as long as its slowest learner, and lists the learners in
  # the order they finish.
  learners, rounds = 5, 40
  timing = TimingModel(jitter="exponential")
  schedule = simulate("hardsync", learners=learners, num_updates=rounds, seed=13, timing=timing)
  step_times = np.stack([StepDurations(timing, learners, 13).first(learner, rounds) for learner in range(learners)])
  np.testing.assert_allclose(schedule.update_time, np.cumsum(step_times.max(axis=0)), rtol=1e-12)
  np.testing.assert_array_equal(schedule.learner, np.argsort(step_times, axis=0, kind="stable").T)
  np.testing.assert_array_equal(schedule.timestamp, np.broadcast_to(np.arange(rounds)[:, None], (rounds, learners)))


def test_softsync_with_hundreds_of_contributions_per_update_applies_each_when_it_fills():
  # c = 600 // 2 = 300 gradients per update: more than CPython caches as shared int objects (-5 to 256), so the
  # server must compare the count of pending gradients with c by value.
  schedule = simulate("softsync", learners=600, n=2, num_updates=3, seed=0)
  assert schedule.contributions_per_update == 300 and schedule.learner.shape == (3, 300)
  assert all(len(set(row)) == 300 for row in schedule.learner.tolist())  # 300 learners, none twice


@pytest.mark.parametrize("n", [2, 4, 10, 15, 30])
def test_softsync_staleness_matches_zhang_et_al(n):
  contributions = ZHANG_LEARNERS // n
  schedule = simulate("softsync", learners=ZHANG_LEARNERS, n=n, num_updates=-(-100_000 // contributions), seed=n)
  staleness = schedule.gradient_staleness
  assert staleness.size >= 100_000
  assert schedule.contributions_per_update == contributions
  assert abs(staleness.mean() - n) <= 0.2 * n
  assert np.mean(staleness > 2 * n) < 1e-3


def test_one_softsync_staleness_is_zero_one_or_two():
  schedule = simulate("softsync", learners=ZHANG_LEARNERS, n=1, num_updates=4_000, seed=1)
  assert set(np.unique(schedule.gradient_staleness)) <= {0, 1, 2}
  assert schedule.contributions_per_update == ZHANG_LEARNERS


def test_async_with_identical_learners_has_staleness_learners_minus_one_in_steady_state():
  learners = 16
  schedule = simulate("async", learners=learners, num_updates=2_000, seed=0, timing=DETERMINISTIC)
  staleness = schedule.gradient_staleness
  np.testing.assert_array_equal(staleness[:learners], np.arange(learners))  # the first round fills the pipeline
  assert np.all(staleness[learners:] == learners - 1)


def test_async_is_softsync_with_n_equal_learners():
  asynchronous = simulate("async", learners=9, num_updates=300, seed=4)
  softsync = simulate("softsync", learners=9, n=9, num_updates=300, seed=4)
  np.testing.assert_array_equal(asynchronous.timestamp, softsync.timestamp)
  np.testing.assert_array_equal(asynchronous.learner, softsync.learner)
  np.testing.assert_array_equal(asynchronous.update_time, softsync.update_time)


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_keeps_every_clock_within_the_bound_at_every_event(bound):
  # Heterogeneous speeds so that the bound binds.
  timing = TimingModel(speed_factors=(1.0, 1.0, 1.3, 2.0, 0.7), jitter_sigma=0.3)
  schedule = simulate("ssp", learners=5, s=bound, num_updates=400, seed=2, timing=timing, record_events=True)
  trace = schedule.events
  started = trace.counts_after_each_event(events_lib.START, 5)
  arrived = trace.counts_after_each_event(events_lib.ARRIVE, 5)
  everyone_started = np.all(started >= 1, axis=1)
  # Clock of the gradient each learner works on (or last worked on) versus
  # the slowest learner's completed clocks.
  lead = (started - 1).max(axis=1) - arrived.min(axis=1)
  assert np.all(lead[everyone_started] <= bound)
  assert lead[everyone_started].max() == bound  # the bound is reached, so it is what stops the fast learners
  assert schedule.max_staleness <= bound  # reads include every update older than clock - s


@pytest.mark.parametrize("bound", [1, 2, 3, 5])
def test_ssp_clocks_match_the_closed_form(bound):
  # With free communication, learner l starts clock k as soon as it has pushed clock k - 1 and the slowest clock
  # allows it (k - s updates applied); update k is applied when the last gradient of clock k arrives:
  #   start(l, k) = max(finish(l, k - 1), U[k - s - 1] (0 before any)),  finish(l, k) = start(l, k) + d(l, k),
  #   U[k] = max_l finish(l, k),  and the gradient's timestamp is the count of updates applied before its start.
  learners, clocks = 4, 60
  timing = TimingModel(speed_factors=(1.0, 1.4, 2.5, 0.6), jitter="lognormal", jitter_sigma=0.4)
  schedule = simulate("ssp", learners=learners, s=bound, num_updates=clocks, seed=7, timing=timing)
  durations = np.stack([StepDurations(timing, learners, 7).first(learner, clocks) for learner in range(learners)])
  finish = np.zeros((learners, clocks))
  start = np.zeros((learners, clocks))
  applied = np.zeros(clocks)
  for k in range(clocks):
    allowed = applied[k - bound - 1] if k - bound - 1 >= 0 else 0.0
    for learner in range(learners):
      start[learner, k] = max(finish[learner, k - 1] if k else 0.0, allowed)
      finish[learner, k] = start[learner, k] + durations[learner, k]
    applied[k] = finish[:, k].max()
  np.testing.assert_allclose(schedule.update_time, applied, rtol=1e-12)
  np.testing.assert_array_equal(schedule.learner, np.argsort(finish, axis=0, kind="stable").T)
  # Clock k's gradient from learner l read the weights of every update applied by its start (one released by an
  # update starts after it).
  timestamps = np.searchsorted(applied, start, side="right")  # [learner, clock]
  np.testing.assert_array_equal(schedule.timestamp, timestamps[schedule.learner, np.arange(clocks)[:, None]])
  assert schedule.max_staleness == bound  # the bound binds


def test_ssp_with_hundreds_of_learners_applies_each_clock_when_it_completes():
  # 300 gradients per clock: more than CPython caches as shared int objects (-5 to 256), so the server must
  # compare a clock's count with lambda by value.
  schedule = simulate("ssp", learners=300, s=1, num_updates=3, seed=0)
  assert schedule.learner.shape == (3, 300) and all(len(set(row)) == 300 for row in schedule.learner.tolist())


def test_ssp_bounds_the_arrivals_between_updates_by_lambda_times_s_plus_one():
  # Between two updates every learner may push clocks u .. u + s: the event loop's guard against a rule that never
  # updates stops SSP past lambda (s + 1) arrivals, and not before.
  assert StaleSynchronousServer(learners=4, s=2).arrivals_between_updates() == 12
  assert StaleSynchronousServer(learners=7, s=0).arrivals_between_updates() == 7


def test_ssp_with_bound_zero_equals_hardsync():
  timing = TimingModel(jitter="exponential")
  hardsync = simulate("hardsync", learners=7, num_updates=200, seed=5, timing=timing)
  ssp = simulate("ssp", learners=7, s=0, num_updates=200, seed=5, timing=timing)
  for field in ("learner", "timestamp", "batch_index", "update_time", "learner_busy_time"):
    np.testing.assert_array_equal(getattr(ssp, field), getattr(hardsync, field), err_msg=field)


def test_ssp_with_a_large_bound_lets_fast_learners_run_ahead():
  timing = TimingModel(speed_factors=(1.0, 3.0), jitter="deterministic")
  bounded = simulate("ssp", learners=2, s=1, num_updates=60, seed=0, timing=timing)
  loose = simulate("ssp", learners=2, s=100, num_updates=60, seed=0, timing=timing)
  assert bounded.max_staleness == 1
  assert loose.max_staleness > 1
  assert loose.utilisation[0] > bounded.utilisation[0]


def test_backup_workers_apply_exactly_learners_minus_b_and_drop_the_latest_arrivals():
  learners, backup = 10, 3
  timing = TimingModel(jitter="lognormal", jitter_sigma=0.4)
  schedule = simulate(
    "backup", learners=learners, backup=backup, num_updates=300, seed=3, timing=timing, record_events=True
  )
  assert schedule.contributions_per_update == learners - backup
  assert np.all(schedule.gradient_staleness == 0)
  assert np.all([np.unique(row).size == row.size for row in schedule.learner])
  assert schedule.num_dropped > 0 and np.all(schedule.dropped_staleness >= 1)
  arrived_at = _arrival_times(schedule)
  last_accepted = np.array(
    [
      max(arrived_at[(int(learner), int(batch))] for learner, batch in zip(row, batches))
      for row, batches in zip(schedule.learner, schedule.batch_index)
    ]
  )
  for learner, batch, timestamp in zip(
    schedule.dropped_learner, schedule.dropped_batch_index, schedule.dropped_timestamp
  ):
    assert arrived_at[(int(learner), int(batch))] >= last_accepted[timestamp]


def test_backup_workers_with_hundreds_of_gradients_per_round_close_it_when_it_fills():
  # c = 300 - 1 = 299 gradients per round: more than CPython caches as shared int objects (-5 to 256), so the
  # server must compare the round's count with c by value.
  schedule = simulate("backup", learners=300, backup=1, num_updates=2, seed=0)
  assert schedule.learner.shape == (2, 299) and all(len(set(row)) == 299 for row in schedule.learner.tolist())
  assert np.all(schedule.timestamp == np.arange(2)[:, None])


def test_backup_workers_drop_the_persistently_slow_learners():
  timing = TimingModel(jitter="deterministic", speed_factors=(1.0,) * 6 + (2.5,) * 2)
  schedule = simulate("backup", learners=8, backup=2, num_updates=100, seed=0, timing=timing)
  assert set(np.unique(schedule.learner)) == set(range(6))
  assert set(np.unique(schedule.dropped_learner)) == {6, 7}


def test_backup_with_no_backup_workers_equals_hardsync():
  hardsync = simulate("hardsync", learners=6, num_updates=150, seed=8)
  backup = simulate("backup", learners=6, backup=0, num_updates=150, seed=8)
  for field in ("learner", "timestamp", "batch_index", "update_time"):
    np.testing.assert_array_equal(getattr(backup, field), getattr(hardsync, field), err_msg=field)
  assert backup.num_dropped == 0


@pytest.mark.parametrize("n", [1, 4, 12])
def test_drop_stale_applies_nothing_staler_than_the_bound_and_counts_every_drop(n):
  max_staleness = 2
  schedule = simulate(
    "drop_stale",
    learners=12,
    n=n,
    max_staleness=max_staleness,
    num_updates=3_000,
    seed=6,
    timing=TimingModel(jitter="exponential"),
    record_events=True,
  )
  assert schedule.max_staleness <= max_staleness
  assert schedule.num_dropped > 0
  assert np.all(schedule.dropped_staleness > max_staleness)
  trace = schedule.events
  arrivals = trace.kind == events_lib.ARRIVE
  # Every arrival is either applied or dropped; arrivals of the gradients
  # still pending when the run stopped are neither.
  assert arrivals.sum() - schedule.learner.size - schedule.num_dropped < schedule.contributions_per_update
  start_timestamp = {
    (int(learner), int(batch)): int(timestamp)
    for learner, batch, timestamp, kind in zip(trace.learner, trace.batch_index, trace.timestamp, trace.kind)
    if kind == events_lib.START
  }
  too_stale = sum(
    int(timestamp) - start_timestamp[(int(learner), int(batch))] > max_staleness
    for learner, batch, timestamp in zip(
      trace.learner[arrivals], trace.batch_index[arrivals], trace.timestamp[arrivals]
    )
  )
  assert too_stale == schedule.num_dropped


@pytest.mark.parametrize(
  "protocol,options",
  [
    ("allreduce_sync", {}),
    ("s3gd", {"staleness": 2}),
    ("dcs3gd", {"staleness": 1, "overlap": False}),
    ("diloco", {}),
    ("streaming_diloco", {}),
  ],
)
def test_decentralized_schedules_have_every_learner_every_step(protocol, options):
  learners, steps = 4, 50
  schedule = simulate(protocol, learners=learners, num_updates=steps, seed=0, **options)
  staleness = options.get("staleness", 0)
  np.testing.assert_array_equal(schedule.learner, np.broadcast_to(np.arange(learners), (steps, learners)))
  np.testing.assert_array_equal(schedule.batch_index[:, 0], np.arange(steps))
  np.testing.assert_array_equal(schedule.timestamp[:, 0], np.maximum(np.arange(steps) - staleness, 0))


def _step_period(schedule) -> float:
  return float(np.diff(schedule.update_time)[-10:].mean())


@pytest.mark.parametrize("compute_time,allreduce_bytes", [(1.0, 0.5), (1.0, 2.0)])
def test_decentralized_step_cost_with_and_without_overlap(compute_time, allreduce_bytes):
  learners = 4
  # bandwidth chosen so the ring all-reduce takes `allreduce_bytes` seconds.
  timing = TimingModel(
    compute_time=compute_time,
    jitter="deterministic",
    model_bytes=1_000,
    bandwidth=1_000 * 2 * (learners - 1) / learners / allreduce_bytes,
  )
  allreduce = timing.allreduce_time(learners)
  assert allreduce == pytest.approx(allreduce_bytes)
  sync = simulate("allreduce_sync", learners=learners, num_updates=40, seed=0, timing=timing)
  overlapped = simulate("s3gd", learners=learners, num_updates=40, seed=0, timing=timing, staleness=1)
  serial = simulate("s3gd", learners=learners, num_updates=40, seed=0, timing=timing, staleness=1, overlap=False)
  assert _step_period(sync) == pytest.approx(compute_time + allreduce)
  assert _step_period(serial) == pytest.approx(compute_time + allreduce)
  assert _step_period(overlapped) == pytest.approx(max(compute_time, allreduce))


def test_dcs3gd_has_the_timing_of_s3gd():
  s3gd = simulate("s3gd", learners=3, num_updates=100, seed=1)
  dcs3gd = simulate("dcs3gd", learners=3, num_updates=100, seed=1)
  np.testing.assert_array_equal(s3gd.update_time, dcs3gd.update_time)


def _protocol_options(protocol: str, learners: int) -> dict:
  return {
    "softsync": {"n": 2},
    "ssp": {"s": 2},
    "backup": {"backup": 1},
    "drop_stale": {"max_staleness": 3, "n": learners // 2},
  }.get(protocol, {})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_learner_consumes_consecutive_mini_batches(protocol):
  learners = 6
  timing = TimingModel(jitter="straggler", jitter_sigma=0.2, straggler_prob=0.1, straggler_factor=4.0)
  schedule = simulate(
    protocol, learners=learners, num_updates=200, seed=7, timing=timing, **_protocol_options(protocol, learners)
  )
  for learner in range(learners):
    batches = np.concatenate(
      [
        schedule.batch_index[schedule.learner == learner],
        schedule.dropped_batch_index[schedule.dropped_learner == learner],
      ]
    )
    np.testing.assert_array_equal(np.sort(batches), np.arange(batches.size), err_msg=f"learner {learner}")
    applied_in_order = schedule.batch_index[schedule.learner == learner]  # row-major = arrival order
    assert np.all(np.diff(applied_in_order) > 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_same_seed_same_schedule_and_different_seed_different_schedule(protocol):
  options = _protocol_options(protocol, 5)
  first = simulate(protocol, learners=5, num_updates=100, seed=11, **options)
  again = simulate(protocol, learners=5, num_updates=100, seed=11, **options)
  other = simulate(protocol, learners=5, num_updates=100, seed=12, **options)
  for field in ("learner", "timestamp", "batch_index", "update_time", "dropped_learner", "learner_busy_time"):
    np.testing.assert_array_equal(getattr(first, field), getattr(again, field), err_msg=field)
  assert not np.array_equal(first.update_time, other.update_time)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_busy_and_idle_time_add_up(protocol):
  schedule = simulate(protocol, learners=4, num_updates=80, seed=0, **_protocol_options(protocol, 4))
  np.testing.assert_allclose(schedule.learner_busy_time + schedule.idle_time, schedule.total_time)
  assert np.all(schedule.utilisation > 0) and np.all(schedule.utilisation <= 1 + 1e-12)


# c per protocol, by hand: hardsync and ssp take every learner's gradient, n-softsync floor(lambda / n), async 1,
# backup lambda - b, drop_stale its softsync's floor(lambda / n), the all-reduce protocols every learner (M).
CONTRIBUTIONS = [
  ("hardsync", 30, {}, 30),
  ("softsync", 30, {"n": 1}, 30),
  ("softsync", 30, {"n": 4}, 7),
  ("softsync", 30, {"n": 30}, 1),
  ("async", 30, {}, 1),
  ("ssp", 30, {"s": 3}, 30),
  ("backup", 30, {"backup": 1}, 29),
  ("backup", 30, {"backup": 6}, 24),
  ("drop_stale", 30, {"max_staleness": 2}, 1),
  ("drop_stale", 30, {"max_staleness": 2, "n": 3}, 10),
  ("allreduce_sync", 8, {}, 8),
  ("s3gd", 8, {"staleness": 2}, 8),
  ("dcs3gd", 8, {}, 8),
  ("diloco", 8, {}, 8),
  ("streaming_diloco", 8, {}, 8),
]


@pytest.mark.parametrize("protocol, learners, options, contributions", CONTRIBUTIONS)
def test_contributions_per_update_by_hand(protocol, learners, options, contributions):
  """c without simulating (it sizes the training's effective batch c mu): the hand table above, and the c every
  update of a simulated schedule applies."""
  assert contributions_per_update(protocol, learners=learners, **options) == contributions
  assert simulate(protocol, learners=learners, num_updates=3, seed=0, **options).contributions_per_update == (
    contributions
  )


def test_contributions_table_covers_every_protocol():
  assert {row[0] for row in CONTRIBUTIONS} == set(PROTOCOLS)


def test_a_server_rule_must_say_how_it_receives():
  """ServerRule is abstract in `receive`: a rule that forgets it cannot be made."""
  from stalesgd.schedule._parameter_server import ServerRule

  class Forgetful(ServerRule):
    pass

  with pytest.raises(TypeError, match="receive"):
    Forgetful(learners=2, contributions=1)


def test_the_protocol_tables_flags_and_fixed_settings_by_hand():
  """The rows as docs/protocols.md states them: S3GD and DC-S3GD default to S = 1 with overlap; S3GD, the
  synchronous all-reduce and both DiLoCos fix lambda = 0 (no correction), the last three S = 0; eager updates for
  S3GD, DC-S3GD and streaming DiLoCo; streaming options for streaming DiLoCo only; the rows cannot be changed."""
  import dataclasses

  from stalesgd.schedule import _protocols as protocols

  table = protocols.PROTOCOL_TABLE
  uncorrected = {"dc_lambda": 0.0, "lambda_mode": "constant"}
  assert table["s3gd"].fixed_settings == uncorrected and table["dcs3gd"].fixed_settings == {}
  for name in ("allreduce_sync", "diloco", "streaming_diloco"):
    assert table[name].fixed_settings == {"staleness": 0, **uncorrected}, name
  for name in ("s3gd", "dcs3gd"):
    assert table[name].resolve(4, {}) == {"staleness": 1, "overlap": True}, name
  assert table["streaming_diloco"].resolve(4, {}) == {"fragments": 1, "delay": 0}
  assert protocols.EAGER_PROTOCOLS == ("s3gd", "dcs3gd", "streaming_diloco")
  assert protocols.OUTER_LOOP_PROTOCOLS == ("diloco", "streaming_diloco")
  assert [name for name, row in table.items() if row.streaming] == ["streaming_diloco"]
  assert protocols.CORRECTED_DECENTRALIZED_PROTOCOLS == ("dcs3gd",)
  with pytest.raises(dataclasses.FrozenInstanceError):
    table["s3gd"].eager = False
  with pytest.raises(dataclasses.FrozenInstanceError):
    table["s3gd"].options["staleness"].default = 2


def test_contributions_per_update_and_simulate_take_their_learners_by_keyword():
  with pytest.raises(TypeError):
    contributions_per_update("async", 4)
  with pytest.raises(TypeError):
    simulate("async", 4, num_updates=3, seed=0)


@pytest.mark.parametrize(
  "options, message",
  [
    ({"fragments": 0}, "fragments=0; allowed: an integer >= 1"),
    ({"dynamic_min_steps": -1}, "dynamic_min_steps=-1; allowed: an integer >= 0 and <= 2"),
    ({"local_steps": 0}, "local_steps=0; allowed: an integer >= 1"),
  ],
)
def test_option_ranges_are_checked_before_simulating(options, message):
  protocol = "streaming_diloco" if "fragments" in options else "async"
  with pytest.raises(ValueError, match=f"^{message}$"):
    simulate(protocol, learners=2, num_updates=3, seed=0, **{"local_steps": 2, **options})


def test_local_steps_are_recorded_only_where_they_differ_from_one():
  """H = 1 schedules keep the provenance they had before local runs existed."""
  assert "local_steps" not in simulate("async", learners=2, num_updates=3, seed=0).options
  assert simulate("async", learners=2, num_updates=3, seed=0, local_steps=2).options["local_steps"] == 2


@pytest.mark.parametrize("protocol, options", [("allreduce_sync", {}), ("backup", {"backup": 1}), ("ssp", {"s": 1})])
def test_a_grace_window_is_refused_outside_async(protocol, options):
  with pytest.raises(ValueError, match=f"grace_window=0.5 with protocol='{protocol}'; allowed: 0, or a window"):
    simulate(protocol, learners=2, num_updates=3, seed=0, grace_window=0.5, **options)
  with pytest.raises(ValueError, match="grace_window"):
    simulate("async", learners=2, num_updates=3, seed=0, grace_window=-0.5)
  built = "".join(["as", "ync"])  # not the interned literal: the name is compared by value
  assert simulate(built, learners=2, num_updates=3, seed=0, grace_window=0.5).options["grace_window"] == 0.5


def test_simulate_takes_one_byte_count_per_fragment_and_records_them_for_p_above_one():
  """Streaming DiLoCo's fragments may differ in size (fragment_bytes, one count per fragment); P = 1 schedules
  keep the provenance they had before, and only the outer-loop protocols take byte counts."""
  timing = TimingModel(model_bytes=16, bandwidth=4.0, jitter="deterministic")
  common = dict(learners=2, num_updates=3, seed=0, timing=timing, local_steps=2, fragments=2, delay=1)
  run = simulate("streaming_diloco", fragment_bytes=(4, 12), **common)
  assert run.options["fragment_bytes"] == [4, 12]
  equal = simulate("streaming_diloco", **common)
  assert "fragment_bytes" not in equal.options
  assert run.update_time.tolist() != equal.update_time.tolist()
  one = dict(common, fragments=1)
  assert (
    simulate("streaming_diloco", fragment_bytes=(16,), **one).options == simulate("streaming_diloco", **one).options
  )
  for wrong in [(16,), (4, 4, 8)]:
    with pytest.raises(ValueError, match=r"fragment_bytes=\[.*\]; allowed: one byte count per fragment, 2$"):
      simulate("streaming_diloco", fragment_bytes=wrong, **common)
  diloco = dict(learners=2, num_updates=3, seed=0, timing=timing, local_steps=2)  # one fragment, no option for it
  assert simulate("diloco", fragment_bytes=(16,), **diloco).options == simulate("diloco", **diloco).options
  with pytest.raises(ValueError, match=r"fragment_bytes=\[4, 12\]; allowed: one byte count per fragment, 1$"):
    simulate("diloco", fragment_bytes=(4, 12), **diloco)
  # Past CPython's cached small ints: 300 fragments of one step each, the counts compared by value.
  many = dict(diloco, local_steps=300, fragments=300, delay=0, num_updates=1)
  assert simulate("streaming_diloco", fragment_bytes=[4] * 300, **many).options["fragment_bytes"] == [4] * 300
  for protocol in ("s3gd", "async"):
    with pytest.raises(ValueError, match=f"fragment_bytes with protocol='{protocol}'; allowed: None, or byte"):
      simulate(protocol, learners=2, num_updates=3, seed=0, fragment_bytes=(16,))


def test_local_runs_are_refused_for_the_one_step_decentralized_protocols():
  allowed = "hardsync, softsync, async, ssp, backup, drop_stale, diloco, streaming_diloco"
  with pytest.raises(ValueError, match=f"local_steps=2 with protocol='dcs3gd'.*allowed: 1, or .* one of {allowed}$"):
    simulate("dcs3gd", learners=2, num_updates=3, seed=0, local_steps=2)
  assert simulate("diloco", learners=2, num_updates=3, seed=0, local_steps=2).options["local_steps"] == 2
