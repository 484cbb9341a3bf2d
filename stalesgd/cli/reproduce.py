r"""Runs a reproduction study's grid and writes its table and plots.

``stalesgd-reproduce --study=STUDY [--quick] [--workdir=DIR]
[--data_source=tfds|npz --data_dir=DIR] [--epochs=E] [--variants=SLUG,...]``
(also ``python -m stalesgd.cli.reproduce``).

Studies (grids and published numbers in `stalesgd.studies._catalogue`):

* ``demo``: the four `make demo` runs at lambda = 8 on the embedded digits
  (hardsync, 8-softsync with alpha_0 and with alpha_0/sigma, async with
  DC-ASGD-a), on a CPU in seconds (results/demo_3seeds).
* ``zhang_cifar10``: Zhang et al.: the single learner (mu = 128), hardsync and
  n-softsync for n in {1, 2, 4, 10, 15, 30} with alpha_0 and alpha_0/sigma,
  and Rudra's alpha_0/<sigma> at n = 30; lambda = 30, mu = 4 (15 runs of
  ``rudra_cifar10``).
* ``zhang_cifar10_e140``: the seed papers' central claims at the uncompressed
  140 epochs: hardsync, 30-softsync alpha_0/sigma, the single learner,
  1-softsync at mu lambda = 120 and 15-softsync alpha_0/sigma (5 runs).
* ``rudra_mu_lambda``: Rudra's mu lambda study: the single-learner baseline and
  1-softsync at lambda = 30 with mu lambda in {120, ..., 3840} (7 runs).
* ``rudra_mu_lambda_mnist``: the same grid and claims on MNIST with a small CNN
  (``zhang_mnist``), where several seeds reach the end of a schedule.
* ``dcasgd_mnist``: Zheng et al.'s ordering (ASGD, DC-ASGD-c, DC-ASGD-a at M = 4
  and 8, and SGD) on MNIST with a small CNN (7 runs of ``dcasgd_mnist``).
* ``dcasgd_table1``: Zheng et al. Table 1: SGD, and ASGD, SSGD, DC-ASGD-c,
  DC-ASGD-a at M = 4 and 8, then the ablation DC-ASGD-a with a bias-corrected
  MeanSquare at M = 4 and 8, not in the paper (11 runs of
  ``dcasgd_cifar10_resnet20``).

Which data and how long:

* default: the papers' settings on the papers' data (tfds ``cifar10`` from a
  prepared ``--data_dir``); hours per run on a GPU, see each config file;
* ``--quick``: each config's ``quick`` variant, on the embedded 8x8 digits
  (no download); minutes per study on a CPU;
* ``--data_source``/``--data_dir``: the papers' model and data read from
  there, e.g. CIFAR-10 as npz arrays (docs/data.md) in ``/tmp/cifar10_npz``:
  ``--data_source=npz --data_dir=/tmp/cifar10_npz``;
  with ``--quick`` as well, for the study's short epoch count;
* ``--progress``: train nothing; a progress report of an unfinished grid,
  marked as such (``--compare_with`` draws an earlier grid beside it);
* a study with a pilot (``kale_outer_steps_digits``, ``streaming_diloco_digits_piloted``)
  chooses a setting first: ``--pilot`` runs the pilot's grid on its own seeds,
  evaluated on a validation split held out of the training data, and writes
  the value chosen per variant family into ``<workdir>/choice.json``; the
  decision grid then reads it from ``--pilot_dir`` (default
  ``<workdir>/pilot``) and refuses to start without it (docs/studies.md, *Pilots*);
* ``--epochs`` overrides the epochs of every run; ``--variants`` runs a
  subset, named by the runs' directory names (e.g.
  ``--variants=hardsync,30_softsync_a0_sigma``; an unknown name is refused
  with the list of allowed ones).

Every run gets its own sub-directory of ``--workdir`` (default
``runs/<study>[_quick][_<data_source>]``); rerunning the same command reuses
finished runs and resumes an interrupted one, and a directory holding runs of
other settings is refused. A run whose loss becomes non-finite is recorded as
diverged (chance-level error) and the sweep continues. What a run's directory
holds: `stalesgd.records._run_directory`; the study's directory receives the
report of `stalesgd.studies._report` (tables, every evaluation, plots, the
claims' decisions and a ``README.md``); the Markdown table and the directory are
printed at the end.
"""

from __future__ import annotations

import os
import sys

# Learners are emulated on 8 forced host devices on a CPU (all runs of a study on the same count) unless
# JAX_NUM_CPU_DEVICES says otherwise. Read here, set in `main` before JAX starts: this module is imported
# after `stalesgd` (and so JAX) is, whether run with -m or as a console script, so setting the environment
# variable here would come too late.
_DEVICES_CHOSEN = "JAX_NUM_CPU_DEVICES" in os.environ
STUDY_CPU_DEVICES = 8
PROGRAM = "stalesgd.cli.reproduce"  # what each process of a parallel sweep runs, with --task

