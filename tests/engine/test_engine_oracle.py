"""The engine oracle's own arithmetic (tests/helpers/engine_oracle.py), against values worked out by hand.

The oracle derives each contribution's version and staleness from the pulls in the schedule's event trace, not
from ``Schedule.timestamp`` / ``staleness_of`` (which the engine reads), and steps the server in numpy; if either
were wrong here, every engine comparison would hold the engine to the wrong numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from stalesgd import schedule as schedule_lib
from tests.helpers import engine_oracle

# Two learners, asynchronous SGD (c = 1), five updates, as (time, kind, learner, k, server timestamp):
#   t=0    L0 and L1 pull w_0 and start their gradient 0
#   t=1    L0's gradient 0 arrives at timestamp 0: update 0 (sigma 0 - 0 = 0); L0 pulls w_1
#   t=1.5  L1's gradient 0 arrives at 1: update 1 (sigma 1 - 0 = 1); L1 pulls w_2
#   t=2    L0's gradient 1 (from w_1) arrives at 2: update 2 (sigma 2 - 1 = 1); L0 pulls w_3
#   t=2.2  L0's gradient 2 (from w_3) arrives at 3: update 3 (sigma 3 - 3 = 0); L0 pulls w_4
#   t=3    L1's gradient 1 (from w_2) arrives at 4: update 4 (sigma 4 - 2 = 2)
PULL, PUSH = engine_oracle.PULL, engine_oracle.PUSH
EVENTS = [
  (0.0, PULL, 0, 0, 0),
  (0.0, PULL, 1, 0, 0),
  (1.0, PUSH, 0, 0, 0),
  (1.1, PULL, 0, 1, 1),
  (1.5, PUSH, 1, 0, 1),
  (1.6, PULL, 1, 1, 2),
  (2.0, PUSH, 0, 1, 2),
  (2.1, PULL, 0, 2, 3),
  (2.2, PUSH, 0, 2, 3),
  (2.3, PULL, 0, 3, 4),
  (3.0, PUSH, 1, 1, 4),
]
LEARNER = [0, 1, 0, 0, 1]
BATCH_INDEX = [0, 0, 1, 2, 1]
VERSIONS = [0, 0, 1, 3, 2]
STALENESS = [0, 1, 1, 0, 2]


def hand_schedule(timestamp=VERSIONS, events=EVENTS):
  column = lambda values: np.asarray(values)[:, None]
  return schedule_lib.Schedule(
    protocol="async",
    learners=2,
    learner=column(LEARNER),
    timestamp=column(timestamp),
    batch_index=column(BATCH_INDEX),
    update_time=[1.0, 1.5, 2.0, 2.2, 3.0],
    dropped_learner=np.zeros(0, np.int32),
    dropped_timestamp=np.zeros(0, np.int64),
    dropped_batch_index=np.zeros(0, np.int64),
    dropped_at_update=np.zeros(0, np.int64),
    learner_busy_time=[3.0, 3.0],
    total_time=3.0,
    events=None if events is None else schedule_lib.EventTrace(*map(np.asarray, zip(*events))),
  )


def test_versions_and_staleness_come_from_the_pulls_by_hand():
  versions, staleness = engine_oracle.contribution_versions(hand_schedule())
  assert versions[:, 0].tolist() == VERSIONS
  assert staleness[:, 0].tolist() == STALENESS


def test_the_schedules_timestamp_column_is_not_read():
  """A (valid) timestamp column of zeros: the oracle's versions still follow the pulls."""
  versions, staleness = engine_oracle.contribution_versions(hand_schedule(timestamp=[0] * 5))
  assert versions[:, 0].tolist() == VERSIONS
  assert staleness[:, 0].tolist() == STALENESS


def test_a_schedule_without_events_or_with_a_gradient_applied_before_its_push_is_refused():
  with pytest.raises(ValueError, match="record_events=True"):
    engine_oracle.contribution_versions(hand_schedule(events=None))
  late = [event if event[1:4] != (PUSH, 1, 1) else (3.0, PUSH, 1, 1, 5) for event in EVENTS]  # pushed after update 4
  with pytest.raises(ValueError, match="learner 1's gradient 1: pulled at 2, pushed at 5, applied by 4"):
    engine_oracle.contribution_versions(hand_schedule(events=late))


def test_staleness_of_simulated_protocols_as_their_text_states():
  """hardsync: sigma = 0 (docs/algorithms.md §1). Async with identical deterministic learners is round robin:
  update u applies learner (u mod lambda)'s gradient from w_{u - lambda + 1}, so sigma = min(u, lambda - 1)."""
  timing = schedule_lib.TimingModel(jitter="deterministic")
  hardsync = schedule_lib.simulate("hardsync", learners=3, num_updates=20, seed=0, record_events=True)
  assert not engine_oracle.contribution_versions(hardsync)[1].any()
  learners, updates = 4, 30
  run = schedule_lib.simulate(
    "async", learners=learners, num_updates=updates, seed=0, timing=timing, record_events=True
  )
  _, staleness = engine_oracle.contribution_versions(run)
  assert staleness[:, 0].tolist() == np.minimum(np.arange(updates), learners - 1).tolist()


def test_server_step_by_hand():
  """c = 2 gradients at sigma = (0, 2), one coordinate, alpha = 0.5, mu = 0.5, two updates.

  Plain, with alpha0/sigma: avg_0 = (1 * 2 + 1/2 * 4) / 2 = 2, v = 2, w = 1 - 0.5 * 2 = 0; the same gradients
  again: v = 2 + 0.5 * 2 = 3, w = 0 - 1.5 = -1.5.
  DC-ASGD-a (lambda0 = 1, m = 0.5, eps = 0), no staleness rule, w_bak = (w, w - 1): MeanSquare = 0.5 * (4 + 16) / 2
  = 5, g~ = (2, 4 + 16 / sqrt(5)); avg = 3 + 8 / sqrt(5), w = 1 - 0.5 avg.
  """
  weights, zero = {"w": np.array([1.0])}, {"w": np.array([0.0])}
  grads = [{"w": np.array([2.0])}, {"w": np.array([4.0])}]
  options = dict(learning_rate=0.5, momentum=0.5, dc_lambda=None, dc_decay=0.0, dc_eps=0.0)
  step = lambda w, v: engine_oracle.server_step(w, v, zero, grads, [w, w], [0, 2], staleness_rule="inverse", **options)
  weights_1, velocity_1, _ = step(weights, zero)
  assert (weights_1["w"][0], velocity_1["w"][0]) == (0.0, 2.0)
  weights_2, velocity_2, _ = step(weights_1, velocity_1)
  assert (weights_2["w"][0], velocity_2["w"][0]) == (-1.5, 3.0)

  options.update(dc_lambda=1.0, dc_decay=0.5)
  stale = [weights, {"w": np.array([0.0])}]
  corrected, _, mean_square = engine_oracle.server_step(
    weights, zero, zero, grads, stale, [0, 2], staleness_rule=None, **options
  )
  assert mean_square["w"][0] == 5.0
  np.testing.assert_allclose(corrected["w"][0], 1.0 - 0.5 * (3.0 + 8.0 / np.sqrt(5.0)), rtol=1e-15)
