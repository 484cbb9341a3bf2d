"""Timing of decentralized all-reduce protocols: synchronous, S3GD and DC-S3GD.

M learners each compute a gradient per step and exchange their updates with a
ring all-reduce (`TimingModel.allreduce_time`). With all-reduce staleness S
(Rigazzi, arXiv 1911.02516; docs/algorithms.md §3, reconstructed), step t
needs the all-reduce started at step t - S: learner i's step t

    ends computing at   C[i, t] = start[i, t] + compute[i, t]
    finishes at         E[i, t] = max(C[i, t], A[t - S])          (S >= 1)
    all-reduce t done   A[t]    = max(max_i E[i, t], A[t - 1]) + allreduce

(all-reduces use the network one after another). With overlap, the next step
starts as soon as the learner is done, start[i, t+1] = E[i, t], so in steady
state a step costs max(compute, allreduce). Without overlap a learner does not
compute while the network is busy, start[i, t+1] = max(E[i, t], A[t]): a step
costs compute + allreduce. S = 0 is synchronous all-reduce SGD: every learner
waits for its own step's all-reduce, E[i, t] = A[t] = max(max_i C[i, t],
A[t - 1]) + allreduce, so a step also costs compute + allreduce.

The result is a `Schedule` with c = M (every learner contributes to every
step), learner[t, i] = i, batch_index = t, timestamp = max(t - S, 0) (the newest
consensus step t's weights include) and update_time[t] = max_i E[i, t].
Delay compensation costs compute, not communication, so ``dcs3gd`` has the
timing of ``s3gd``. The server's ``apply_time`` does not apply here: a local
update belongs in ``compute_time``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stalesgd.schedule._durations import StepDurations
from stalesgd.schedule._parameter_server import ProgressCallback
from stalesgd.schedule._schedule_arrays import Schedule
from stalesgd.schedule._timing import TimingModel


def simulate_allreduce(
  *,
  protocol: str,
  learners: int,
  num_updates: int,
  timing: TimingModel,
  seed: int,
  staleness: int,
  overlap: bool,
  options: dict[str, Any],
  progress: ProgressCallback | None = None,
  local_steps: int = 1,
  outer_loop: bool = False,
  fragments: int = 1,
  delay: int = 0,
  fragment_bytes: Sequence[int] | None = None,
) -> Schedule:
  """Simulates ``num_updates`` steps of M learners with all-reduce staleness S.

  Args:
    protocol: protocol name recorded in the schedule.
    learners: M.
    num_updates: steps to simulate.
    timing: compute and communication times.
    seed: seeds every draw (learner i draws the stream it would under a parameter server).
    staleness: S >= 0, steps an all-reduce may lag behind.
    overlap: whether communication overlaps the next step's computation.
    options: JSON-serialisable provenance recorded in the schedule.
    progress: optional `ProgressCallback`.
    local_steps: H, the local steps of one learner's step (an outer round of
      ``diloco``): its compute time is the sum of H step times.
    outer_loop: time outer rounds step by step (`outer_round_ends`), with
      ``fragments`` P and ``delay`` tau of streaming DiLoCo.
    fragment_bytes: outer loops: each fragment's bytes (`outer_round_ends`); None: P equal fragments.

  Returns:
    The `Schedule` of the run.
  """
  if outer_loop:
    if local_steps % fragments or not 0 <= delay <= local_steps:
      raise ValueError(
        f"fragments={fragments}, delay={delay} with local_steps={local_steps}; allowed: fragments dividing "
        "local_steps and 0 <= delay <= local_steps"
      )
    steps = StepDurations(timing, learners, seed)
    step_times = np.stack([steps.first(learner, num_updates * local_steps) for learner in range(learners)], axis=1)
    update_time = outer_round_ends(step_times, timing, local_steps, fragments, delay, fragment_bytes)
    if progress is not None:
      progress(num_updates, num_updates)
    return _decentralized_schedule(protocol, learners, num_updates, 0, update_time, step_times, options)
  durations = StepDurations(timing, learners, seed, local_steps=local_steps)
  compute = np.stack([durations.first(learner, num_updates) for learner in range(learners)], axis=1)
  allreduce = timing.allreduce_time(learners)
  if staleness >= 1 and overlap:
    update_time = _overlapped_step_ends(compute, allreduce, staleness, progress)
  else:
    # Every learner starts each step when the previous all-reduce is done.
    allreduce_done = np.cumsum(compute.max(axis=1) + allreduce)
    update_time = allreduce_done if staleness == 0 else allreduce_done - allreduce
    if progress is not None:  # one vectorised pass: report it done
      progress(num_updates, num_updates)
  return _decentralized_schedule(protocol, learners, num_updates, staleness, update_time, compute, options)


def outer_round_ends(
  step_times: np.ndarray,
  timing: TimingModel,
  local_steps: int,
  fragments: int,
  delay: int,
  fragment_bytes: Sequence[int] | None = None,
) -> np.ndarray:
  """When each outer round of (streaming) DiLoCo ends, float64 [R], from every inner step's time [R H, M].

  The model, step by step: learner m's clock advances by its step times without pause. Fragment p's all-reduce
  (a ring all-reduce of its bytes b_p: ``2 (M-1)/M x b_p / bandwidth + 2 (M-1) x latency``) starts
  when the slowest learner reaches its sync (after step k H / P of a round, fragment k - 1) and the link is free
  (one all-reduce at a time, in sync order); a learner that reaches the fragment's application, tau steps after
  the sync, waits until that all-reduce is done. A round ends when its slowest learner has finished its H steps
  and the round-end events (the last sync, and with tau = 0 its application). With P = 1 and tau = 0 this is
  synchronous DiLoCo: each round lasts the slowest learner's H steps plus one all-reduce of the whole model.

  ``fragment_bytes``: each fragment's bytes B_p (fragment p synced after step (p + 1) H / P), of which it moves
  b_p = model_bytes x B_p / sum B (B_p itself where the timing model's model_bytes are the weights' bytes, its
  default; a model_bytes set otherwise is shared in the same proportions). None: b_p = model_bytes / P.
  """
  num_steps, learners = step_times.shape
  ring = 2 * (learners - 1) / learners * timing.transfer_time
  if fragment_bytes is None:
    transfers = [ring / fragments] * fragments
  else:
    if len(fragment_bytes) != fragments or min(fragment_bytes) < 0 or not sum(fragment_bytes) > 0:
      raise ValueError(
        f"fragment_bytes={list(fragment_bytes)}; allowed: {fragments} byte counts (one per fragment), >= 0, not all 0"
      )
    total = sum(fragment_bytes)
    transfers = [ring * (size / total) for size in fragment_bytes]  # P = 1: ring * 1.0, as before
  fragment_allreduce = [transfer + 2 * (learners - 1) * timing.latency for transfer in transfers]
  per_fragment = local_steps // fragments
  clock = np.zeros(learners)
  link_free = 0.0
  # A fragment is named by the step of the round after which it syncs.
  done: dict[int, float] = {}  # fragment -> when its all-reduce in flight finishes
  due: dict[int, int] = {}  # fragment -> the step boundary its application waits at
  ends = np.zeros(num_steps // local_steps)
  for step in range(num_steps):
    clock = clock + step_times[step]
    boundary = step + 1
    for p in [p for p, at in due.items() if at == boundary and delay > 0]:
      clock = np.maximum(clock, done[p])
      del due[p]
    position = boundary % local_steps or local_steps
    if position % per_fragment == 0:
      start = max(float(clock.max()), link_free)
      link_free = done[position] = start + fragment_allreduce[position // per_fragment - 1]
      due[position] = boundary + delay
      if delay == 0:
        clock = np.maximum(clock, done[position])
        del due[position]
    if position == local_steps:
      ends[boundary // local_steps - 1] = clock.max()
  return ends


def _decentralized_schedule(protocol, learners, num_updates, staleness, update_time, compute, options) -> Schedule:
  """The `Schedule` of a decentralized run; ``compute`` holds each learner's compute times in its columns."""
  steps = np.arange(num_updates, dtype=np.int64)
  empty = np.zeros(0, dtype=np.int64)
  return Schedule(
    protocol=protocol,
    learners=learners,
    learner=np.broadcast_to(np.arange(learners, dtype=np.int32), (num_updates, learners)).copy(),
    timestamp=np.broadcast_to(np.maximum(steps - staleness, 0)[:, None], (num_updates, learners)).copy(),
    batch_index=np.broadcast_to(steps[:, None], (num_updates, learners)).copy(),
    update_time=update_time,
    dropped_learner=empty.astype(np.int32),
    dropped_timestamp=empty,
    dropped_batch_index=empty,
    dropped_at_update=empty,
    learner_busy_time=compute.sum(axis=0),
    total_time=float(update_time[-1]),
    options=options,
  )


def _overlapped_step_ends(
  compute: np.ndarray, allreduce: float, staleness: int, progress: ProgressCallback | None
) -> np.ndarray:
  """max_i E[i, t] of the overlapped recurrence (module docstring), float64 [U]."""
  num_updates, learners = compute.shape
  finished = np.zeros(learners)
  allreduce_done = np.zeros(num_updates)
  step_end = np.zeros(num_updates)
  previous_done = 0.0
  report_every = max(1, num_updates // 100)
  for step in range(num_updates):
    computed = finished + compute[step]
    finished = np.maximum(computed, allreduce_done[step - staleness]) if step >= staleness else computed
    latest = finished.max()
    step_end[step] = latest
    previous_done = max(latest, previous_done) + allreduce
    allreduce_done[step] = previous_done
    if progress is not None and (step + 1) % report_every == 0:
      progress(step + 1, num_updates)
  return step_end
