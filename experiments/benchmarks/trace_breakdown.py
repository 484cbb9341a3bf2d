r"""Where a gradient's time goes, engine against the specialised emulator, from `jax.profiler` traces.

The training benchmark (`experiments.benchmarks.training`) gives one ratio,
``engine_over_emulator``. This script says what makes it: it runs the
engine (the training benchmark's `EngineChunks`, on the host device count a
user's run gets) and the round-robin emulator (`round_robin.RoundRobinEmulator`,
one process on one core) on the same case, traces a few steady-state chunks of
each with `jax.profiler` (host tracer at level 3, which records every XLA:CPU
thunk with its device, HLO op and module; no Python tracer), and splits each
device's wall clock per gradient into

* ``convolution``: YNNPACK/oneDNN fusions, convolutions, dots and pooling
  (``reduce-window``): the work the emulator does too;
* ``elementwise``: every other fused or single op (the optimizer, ring reads
  and writes, slicing, copies);
* ``collective``: all-to-all, all-gather, all-reduce, reduce-scatter and
  collective-permute, their wait for the other devices included;
* ``idle``: the rest of the device's wall clock, inside a program (a thunk
  waiting on another) or between two programs (dispatch, the host preparing
  inputs).

Per gradient means: the devices' summed wall clock divided by the gradients
applied, so the engine on P devices and the emulator's P processes (one per
core, run side by side as the training benchmark runs them, each tracing
itself) are in the same unit, device-microseconds per gradient.

The profiler costs time per traced thunk, and the engine runs more thunks per
gradient than the emulator (``thunks_per_gradient``), so the traced ratio of
the two is lower than the untraced one (`experiments.benchmarks.training`);
the split, not the sum, is what this script is for.

Usage::

  python -m experiments.benchmarks.trace_breakdown --case=async:8

Writes ``results/trace_breakdown.json`` (``--output``); the traces themselves
stay in a temporary directory (``--trace_dir`` keeps them for TensorBoard or
Perfetto).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
from absl import app, flags

from experiments.benchmarks.common import (
  BATCH_PER_LEARNER,
  EngineChunks,
  benchmark_config,
  cifar10_data_dir,
  machine_description,
  parse_case,
)
from experiments.benchmarks.round_robin import build_from_config
from experiments.benchmarks.trace_analysis import CATEGORIES, device_seconds, per_gradient
from stalesgd.training import _device_layout as device_layout
from stalesgd.training._config_readers import contributions_per_update

_CASE = flags.DEFINE_string("case", "async:8", "protocol:learners, as in experiments.benchmarks.training.")
_CHUNKS = flags.DEFINE_integer("chunks", 6, "Traced chunks per program (after one untraced warm-up chunk).")
_GRADIENTS_PER_CHUNK = flags.DEFINE_integer("gradients_per_chunk", 256, "Gradients per chunk.")
_TRAIN_EXAMPLES = flags.DEFINE_integer(
  "train_examples",
  None,
  "Size of the generated training split (default: "
  "enough one-gradient-per-example updates for the chunks, at least 6,250).",
)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "cifar10_{train,test}.npz; default: random images.")
_TRACE_DIR = flags.DEFINE_string("trace_dir", None, "Keep the traces here (default: a temporary directory).")
_OUTPUT = flags.DEFINE_string("output", "results/trace_breakdown.json", "Where to write the JSON.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: PROGRAM,CASE,DATA_DIR,TRACE_DIR,OUT,CORE in this process.")

PROGRAMS = {"engine": "jit__block_step_impl", "emulator": "jit_call"}  # program -> its traced HLO module


def _trace_events(trace_dir: str) -> list[dict]:
  (path,) = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*.trace.json.gz"))
  with gzip.open(path) as f:
    return json.load(f)["traceEvents"]


def _worker(program: str, case: str, data_dir: str, trace_dir: str, output: str, core: str = "") -> None:
  """Builds one program, runs a warm-up chunk, traces ``--chunks`` chunks, writes its breakdown."""

  protocol, n, learners = parse_case(case)
  config = benchmark_config(protocol, n, learners, data_dir, _TRAIN_EXAMPLES.value)
  gradients = _GRADIENTS_PER_CHUNK.value
  if program == "engine":
    chunks = EngineChunks(config, gradients)
    run_chunk = chunks
  else:
    os.sched_setaffinity(0, {int(core)})
    contributions = contributions_per_update(config)
    emulator = build_from_config(config, max(1, gradients // contributions))

    def run_chunk() -> int:
      emulator.run_chunk()
      emulator.wait()
      return emulator.updates_per_chunk * contributions

  run_chunk()  # compiles
  options = jax.profiler.ProfileOptions()
  options.python_tracer_level = 0
  options.host_tracer_level = 3
  jax.profiler.start_trace(trace_dir, profiler_options=options)
  start = time.perf_counter()
  applied = sum(run_chunk() for _ in range(_CHUNKS.value))
  seconds = time.perf_counter() - start
  jax.profiler.stop_trace()
  part = device_seconds(_trace_events(trace_dir), PROGRAMS[program])
  part.update(gradients=applied, seconds=seconds)
  with open(output, "w") as f:
    json.dump(part, f)


def main(argv):
  del argv
  if _WORKER.value:
    _worker(*_WORKER.value.split(","))
    return

  protocol, n, learners = parse_case(_CASE.value)
  # Every gradient consumes batch_per_learner examples of a one-epoch schedule: the warm-up and traced chunks,
  # with a chunk to spare, must fit in it.
  needed = (_CHUNKS.value + 2) * _GRADIENTS_PER_CHUNK.value * BATCH_PER_LEARNER
  train_examples = _TRAIN_EXAMPLES.value or max(6_250, needed)
  rows = []
  with tempfile.TemporaryDirectory(prefix="stalesgd_trace_breakdown_") as scratch:
    scratch = pathlib.Path(scratch)
    traces = pathlib.Path(_TRACE_DIR.value) if _TRACE_DIR.value else scratch / "traces"
    data_dir = cifar10_data_dir(_DATA_DIR.value, scratch, train_examples)
    engine_devices = os.environ.get("JAX_NUM_CPU_DEVICES") or str(
      device_layout.cpu_device_count(benchmark_config(protocol, n, learners, data_dir, train_examples))
    )
    cores = sorted(os.sched_getaffinity(0))
    for program, devices, processes in (("engine", engine_devices, [""]), ("emulator", "1", cores)):
      # The emulator runs as the training benchmark runs it: one process per core, side by side.
      running = []
      for index, core in enumerate(processes):
        output = scratch / f"{program}{index}.json"
        command = [
          sys.executable,
          "-m",
          "experiments.benchmarks.trace_breakdown",
          f"--worker={program},{_CASE.value},{data_dir},{traces / f'{program}{index}'},{output},{core}",
          f"--chunks={_CHUNKS.value}",
          f"--gradients_per_chunk={_GRADIENTS_PER_CHUNK.value}",
          f"--train_examples={train_examples}",
        ]
        running.append((subprocess.Popen(command, env={**os.environ, "JAX_NUM_CPU_DEVICES": devices}), output))
      parts = []
      for process, output in running:
        if process.wait() != 0:
          raise RuntimeError(f"the {program} worker failed (exit status {process.returncode}); its output is above")
        parts.append(json.loads(output.read_text()))
      rows.append({"program": program, "processes": len(parts), **per_gradient(parts)})
    machine = machine_description()
  print(f"machine: {machine}")
  print(
    f"{'program':>9} {'devices':>7} "
    + " ".join(f"{name:>11}" for name in CATEGORIES)
    + f" {'sum':>8} {'grads/s':>8} {'thunks':>7}  (device-microseconds per gradient; grads/s while traced;"
    " thunks per gradient)"
  )
  for row in rows:
    total = sum(row[name] for name in CATEGORIES)
    print(
      f"{row['program']:>9} {row['devices']:>7} "
      + " ".join(f"{row[name]:11.0f}" for name in CATEGORIES)
      + f" {total:8.0f} {row['traced_grads_per_s']:8.1f} {row['thunks_per_gradient']:7.1f}"
    )
  engine, emulator = rows
  print(f"engine / emulator, gradients per second: {engine['traced_grads_per_s'] / emulator['traced_grads_per_s']:.2f}")
  os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
  with open(_OUTPUT.value, "w") as f:
    json.dump({"machine": machine, "case": _CASE.value, "rows": rows}, f, indent=2)
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
