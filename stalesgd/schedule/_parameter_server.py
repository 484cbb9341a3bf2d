"""The discrete-event simulation of learners and a parameter server.

Learners follow Rudra's loop (Gupta et al., arXiv 1509.04210): pull the
weights (w_t, t), compute the gradient of one mini-batch at them, push it, pull
again; a learner never accumulates mini-batches. What differs between
protocols is the server: which arriving gradients form an update, which are
dropped, and when a learner's pull is answered. That is a `ServerRule`; this
module runs any rule under a `TimingModel`:

* A push leaves when the computation ends and reaches the server after
  ``latency + model_bytes / bandwidth`` (later if the server's links are busy:
  `FifoLink`). The pull request travels with the push, so the server answers
  it right after processing the push.
* The server processes messages one at a time in arrival order; applying an
  update takes ``apply_time``, during which later messages wait. Update u's
  time is when w_{u+1} becomes readable.
* A pull answered at server time T returns the weights of the newest applied
  update (timestamp = updates applied so far) and reaches the learner after
  the same message cost; the learner then computes its next mini-batch.

The loop is a heap of computation end times. Because every link is first come
first served, arrivals at the server are in the same order as computation ends,
so one heap entry per gradient suffices (10^6 arrivals in a few seconds).
"""

from __future__ import annotations

import abc
import array
import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stalesgd.schedule import _events as events_lib
from stalesgd.schedule._durations import StepDurations
from stalesgd.schedule._schedule_arrays import Schedule
from stalesgd.schedule._timing import TimingModel

_WINDOW_CLOSES = -1  # the heap entry of a grace window's end (learners are >= 0)
# The data-shard ties are drawn from the seed's spawn key (_SHARD_STREAM,): apart from the timing model's streams
# (stalesgd.schedule._timing uses 0 and 1), so shards never change a step time.
_SHARD_STREAM = 2


