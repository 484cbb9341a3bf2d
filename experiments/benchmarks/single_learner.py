r"""The single learner at the cost of the others: images/s of Rudra's runs in a study's device layout.

A study (``stalesgd-reproduce``) gives every run 8 host devices, so that all its
runs compute on one layout. This times, one after the other in fresh processes
with ``JAX_NUM_CPU_DEVICES=8``, the two Rudra runs at mu = 128 that
``rudra_mu_lambda`` compares:

* ``single``: ``rudra_cifar10:baseline``, one learner (lambda = 1), mu = 128;
* ``lambda30``: ``rudra_cifar10:mu_lambda_3840``, 1-softsync at lambda = 30, mu = 128;

each for `EPOCHS` of CIFAR-10's shape (random pixels unless ``--data_dir``
names real ones), ``--rounds`` times in alternation. A run's rate is its
loop's steady state (``metrics.jsonl`` records after the first, which holds the
compilation). The target: ``single_over_lambda30`` >= 1 / 1.5 (the single learner within 1.5x of lambda = 30).
`experiments.benchmarks.training` runs the same measurement (`measure`) after its own cases.

Usage::

  python -m experiments.benchmarks.single_learner --data_dir=/tmp/cifar10_npz
  python -m experiments.benchmarks.single_learner --epochs_scale=0.5 --rounds=1   # a smoke run

Writes ``results/single_learner_benchmark.json`` (``--out``): medians, every
round, the ratio and the machine (with its load average before and after: measure on a quiet one).
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable

from absl import app, flags

from experiments.benchmarks.common import cifar10_data_dir, machine_description
from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import read_jsonl
from stalesgd.training._config_readers import examples_per_update

CASES = {"single": "rudra_cifar10:baseline", "lambda30": "rudra_cifar10:mu_lambda_3840"}
# Epochs per timed run: lambda = 30 applies 30 x 128 images per update (13 updates per epoch), so it needs a whole
# epoch for a few steady records; the single learner (128 per update) has hundreds in a third of one.
EPOCHS = {"single": 0.3, "lambda30": 1.0}
STUDY_DEVICES = "8"  # stalesgd.cli.reproduce.STUDY_CPU_DEVICES
TARGET_RATIO = 1 / 1.5
TRAIN_EXAMPLES = 50_000  # CIFAR-10's train split, which EPOCHS are sized for


def in_training_benchmark(requested: bool | None, *, quick: bool, cases_given: bool) -> bool:
  """Whether `experiments.benchmarks.training` times this too: as asked (``--single_learner``), else only in its
  full run (its ``--quick`` and a run of chosen ``--cases``, such as the GPU suite's, stay short)."""
  if requested is not None:
    return requested
  return not quick and not cases_given


def loop_images_per_s(workdir: pathlib.Path, batch: int) -> float:
  """Steady-state images/s of a finished run: the records after the first (which holds the compilation)."""
  steady = read_jsonl(workdir / run_directory.METRICS)[1:]
  if len(steady) < 2:
    raise RuntimeError(f"{workdir} logged too few records to time a steady state; use a larger --epochs_scale")
  seconds = steady[-1]["wall_time"] - steady[0]["wall_time"]
  return (steady[-1]["step"] - steady[0]["step"]) * batch / seconds


def timed_run(case: str, data_dir: str, workdir: pathlib.Path, epochs_scale: float = 1.0) -> float:
  """One run in a fresh process on the study's 8 host devices; its steady images/s."""
  name, _, variant = CASES[case].partition(":")
  epochs = EPOCHS[case] * epochs_scale
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.train",
    f"--config={CASES[case]}",
    "--config.data_source=npz",
    f"--config.data_dir={data_dir}",
    f"--config.num_epochs={epochs}",
    f"--config.eval_every_epochs={epochs}",
    "--config.log_every_updates=1",
    f"--workdir={workdir}",
  ]
  subprocess.run(command, env={**os.environ, "JAX_NUM_CPU_DEVICES": STUDY_DEVICES}, check=True)
  config = importlib.import_module(f"stalesgd.configs.{name}").get_config(variant)
  return loop_images_per_s(workdir, batch=examples_per_update(config))  # c x mu: 128 and 30 x 128


def measure(
  data_dir: str,
  scratch: pathlib.Path,
  *,
  rounds: int,
  epochs_scale: float = 1.0,
  real_data: bool,
  run: Callable[[str, str, pathlib.Path, float], float] = timed_run,
) -> dict:
  """Both cases ``rounds`` times in alternation, one run at a time; images/s, medians and their ratio.

  The load average before and after says whether the machine was quiet (other processes share its cores).
  """
  if rounds < 1:
    raise ValueError(f"rounds={rounds}: at least one round of the two runs is needed for a median")
  load_before = list(os.getloadavg())
  rates: dict[str, list[float]] = {case: [] for case in CASES}
  for round_index in range(rounds):
    for case in CASES:
      rates[case].append(run(case, data_dir, scratch / f"{case}_{round_index}", epochs_scale))
      print(f"single learner, round {round_index}: {case} {rates[case][-1]:.0f} images/s", flush=True)
  medians = {case: statistics.median(values) for case, values in rates.items()}
  ratio = medians["single"] / medians["lambda30"]
  return {
    "cases": CASES,
    "devices": int(STUDY_DEVICES),
    "epochs": {case: EPOCHS[case] * epochs_scale for case in CASES},
    "real_data": real_data,
    "images_per_s": rates,
    "median_images_per_s": medians,
    "single_over_lambda30": ratio,
    "target": f">= {TARGET_RATIO:.3f} (within 1.5x)",
    "met": ratio >= TARGET_RATIO,
    "load_average_1_5_15_min": {"before": load_before, "after": list(os.getloadavg())},
  }


def main(argv):
  del argv
  options = flags.FLAGS
  with tempfile.TemporaryDirectory() as scratch:
    data_dir = cifar10_data_dir(options.data_dir, pathlib.Path(scratch), TRAIN_EXAMPLES)
    result = measure(
      data_dir,
      pathlib.Path(scratch),
      rounds=options.rounds,
      epochs_scale=options.epochs_scale,
      real_data=options.data_dir is not None,
    )
  result["machine"] = machine_description()
  pathlib.Path(options.out).write_text(json.dumps(result, indent=2) + "\n")
  print(json.dumps({key: result[key] for key in ("median_images_per_s", "single_over_lambda30", "met")}))


if __name__ == "__main__":
  # Defined here only: experiments.benchmarks.training imports `measure` and has flags of the same names.
  flags.DEFINE_string("data_dir", None, "cifar10_{train,test}.npz; default: random images of that shape.")
  flags.DEFINE_float("epochs_scale", 1.0, "Multiplies every case's epochs (EPOCHS); below 1 for a smoke run.")
  flags.DEFINE_integer("rounds", 2, "Alternations of the two runs (medians over them).")
  flags.DEFINE_string("out", "results/single_learner_benchmark.json", "Where the JSON goes.")
  app.run(main)
