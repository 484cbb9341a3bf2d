r"""The single learner at the cost of the others: images/s of Rudra's runs in a study's device layout.

A study (``stalesgd-reproduce``) gives every run 8 host devices, so that all its
runs compute on one layout. This times, one after the other in fresh processes
with ``JAX_NUM_CPU_DEVICES=8``, the two Rudra runs at mu = 128 that
``rudra_mu_lambda`` compares:

* ``single``: ``rudra_cifar10:baseline``, one learner (lambda = 1), mu = 128;
* ``lambda30``: ``rudra_cifar10:mu_lambda_3840``, 1-softsync at lambda = 30, mu = 128;

each for ``--epochs`` of CIFAR-10's shape (random pixels unless ``--data_dir``
names real ones), ``--rounds`` times in alternation. A run's rate is its
loop's steady state (``metrics.jsonl`` records after the first, which holds the
compilation). The target (issue: "the single learner at the cost of the
others"): ``single_over_lambda30`` >= 1 / 1.5.

Usage::

  python -m experiments.benchmarks.single_learner --data_dir=/tmp/cifar10_npz
  python -m experiments.benchmarks.single_learner --epochs=0.1 --rounds=1   # a smoke run

Writes ``results/single_learner_benchmark.json`` (``--out``): medians, every
round, the ratio and the machine (with its load average: measure on a quiet one).
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

from experiments.benchmarks.common import cifar10_data_dir, machine_description
from stalesgd.utils._metrics import METRICS_FILENAME, read_jsonl

CASES = {"single": "rudra_cifar10:baseline", "lambda30": "rudra_cifar10:mu_lambda_3840"}
STUDY_DEVICES = "8"  # stalesgd.cli.reproduce.STUDY_CPU_DEVICES
TARGET_RATIO = 1 / 1.5

_DATA_DIR = flags.DEFINE_string("data_dir", None, "cifar10_{train,test}.npz; default: random images of that shape.")
_EPOCHS = flags.DEFINE_float("epochs", 0.2, "Epochs per timed run.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Alternations of the two runs (medians over them).")
_OUT = flags.DEFINE_string("out", "results/single_learner_benchmark.json", "Where the JSON goes.")


def loop_images_per_s(workdir: pathlib.Path, batch: int) -> float:
  """Steady-state images/s of a finished run: the records after the first (which holds the compilation)."""
  steady = read_jsonl(workdir / METRICS_FILENAME)[1:]
  if len(steady) < 2:
    raise RuntimeError(f"{workdir} logged too few records to time a steady state; use more --epochs")
  seconds = steady[-1]["wall_time"] - steady[0]["wall_time"]
  return (steady[-1]["step"] - steady[0]["step"]) * batch / seconds


def timed_run(config: str, data_dir: str, workdir: pathlib.Path) -> float:
  """One run in a fresh process on the study's 8 host devices; its steady images/s."""
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.train",
    f"--config={config}",
    "--config.data_source=npz",
    f"--config.data_dir={data_dir}",
    f"--config.num_epochs={_EPOCHS.value}",
    f"--config.eval_every_epochs={_EPOCHS.value}",
    "--config.log_every_updates=5",
    f"--workdir={workdir}",
  ]
  subprocess.run(command, env={**os.environ, "JAX_NUM_CPU_DEVICES": STUDY_DEVICES}, check=True)
  # Both cases apply mu = 128 images per gradient, one gradient per update (1-softsync, c = 1, and lambda = 1).
  return loop_images_per_s(workdir, batch=128)


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as scratch:
    data_dir = cifar10_data_dir(_DATA_DIR.value, pathlib.Path(scratch), 50_000)
    rates: dict[str, list[float]] = {case: [] for case in CASES}
    for round_index in range(_ROUNDS.value):
      for case, config in CASES.items():
        rates[case].append(timed_run(config, data_dir, pathlib.Path(scratch) / f"{case}_{round_index}"))
        print(f"round {round_index}: {case} {rates[case][-1]:.0f} images/s", flush=True)
  medians = {case: statistics.median(values) for case, values in rates.items()}
  ratio = medians["single"] / medians["lambda30"]
  result = {
    "cases": CASES,
    "devices": int(STUDY_DEVICES),
    "epochs": _EPOCHS.value,
    "real_data": _DATA_DIR.value is not None,
    "images_per_s": rates,
    "median_images_per_s": medians,
    "single_over_lambda30": ratio,
    "target": f">= {TARGET_RATIO:.3f} (within 1.5x)",
    "met": ratio >= TARGET_RATIO,
    "machine": machine_description(),
  }
  pathlib.Path(_OUT.value).write_text(json.dumps(result, indent=2) + "\n")
  print(json.dumps({key: result[key] for key in ("median_images_per_s", "single_over_lambda30", "met")}))


if __name__ == "__main__":
  app.run(main)