class LeastVisitedShards:
  """Data shards handed to local runs as DeepMind's asynchronous DiLoCo notebook does (``sample_data``): a starting
  local run takes a shard visited least often so far, ties drawn uniformly, and reads the shard's next H_m
  mini-batches, so a shard's mini-batches are read in order by whichever learners take it.

  ``take(steps)`` returns ``(shard, offset)``: the shard and the inner steps its earlier local runs took.
  """

  def __init__(self, shards: int, seed: int):
    self._visits = [0] * shards
    self._steps = [0] * shards
    self._generator = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_SHARD_STREAM,)))

  def take(self, steps: int) -> tuple[int, int]:
    fewest = min(self._visits)
    candidates = [shard for shard, visits in enumerate(self._visits) if visits == fewest]
    shard = candidates[int(self._generator.integers(len(candidates)))] if len(candidates) > 1 else candidates[0]
    offset = self._steps[shard]
    self._visits[shard] += 1
    self._steps[shard] += steps
    return shard, offset


ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(updates_done, num_updates)`` as a run advances, last with
``updates_done == num_updates``: about 100 times by event loops, once by a vectorised pass."""


class FifoLink:
  """First-come-first-served transfers between learners and a (sharded) server.

  A message sent at time t occupies the sender's link for ``transfer_time``
  and every server shard's link for ``server_link_time`` (its share of the
  bytes), starting when that shard's link is free; it is delivered
  ``latency`` after both are done. Messages must be sent in time order.
  """

  def __init__(self, timing: TimingModel):
    self._transfer = timing.transfer_time
    self._occupancy = timing.server_link_time
    self._latency = timing.latency
    self._free = 0.0

  def send(self, sent_at: float) -> float:
    """Returns the delivery time of a message sent at ``sent_at``."""
    begin = sent_at if sent_at > self._free else self._free
    self._free = begin + self._occupancy
    finish = sent_at + self._transfer
    if finish < self._free:
      finish = self._free
    return finish + self._latency


class ServerRule(abc.ABC):
  """How a server turns arriving gradients into updates and answers pulls.

  Subclasses implement `receive`; they record applied contributions with
  `_apply` (one call per update, contributions in arrival order) and discarded
  gradients with `_drop`.

  Attributes:
    learners: number of learners.
    contributions: gradients per update (c), constant.
    updates: updates applied so far (the server timestamp).
  """

  def __init__(self, learners: int, contributions: int):
    self.learners = learners
    self.contributions = contributions
    self.updates = 0
    # Flat int64 columns (8 bytes per value, not a Python object per record).
    self.applied = {name: array.array("q") for name in ("learner", "timestamp", "batch_index")}
    self.dropped = {name: array.array("q") for name in ("learner", "timestamp", "batch_index", "at_update")}

  @abc.abstractmethod
  def receive(self, learner: int, timestamp: int, batch_index: int) -> Sequence[int]:
    """Processes one arriving gradient.

    Args:
      learner: who sent it.
      timestamp: server timestamp of the weights it was computed at.
      batch_index: which of the learner's gradients it is (0-based).

    Returns:
      The learners whose pulls are answered now (after any update this
      arrival triggered), in the order they asked; each then computes its
      next gradient at the current weights.
    """

  def arrivals_between_updates(self) -> int:
    """The most gradients that can arrive without making an update; the event loop stops a rule that exceeds it.

    At most c - 1 arrivals join the next update without completing it, and each learner's gradient is dropped
    at most once between two updates: a learner whose gradient was dropped restarts at the current weights, and
    no rule drops a gradient computed at the current weights (staleness 0). Rules that hold more override it.
    """
    return self.contributions + self.learners

  def _apply(self, contributions: list[tuple[int, int, int]]) -> None:
    """Applies one update made of ``(learner, timestamp, batch_index)`` triples."""
    learners, timestamps, batch_indices = self.applied.values()
    for learner, timestamp, batch_index in contributions:
      learners.append(learner)
      timestamps.append(timestamp)
      batch_indices.append(batch_index)
    self.updates += 1

  def _drop(self, learner: int, timestamp: int, batch_index: int) -> None:
    """Records a discarded gradient at the current server timestamp."""
    for column, value in zip(self.dropped.values(), (learner, timestamp, batch_index, self.updates)):
      column.append(value)


def run_parameter_server(
  rule: ServerRule,
  *,
  protocol: str,
  num_updates: int,
  timing: TimingModel,
  seed: int,
  options: dict[str, Any],
  record_events: bool = False,
  progress: ProgressCallback | None = None,
  local_steps: Any = 1,
  grace_window: float = 0.0,
  data_shards: int = 0,
  inner_steps: int = 0,
) -> Schedule:
  """Simulates learners and a server under ``rule`` until ``num_updates`` updates.

  Gradients still in flight when the last update is applied are not part of
  the schedule, so every learner's applied and dropped mini-batch indices are
  a consecutive prefix 0, 1, 2, ...

  Args:
    rule: the server's protocol (fresh; it is consumed).
    protocol: protocol name recorded in the schedule.
    num_updates: updates to simulate (U).
    timing: compute and communication times.
    seed: seeds every draw.
    options: JSON-serialisable provenance recorded in the schedule.
    record_events: attach an `EventTrace` of every start and arrival.
    progress: optional `ProgressCallback`.
    local_steps: H, the local steps of one contribution, or H_m per learner:
      its compute time is the sum of H step times (`StepDurations`).
    grace_window: T_g > 0 holds the learners whose gradients arrive within
      T_g seconds of the first arrival after a release (the rule still
      applies each on arrival), then answers all their pulls together at the
      window's end, so they restart from the same version (the asynchronous
      DiLoCo notebook's grace window; Liu et al.). 0: every pull is answered
      as the rule says.
    data_shards: S > 0 splits the data into S shards and hands each starting
      local run the least-visited one (`LeastVisitedShards`), recorded in
      ``Schedule.data_stream`` and ``data_offset``; 0: every learner reads its
      own mini-batches.
    inner_steps: > 0 ends the run at the first update at which the applied
      contributions' inner steps (H_m each) reach it, if that comes before
      ``num_updates`` (equal inner steps under dynamic local updates, as the
      notebook's ``finished``); 0: ``num_updates`` updates.

  Returns:
    The `Schedule` of the run.
  """
  learners = rule.learners
  durations = StepDurations(timing, learners, seed, local_steps=local_steps)
  steps_of = np.broadcast_to(np.asarray(local_steps, np.int64), (learners,)).tolist()
  shards = LeastVisitedShards(data_shards, seed) if data_shards else None
  taken: list[list[tuple[int, int]]] = [[] for _ in range(learners)]  # learner's k-th run: (shard, offset)
  applied_steps = 0
  streams = [durations.stream(learner) for learner in range(learners)]
  push_send = FifoLink(timing).send
  pull_send = FifoLink(timing).send
  apply_time = timing.apply_time
  weights_timestamp = [0] * learners
  next_batch = [0] * learners
  compute_start = [0.0] * learners
  compute_end = [0.0] * learners
  busy_time = [0.0] * learners
  update_time: list[float] = []
  heap: list[tuple[float, int, int]] = []
  sequence = itertools.count()
  log: list[tuple[float, int, int, int, int]] | None = [] if record_events else None
  report_every = max(1, num_updates // 100)

  def start(learner: int, served_at: float) -> None:
    begin = pull_send(served_at)
    duration = next(streams[learner])
    end = begin + duration
    weights_timestamp[learner] = rule.updates
    if shards is not None:
      taken[learner].append(shards.take(steps_of[learner]))
    compute_start[learner] = begin
    compute_end[learner] = end
    busy_time[learner] += duration
    heapq.heappush(heap, (end, next(sequence), learner))
    if log is not None:
      log.append((begin, events_lib.START, learner, next_batch[learner], rule.updates))

  for learner in range(learners):
    start(learner, 0.0)
  server_free = 0.0
  receive = rule.receive
  # A rule that keeps taking gradients without ever updating (e.g. one that drops fresh gradients) would loop
  # forever; past the rule's own bound on arrivals between updates it is stopped.
  most_idle_arrivals = rule.arrivals_between_updates()
  idle_arrivals = 0
  held: list[int] = []  # learners waiting for the grace window to close
  window_open = False
  while rule.updates < num_updates and not (inner_steps and applied_steps >= inner_steps):
    if not heap:
      raise RuntimeError(f"{protocol}: every learner is waiting after {rule.updates} updates (protocol deadlock)")
    end, _, learner = heapq.heappop(heap)
    if learner == _WINDOW_CLOSES:
      # Every learner that arrived in the window restarts from the current version, at the time the window's last
      # arrival was applied (the asynchronous DiLoCo notebook's simulation, which restarts them once it sees that
      # no other arrival falls in the window; nothing was processed between that arrival and this timer).
      released, held, window_open = held, [], False
      for other in released:
        start(other, server_free)
      continue
    now = push_send(end)
    if now < server_free:
      now = server_free
    updates_before = rule.updates
    batch_index = next_batch[learner]
    next_batch[learner] = batch_index + 1
    if log is not None:
      log.append((now, events_lib.ARRIVE, learner, batch_index, updates_before))
    released = receive(learner, weights_timestamp[learner], batch_index)
    if rule.updates != updates_before:
      idle_arrivals = 0
      if inner_steps:
        applied_steps += sum(steps_of[other] for other in rule.applied["learner"][-rule.contributions :])
      now += apply_time
      update_time.append(now)
      if progress is not None and rule.updates % report_every == 0:
        progress(rule.updates, num_updates)
    else:
      idle_arrivals += 1
      if idle_arrivals > most_idle_arrivals:
        raise RuntimeError(
          f"{protocol}: {idle_arrivals} gradients arrived after update {rule.updates} without another update, more "
          f"than {type(rule).__name__} allows ({most_idle_arrivals}); the server makes no progress"
        )
    server_free = now
    if grace_window > 0:
      if not window_open:
        window_open = True
        heapq.heappush(heap, (now + grace_window, next(sequence), _WINDOW_CLOSES))
      held.extend(released)
      released = ()
    for other in released:
      start(other, now)

  if progress is not None and rule.updates < num_updates:  # ended early by ``inner_steps``
    progress(rule.updates, rule.updates)
  total_time = update_time[-1]
  # Computations still running at the end count only up to total_time.
  for learner in range(learners):
    busy_time[learner] -= max(0.0, compute_end[learner] - max(compute_start[learner], total_time))
  data = taken if shards is not None else None
  return _assemble(rule, protocol, rule.updates, update_time, busy_time, total_time, options, log, data)


def _assemble(rule, protocol, num_updates, update_time, busy_time, total_time, options, log, taken) -> Schedule:
  """Packs the rule's records (and ``taken``, each learner's runs' (shard, offset), or None) into a `Schedule`."""
  shape = (num_updates, rule.contributions)
  applied = {name: np.array(column, dtype=np.int64).reshape(shape) for name, column in rule.applied.items()}
  dropped = {name: np.array(column, dtype=np.int64) for name, column in rule.dropped.items()}
  events = events_lib.EventTrace.from_unsorted(*zip(*log)) if log else None
  data = {}
  if taken is not None:
    pairs = np.array(
      [taken[learner][k] for learner, k in zip(applied["learner"].reshape(-1), applied["batch_index"].reshape(-1))],
      dtype=np.int64,
    ).reshape(shape + (2,))
    data = {"data_stream": pairs[..., 0], "data_offset": pairs[..., 1]}
  return Schedule(
    protocol=protocol,
    learners=rule.learners,
    learner=applied["learner"],
    timestamp=applied["timestamp"],
    batch_index=applied["batch_index"],
    update_time=np.asarray(update_time, dtype=np.float64),
    dropped_learner=dropped["learner"],
    dropped_timestamp=dropped["timestamp"],
    dropped_batch_index=dropped["batch_index"],
    dropped_at_update=dropped["at_update"],
    learner_busy_time=np.asarray(busy_time, dtype=np.float64),
    total_time=total_time,
    options=options,
    events=events,
    **data,
  )
