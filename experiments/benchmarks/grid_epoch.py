r"""What one run of each variant of a study's grid costs: its epochs timed, extrapolated to the study's length.

Before a long grid starts, and on a lent accelerator (the GPU suite's ``grid`` part), this runs every variant of
``--study`` (seed 0), one after the other, each in a fresh ``stalesgd-reproduce --task=0`` process: the study's
own config and device layout, `EPOCHS_TIMED` epochs evaluated every ``--eval_every`` epochs (1, as the long grids
are), the persistent compilation cache off (a first run's compilation counts), on CIFAR-10's shape (random pixels
unless ``--data_dir`` names real ``cifar10_{train,test}.npz``; timing does not depend on the pixels). From the
run's own records (``summary.json``'s wall-time breakdown, ``metrics.jsonl``'s wall time at each evaluation):

* ``startup_s``: data, model, schedule and state, before the loop;
* ``first_epoch_s``: the first epoch's training, compilation included (the loop's wall time at the first
  evaluation);
* ``steady_epoch_s``: one epoch after the first: its training plus the evaluation before it (the loop's wall time
  between the first two evaluations);
* ``full_length_s``: the run alone at the study's length E (``config.num_epochs``, the schedule the grid runs)::

      full_length_s = startup_s + first_epoch_s + (E - 1) * steady_epoch_s + evaluation_s / evaluations

  (the last term: the final evaluation). Two runs at once on the same cores each take about twice as long, so a
  grid's machine time is the sum of its runs' ``full_length_s``.

Usage::

  python -m experiments.benchmarks.grid_epoch --study=zhang_cifar10_e140                  # every variant
  python -m experiments.benchmarks.grid_epoch --study=zhang_cifar10_e140 --variants=hardsync --data_dir=/tmp/cifar10_npz
  python -m experiments.benchmarks.grid_epoch --study=demo --quick                        # embedded digits, seconds

Writes ``results/grid_epoch_benchmark.json`` (``--output``): the machine (its load average before the runs; its
device count is this process's, the runs use the study's layout: 8 host devices on a CPU), the load average
after, and per variant its figures, or its exit status and output tail if it failed or passed ``--timeout``.
Measure on a quiet machine: another job on the same cores inflates every figure.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from absl import app, flags

from experiments.benchmarks.common import cifar10_data_dir, machine_description, run_part
from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import read_jsonl
from stalesgd.studies import STUDIES
from stalesgd.studies._study import Study, Variant
from stalesgd.studies._study_runs import StudySettings, run_directory_name, study_config

EPOCHS_TIMED = 2
"""Epochs each run trains: the first holds the compilation, the second is the steady state."""
SEED = 0
TRAIN_EXAMPLES = 50_000  # CIFAR-10's train split (random pixels when no --data_dir)


def define_flags() -> None:
  """The program's flags, defined only when it runs (importing this module defines none, so a test process that
  also imports another benchmark with a ``--quick`` or ``--output`` keeps one of each)."""
  flags.DEFINE_enum("study", "zhang_cifar10_e140", sorted(STUDIES), "The study whose variants are timed.")
  flags.DEFINE_list("variants", None, "Only these variants (their directory names); default: all.")
  flags.DEFINE_bool("quick", False, "The study's quick runs on the embedded digits (no data source).")
  flags.DEFINE_string("data_dir", None, "Real cifar10_{train,test}.npz (default: random pixels).")
  flags.DEFINE_float("eval_every", 1.0, "Evaluate every this many epochs, as the grid does.")
  flags.DEFINE_integer("timeout", 900, "Seconds before one variant's run is stopped and reported failed.")
  flags.DEFINE_string("output", "results/grid_epoch_benchmark.json", "Where to write the JSON.")


def epoch_figures(run: pathlib.Path, full_epochs: float) -> dict[str, float]:
  """The figures of the module docstring, read from a finished run's directory ``run``.

  Raises:
    RuntimeError: if the run recorded fewer than two evaluations (nothing to time a steady epoch by).
  """
  summary = json.loads((run / run_directory.SUMMARY).read_text())
  breakdown = summary["wall_time_breakdown"]
  evaluations = [record for record in read_jsonl(run / run_directory.METRICS) if "test_error" in record]
  if len(evaluations) < 2:
    raise RuntimeError(f"{run} recorded {len(evaluations)} evaluations; timing a steady epoch needs 2")
  first, second = evaluations[0]["wall_time"], evaluations[1]["wall_time"]
  steady = second - first
  final_evaluation = breakdown["evaluation_s"] / len(evaluations)
  full_length = breakdown["startup_s"] + first + (full_epochs - 1) * steady + final_evaluation
  return {
    "startup_s": breakdown["startup_s"],
    "first_epoch_s": first,
    "steady_epoch_s": steady,
    "evaluation_s": final_evaluation,
    "full_epochs": full_epochs,
    "full_length_s": full_length,
    "full_length_h": full_length / 3600,
  }


def reproduce_command(
  study: str, slug: str, workdir: pathlib.Path, *, quick: bool, data_dir: str | None, eval_every: float
) -> list[str]:
  """The ``stalesgd-reproduce`` command that runs ``slug``'s seed-0 run for `EPOCHS_TIMED` epochs alone."""
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.reproduce",
    f"--study={study}",
    f"--variants={slug}",
    f"--first_seed={SEED}",
    "--seeds=1",
    "--task=0",
    f"--workdir={workdir}",
    f"--epochs={EPOCHS_TIMED}",
    f"--eval_every={eval_every}",
    "--compilation_cache_dir=",
  ]
  if quick:
    command.append("--quick")
  if data_dir is not None:
    command += ["--data_source=npz", f"--data_dir={data_dir}"]
  return command


