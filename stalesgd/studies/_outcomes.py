"""How a study's run ended (`RunOutcome`), read back from its run directory, and its row in the results.

A run is trained at most once: `run_variant` reads back a finished run
(``summary.json``, not preempted) or a diverged one (``diverged.json``) instead
of training it again, and resumes an unfinished one from its checkpoint. A run
whose loss becomes non-finite (`stalesgd.training.TrainingDiverged`) is an
outcome, not an error: recorded with the update the trainer names and, in its
row, the chance-level test error of the data it loaded (Zhang et al. report
such runs as "90% error" on CIFAR-10). A finished run that fell back to chance
is marked diverged by the report (`stalesgd.studies._divergence`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import ml_collections

from stalesgd.records import _run_directory as run_directory
from stalesgd.reports import _tables as tables
from stalesgd.schedule import Schedule
from stalesgd.studies._tasks import Task, command_with_workdir
from stalesgd.training import _loop as train
from stalesgd.training._config_readers import protocol_options


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
  if not is_unfinished(finished):
    return finished
  workdir.mkdir(parents=True, exist_ok=True)
  try:
    return RunOutcome(train.train_and_evaluate(config, str(workdir), hparams_first=hparams_first))
  except train.TrainingDiverged as error:
    (workdir / run_directory.DIVERGED).write_text(json.dumps({"update": error.update, "message": str(error)}, indent=2))
    return RunOutcome(None, diverged_at=error.update, message=str(error))


def chance_error(workdir: pathlib.Path) -> float | None:
  """Test error (%) of always predicting the most frequent test class, from the data the run in ``workdir``
  loaded (its ``dataset.json``): what a diverged run is recorded with. None if the run wrote none."""
  path = pathlib.Path(workdir) / run_directory.DATASET
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
    row[tables.PUBLISHED_PREFIX + field] = value
  row.update(host_devices=host_devices, workdir=str(workdir), command=command_with_workdir(task, host_devices))
  return row


def _simulated_time_at(workdir: pathlib.Path, update: int) -> float | None:
  path = workdir / run_directory.SCHEDULE
  if update < 0 or not path.exists():
    return None
  update_time = Schedule.load(path).update_time
  return float(update_time[min(update, update_time.shape[0] - 1)])


def read_outcome_in(workdir: pathlib.Path) -> RunOutcome | None:
  """The outcome a finished (or diverged, or preempted) run left in ``workdir``; None if it has none."""
  summary_path, diverged_path = workdir / run_directory.SUMMARY, workdir / run_directory.DIVERGED
  if diverged_path.exists():
    record = json.loads(diverged_path.read_text())
    return RunOutcome(None, diverged_at=record["update"], message=record["message"], reused=True)
  if summary_path.exists():
    return RunOutcome(json.loads(summary_path.read_text()), reused=True)
  return None


def read_outcome(task: Task) -> RunOutcome | None:
  """`read_outcome_in` of the task's directory."""
  return read_outcome_in(task.directory)


def is_unfinished(outcome: RunOutcome | None) -> bool:
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
