r"""Which number of forced host devices runs the engine fastest on this CPU.

On a CPU backend JAX's devices are a knob (``JAX_NUM_CPU_DEVICES``): each is
a share of the same cores. More devices spread a block's gradients wider but add
per-device work (collectives, the parameter-sharded apply loop, thread
switching). For each case (protocol:learners, Rudra's solver and
``cifar10_full`` at mu = 4 as in `experiments.benchmarks.training`) and each
device count, a fresh process times the engine alone over several chunks;
the rates (gradients/s, medians) and the fastest count go to
``results/layout_benchmark.json``.

Usage::

  python -m experiments.benchmarks.layout                       # async/4-softsync at lambda 8, 32, 128
  python -m experiments.benchmarks.layout --cases=async:8 --devices=1,2,8

The engine's results do not depend on the device count (bit for bit), so the
fastest count is free to choose; `stalesgd.training._device_layout` encodes the choice
the figures support for the command-line tools.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_CASES = flags.DEFINE_list(
  "cases",
  ["async:8", "softsync4:8", "async:32", "softsync4:32", "async:128", "softsync4:128"],
  "protocol:learners cases.",
)
_DEVICES = flags.DEFINE_list("devices", ["1", "2", "4", "8"], "Forced host device counts to try.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Timed chunks per case and count.")
_GRADIENTS = flags.DEFINE_integer("gradients_per_chunk", 256, "Gradients per timed chunk.")
_OUTPUT = flags.DEFINE_string("output", "results/layout_benchmark.json", "Where to write the JSON.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: time one case in this process (CASE,DATA_DIR,OUT).")


def _time_one(case: str, data_dir: str, rounds: int, gradients: int) -> dict:
  import jax

  from experiments.benchmarks.common import EngineChunks, benchmark_config, parse_case

  protocol, n, learners = parse_case(case)
  config = benchmark_config(protocol, n, learners, data_dir, train_examples=12_500)
  config.num_epochs = 4.0  # room for the chunks
  engine = EngineChunks(config, gradients)
  start = time.perf_counter()
  engine()
  compile_seconds = time.perf_counter() - start
  rates = []
  for _ in range(rounds):
    start = time.perf_counter()
    applied = engine()
    rates.append(applied / (time.perf_counter() - start))
  return {
    "case": case,
    "devices": len(jax.devices()),
    "grads_per_s": statistics.median(rates),
    "grads_per_s_rounds": rates,
    "first_chunk_s": compile_seconds,
    "slots_per_block": engine.plan.slots_per_block,
    "rows_per_block": engine.plan.rows_per_block,
  }


def main(argv):
  del argv
  if _WORKER.value:
    case, data_dir, output = _WORKER.value.split(",")
    with open(output, "w") as f:
      json.dump(_time_one(case, data_dir, _ROUNDS.value, _GRADIENTS.value), f)
    return
  import pathlib

  from experiments.benchmarks.common import machine_description, parse_case, write_random_cifar10

  for case in _CASES.value:
    parse_case(case)
  counts = [int(count) for count in _DEVICES.value]
  rows = []
  with tempfile.TemporaryDirectory(prefix="stalesgd_layout_") as scratch:
    write_random_cifar10(pathlib.Path(scratch), 12_500)
    for case in _CASES.value:
      for count in counts:
        output = os.path.join(scratch, f"{case.replace(':', '_')}_{count}.json")
        env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(count), "JAX_PLATFORMS": "cpu"}
        completed = subprocess.run(
          [
            sys.executable,
            "-m",
            "experiments.benchmarks.layout",
            f"--worker={case},{scratch},{output}",
            f"--rounds={_ROUNDS.value}",
            f"--gradients_per_chunk={_GRADIENTS.value}",
          ],
          env=env,
          capture_output=True,
          text=True,
          check=False,
        )
        if completed.returncode != 0:
          raise RuntimeError(f"{case} on {count} devices failed:\n{completed.stderr[-3000:]}")
        with open(output) as f:
          row = json.load(f)
        rows.append(row)
        print(
          f"{case:>14} {count:>2} devices: {row['grads_per_s']:7.1f} gradients/s "
          f"(rounds {[round(rate) for rate in row['grads_per_s_rounds']]})",
          flush=True,
        )
  best = {}
  for case in _CASES.value:
    mine = [row for row in rows if row["case"] == case]
    fastest = max(mine, key=lambda row: row["grads_per_s"])
    best[case] = {
      "devices": fastest["devices"],
      "speed_over_8": fastest["grads_per_s"]
      / next((row["grads_per_s"] for row in mine if row["devices"] == 8), fastest["grads_per_s"]),
    }
    print(f"{case:>14}: fastest with {fastest['devices']} devices")
  os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
  with open(_OUTPUT.value, "w") as f:
    json.dump({"machine": machine_description(), "rows": rows, "fastest": best}, f, indent=2)
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
