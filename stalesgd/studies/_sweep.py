"""Runs a study's grid (variants x seeds), one run at a time or as concurrent processes, and reports it.

Each run trains with `stalesgd.training.train_and_evaluate` in its own directory,
``<workdir>/<variant slug>/seed_<s>`` (`Task`), so

* a sweep resumes: a run whose ``summary.json`` says it finished (not
  preempted) is read back instead of trained again, and an unfinished one
  resumes from its checkpoint; a directory holding a run of another config
  (``config.json``, `stalesgd.training.check_same_run`) is refused. Asking for
  more seeds later reuses the seeds already run;
* a run whose loss becomes non-finite (`stalesgd.training.TrainingDiverged`) is
  recorded as diverged at the update the trainer names, with the chance-level
  test error (Zhang et al. report such runs as "90% error" on CIFAR-10), and
  the sweep goes on; the record (``diverged.json``) is read back on resume;
* a preempted run (SIGTERM) stops the sweep; running it again resumes.

``parallel`` > 1 runs the grid's runs as that many concurrent processes
(`stalesgd.studies._processes`), each the same program restricted to one run
(``stalesgd-reproduce --task=I``), so each computes what it computes alone; a
SLURM job array runs one task per array element the same way
(``launch/study_array.sbatch``), and ``gather_only`` then writes the report
from the finished runs.

At the end the study's workdir holds the report of `stalesgd.studies._report`:
per-run and per-variant tables (mean +- std over seeds), every evaluation,
learning curves with bands over seeds, and the decisions of the study's claims.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections

from stalesgd.schedule import Schedule
from stalesgd.studies import _processes as processes
from stalesgd.studies import _report as report
from stalesgd.studies._study import Study, Variant
from stalesgd.studies._study_runs import RunSettings, run_directory_name, study_run
from stalesgd.training import _loop as train
from stalesgd.training._config_checks import validate_config
from stalesgd.training._config_readers import is_decentralized, protocol_options
from stalesgd.training._loop import PREEMPTED_EXIT_STATUS, SCHEDULE_FILENAME, SUMMARY_FILENAME
from stalesgd.training._run_config import flatten_config
from stalesgd.training._workdir import check_same_run
from stalesgd.utils import _plots as plots
from stalesgd.utils import _run_directory as run_directory

DIVERGED_FILENAME = run_directory.DIVERGED


class SweepResult(NamedTuple):
  """What `run_study` returns.

  Attributes:
    rows: one result row per run, in the study's order (`result_row`).
    table: the Markdown table, or None when a run was preempted (the report
      is then not written).
  """

  rows: list[dict[str, Any]]
  table: str | None


@dataclasses.dataclass(frozen=True)
class RunOutcome:
  """How one variant ended.

  Attributes:
    summary: the trainer's summary of a finished or preempted run (None if
      it diverged).
    diverged_at: the update whose loss was non-finite (None otherwise; -1 if
      the trainer's message named none).
    message: the divergence message (empty otherwise).
    reused: whether the result was read back from an earlier sweep.
  """

  summary: dict[str, Any] | None
  diverged_at: int | None = None
  message: str = ""
  reused: bool = False

  @property
  def preempted(self) -> bool:
    return bool(self.summary and self.summary.get("preempted"))


def varied_fields(tasks: Sequence[Task]) -> tuple[str, ...]:
  """The config fields (flattened) whose values differ between the grid's runs: TensorBoard shows them first."""
  flats = [flatten_config(task.config) for task in tasks]
  fields = sorted(set().union(*flats)) if flats else []
  return tuple(field for field in fields if len({json.dumps(flat.get(field), sort_keys=True) for flat in flats}) > 1)


def run_variant(
  config: ml_collections.ConfigDict, workdir: pathlib.Path, *, hparams_first: Sequence[str] = ()
) -> RunOutcome:
  """Trains one variant in ``workdir``, or reads back the result of an earlier sweep.

  Args:
    config: the run's config.
    workdir: the run's own directory.
    hparams_first: the fields TensorBoard's HParams table shows first (`varied_fields`).

  Returns:
    The outcome; a diverged run is an outcome, not an error.
  """
  finished = read_outcome_in(workdir)
  if not _unfinished(finished):
    return finished
  workdir.mkdir(parents=True, exist_ok=True)
  try:
    return RunOutcome(train.train_and_evaluate(config, str(workdir), hparams_first=hparams_first))
  except train.TrainingDiverged as error:
    (workdir / DIVERGED_FILENAME).write_text(json.dumps({"update": error.update, "message": str(error)}, indent=2))
    return RunOutcome(None, diverged_at=error.update, message=str(error))


def chance_error(workdir: pathlib.Path) -> float | None:
  """Test error (%) of always predicting the most frequent test class, from the data the run in ``workdir``
  loaded (its ``dataset.json``): what a diverged run is recorded with. None if the run wrote none."""
  path = pathlib.Path(workdir) / train.DATASET_FILENAME
  return json.loads(path.read_text())["chance_test_error"] if path.exists() else None


def result_row(task: Task, outcome: RunOutcome, *, host_devices: int | None = None) -> dict[str, Any]:
  """One run's row: the variant, its seed and settings, our result, the published one, and how to rerun it.

  ``host_devices``: the host CPU devices the run had (None on an accelerator),
  part of its command, since runs with several contributions per update
  differ in their last bits between device counts.
  """
  variant, config, workdir = task.variant, task.config, task.directory
  row: dict[str, Any] = {
    "variant": variant.label,
    "slug": variant.slug,
    "seed": task.seed,
    "protocol": config.protocol,
    "learners": config.learners,
    "batch_per_learner": config.batch_per_learner,
    "n": protocol_options(config).get("n"),  # only for the protocols that have an n
    "staleness_rule": config.staleness_rule,
    "delay_compensation": config.delay_compensation,
    "dataset": config.dataset,
    "model": config.model,
  }
  summary = outcome.summary or {}
  if outcome.diverged_at is not None:
    error = chance_error(workdir)
    row.update(
      updates=outcome.diverged_at,
      epochs=None,
      test_error=error,
      test_accuracy=None if error is None else 1.0 - error / 100.0,
      sim_time=_simulated_time_at(workdir, outcome.diverged_at),
      status=f"diverged at update {outcome.diverged_at}",
    )
  else:
    row.update(
      {
        field: summary.get(field)
        for field in (
          "updates",
          "epochs",
          "test_error",
          "test_accuracy",
          "train_accuracy",
          "sim_time",
          "wall_time",
          "staleness_mean",
          "staleness_max",
        )
      }
    )
    row["status"] = "preempted" if outcome.preempted else "ok"
  for field, value in variant.published.items():
    row[plots.PUBLISHED_PREFIX + field] = value
  row.update(host_devices=host_devices, workdir=str(workdir), command=command_with_workdir(task, host_devices))
  return row


def command_with_workdir(task: Task, host_devices: int | None = None) -> str:
  """The run's training command with its ``--workdir`` (and host device count): what reruns it alone."""
  prefix = "" if host_devices is None else f"JAX_NUM_CPU_DEVICES={host_devices} "
  return f"{prefix}{task.command} --workdir={task.directory}"


def _simulated_time_at(workdir: pathlib.Path, update: int) -> float | None:
  path = workdir / SCHEDULE_FILENAME
  if update < 0 or not path.exists():
    return None
  update_time = Schedule.load(path).update_time
  return float(update_time[min(update, update_time.shape[0] - 1)])


@dataclasses.dataclass(frozen=True)
class Task:
  """One run of a study's grid: a variant with a seed, its config, command and directory.

  Attributes:
    index: its place in the grid (`plan_tasks`'s order; ``--task=INDEX``).
    variant: the variant.
    seed: the run's ``config.seed``.
    config: the run's config.
    command: the training command that rebuilds the config (`Variant.command`).
    directory: ``<study workdir>/<variant slug>/seed_<seed>``.
  """

  index: int
  variant: Variant
  seed: int
  config: ml_collections.ConfigDict
  command: str
  directory: pathlib.Path

  @property
  def label(self) -> str:
    return f"{self.variant.label}, seed {self.seed}"


def plan_tasks(
  study: Study,
  workdir: str | pathlib.Path,
  settings: RunSettings = RunSettings(),
  *,
  variants: Sequence[str] | None = None,
  seeds: int = 1,
) -> list[Task]:
  """Every run of the grid, variant by variant and seed by seed within a variant (seeds 0 .. seeds - 1).

  Raises:
    ValueError: for an unknown variant or ``seeds`` < 1.
  """
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise ValueError(f"seeds={seeds!r}; allowed: an integer >= 1 (runs seeds 0 .. seeds - 1)")
  workdir = pathlib.Path(workdir)
  tasks = []
  for variant in study.select(variants):
    for seed in range(seeds):
      config, command = study_run(study, variant, settings, seed=seed)
      tasks.append(Task(len(tasks), variant, seed, config, command, workdir / variant.slug / run_directory_name(seed)))
  return tasks


def check_tasks(tasks: Sequence[Task], num_devices: Callable[[ml_collections.ConfigDict], int] | None) -> None:
  """Validates every run's config and refuses a directory that holds another run, before any run starts.

  Args:
    tasks: the runs.
    num_devices: the number of devices a run's config will see; None checks
      only the directories (nothing will train).
  """
  for task in tasks:
    if num_devices is not None:
      validate_config(task.config, num_devices=num_devices(task.config))
    check_same_run(task.config, task.directory)


def gpus_needed(config: ml_collections.ConfigDict) -> int:
  """GPUs one run takes on a GPU host: one per learner for a decentralized protocol, else one."""
  return int(config.learners) if is_decentralized(config) else 1


def read_outcome_in(workdir: pathlib.Path) -> RunOutcome | None:
  """The outcome a finished (or diverged, or preempted) run left in ``workdir``; None if it has none."""
  summary_path, diverged_path = workdir / SUMMARY_FILENAME, workdir / DIVERGED_FILENAME
  if diverged_path.exists():
    record = json.loads(diverged_path.read_text())
    return RunOutcome(None, diverged_at=record["update"], message=record["message"], reused=True)
  if summary_path.exists():
    return RunOutcome(json.loads(summary_path.read_text()), reused=True)
  return None


def read_outcome(task: Task) -> RunOutcome | None:
  """`read_outcome_in` of the task's directory."""
  return read_outcome_in(task.directory)


def _unfinished(outcome: RunOutcome | None) -> bool:
  return outcome is None or outcome.preempted


def describe_outcome(outcome: RunOutcome | None) -> str:
  """How a run ended, in a few words (for progress lines)."""
  if outcome is None:
    return "stopped before its first result"
  if outcome.diverged_at is not None:
    return f"diverged at update {outcome.diverged_at}"
  if outcome.preempted:
    return "preempted (rerun to resume)"
  return f"finished, test error {outcome.summary.get('test_error'):.2f} %"


def _echo_outcome(task: Task, outcome: RunOutcome, echo) -> None:
  if outcome.reused:
    echo(f"  reused the finished run in {task.directory}")
  if outcome.diverged_at is not None:
    echo(f"  diverged at update {outcome.diverged_at}; recorded, continuing")
  if outcome.preempted:
    echo(f"  preempted: the sweep stops here; run the same command again to resume from {task.directory}")


def run_tasks_here(
  tasks: Sequence[Task], echo=print, *, hparams_first: Sequence[str] = ()
) -> list[tuple[Task, RunOutcome]] | None:
  """Runs (or reads back) ``tasks`` one after the other in this process; None if one was preempted."""
  done = []
  for position, task in enumerate(tasks, start=1):
    echo(f"[{position}/{len(tasks)}] {task.label}: {task.command} --workdir={task.directory}")
    outcome = run_variant(task.config, task.directory, hparams_first=hparams_first)
    _echo_outcome(task, outcome, echo)
    if outcome.preempted:
      return None
    done.append((task, outcome))
  return done


def run_tasks_in_processes(
  tasks: Sequence[Task],
  task_command: Callable[[Task], list[str]],
  *,
  parallel: int,
  cpu_devices: int,
  gpu_ids: Sequence[str] = (),
  echo=print,
) -> list[tuple[Task, RunOutcome]] | None:
  """Runs the unfinished ``tasks`` as up to ``parallel`` concurrent processes, then reads every outcome back.

  Args:
    tasks: the runs.
    task_command: the command of the process that runs one task alone
      (``stalesgd-reproduce ... --task=INDEX``).
    parallel: the most processes at once.
    cpu_devices: the host devices every run emulates its learners on (CPU
      hosts): the sequential sweep's count, so that each run is bit for bit the
      run a sequential sweep makes (docs/semantics.md, *What a run's bits
      depend on*).
    gpu_ids: the host's GPUs, one per process (a decentralized run: one per
      learner); empty on a CPU host.
    echo: where progress lines go.

  Returns:
    Every task with its outcome, or None if a run was preempted.

  Raises:
    RuntimeError: naming the runs whose process failed, and their logs.
  """
  unfinished = [task for task in tasks if _unfinished(read_outcome(task))]
  echo(
    f"{len(tasks) - len(unfinished)} of {len(tasks)} runs already finished; running {len(unfinished)} as up to "
    f"{parallel} processes at a time"
  )
  process_tasks = [
    processes.ProcessTask(
      label=task.label,
      argv=task_command(task),
      log_path=task.directory / processes.LOG_FILENAME,
      gpus=gpus_needed(task.config),
      cpu_devices=cpu_devices,
    )
    for task in unfinished
  ]
  statuses = processes.run_in_processes(
    process_tasks,
    parallel=parallel,
    gpu_ids=gpu_ids,
    echo=echo,
    describe=lambda position: describe_outcome(read_outcome(unfinished[position])),
  )
  # A preempted run exits with PREEMPTED_EXIT_STATUS: checkpointed, not failed (`gather` then reports the sweep
  # unfinished, and running it again resumes).
  failed = [
    (task, statuses[position])
    for position, task in enumerate(unfinished)
    if statuses.get(position, 0) not in (0, PREEMPTED_EXIT_STATUS)
  ]
  if failed:
    raise RuntimeError(
      "runs failed: "
      + "; ".join(
        f"{task.label} (exit status {status}, log {task.directory / processes.LOG_FILENAME})" for task, status in failed
      )
    )
  return gather(tasks, echo=echo, missing_ok=True)


def gather(tasks: Sequence[Task], *, echo=print, missing_ok: bool = False) -> list[tuple[Task, RunOutcome]] | None:
  """Every task with the outcome its directory holds; None if a run is unfinished or preempted.

  Raises:
    ValueError: unless ``missing_ok``, naming the runs that have not finished
      (a report is written only from a whole grid).
  """
  done, missing = [], []
  for task in tasks:
    outcome = read_outcome(task)
    if _unfinished(outcome):
      missing.append(task)
    else:
      done.append((task, outcome))
  if missing and not missing_ok:
    raise ValueError(
      f"{len(missing)} of {len(tasks)} runs have not finished: "
      + ", ".join(f"--task={task.index} ({task.label}, {task.directory})" for task in missing)
      + "; allowed: gather once every run of the grid has finished"
    )
  if missing:
    echo(f"  {len(missing)} runs unfinished (preempted): rerun the same command to resume them")
    return None
  return done


def run_study(
  study: Study,
  workdir: str | pathlib.Path,
  settings: RunSettings = RunSettings(),
  *,
  variants: Sequence[str] | None = None,
  seeds: int = 1,
  parallel: int = 1,
  task_command: Callable[[Task], list[str]] | None = None,
  cpu_devices: int | None = None,
  gpu_ids: Sequence[str] = (),
  only_task: int | None = None,
  gather_only: bool = False,
  command: str | None = None,
  echo=print,
) -> SweepResult:
  """Runs (or resumes) the grid ``variants x seeds`` of ``study``, then writes the report.

  Every config is built and validated, and checked against the config of any
  earlier run in its directory, before the first run: a bad setting stops the
  sweep at once instead of after hours, and results of another setting are
  never reused.

  Args:
    study: the study.
    workdir: the study's directory; variant ``v`` with seed ``s`` runs in
      ``workdir/v.slug/seed_s``.
    settings: the study-level flags (`RunSettings`).
    variants: run only these variants, by slug (their directory names, e.g.
      ``"15_softsync_a0_sigma"``), in the study's order; None runs them all.
    seeds: seeds per variant (0 .. seeds - 1).
    parallel: runs at once; above 1 each run is its own process, started
      with ``task_command`` (this process then starts no JAX backend).
    task_command: the command of a process that runs one task alone.
    cpu_devices: the host devices every child process (``parallel`` > 1)
      emulates its learners on, on a CPU host: the count a sequential sweep
      has (``stalesgd-reproduce``: 8), because runs with several contributions
      per update differ in their last bits between device counts.
    gpu_ids: a GPU host's GPUs to hand out, one per process.
    only_task: run only this task of the grid (its index) and write no report:
      one element of a job array, or one process of a parallel sweep.
    gather_only: train nothing; write the report from the finished runs
      (after a job array), refusing an unfinished grid.
    command: the study's command line, for the report's ``README.md``.
    echo: where progress lines go.

  Returns:
    The per-run rows and the report's Markdown table (`SweepResult`; no
    table when a run was preempted or only one task ran).
  """
  tasks = plan_tasks(study, workdir, settings, variants=variants, seeds=seeds)
  if only_task is not None and not 0 <= only_task < len(tasks):
    raise ValueError(
      f"task={only_task}; allowed: an index in [0, {len(tasks)}) of this grid's "
      f"{len(tasks)} runs (variants x seeds, in the order `--list_tasks` prints)"
    )
  in_processes = parallel > 1 and only_task is None and not gather_only
  if in_processes and (task_command is None or cpu_devices is None):
    raise ValueError("parallel > 1 needs task_command and cpu_devices (stalesgd-reproduce passes them)")
  chosen = tasks if only_task is None else [tasks[only_task]]
  if gather_only:
    check_tasks(chosen, None)  # nothing trains here: only that every directory holds this grid's run
  elif in_processes:  # validated for the devices each process will see
    check_tasks(chosen, lambda config: gpus_needed(config) if gpu_ids else cpu_devices)
  else:
    check_tasks(chosen, lambda config: jax.device_count())
  if gather_only:
    done = gather(tasks, echo=echo)
  elif in_processes:
    done = run_tasks_in_processes(
      tasks, task_command, parallel=parallel, cpu_devices=cpu_devices, gpu_ids=gpu_ids, echo=echo
    )
  else:
    done = run_tasks_here(chosen, echo=echo, hparams_first=varied_fields(tasks))
  if done is None:
    return SweepResult([], None)
  if in_processes:
    host_devices = None if gpu_ids else cpu_devices
  else:
    host_devices = jax.device_count() if jax.default_backend() == "cpu" else None
  rows = [result_row(task, outcome, host_devices=host_devices) for task, outcome in done]
  if only_task is not None:
    return SweepResult(rows, None)
  result = SweepResult(rows, report.write_report(study, rows, pathlib.Path(workdir), command=command))
  echo(
    f"TensorBoard: tensorboard --logdir {workdir} (HParams: every run's config, the fields the grid varies "
    "first, and its final metrics)"
  )
  return result
