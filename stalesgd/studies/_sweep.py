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

import pathlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from stalesgd.records import _run_directory as run_directory
from stalesgd.studies import _processes as processes
from stalesgd.studies import _registration as registration
from stalesgd.studies import _report as report
from stalesgd.studies._outcomes import (
  RunOutcome,
  describe_outcome,
  is_unfinished,
  read_outcome,
  result_row,
  run_variant,
)
from stalesgd.studies._study import Study
from stalesgd.studies._study_runs import StudySettings
from stalesgd.studies._tasks import Task, check_tasks, gpus_needed, plan_tasks, varied_fields
from stalesgd.training._loop import PREEMPTED_EXIT_STATUS
from stalesgd.training._provenance import source_commit


class SweepResult(NamedTuple):
  """What `run_study` returns.

  Attributes:
    rows: one result row per run, in the study's order (`result_row`).
    table: the Markdown table, or None when a run was preempted (the report
      is then not written).
  """

  rows: list[dict[str, Any]]
  table: str | None


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
    registration.write_registration(task.directory, task.registration, source_commit())
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
  unfinished = [task for task in tasks if is_unfinished(read_outcome(task))]
  echo(
    f"{len(tasks) - len(unfinished)} of {len(tasks)} runs already finished; running {len(unfinished)} as up to "
    f"{parallel} processes at a time"
  )
  process_tasks = [
    processes.ProcessTask(
      label=task.label,
      argv=task_command(task),
      log_path=task.directory / run_directory.PROCESS_LOG,
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
        f"{task.label} (exit status {status}, log {task.directory / run_directory.PROCESS_LOG})"
        for task, status in failed
      )
    )
  return gather(tasks, echo=echo, missing_ok=True)


def gather_refusal(tasks: Sequence[Task]) -> str | None:
  """Why no report can be gathered from ``tasks`` yet (the runs that have not finished), or None if it can.

  `gather` refuses with this message; ``stalesgd-reproduce --gather`` asks first, before JAX starts.
  """
  missing = [task for task in tasks if is_unfinished(read_outcome(task))]
  return _unfinished_message(missing, len(tasks)) if missing else None


def _unfinished_message(missing: Sequence[Task], num_tasks: int) -> str:
  verb = "has" if len(missing) == 1 else "have"
  return (
    f"{len(missing)} of {num_tasks} runs {verb} not finished: "
    + ", ".join(f"--task={task.index} ({task.label}, {task.directory})" for task in missing)
    + "; allowed: gather once every run of the grid has finished"
  )


def gather(tasks: Sequence[Task], *, echo=print, missing_ok: bool = False) -> list[tuple[Task, RunOutcome]] | None:
  """Every task with the outcome its directory holds; None if a run is unfinished or preempted.

  Raises:
    ValueError: unless ``missing_ok``, naming the runs that have not finished
      (a report is written only from a whole grid).
  """
  done, missing = [], []
  for task in tasks:
    outcome = read_outcome(task)
    if is_unfinished(outcome):
      missing.append(task)
    else:
      done.append((task, outcome))
  if missing and not missing_ok:
    raise ValueError(_unfinished_message(missing, len(tasks)))
  if missing:
    echo(f"  {len(missing)} runs unfinished (preempted): rerun the same command to resume them")
    return None
  return done


def run_study(
  study: Study,
  workdir: str | pathlib.Path,
  settings: StudySettings = StudySettings(),
  *,
  variants: Sequence[str] | None = None,
  seeds: int = 1,
  first_seed: int = 0,
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
    settings: the study-level flags (`StudySettings`).
    variants: run only these variants, by slug (their directory names, e.g.
      ``"15_softsync_a0_sigma"``), in the study's order; None runs them all.
    seeds: seeds per variant (``first_seed`` .. ``first_seed + seeds - 1``).
    first_seed: the first seed run.
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
  tasks = plan_tasks(study, workdir, settings, variants=variants, seeds=seeds, first_seed=first_seed)
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
  result = SweepResult(
    rows, report.write_report(study, rows, pathlib.Path(workdir), command=command, registration=tasks[0].registration)
  )
  echo(
    f"TensorBoard: tensorboard --logdir {workdir} (HParams: every run's config, the fields the grid varies "
    "first, and its final metrics)"
  )
  return result
