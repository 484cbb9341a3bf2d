r"""A yardstick of the machine: CPU seconds XLA:CPU takes to compile and run one small program.

The suite's time is mostly XLA:CPU compilation (docs/contributing.md), and this project's 2-core machines differ
in speed by half between sessions. A suite time next to this figure, measured on the same machine just before or
after, says whether a slower suite is the suite or the machine.

The programs: for each of ``--programs`` shapes, an Adam update of two arrays (optax) and a reduction of a
matrix product, each a fresh ``jax.jit`` compiled once and run once, so each round compiles every program again
(JAX's persistent compilation cache is turned off here). The CPU time of the process (`time.process_time`: every
thread's, so a busy neighbour on the host slows the figure less than it slows wall time) per program, median over
``--repeats`` rounds after a warm-up.

Usage::

  python -m experiments.benchmarks.compile_speed      # 120 programs, 3 rounds: 50-60 s on a 2-core EPYC

Writes ``results/compile_speed.json`` (``--output``): the machine (`machine_description`: the processor's name,
family and instruction sets among it), the CPU and wall seconds per program of each round, and their medians.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from experiments.benchmarks.common import machine_description


def define_flags() -> None:
  """The program's flags, defined only when it runs (importing this module defines none)."""
  flags.DEFINE_integer("programs", 60, "Shapes per round; two programs each.")
  flags.DEFINE_integer("repeats", 3, "Rounds (the median is reported).")
  flags.DEFINE_string("output", "results/compile_speed.json", "Where to write the JSON.")


def compile_round(shapes: int) -> tuple[float, float, int]:
  """Compiles and runs two fresh programs per shape; returns (CPU seconds, wall seconds, programs)."""
  cpu, wall = time.process_time(), time.perf_counter()
  adam = optax.adam(1e-3)
  for k in range(shapes):
    params = {"a": np.ones((k + 3, 7), np.float32), "b": np.ones((k + 1,), np.float32)}  # no eager program
    update = jax.jit(lambda p, g: adam.update(g, adam.init(p), p)[0])
    reduce = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() + jnp.cumsum(x, axis=0).max())
    jax.block_until_ready((update(params, params), reduce(params["a"])))
  return time.process_time() - cpu, time.perf_counter() - wall, 2 * shapes


def measure(shapes: int, repeats: int) -> dict[str, Any]:
  """``repeats`` rounds of `compile_round`: per-program CPU and wall seconds of each round and their medians."""
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)  # every round compiles; nothing is read back
  try:
    compile_round(min(shapes, 5))  # a warm-up, not reported: the backend's start-up and the first traces
    rounds = [compile_round(shapes) for _ in range(repeats)]
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
  cpu = [seconds / programs for seconds, _, programs in rounds]
  wall = [seconds / programs for _, seconds, programs in rounds]
  return {
    "programs_per_round": rounds[0][2],
    "cpu_seconds_per_program": cpu,
    "wall_seconds_per_program": wall,
    "median_cpu_seconds_per_program": statistics.median(cpu),
    "median_wall_seconds_per_program": statistics.median(wall),
  }


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  report = {"machine": machine_description(), **measure(FLAGS.programs, FLAGS.repeats)}
  report["machine"]["load_average_after"] = list(os.getloadavg())
  os.makedirs(os.path.dirname(FLAGS.output) or ".", exist_ok=True)
  with open(FLAGS.output, "w") as f:
    json.dump(report, f, indent=2)
  print(
    f"[compile_speed] {report['median_cpu_seconds_per_program']:.3f} CPU-s "
    f"({report['median_wall_seconds_per_program']:.3f} s wall) per program, median of {FLAGS.repeats} rounds of "
    f"{report['programs_per_round']}; wrote {FLAGS.output}"
  )


if __name__ == "__main__":
  define_flags()
  app.run(main)