def time_variant(
  study: Study,
  variant: Variant,
  scratch: pathlib.Path,
  *,
  quick: bool,
  data_dir: str | None,
  eval_every: float,
  timeout: int,
  env: Mapping[str, str],
) -> dict[str, Any]:
  """One variant's row: its figures (`epoch_figures`), or its status and output tail if its run failed."""
  settings = StudySettings(quick=quick, data_source=None if data_dir is None else "npz", data_dir=data_dir)
  full_epochs = float(study_config(study, variant, settings, seed=SEED).num_epochs)
  workdir = scratch / variant.slug
  command = reproduce_command(study.name, variant.slug, workdir, quick=quick, data_dir=data_dir, eval_every=eval_every)
  part = run_part(f"grid_epoch: {variant.slug}", command, timeout, env)
  row: dict[str, Any] = {"variant": variant.slug, "status": part["status"], "process_s": part["seconds"]}
  if part["status"] != 0:
    return {**row, "full_epochs": full_epochs, "output_tail": part["output_tail"]}
  return {**row, **epoch_figures(workdir / variant.slug / run_directory_name(SEED), full_epochs)}


def table(rows: Sequence[Mapping[str, Any]]) -> str:
  """The rows as a Markdown table (hours at the study's length alone; the grid's total in the last row)."""
  lines = [
    "| variant | start-up (s) | first epoch (s) | steady epoch (s) | epochs | full length alone |",
    "|---|--:|--:|--:|--:|--:|",
  ]
  for row in rows:
    if row["status"] != 0:
      lines.append(f"| {row['variant']} | failed: {row['status']} | | | {row['full_epochs']:g} | |")
      continue
    lines.append(
      f"| {row['variant']} | {row['startup_s']:.1f} | {row['first_epoch_s']:.1f} | {row['steady_epoch_s']:.1f} "
      f"| {row['full_epochs']:g} | {row['full_length_s']:.0f} s = {row['full_length_h']:.2f} h |"
    )
  timed = [row["full_length_s"] for row in rows if row["status"] == 0]
  lines.append(f"| the {len(timed)} timed, one seed each | | | | | {sum(timed):.0f} s = {sum(timed) / 3600:.2f} h |")
  return "\n".join(lines)


def refuse_a_piloted_study(study: Study) -> None:
  """A study with a `Pilot` runs its decision grid at the value its pilot chose, which no timing run has made:
  refused before any run starts."""
  if study.pilot is None:
    return
  allowed = sorted(name for name, candidate in STUDIES.items() if candidate.pilot is None)
  raise app.UsageError(
    f"--study={study.name} takes {study.pilot.field} from its pilot, which this program does not run; "
    f"allowed: a study without a pilot ({', '.join(allowed)})"
  )


def main(argv):
  del argv
  FLAGS = flags.FLAGS
  study = STUDIES[FLAGS.study]
  refuse_a_piloted_study(study)
  try:
    variants = study.select(FLAGS.variants)
  except ValueError as error:  # an unknown name, with the allowed ones
    raise app.UsageError(f"--{error}") from None
  if FLAGS.quick and FLAGS.data_dir is not None:
    raise app.UsageError("--quick runs on the embedded digits; allowed: --quick or --data_dir, not both")
  load_before = list(os.getloadavg())
  with tempfile.TemporaryDirectory(prefix="stalesgd_grid_epoch_") as scratch:
    scratch = pathlib.Path(scratch)
    data_dir = None if FLAGS.quick else cifar10_data_dir(FLAGS.data_dir, scratch, TRAIN_EXAMPLES)
    env = {**os.environ}
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the runs follow one another
    rows = [
      time_variant(
        study,
        variant,
        scratch,
        quick=FLAGS.quick,
        data_dir=data_dir,
        eval_every=FLAGS.eval_every,
        timeout=FLAGS.timeout,
        env=env,
      )
      for variant in variants
    ]
  # JAX starts in this process only now, after the runs (on a GPU it would hold the device they need).
  report = {
    "machine": {**machine_description(), "load_average_1_5_15_min": load_before},
    "load_average_after": list(os.getloadavg()),
    "study": study.name,
    "seed": SEED,
    "epochs_timed": EPOCHS_TIMED,
    "eval_every_epochs": FLAGS.eval_every,
    "data": "embedded (quick)" if FLAGS.quick else (FLAGS.data_dir or f"random CIFAR-10 shape, {TRAIN_EXAMPLES}"),
    "rows": rows,
  }
  os.makedirs(os.path.dirname(FLAGS.output) or ".", exist_ok=True)
  pathlib.Path(FLAGS.output).write_text(json.dumps(report, indent=2) + "\n")
  print(table(rows))
  print(f"wrote {FLAGS.output}")
  if any(row["status"] != 0 for row in rows):
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