from stalesgd._extras import require_training_stack

require_training_stack("stalesgd-reproduce")  # before the first import of the training stack

import pathlib
import shlex
import time

import jax
from absl import app, flags, logging

from stalesgd.cli import _program as program
from stalesgd.cluster import _compilation_cache as compilation_cache
from stalesgd.data._loading import SOURCES
from stalesgd.records import _paths as paths
from stalesgd.studies import STUDIES, StudySettings, run_study
from stalesgd.studies import _pilot as pilots
from stalesgd.studies import _processes as processes
from stalesgd.studies._progress import write_progress
from stalesgd.studies._sweep import gather_refusal
from stalesgd.studies._tasks import plan_tasks
from stalesgd.training import PREEMPTED_EXIT_STATUS

_STUDY = flags.DEFINE_enum("study", None, sorted(STUDIES), "The study to run.")
_QUICK = flags.DEFINE_bool("quick", False, "CPU-sized runs (embedded digits, or short runs with --data_source).")
_WORKDIR = flags.DEFINE_string("workdir", None, "The study's directory (default runs/<study>[_quick][_<data_source>]).")
_DATA_SOURCE = flags.DEFINE_enum(
  "data_source",
  None,
  [source for source in SOURCES if source != "embedded"],
  "Read the paper's data set from this source.",
)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "The data source's directory.")
_EPOCHS = flags.DEFINE_float(
  "epochs",
  None,
  "Epochs per run, overriding the study's (the learning-rate decay epochs stay where the config puts them).",
)
_SCHEDULE_EPOCHS = flags.DEFINE_float(
  "schedule_epochs",
  None,
  "Compress each config's whole schedule to this many epochs: the learning-rate decay "
  "epochs move to the same fractions of the run (e.g. 140 epochs with x0.1 at 120 and 130 -> 20 epochs with "
  "x0.1 at 17.14 and 18.57). Not with --epochs.",
)
_EVAL_EVERY = flags.DEFINE_float(
  "eval_every",
  None,
  "Evaluate every run every this many epochs (default: the config's, or 4 evaluations of a shortened run).",
)
_VARIANTS = flags.DEFINE_list(
  "variants", None, "Run only these variants (their directory names), e.g. hardsync,30_softsync_a0_sigma."
)
_SEEDS = flags.DEFINE_integer(
  "seeds",
  1,
  "Seeds per variant: runs seeds 0 .. K-1 (config.seed: initialisation, "
  "data order and timing jitter); more seeds later reuse the finished ones.",
)
_FIRST_SEED = flags.DEFINE_integer(
  "first_seed",
  0,
  "The first seed: runs seeds F .. F+K-1 with --seeds=K (a confirmatory grid on seeds an earlier one never used, "
  "e.g. --first_seed=3 --seeds=3 runs seeds 3, 4, 5).",
)
_PARALLEL = flags.DEFINE_string(
  "parallel",
  "1",
  "Runs at once, each its own process: an integer, or 'auto' (one per GPU on a GPU host, else one per usable core).",
)
_TASK = flags.DEFINE_integer(
  "task",
  None,
  "Run only this run of the grid (its index in --list_tasks) and write no "
  "report: one element of a job array (launch/study_array.sbatch).",
)
_GATHER = flags.DEFINE_bool(
  "gather",
  False,
  "Train nothing: write the report from the finished runs (after a job array); refused while a run is unfinished.",
)
_PROGRESS = flags.DEFINE_bool(
  "progress",
  False,
  "Train nothing: write a progress report of the grid so far, marked unfinished, into <workdir>/progress/ "
  "(every run's test error so far; a claim decided only once all its runs have finished).",
)
_COMPARE_WITH = flags.DEFINE_string(
  "compare_with",
  None,
  "With --progress: a finished report's directory whose runs of the same variants and seeds are drawn beside "
  "these, their epochs stretched to this grid's schedule (e.g. results/zhang_cifar10_e20_3seeds).",
)
_PILOT = flags.DEFINE_bool(
  "pilot",
  False,
  "Run the study's pilot instead of its decision grid: every variant at every value of the pilot's grid, on the "
  "pilot's seeds (not --seeds), evaluated on a validation split held out of the training data; at its end the "
  "value chosen per variant family is written to <workdir>/choice.json (docs/studies.md, Pilots).",
)
_PILOT_DIR = flags.DEFINE_string(
  "pilot_dir",
  None,
  "For a study with a pilot: the directory where its pilot ran (--pilot --workdir=...), whose choice.json sets "
  "the decision grid's values (default <workdir>/pilot).",
)
_LIST_TASKS = flags.DEFINE_bool("list_tasks", False, "Print the grid's runs with their --task index and exit.")
_COMPILATION_CACHE_DIR = compilation_cache.define_flag()
flags.mark_flag_as_required("study")


