"""What the benchmark scripts share: where a figure was measured, and how to time side by side.

On a shared machine, absolute times drift with other jobs' load. The scripts
therefore time their programs in turn within each round and report medians
of per-round ratios, which every program's slow phases affect alike.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax


def machine_description() -> dict[str, Any]:
  """Where the numbers were measured (recorded in every benchmark's JSON)."""
  devices = jax.devices()
  return {
      "platform": devices[0].platform,
      "device_kind": devices[0].device_kind,
      "num_devices": len(devices),
      "num_processes": jax.process_count(),
      "host_cpus": os.cpu_count(),
      "processor": platform.processor() or platform.machine(),
      "python": platform.python_version(),
      "jax": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      # Other jobs on a shared host inflate absolute times; the paired ratios are robust to it.
      "load_average_1_5_15_min": list(os.getloadavg()),
  }


def time_interleaved(programs: Mapping[str, Callable[[], Any]], steps_per_round: int,
                     rounds: int) -> dict[str, list[float]]:
  """Seconds per step of each program in every round; the programs alternate within a round.

  Each program is called once first to compile and warm up. A program's
  result is waited for (`jax.block_until_ready`) after its steps of a round.
  """
  for run in programs.values():
    jax.block_until_ready(run())
  samples = {name: [] for name in programs}
  for _ in range(rounds):
    for name, run in programs.items():
      start = time.perf_counter()
      for _ in range(steps_per_round):
        result = run()
      jax.block_until_ready(result)
      samples[name].append((time.perf_counter() - start) / steps_per_round)
  return samples


def paired_ratio(samples: Mapping[str, list[float]], numerator: str, denominator: str) -> float:
  """Median over rounds of the per-round ratio of two programs' step times."""
  return statistics.median(top / bottom for top, bottom in zip(samples[numerator], samples[denominator]))
