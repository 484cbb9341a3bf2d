r"""One study's wall time, one run after the other against K runs at once, with the weights compared.

``python -m experiments.benchmarks.study_parallel [--study=demo] [--variants=...] [--seeds=2] [--epochs=E]
[--parallel=2] [--rounds=1] [--data_source=npz --data_dir=DIR]`` runs the same grid twice per round, each time
from nothing in its own directory: ``stalesgd-reproduce --parallel=1`` (every run in one process, one after the
other) and ``--parallel=K`` (K processes at a time, `stalesgd.studies._processes`), alternating which goes first
from round to round. It reports each side's wall time, their ratio (sequential / parallel, > 1: parallel is
faster), and whether every run's final weights (``params_sha256``) are the same in both, and writes JSON
(default ``results/study_parallel_benchmark.json``).

Both sides are whole commands, start-up and report included, as a user runs them. Their times on a shared
machine move with its load: the JSON records the load average, and more rounds give medians.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_STUDY = flags.DEFINE_string("study", "demo", "The study.")
_VARIANTS = flags.DEFINE_list("variants", None, "Its variants (directory names); default all.")
_SEEDS = flags.DEFINE_integer("seeds", 2, "Seeds per variant.")
_EPOCHS = flags.DEFINE_float("epochs", 1.0, "Epochs per run.")
_PARALLEL = flags.DEFINE_integer("parallel", 2, "Processes at once on the parallel side.")
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Rounds (each runs both sides once).")
_DATA_SOURCE = flags.DEFINE_string("data_source", None, "The study's --data_source.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "The study's --data_dir.")
_OUTPUT = flags.DEFINE_string("output", "results/study_parallel_benchmark.json", "Where the JSON goes.")


def study_command(workdir: pathlib.Path, parallel: int) -> list[str]:
  """The ``stalesgd-reproduce`` command of one side."""
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.reproduce",
    f"--study={_STUDY.value}",
    f"--workdir={workdir}",
    f"--epochs={_EPOCHS.value}",
    f"--seeds={_SEEDS.value}",
    f"--parallel={parallel}",
    "--compilation_cache_dir=",
  ]  # no cache: each side compiles for itself
  if _VARIANTS.value:
    command.append("--variants=" + ",".join(_VARIANTS.value))
  if _DATA_SOURCE.value:
    command += [f"--data_source={_DATA_SOURCE.value}", f"--data_dir={_DATA_DIR.value}"]
  return command


def run_side(workdir: pathlib.Path, parallel: int) -> tuple[float, dict[str, str]]:
  """Runs one side from nothing; returns its wall time and every run's weight digest by directory."""
  shutil.rmtree(workdir, ignore_errors=True)
  started = time.perf_counter()
  subprocess.run(study_command(workdir, parallel), check=True, stdout=subprocess.DEVNULL)
  seconds = time.perf_counter() - started
  digests = {
    str(path.parent.relative_to(workdir)): json.loads(path.read_text())["params_sha256"]
    for path in sorted(workdir.glob("*/seed_*/summary.json"))
  }
  return seconds, digests


def main(argv):
  del argv
  rounds = []
  with tempfile.TemporaryDirectory(prefix="study_parallel_") as scratch:
    for index in range(_ROUNDS.value):
      order = (1, _PARALLEL.value) if index % 2 == 0 else (_PARALLEL.value, 1)
      measured = {}
      for parallel in order:
        measured[parallel] = run_side(pathlib.Path(scratch) / f"parallel_{parallel}", parallel)
        print(f"round {index + 1}: --parallel={parallel}: {measured[parallel][0]:.1f} s")
      (sequential, sequential_digests), (parallel_seconds, parallel_digests) = measured[1], measured[_PARALLEL.value]
      rounds.append(
        {
          "order": list(order),
          "sequential_s": sequential,
          "parallel_s": parallel_seconds,
          "ratio": sequential / parallel_seconds,
          "runs": len(sequential_digests),
          "bit_identical": sequential_digests == parallel_digests and bool(sequential_digests),
        }
      )
  ratio = statistics.median(entry["ratio"] for entry in rounds)
  result = {
    "machine": {
      "host_cpus": os.cpu_count(),
      "usable_cores": len(os.sched_getaffinity(0)),
      "load_average_1_5_15_min": list(os.getloadavg()),
      "python": sys.version.split()[0],
    },
    "study": _STUDY.value,
    "variants": _VARIANTS.value,
    "seeds": _SEEDS.value,
    "epochs": _EPOCHS.value,
    "parallel": _PARALLEL.value,
    "data_source": _DATA_SOURCE.value,
    "rounds": rounds,
    "median_sequential_over_parallel": ratio,
    "bit_identical_every_round": all(entry["bit_identical"] for entry in rounds),
  }
  # No JAX in this process (experiments.benchmarks.common would start a backend): each side is its own program.
  output = pathlib.Path(_OUTPUT.value)
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(json.dumps(result, indent=2) + "\n")
  print(
    f"sequential / parallel wall time: {ratio:.2f} (median of {len(rounds)} rounds); every run's weights "
    f"bit-identical: {result['bit_identical_every_round']}; {_OUTPUT.value}"
  )


if __name__ == "__main__":
  app.run(main)
