"""Summary statistics of a `Schedule`: staleness and runtime, as the papers report them.

Zhang et al. (arXiv 1511.05950, Fig. 1) report <sigma> and the tail P(sigma > 2n)
for n-softsync; their runtime claim is a speedup over one learner (22-28x at
lambda = 30). `summarize` computes these for any schedule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stalesgd.schedule._protocols import PARAMETER_SERVER_PROTOCOLS
from stalesgd.schedule._schedule_arrays import Schedule
from stalesgd.schedule._timing import TimingModel


def mean_jitter(timing: TimingModel) -> float:
  """E[jitter]: 1 for every jitter except stragglers, 1 + p (k - 1)."""
  if timing.jitter == "straggler":
    return 1.0 + timing.straggler_prob * (timing.straggler_factor - 1.0)
  return 1.0


def single_learner_step_time(timing: TimingModel, learners: int, seed: int, *, parameter_server: bool = True) -> float:
  """Expected seconds per gradient of one learner alone.

  One learner of the cluster's mean speed factor (mean over learners, or over
  every entry of a per-step trace) loops pull -> compute -> push -> apply with
  a parameter server:

      compute_time * mean_factor * E[jitter] + 2 (latency + transfer) + apply_time,

  and only computes without one (a single all-reduce learner communicates
  nothing).

  Args:
    timing: the cluster's timing model.
    learners: the cluster's learners (to resolve per-learner factors).
    seed: the simulation seed (drawn factors depend on it).
    parameter_server: whether the learner talks to a server.

  Returns:
    Expected seconds between that learner's gradients.
  """
  per_step = timing.per_step_trace(learners)
  factors = timing.speed_factors_for(learners, seed) if per_step is None else per_step
  compute = timing.compute_time * float(np.mean(factors)) * mean_jitter(timing)
  if not parameter_server:
    return compute
  return compute + 2 * (timing.latency + timing.transfer_time) + timing.apply_time


def speedup_over_one_learner(schedule: Schedule) -> float:
  """Applied gradients per simulated second relative to one learner alone.

  Uses the timing model and seed recorded in ``schedule.options`` (as
  `simulate` records them); dropped gradients do not count.
  """
  if "timing" not in schedule.options or "seed" not in schedule.options:
    raise ValueError(
      f"schedule.options must hold the 'timing' and 'seed' that simulate records; got keys {sorted(schedule.options)}"
    )
  timing = TimingModel.from_dict(schedule.options["timing"])
  step_time = single_learner_step_time(
    timing,
    schedule.learners,
    schedule.options["seed"],
    parameter_server=schedule.protocol in PARAMETER_SERVER_PROTOCOLS,
  )
  return schedule.gradients_per_second * step_time


def softsync_n(schedule: Schedule) -> int | None:
  """The n of n-softsync-like protocols (async: lambda), else None."""
  if schedule.protocol == "async":
    return schedule.learners
  return schedule.options.get("protocol_options", {}).get("n")


def summarize(schedule: Schedule) -> dict[str, Any]:
  """The statistics the protocol papers report, as a flat dict.

  Returns:
    ``mean_staleness`` <sigma>, ``max_staleness``, ``p_staleness_above_2n``
    (P(sigma > 2n); NaN where the protocol has no n), ``updates_per_second``
    and ``gradients_per_second`` (simulated), ``speedup`` over one learner,
    ``dropped_fraction`` of all gradients that reached the server, and the
    mean ``utilisation`` of the learners.
  """
  n = softsync_n(schedule)
  applied = schedule.learner.size
  return {
    "protocol": schedule.protocol,
    "learners": schedule.learners,
    "contributions_per_update": schedule.contributions_per_update,
    "mean_staleness": schedule.mean_staleness,
    "max_staleness": schedule.max_staleness,
    "p_staleness_above_2n": math.nan if n is None else schedule.fraction_staleness_above(2 * n),
    "updates_per_second": schedule.updates_per_second,
    "gradients_per_second": schedule.gradients_per_second,
    "speedup": speedup_over_one_learner(schedule),
    "dropped_fraction": schedule.num_dropped / (applied + schedule.num_dropped),
    "utilisation": float(schedule.utilisation.mean()),
  }
