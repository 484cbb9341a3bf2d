r"""Training-loop throughput: a user's run vs the engine alone vs a specialised emulator.

For Rudra's CIFAR-10 solver and network (`cifar10_full`, mu = 4, the optimizer
`rudra_cifar10.py` builds) with deterministic timing, for async and
4-softsync at lambda in {8, 32}, this measures side by side, each case in its own
process on the host device count ``stalesgd-train`` would pick for it
(`stalesgd.training._device_layout`; ``JAX_NUM_CPU_DEVICES`` overrides):

* ``user``: `stalesgd.training.train_and_evaluate` end to end on an npz data
  source of CIFAR-10's shape (50,000 + 10,000 32x32x3 images; random pixels
  unless ``--data_dir`` names real ones), one epoch, evaluated at its end, as a
  user runs it: ``user_images_per_s`` counts everything from the call to its
  return (start-up, compilation, evaluation, the final checkpoint);
  ``loop_images_per_s`` is the loop's steady state (the ``metrics.jsonl``
  records after the first, which holds the compilation);
* ``engine``: `stalesgd.engine.Engine` alone executing the same schedule with
  the same optimizer on the same mini-batches (`stalesgd.training.build_run`),
  no metrics, no evaluation;
* ``emulator``: `experiments.benchmarks.round_robin`, the fastest
  emulator of this one schedule found here: one process per core, each running
  the updates sequentially on its own device as one compiled scan per chunk.

Ratios, all per gradient on the same cores with the same batches:
``loop_over_engine`` (target >= 0.9), ``engine_over_emulator`` (target >= 1.0)
and ``user_over_loop`` (a user's epoch, wall clock; target >= 0.8). The engine
and the emulator alternate chunk by chunk over several rounds (medians); the
user's run sits between the two halves of the rounds.

Then the single learner at the cost of the others (issue 28, item 8;
`experiments.benchmarks.single_learner.measure`): ``rudra_cifar10:baseline``
(lambda = 1, mu = 128) and ``rudra_cifar10:mu_lambda_3840`` (lambda = 30,
mu = 128), one after the other in fresh ``stalesgd-train`` processes on the 8
host devices ``stalesgd-reproduce`` gives a study's runs, each its steady
images/s; ``single_over_lambda30`` (target >= 1 / 1.5) and the load average
before and after go to the JSON's ``single_learner``. On by default in the full
run; ``--quick``, ``--cases`` (the GPU suite's tiny run) leave it out unless
``--single_learner`` asks for it (``--cases= --single_learner`` runs it alone).

Usage::

  python -m experiments.benchmarks.training            # 4 cases, one epoch each, then the single learner
  python -m experiments.benchmarks.training --quick    # async at lambda = 8 on 1/8 of the data
  python -m experiments.benchmarks.training --cases= --single_learner --output=/tmp/single.json

Writes ``results/training_benchmark.json``. Compilation caches are left cold,
as on a first run.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import jax
from absl import app, flags, logging

from experiments.benchmarks import single_learner
from experiments.benchmarks.common import (
  BATCH_PER_LEARNER,
  EngineChunks,
  benchmark_config,
  cifar10_data_dir,
  machine_description,
  parse_case,
)
from experiments.benchmarks.round_robin import EmulatorPool, build_from_config
from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import read_jsonl
from stalesgd.training import _device_layout as device_layout
from stalesgd.training._config_readers import contributions_per_update
from stalesgd.training._loop import train_and_evaluate

_QUICK = flags.DEFINE_bool(
  "quick", False, "async at lambda = 8 only, 1/8 of CIFAR-10's size, 2 rounds: about a minute."
)
_CASES = flags.DEFINE_list("cases", None, "Override the cases, e.g. async:8,softsync4:32 (empty: none).")
_SINGLE_LEARNER = flags.DEFINE_bool(
  "single_learner",
  None,
  "Also time the single learner against lambda = 30 at mu = 128 in the study's 8-device layout "
  "(default: on unless --quick or --cases is given).",
)
_SINGLE_LEARNER_ROUNDS = flags.DEFINE_integer(
  "single_learner_rounds", 2, "Alternations of the two single-learner runs."
)
_SINGLE_LEARNER_EPOCHS_SCALE = flags.DEFINE_float(
  "single_learner_epochs_scale", 1.0, "Multiplies the single-learner runs' epochs (0.3 and 1.0 of 50,000 images)."
)
_DATA_DIR = flags.DEFINE_string(
  "data_dir",
  None,
  "A directory with cifar10_{train,test}.npz (real images); "
  "default: random images of the same shape in a temporary directory.",
)
_TRAIN_EXAMPLES = flags.DEFINE_integer(
  "train_examples",
  None,
  "Size of the generated training split (default 50,000; 6,250 with --quick); the test split is a fifth of it.",
)
_ROUNDS = flags.DEFINE_integer("rounds", None, "Engine/emulator rounds (default 6; 2 with --quick).")
_GRADIENTS_PER_CHUNK = flags.DEFINE_integer("gradients_per_chunk", 256, "Gradients per timed chunk.")
_PROCESSES = flags.DEFINE_integer(
  "emulator_processes",
  None,
  "Emulator processes (default: one per core; 0 skips the emulator, e.g. on an accelerator).",
)
_OUTPUT = flags.DEFINE_string("output", "results/training_benchmark.json", "Where to write the JSON.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: run one case in this process (CASE,DATA_DIR,SCRATCH,OUT).")

CASES = ("async:8", "softsync4:8", "async:32", "softsync4:32")
QUICK_CASES = ("async:8",)


def user_run(config, workdir: pathlib.Path) -> dict:
  """One `train_and_evaluate` call: its wall clock, loop rate and wall-time breakdown."""
  start = time.perf_counter()
  summary = train_and_evaluate(config, str(workdir))
  wall = time.perf_counter() - start
  records = read_jsonl(workdir / run_directory.METRICS)
  examples_per_update = config.batch_per_learner * contributions_per_update(config)
  steady = records[1:]  # the first record's interval holds the compilation
  if len(steady) < 2:
    raise RuntimeError("the run logged too few records to time its steady state; use more training data")
  loop_seconds = steady[-1]["wall_time"] - steady[0]["wall_time"]
  loop_updates = steady[-1]["step"] - steady[0]["step"]
  return {
    "wall_s": wall,
    "updates": summary["updates"],
    "user_images_per_s": summary["updates"] * examples_per_update / wall,
    "loop_images_per_s": loop_updates * examples_per_update / loop_seconds,
    "wall_time_breakdown": summary["wall_time_breakdown"],
    "test_error": summary["test_error"],
  }


def run_case(
  case: str, data_dir: str, train_examples: int, rounds: int, gradients: int, processes: int, scratch: pathlib.Path
) -> dict:
  protocol, n, learners = parse_case(case)
  config = benchmark_config(protocol, n, learners, data_dir, train_examples)
  contributions = contributions_per_update(config)
  # The emulator processes compile while this one compiles the engine.
  pool = None
  if processes:
    pool = EmulatorPool(functools.partial(build_from_config, config, max(1, gradients // contributions)), processes)
  engine_rates, emulator_rates, user = [], [], None
  try:
    engine = EngineChunks(config, gradients)
    engine()  # compiles
    updates_per_chunk = pool.wait_ready() if pool else 0
    for round_index in range(rounds):
      if round_index == rounds // 2:
        user = user_run(config, scratch / case.replace(":", "_"))
      start = time.perf_counter()
      applied = engine()
      engine_rates.append(applied / (time.perf_counter() - start))
      if pool:
        seconds = pool.run(1)
        emulator_rates.append(processes * updates_per_chunk * contributions / seconds)
  finally:
    if pool:
      pool.close()
  if user is None:
    user = user_run(config, scratch / case.replace(":", "_"))
  engine_grads = statistics.median(engine_rates)
  emulator_grads = statistics.median(emulator_rates) if emulator_rates else None
  loop_grads = user["loop_images_per_s"] / BATCH_PER_LEARNER
  return {
    "case": case,
    "protocol": "async" if protocol == "async" else f"{n}-softsync",
    "learners": learners,
    "batch_per_learner": BATCH_PER_LEARNER,
    "engine_grads_per_s": engine_grads,
    "emulator_grads_per_s": emulator_grads,
    "loop_grads_per_s": loop_grads,
    "user_grads_per_s": user["user_images_per_s"] / BATCH_PER_LEARNER,
    "loop_over_engine": loop_grads / engine_grads,
    "engine_over_emulator": engine_grads / emulator_grads if emulator_grads else None,
    "user_over_loop": user["user_images_per_s"] / user["loop_images_per_s"],
    "engine_grads_per_s_rounds": engine_rates,
    "emulator_grads_per_s_rounds": emulator_rates,
    "emulator_processes": processes,
    "user_run": user,
  }


def _run_case_in_a_process(
  case: str, data_dir: str, train_examples: int, rounds: int, processes: int, scratch: pathlib.Path
) -> dict:
  """`run_case` in a fresh process, on the host device count stalesgd-train would use for it
  (`stalesgd.training._device_layout`; ``JAX_NUM_CPU_DEVICES``, when set, wins)."""
  protocol, n, learners = parse_case(case)
  devices = os.environ.get("JAX_NUM_CPU_DEVICES") or str(
    device_layout.cpu_device_count(benchmark_config(protocol, n, learners, data_dir, train_examples))
  )
  output = scratch / f"{case.replace(':', '_')}.json"
  command = [
    sys.executable,
    "-m",
    "experiments.benchmarks.training",
    f"--worker={case},{data_dir},{scratch},{output}",
    f"--train_examples={train_examples}",
    f"--rounds={rounds}",
    f"--emulator_processes={processes}",
    f"--gradients_per_chunk={_GRADIENTS_PER_CHUNK.value}",
  ]
  completed = subprocess.run(command, env={**os.environ, "JAX_NUM_CPU_DEVICES": devices}, check=False)
  if completed.returncode != 0:
    raise RuntimeError(f"case {case} failed (exit status {completed.returncode}); its output is above")
  with open(output) as f:
    return json.load(f)


def single_learner_part(scratch: pathlib.Path, data_dir: str, train_examples: int) -> dict:
  """`single_learner.measure` on the benchmark's data, or on 50,000 random images where the benchmark's split is
  smaller (the runs' epochs are sized for CIFAR-10's 50,000)."""
  if _DATA_DIR.value is None and train_examples != single_learner.TRAIN_EXAMPLES:
    (scratch / "single_learner").mkdir()
    data_dir = cifar10_data_dir(None, scratch / "single_learner", single_learner.TRAIN_EXAMPLES)
  return single_learner.measure(
    data_dir,
    scratch,
    rounds=_SINGLE_LEARNER_ROUNDS.value,
    epochs_scale=_SINGLE_LEARNER_EPOCHS_SCALE.value,
    real_data=_DATA_DIR.value is not None,
  )


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint at INFO
  if _WORKER.value:
    case, data_dir, scratch, output = _WORKER.value.split(",")
    row = run_case(
      case,
      data_dir,
      _TRAIN_EXAMPLES.value,
      _ROUNDS.value,
      _GRADIENTS_PER_CHUNK.value,
      _PROCESSES.value,
      pathlib.Path(scratch),
    )
    row["devices"] = len(jax.devices())
    with open(output, "w") as f:
      json.dump(row, f)
    return
  quick = _QUICK.value
  cases = _CASES.value if _CASES.value is not None else (QUICK_CASES if quick else CASES)
  with_single_learner = single_learner.in_training_benchmark(
    _SINGLE_LEARNER.value, quick=quick, cases_given=_CASES.value is not None
  )
  rounds = _ROUNDS.value or (2 if quick else 6)
  processes = len(os.sched_getaffinity(0)) if _PROCESSES.value is None else _PROCESSES.value
  train_examples = _TRAIN_EXAMPLES.value or (6_250 if quick else 50_000)
  for case in cases:
    parse_case(case)  # bad flags fail before anything is built
  machine = machine_description()
  print(f"machine: {machine}")
  rows = []
  header = (
    f"{'case':>13} {'devices':>7} {'loop g/s':>9} {'engine g/s':>10} {'emul. g/s':>9} {'user g/s':>9} "
    f"{'loop/eng':>8} {'eng/emul':>8} {'user/loop':>9}"
  )
  with tempfile.TemporaryDirectory(prefix="stalesgd_training_benchmark_") as scratch:
    scratch = pathlib.Path(scratch)
    data_dir = cifar10_data_dir(_DATA_DIR.value, scratch, train_examples)
    for case in cases:
      row = _run_case_in_a_process(case, data_dir, train_examples, rounds, processes, scratch)
      rows.append(row)
      print(header)
      emulator = "-" if row["emulator_grads_per_s"] is None else f"{row['emulator_grads_per_s']:.1f}"
      versus = "-" if row["engine_over_emulator"] is None else f"{row['engine_over_emulator']:.2f}"
      print(
        f"{case:>13} {row['devices']:>7} {row['loop_grads_per_s']:>9.1f} {row['engine_grads_per_s']:>10.1f} "
        f"{emulator:>9} "
        f"{row['user_grads_per_s']:>9.1f} {row['loop_over_engine']:>8.2f} {versus:>8} "
        f"{row['user_over_loop']:>9.2f}",
        flush=True,
      )
      print(f"  user run: {json.dumps(row['user_run']['wall_time_breakdown'])}", flush=True)
    single = single_learner_part(scratch, data_dir, train_examples) if with_single_learner else None
  if single:
    medians = single["median_images_per_s"]
    print(
      f"single learner ({single['devices']} devices): {medians['single']:.0f} images/s, lambda = 30: "
      f"{medians['lambda30']:.0f}, ratio {single['single_over_lambda30']:.2f} ({single['target']})",
      flush=True,
    )
  os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
  with open(_OUTPUT.value, "w") as f:
    json.dump(
      {
        "machine": machine,
        "quick": quick,
        "train_examples": train_examples,
        "real_data": _DATA_DIR.value is not None,
        "rows": rows,
        "single_learner": single,
      },
      f,
      indent=2,
    )
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
