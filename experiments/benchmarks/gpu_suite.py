r"""The accelerator suite: one command, one JSON, sized for one GPU (each part stops after ``--part_timeout``).

Runs, each in its own process (so a crash or a memory error in one part still
leaves the others' figures):

1. `experiments.benchmarks.engine` at lambda in {32, 128, 512} with each
   gradient strategy (``unroll``: one gradient call per slot; ``vmap``: the
   slots batched), against synchronous training and the naive event loop.
   Targets on a GPU: ``cost_ratio_vs_sync <= 1.15`` and ``speedup_vs_naive >= 10``
   at lambda >= 32.
2. `experiments.benchmarks.training` at async lambda = 32: a user's run against
   the engine alone (``loop_over_engine``; the per-core emulator reference is
   a CPU notion and is skipped on accelerators).
3. A short real run: `stalesgd.cli.train` with Rudra's ``cifar10_full`` solver at
   lambda = 30 for a few hundred updates on CIFAR-10-shaped data
   (``images_per_s`` from its summary and metrics).

Usage::

  python -m experiments.benchmarks.gpu_suite                  # on the GPU machine
  python -m experiments.benchmarks.gpu_suite --tiny           # any machine, small sizes (a CPU check of the suite)

Writes ``results/gpu_suite.json`` (``--output``): the machine, every part's
rows or error, its wall seconds, and a ``targets`` block saying which targets
were met. ``--tiny`` shrinks every part (lambda = 8, one round, a few updates,
the ``unroll`` strategy only, the MLP in the engine part) to check the suite end
to end, e.g. in CI; its figures mean nothing.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time

from absl import app, flags

from experiments.benchmarks.common import run_part


def define_flags() -> None:
  """The program's flags, defined only when it runs (importing this module defines none, so a test process that
  also imports another benchmark with an ``--output`` keeps one of each)."""
  flags.DEFINE_bool("tiny", False, "A seconds-long version of every part, to test the suite.")
  flags.DEFINE_string("output", "results/gpu_suite.json", "Where to write the suite's JSON.")
  flags.DEFINE_integer("part_timeout", 300, "Seconds before a part is stopped and reported failed.")


ENGINE_LEARNERS = (32, 128, 512)
STRATEGIES = ("unroll", "vmap")
# --tiny runs one strategy: the engine benchmark passes --gradient_strategy to the engine unchanged, and the vmap
# engine itself is checked against the oracle in tests/engine.
TINY_STRATEGIES = ("unroll",)
COST_TARGET, NAIVE_TARGET, LOOP_TARGET = 1.15, 10.0, 0.9


def _read(path: pathlib.Path) -> dict | None:
  return json.loads(path.read_text()) if path.exists() else None


def engine_part(scratch: pathlib.Path, tiny: bool, timeout: int, env: dict[str, str]) -> dict:
  learners = "8" if tiny else ",".join(map(str, ENGINE_LEARNERS))
  results = {}
  for strategy in TINY_STRATEGIES if tiny else STRATEGIES:
    output = scratch / f"engine_{strategy}.json"
    command = [
      sys.executable,
      "-m",
      "experiments.benchmarks.engine",
      f"--learners={learners}",
      f"--gradient_strategy={strategy}",
      f"--output={output}",
      "--repeats=" + ("1" if tiny else "5"),
    ]
    if tiny:  # both protocols once, on a network quicker to compile: the test of the engine benchmark's output
      command += ["--quick", "--gradients_per_chunk=32", "--protocols=async,softsync", "--model=mlp"]
    part = run_part(f"gpu_suite: engine ({strategy})", command, timeout, env)
    report = _read(output)
    part["rows"] = report["rows"] if report else None
    results[strategy] = part
  return results


def training_part(scratch: pathlib.Path, tiny: bool, timeout: int, env: dict[str, str]) -> dict:
  output = scratch / "training.json"
  command = [sys.executable, "-m", "experiments.benchmarks.training", f"--output={output}", "--emulator_processes=0"]
  command += (
    ["--cases=async:8", "--train_examples=512", "--rounds=1", "--gradients_per_chunk=32"]
    if tiny
    else ["--cases=async:32", "--train_examples=12500", "--rounds=4"]
  )
  part = run_part("gpu_suite: training loop", command, timeout, env)
  report = _read(output)
  part["rows"] = report["rows"] if report else None
  return part


def realrun_part(scratch: pathlib.Path, tiny: bool, timeout: int, env: dict[str, str]) -> dict:
  from experiments.benchmarks.common import write_random_cifar10

  data_dir = scratch / "data"
  data_dir.mkdir(exist_ok=True)
  write_random_cifar10(data_dir, 1024 if tiny else 12_000)
  workdir = scratch / "real_run"
  epochs = 0.25 if tiny else 0.4  # 12,000 images x 0.4 / (4 per update) = 1,200 updates
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.train",
    "--config=rudra_cifar10:async_inverse",
    f"--workdir={workdir}",
    "--config.data_source=npz",
    f"--config.data_dir={data_dir}",
    f"--config.num_epochs={epochs}",
    f"--config.eval_every_epochs={epochs}",
    "--config.log_every_updates=100",
    "--config.timing.jitter=deterministic",
  ]
  if not tiny:
    command.append("--compilation_cache_dir=")  # a first run's start-up, compilation included
  part = run_part("gpu_suite: short real run", command, timeout, env)
  summary = _read(workdir / "summary.json")
  if summary:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    steady = [record["images_per_s"] for record in records[1:]] or [records[-1]["images_per_s"]]
    part.update(
      summary={key: summary[key] for key in ("label", "updates", "wall_time", "test_error", "wall_time_breakdown")},
      steady_images_per_s=sorted(steady)[len(steady) // 2],
    )
  return part


def check_targets(engine: dict, training: dict) -> dict:
  """Which of the GPU targets the figures meet (None where a part failed)."""
  targets = {}
  for strategy, part in engine.items():
    for row in part.get("rows") or []:
      if row["learners"] >= 32:
        key = f"{row['protocol']}_lambda{row['learners']}_{strategy}"
        targets[key] = {
          "cost_ratio_vs_sync": row["cost_ratio_vs_sync"],
          "cost_target_met": row["cost_ratio_vs_sync"] <= COST_TARGET,
          "speedup_vs_naive": row["speedup_vs_naive"],
          "naive_target_met": (row["speedup_vs_naive"] or 0) >= NAIVE_TARGET,
        }
  for row in training.get("rows") or []:
    targets[f"loop_{row['case']}"] = {
      "loop_over_engine": row["loop_over_engine"],
      "loop_target_met": row["loop_over_engine"] >= LOOP_TARGET,
    }
  return targets


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  tiny = FLAGS.tiny
  env = {**os.environ}
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the parts run one after another
  started = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="stalesgd_gpu_suite_") as scratch:
    scratch = pathlib.Path(scratch)
    engine = engine_part(scratch, tiny, FLAGS.part_timeout, env)
    training = training_part(scratch, tiny, FLAGS.part_timeout, env)
    real_run = realrun_part(scratch, tiny, FLAGS.part_timeout, env)
  from experiments.benchmarks.common import machine_description  # starts JAX here only now, after the parts

  report = {
    "machine": machine_description(),
    "tiny": tiny,
    "seconds": time.perf_counter() - started,
    "engine": engine,
    "training": training,
    "real_run": real_run,
    "targets": check_targets(engine, training),
  }
  os.makedirs(os.path.dirname(FLAGS.output) or ".", exist_ok=True)
  with open(FLAGS.output, "w") as f:
    json.dump(report, f, indent=2)
  parts = {
    **{f"engine {strategy}": part for strategy, part in engine.items()},
    "training": training,
    "real run": real_run,
  }
  failed = [name for name, part in parts.items() if part["status"] != 0]
  print(f"[gpu_suite] {report['seconds']:.0f} s; targets: {json.dumps(report['targets'], indent=1)}")
  print(f"wrote {FLAGS.output}" + (f"; FAILED parts: {failed}" if failed else ""))
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
