"""`simulate`'s argument checking, progress reports and summary statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stalesgd.reports import _plots as plots
from stalesgd.reports import _schedule_plots as schedule_plots
from stalesgd.schedule import PROTOCOLS, TimingModel, simulate
from stalesgd.schedule import _summary as statistics
from stalesgd.schedule._parameter_server import ServerRule, run_parameter_server
from tests.helpers.schedule_helpers import count_arrivals


@pytest.mark.parametrize(
  "protocol,arguments,message",
  [
    ("softsync", {"n": 31}, r"n=31; allowed: an integer >= 1 and <= learners=30"),
    ("softsync", {"n": 0}, r"n=0; allowed: an integer >= 1 and <= learners=30"),
    ("softsync", {"n": 2.5}, r"n=2\.5; allowed: an integer >= 1 and <= learners=30"),
    ("softsync", {}, r"protocol 'softsync' needs the option 'n'"),
    ("ssp", {"s": -1}, r"s=-1; allowed: an integer >= 0"),
    ("backup", {"backup": 30}, r"backup=30; allowed: an integer >= 0 and <= learners - 1=29"),
    ("drop_stale", {"max_staleness": -2}, r"max_staleness=-2; allowed: an integer >= 0"),
    ("drop_stale", {"max_staleness": 2, "n": 40}, r"n=40; allowed: an integer >= 1 and <= learners=30"),
    ("s3gd", {"staleness": -1}, r"staleness=-1; allowed: an integer >= 0"),
    ("s3gd", {"overlap": 1}, r"overlap=1; allowed: True or False"),
    ("hardsync", {"n": 2}, r"protocol 'hardsync' does not take option\(s\) \['n'\]; allowed options: none"),
    ("softsync", {"n": 2, "bound": 3}, r"does not take option\(s\) \['bound'\]; allowed options: n"),
    ("gossip", {}, r"protocol='gossip'; allowed: one of \('hardsync', .*'dcs3gd', 'diloco', 'streaming_diloco'\)"),
    ("async", {"learners": 0}, r"learners=0; allowed: an integer >= 1"),
    ("async", {"num_updates": 0}, r"num_updates=0; allowed: an integer >= 1"),
    ("async", {"seed": -1}, r"seed=-1; allowed: an integer >= 0"),
    ("async", {"timing": "fast"}, r"timing must be a TimingModel or None; got str"),
    ("async", {"timing": TimingModel(speed_factors=(1.0, 2.0))}, r"speed_factors must hold one factor per learner"),
    ("allreduce_sync", {"record_events": True}, r"record_events is only available for hardsync"),
  ],
)
def test_invalid_arguments_raise_naming_the_argument_and_range(protocol, arguments, message):
  arguments = {"learners": 30, "num_updates": 10, "seed": 0, **arguments}
  with pytest.raises(ValueError, match=message):
    simulate(protocol, **arguments)


@pytest.mark.parametrize("protocol", ["softsync", "s3gd", "allreduce_sync"])
def test_progress_is_reported_up_to_the_last_update(protocol):
  reports = []
  options = {"n": 2} if protocol == "softsync" else {}
  simulate(
    protocol,
    learners=4,
    num_updates=1_000,
    seed=0,
    progress=lambda done, total: reports.append((done, total)),
    **options,
  )
  assert reports and reports[-1] == (1_000, 1_000)
  assert all(later > earlier for (earlier, _), (later, _) in zip(reports, reports[1:]))


@pytest.mark.parametrize("protocol, options", [("async", {}), ("s3gd", {"staleness": 1, "overlap": True})])
@pytest.mark.parametrize("num_updates, every", [(50, 1), (150, 1), (198, 1), (250, 2)])
def test_an_event_loop_reports_progress_every_hundredth_of_the_run(protocol, options, num_updates, every):
  """Every max(1, U // 100) updates: U = 50 and 150 every update, U = 250 every second one, the last included
  (the parameter server's event loop and the overlapped all-reduce recurrence)."""
  reports = []
  simulate(
    protocol, learners=2, num_updates=num_updates, seed=0, progress=lambda done, total: reports.append(done), **options
  )
  assert reports == list(range(every, num_updates + 1, every))


def test_summary_of_deterministic_learners_shows_linear_speedup():
  timing = TimingModel(jitter="deterministic")
  for protocol in ("hardsync", "async", "allreduce_sync"):
    summary = statistics.summarize(simulate(protocol, learners=30, num_updates=300, seed=0, timing=timing))
    assert summary["speedup"] == pytest.approx(30.0, rel=0.01 if protocol == "async" else 1e-9), protocol
  summary = statistics.summarize(simulate("softsync", learners=30, n=4, num_updates=3_000, seed=0))
  assert summary["mean_staleness"] == pytest.approx(4.0, rel=0.2)
  assert summary["p_staleness_above_2n"] == 0.0
  assert math.isnan(
    statistics.summarize(simulate("ssp", learners=4, s=1, num_updates=50, seed=0))["p_staleness_above_2n"]
  )


def test_stragglers_slow_hardsync_more_than_async():
  stragglers = TimingModel(jitter="straggler", jitter_sigma=0.05, straggler_prob=0.02, straggler_factor=5.0)
  speedups = {
    protocol: statistics.summarize(simulate(protocol, learners=30, num_updates=n_updates, seed=0, timing=stragglers))[
      "speedup"
    ]
    for protocol, n_updates in (("hardsync", 300), ("async", 9_000))
  }
  assert speedups["async"] > 25 and speedups["hardsync"] < 20


def test_dropped_gradients_do_not_count_towards_the_speedup():
  timing = TimingModel(jitter="deterministic", speed_factors=(1.0,) * 3 + (2.5,))
  summary = statistics.summarize(simulate("backup", learners=4, backup=1, num_updates=100, seed=0, timing=timing))
  assert summary["dropped_fraction"] > 0
  # Three unit-speed learners' gradients are applied, one per second each.
  mean_step = float(np.mean(timing.speed_factors))
  assert summary["speedup"] == pytest.approx(3.0 * mean_step, rel=0.02)


def test_staleness_histograms_of_every_protocol_are_written(tmp_path):
  options = {"softsync": {"n": 2}, "ssp": {"s": 1}, "backup": {"backup": 1}, "drop_stale": {"max_staleness": 2}}
  staleness = {
    protocol: simulate(protocol, learners=4, num_updates=40, seed=0, **options.get(protocol, {})).gradient_staleness
    for protocol in PROTOCOLS
  }
  path = tmp_path / "nested" / "histogram.png"
  plots.plot_staleness_histograms(staleness, path)
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_protocol_comparison_plot_and_empty_inputs(tmp_path):
  path = tmp_path / "bars.png"
  schedule_plots.plot_protocol_comparison(
    {"no stragglers": {"hardsync": 24.0, "async": 29.0}, "stragglers": {"async": 28.0}}, path, ylabel="speedup"
  )
  assert path.stat().st_size > 0
  with pytest.raises(ValueError, match="at least one"):
    schedule_plots.plot_protocol_comparison({}, path, ylabel="speedup")
  with pytest.raises(ValueError, match="staleness is empty"):
    plots.plot_staleness_histograms({}, path)


class _DropsEverything(ServerRule):
  """The backup server's mutant `timestamp <= updates`: every gradient, fresh ones included, is dropped."""

  def __init__(self, learners):
    super().__init__(learners, contributions=learners)

  def receive(self, learner, timestamp, batch_index):
    self._drop(learner, timestamp, batch_index)
    return (learner,)


class _NeverApplies(_DropsEverything):
  """Takes every gradient and answers the pull, but never makes an update."""

  def receive(self, learner, timestamp, batch_index):
    return (learner,)


def test_the_event_loops_defaults_are_no_window_no_shards_and_no_step_budget():
  """run_parameter_server without grace_window, data_shards and inner_steps runs as simulate does without them."""
  from stalesgd.schedule._softsync import ArrivalOrderServer

  timing = TimingModel(compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 1.5))
  direct = run_parameter_server(
    ArrivalOrderServer(2, n=2), protocol="async", num_updates=6, timing=timing, seed=0, options={}
  )
  simulated = simulate("async", learners=2, num_updates=6, seed=0, timing=timing)
  np.testing.assert_array_equal(direct.timestamp, simulated.timestamp)  # a window would hold learner 0 back
  np.testing.assert_array_equal(direct.update_time, simulated.update_time)
  assert direct.data_stream is None and direct.events is None and direct.num_updates == 6
  # One local step per contribution by default: on one data shard each run reads the next mini-batch.
  sharded = run_parameter_server(
    ArrivalOrderServer(2, n=2), protocol="async", num_updates=6, timing=timing, seed=0, options={}, data_shards=1
  )
  expected = simulate("async", learners=2, num_updates=6, seed=0, timing=timing, data_shards=1)
  np.testing.assert_array_equal(sharded.data_offset, expected.data_offset)
  assert len(set(sharded.data_offset[:, 0].tolist())) == 6  # six runs, six different mini-batches


@pytest.mark.parametrize("rule", [_DropsEverything, _NeverApplies])
def test_a_server_that_never_updates_is_stopped_instead_of_looping_forever(rule):
  # 3 learners, c = 3: at most c + learners = 6 arrivals without an update; the 7th stops the loop.
  server = rule(3)
  arrivals = count_arrivals(server, most=7)  # fails past the 7th instead of looping forever
  with pytest.raises(
    RuntimeError, match=r"toy: 7 gradients arrived after update 0 .* allows \(6\); the server makes no"
  ):
    run_parameter_server(
      server, protocol="toy", num_updates=5, timing=TimingModel(), seed=0, options={}, record_events=False
    )
  assert len(arrivals) == 7  # stopped at the 7th, not one sooner or later


class _AppliesOnce(_NeverApplies):
  """Makes one update from the first gradient, then never another."""

  def receive(self, learner, timestamp, batch_index):
    if not self.updates:
      self._apply([(learner, timestamp, batch_index)])
    return (learner,)


def test_the_count_of_arrivals_without_an_update_starts_again_at_each_update():
  server = _AppliesOnce(3)
  arrivals = count_arrivals(server, most=1 + 7)
  with pytest.raises(RuntimeError, match=r"toy: 7 gradients arrived after update 1 "):
    run_parameter_server(server, protocol="toy", num_updates=5, timing=TimingModel(), seed=0, options={})
  assert len(arrivals) == 1 + 7


def test_the_event_loop_takes_its_options_by_keyword_only():
  from stalesgd.schedule._softsync import ArrivalOrderServer

  with pytest.raises(TypeError):
    run_parameter_server(ArrivalOrderServer(2, n=2), "async", 3, TimingModel(), 0, {})


@pytest.mark.parametrize(
  "protocol, options",
  [
    ("hardsync", {}),
    ("async", {}),
    ("softsync", {"n": 2}),
    ("ssp", {"s": 3}),
    ("backup", {"backup": 2}),
    ("drop_stale", {"max_staleness": 0}),
  ],
)
def test_a_straggler_stays_within_the_bound_on_arrivals_between_updates(protocol, options):
  """One learner ten times slower and a 20 % straggler chance: the fast learners push many gradients between
  updates (ssp: clocks u to u + s each), within each rule's bound, so the simulation completes."""
  timing = TimingModel(speed_factors=(1.0,) * 5 + (10.0,), jitter="straggler", straggler_prob=0.2, straggler_factor=8.0)
  schedule = simulate(protocol, learners=6, num_updates=200, seed=1, timing=timing, **options)
  assert schedule.update_time.shape == (200,)


def test_a_grace_window_answers_the_learners_that_arrive_in_it_together():
  """2 learners at 1 s and 1.5 s per contribution (deterministic, free communication), T_g = 0.6 s, by hand, as the
  asynchronous DiLoCo notebook's loop runs it: learner 0 arrives at 1.0 (version 0: update 1) and opens the window
  until 1.6; learner 1 arrives at 1.5 (version 0: update 2), the window's last arrival, so both restart at 1.5
  from version 2: arrivals at 2.5 (update 3) and 3.0 (update 4, within 2.5 + 0.6), both computed at version 2;
  both restart at 3.0 from version 4, and learner 0 arrives at 4.0 (update 5)."""
  timing = TimingModel(compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 1.5))
  schedule = simulate("async", learners=2, num_updates=5, seed=0, timing=timing, grace_window=0.6)
  np.testing.assert_array_equal(schedule.learner[:, 0], [0, 1, 0, 1, 0])
  np.testing.assert_array_equal(schedule.timestamp[:, 0], [0, 0, 2, 2, 4])
  np.testing.assert_allclose(schedule.update_time, [1.0, 1.5, 2.5, 3.0, 4.0])
  # A learner still computing when the window closes keeps computing; the others restart at the last arrival:
  # 3 learners at 1, 1.2 and 3 s, T_g = 0.5: learners 0 and 1 arrive at 1.0 and 1.2 and restart at 1.2 (arrivals
  # 2.2 and 2.4, window 2.2-2.7), learner 2 arrives at 3.0 (a window of its own) computed at version 0.
  three = TimingModel(compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 1.2, 3.0))
  schedule = simulate("async", learners=3, num_updates=5, seed=0, timing=three, grace_window=0.5)
  np.testing.assert_array_equal(schedule.learner[:, 0], [0, 1, 0, 1, 2])
  np.testing.assert_array_equal(schedule.timestamp[:, 0], [0, 0, 2, 2, 0])
  np.testing.assert_allclose(schedule.update_time, [1.0, 1.2, 2.2, 2.4, 3.0])
  # Ended at update 4 (3.0 s, learner 1) while learner 0 waits in the window it opened at 2.5: its busy time is its
  # two contributions, 1 + 1 s, none of the wait; learner 1's 1.5 + 1.5 s.
  ended_in_a_window = simulate("async", learners=2, num_updates=4, seed=0, timing=timing, grace_window=0.6)
  np.testing.assert_allclose(ended_in_a_window.learner_busy_time, [2.0, 3.0])
  # A window's timer is its own: 4 learners at 1, 1.2, 1.6 and 1.75 s, T_g = 0.5. Learners 0 and 1 arrive at 1.0
  # and 1.2 (window 1.0-1.5) and restart at 1.2 from version 2; learner 2 arrives at 1.6 (a new window, 1.6-2.1),
  # learner 3 at 1.75: both restart at 1.75 from version 4 (learner 2 arrives at 3.35), not when a timer of the
  # first window's second arrival (1.2 + 0.5 = 1.7) would have let learner 2 go at 1.6 from version 3; learners 0
  # and 1 arrive at 2.2 and 2.4 (window 2.2-2.7, restart at 2.4 from version 6: learner 0 arrives at 3.4).
  four = TimingModel(compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 1.2, 1.6, 1.75))
  schedule = simulate("async", learners=4, num_updates=8, seed=0, timing=four, grace_window=0.5)
  np.testing.assert_array_equal(schedule.learner[:, 0], [0, 1, 2, 3, 0, 1, 2, 0])
  np.testing.assert_array_equal(schedule.timestamp[:, 0], [0, 0, 0, 0, 2, 2, 4, 6])
  np.testing.assert_allclose(schedule.update_time, [1.0, 1.2, 1.6, 1.75, 2.2, 2.4, 3.35, 3.4])
  plain = simulate("async", learners=2, num_updates=5, seed=0, timing=timing)
  np.testing.assert_array_equal(plain.timestamp[:, 0], [0, 0, 1, 2, 3])  # without it: each restarts at once
  with pytest.raises(ValueError, match="grace_window=0.5 with protocol='softsync'"):
    simulate("softsync", learners=2, n=1, num_updates=5, seed=0, grace_window=0.5)
