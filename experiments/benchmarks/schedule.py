r"""Speed of the timing model: gradient arrivals simulated per second, per protocol.

The target (issue 3): 10^6 gradient arrivals in under 10 s on one core, so that
the simulation is never the bottleneck of an experiment. For every protocol at
lambda = ``--learners`` this simulates about ``--arrivals`` gradient arrivals
(applied plus dropped), ``--repeats`` times, and reports the median wall time
and arrivals per second.

Usage::

  python -m experiments.benchmarks.schedule                  # 10^6 arrivals, 3 repeats
  python -m experiments.benchmarks.schedule --arrivals=100000 --repeats=1   # seconds

Writes ``results/schedule_benchmark.json`` (one row per protocol plus the
machine description). The simulation is single-threaded Python and numpy.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import app, flags

import stalesgd
from experiments.benchmarks.common import machine_description
from stalesgd import schedule as schedule_lib

_ARRIVALS = flags.DEFINE_integer("arrivals", 1_000_000, "Gradient arrivals per run (about).")
_LEARNERS = flags.DEFINE_integer("learners", 30, "lambda learners (M workers).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Runs per protocol (the median is reported).")
_OUTPUT = flags.DEFINE_string("output", "results/schedule_benchmark.json", "Where to write the JSON rows.")

TARGET_SECONDS_PER_MILLION = 10.0


def benchmark_protocols(learners: int) -> list[tuple[str, dict[str, Any]]]:
  """Every protocol, with options that exercise its rules (waits, drops)."""
  return [
    ("hardsync", {}),
    ("softsync", {"n": min(4, learners)}),
    ("async", {}),
    ("ssp", {"s": 3}),
    ("backup", {"backup": learners // 10}),
    ("drop_stale", {"max_staleness": learners}),
    ("allreduce_sync", {}),
    ("s3gd", {"staleness": 1}),
    ("dcs3gd", {"staleness": 1, "overlap": False}),
  ]


def time_protocol(protocol: str, options: dict[str, Any], learners: int, arrivals: int, repeats: int) -> dict[str, Any]:
  """Median wall time of simulating about ``arrivals`` gradient arrivals."""
  contributions = schedule_lib.contributions_per_update(protocol, learners=learners, **options)
  num_updates = max(1, arrivals // contributions)
  seconds, counted = [], 0
  for repeat in range(repeats):
    started = time.perf_counter()
    schedule = schedule_lib.simulate(protocol, learners=learners, num_updates=num_updates, seed=repeat, **options)
    seconds.append(time.perf_counter() - started)
    counted = schedule.learner.size + schedule.num_dropped
  median = statistics.median(seconds)
  return {
    "protocol": protocol,
    "options": options,
    "learners": learners,
    "num_updates": num_updates,
    "arrivals": counted,
    "seconds_median": median,
    "seconds_all": seconds,
    "arrivals_per_second": counted / median,
    "seconds_per_million_arrivals": median * 1e6 / counted,
  }


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  rows = []
  print(f"{'protocol':>16}  {'arrivals':>9}  {'median s':>8}  {'arrivals/s':>11}  {'s per 10^6':>10}")
  for protocol, options in benchmark_protocols(_LEARNERS.value):
    row = time_protocol(protocol, options, _LEARNERS.value, _ARRIVALS.value, _REPEATS.value)
    rows.append(row)
    print(
      f"{protocol:>16}  {row['arrivals']:>9}  {row['seconds_median']:>8.2f}  {row['arrivals_per_second']:>11,.0f}  "
      f"{row['seconds_per_million_arrivals']:>10.2f}",
      flush=True,
    )
  slowest = max(row["seconds_per_million_arrivals"] for row in rows)
  verdict = "meets" if slowest < TARGET_SECONDS_PER_MILLION else "MISSES"
  print(f"slowest: {slowest:.2f} s per 10^6 arrivals ({verdict} the {TARGET_SECONDS_PER_MILLION:.0f} s target)")
  directory = os.path.dirname(_OUTPUT.value)
  if directory:
    os.makedirs(directory, exist_ok=True)
  with open(_OUTPUT.value, "w") as file:
    json.dump(
      {
        "machine": {**machine_description(), "numpy": np.__version__, "stalesgd": stalesgd.__version__},
        "target_seconds_per_million": TARGET_SECONDS_PER_MILLION,
        "rows": rows,
      },
      file,
      indent=2,
    )


if __name__ == "__main__":
  app.run(main)