def parse_parallel(value: str, *, num_tasks: int, gpu_ids, cores: int) -> int:
  """``--parallel``: an integer >= 1, or ``auto`` (`processes.automatic_parallelism`)."""
  if value == "auto":
    return processes.automatic_parallelism(num_tasks, gpu_ids, cores)
  try:
    parallel = int(value)
  except ValueError:
    parallel = 0
  if parallel < 1:
    raise app.UsageError(f"--parallel={value!r}; allowed: an integer >= 1 or 'auto'")
  return parallel


def task_flags(task_index: int, workdir: str) -> list[str]:
  """The flags of the process that runs one task of this sweep alone: this sweep's, with ``--task``."""
  values = {
    "study": _STUDY.value,
    "workdir": os.path.abspath(workdir),
    "data_source": _DATA_SOURCE.value,
    "data_dir": _DATA_DIR.value,
    "epochs": _EPOCHS.value,
    "schedule_epochs": _SCHEDULE_EPOCHS.value,
    "eval_every": _EVAL_EVERY.value,
    "seeds": _SEEDS.value,
    "first_seed": _FIRST_SEED.value,
    "pilot_dir": _PILOT_DIR.value and os.path.abspath(_PILOT_DIR.value),
    "task": task_index,
    "compilation_cache_dir": _COMPILATION_CACHE_DIR.value,
  }
  if _PILOT.value:  # the pilot runs its own seeds
    del values["seeds"], values["first_seed"]
  result = [
    f"--{name}={value!r}" if isinstance(value, float) else f"--{name}={value}"
    for name, value in values.items()
    if value is not None
  ]
  if _QUICK.value:
    result.append("--quick")
  if _PILOT.value:
    result.append("--pilot")
  if _VARIANTS.value is not None:
    result.append("--variants=" + ",".join(_VARIANTS.value))
  return result


def resolve_study(study, workdir: str):
  """The study this command runs, with its seeds: the one named; its pilot's grid and seeds with ``--pilot``;
  for a study with a pilot, its decision grid at the values the finished pilot chose (copied beside it)."""
  if _SEEDS.value < 1:
    raise app.UsageError(f"--seeds={_SEEDS.value}; allowed: an integer >= 1")
  if _FIRST_SEED.value < 0:
    raise app.UsageError(f"--first_seed={_FIRST_SEED.value}; allowed: an integer >= 0")
  if study.pilot is None:
    if _PILOT.value or _PILOT_DIR.value is not None:
      piloted = sorted(name for name, entry in STUDIES.items() if entry.pilot is not None)
      raise app.UsageError(f"--pilot/--pilot_dir: study {study.name!r} has no pilot; allowed: one of {piloted}")
    return study, _SEEDS.value, _FIRST_SEED.value
  if _PILOT.value:
    if flags.FLAGS["seeds"].present or flags.FLAGS["first_seed"].present or _PILOT_DIR.value is not None:
      raise app.UsageError(
        f"--pilot with --seeds, --first_seed or --pilot_dir; allowed: none of them (the pilot runs its own seeds "
        f"{study.pilot.record()['seeds']})"
      )
    return pilots.pilot_study(study), study.pilot.seeds, study.pilot.first_seed
  pilot_dir = _PILOT_DIR.value or os.path.join(workdir, pilots.DEFAULT_PILOT_DIRECTORY)
  try:
    choice = pilots.read_choice(study, pilot_dir)
  except (FileNotFoundError, ValueError) as error:
    raise app.UsageError(f"--pilot_dir: {error}") from error
  if _TASK.value is None:  # once, by the process that writes the report, not by each of its --task processes
    pilots.copy_choice(pilot_dir, workdir)
  return pilots.with_choice(study, choice), _SEEDS.value, _FIRST_SEED.value


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint at INFO
  try:
    settings = StudySettings(
      quick=_QUICK.value,
      data_source=_DATA_SOURCE.value,
      data_dir=_DATA_DIR.value,
      num_epochs=_EPOCHS.value,
      schedule_epochs=_SCHEDULE_EPOCHS.value,
      eval_every_epochs=_EVAL_EVERY.value,
    )
  except ValueError as error:
    raise app.UsageError(f"--epochs/--schedule_epochs/--eval_every: {error}") from error
  default_name = "_".join(
    [_STUDY.value] + (["quick"] if _QUICK.value else []) + ([_DATA_SOURCE.value] if _DATA_SOURCE.value else [])
  )
  workdir = _WORKDIR.value or os.path.join("runs", default_name + ("_pilot" if _PILOT.value else ""))
  study, seeds, first_seed = resolve_study(STUDIES[_STUDY.value], workdir)
  try:
    study.select(_VARIANTS.value)
  except ValueError as error:
    raise app.UsageError(f"--variants: {error}") from error
  if paths.is_url(workdir):
    raise app.UsageError(
      f"--workdir = {workdir!r}; allowed: a local path (a study's processes and its report share a local "
      "directory; a single run's stalesgd-train --workdir may be gs://)"
    )
  tasks = plan_tasks(study, workdir, settings, variants=_VARIANTS.value, seeds=seeds, first_seed=first_seed)
  if _LIST_TASKS.value:
    for task in tasks:
      print(f"--task={task.index}: {task.label} ({task.directory})")
    return
  if _COMPARE_WITH.value is not None and not _PROGRESS.value:
    raise app.UsageError(f"--compare_with={_COMPARE_WITH.value} without --progress; allowed: only with --progress")
  if _PROGRESS.value:
    if _GATHER.value or _TASK.value is not None:
      raise app.UsageError("--progress with --gather or --task; allowed: one of them")
    compare_with = None if _COMPARE_WITH.value is None else pathlib.Path(_COMPARE_WITH.value)
    try:
      print(write_progress(study, tasks, pathlib.Path(workdir), compare_with=compare_with))
    except FileNotFoundError as error:
      raise app.UsageError(str(error)) from error
    print(f"progress report in {os.path.abspath(os.path.join(workdir, 'progress'))}")
    return
  if _TASK.value is not None and not 0 <= _TASK.value < len(tasks):
    raise app.UsageError(f"--task={_TASK.value}; allowed: an index in [0, {len(tasks)}) (--list_tasks)")
  gpu_ids = processes.visible_gpus()
  parallel = parse_parallel(_PARALLEL.value, num_tasks=len(tasks), gpu_ids=gpu_ids, cores=processes.usable_cores())
  if parallel > 1 and (_TASK.value is not None or _GATHER.value):
    raise app.UsageError(f"--parallel={_PARALLEL.value} with --task or --gather; allowed: one of them")
  if _GATHER.value and (refusal := gather_refusal(tasks)):
    raise app.UsageError(f"--gather: {refusal}")
  in_processes = parallel > 1
  compilation_cache.enable_compilation_cache(_COMPILATION_CACHE_DIR.value)
  study_devices = int(os.environ["JAX_NUM_CPU_DEVICES"]) if _DEVICES_CHOSEN else STUDY_CPU_DEVICES
  if not _DEVICES_CHOSEN and not in_processes:
    # Every run of a study, in this process or in one of a parallel sweep's (--task), on the same count:
    # runs with several contributions per update differ in their last bits between device counts
    # (docs/semantics.md). Ignored by GPU/TPU backends.
    jax.config.update("jax_num_cpu_devices", STUDY_CPU_DEVICES)
  started = time.monotonic()
  result = run_study(
    study,
    workdir,
    settings,
    variants=_VARIANTS.value,
    seeds=seeds,
    first_seed=first_seed,
    parallel=parallel,
    task_command=lambda task: processes.python_module_command(PROGRAM, task_flags(task.index, workdir)),
    cpu_devices=study_devices,
    gpu_ids=gpu_ids,
    only_task=_TASK.value,
    gather_only=_GATHER.value,
    command=shlex.join(
      ["stalesgd-reproduce", *(arg for arg in sys.argv[1:] if arg not in ("--gather", "--gather=true"))]
    ),
  )
  if _TASK.value is not None:
    if not result.rows:  # its run was preempted (a finished or diverged run has a row): the scheduler requeues it
      task = tasks[_TASK.value]
      print(f"\n{task.label}: preempted; run the same command again to resume it ({task.directory})")
      raise SystemExit(PREEMPTED_EXIT_STATUS)
    row = result.rows[0]
    print(f"\n{row['variant']}, seed {row['seed']}: {row['status']}, test error {row['test_error']} ({row['workdir']})")
    return
  if result.table is None:
    print(f"\n{study.name}: preempted before every run finished; rerun to resume ({workdir})")
    raise SystemExit(PREEMPTED_EXIT_STATUS)
  if _PILOT.value:
    print(f"\n{study.name}: {study.finding}\n")
    print(result.table)
    print(pilots.write_choice(STUDIES[_STUDY.value], result.rows, workdir))
    print(f"choice written to {os.path.abspath(os.path.join(workdir, pilots.CHOICE_FILENAME))}")
    return
  print(f"\n{study.name}. The published claims this grid decides: {study.finding}\n")
  print(result.table)
  print(
    f"{len(result.rows)} runs in {time.monotonic() - started:.0f} s; results, metrics and plots in "
    f"{os.path.abspath(workdir)}"
  )


def run() -> None:
  """The ``stalesgd-reproduce`` console script: parses ``sys.argv`` and runs `main`."""
  program.run_main(main, sys.modules[__name__])


if __name__ == "__main__":
  run()
