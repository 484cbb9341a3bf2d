"""Runs a study's grid one run at a time and writes its table and plots.

Each variant trains with `stalesgd.train.train_and_evaluate` in its own
sub-directory of the study's workdir (named by `Variant.slug`), so

* a sweep resumes: a sub-run whose ``summary.json`` says it finished (not
  preempted) is read back instead of trained again, and an unfinished one
  resumes from its checkpoint; a directory holding a run of another config
  (``config.json``, `stalesgd.config.check_same_run`) is refused;
* a run whose loss becomes non-finite (`stalesgd.train.TrainingDiverged`) is recorded as
  diverged at the update the trainer names, with the chance-level test error
  (Zhang et al. report such runs as "90% error" on CIFAR-10), and the sweep
  goes on; the record (``diverged.json``) is read back on resume;
* a preempted run (SIGTERM) stops the sweep; running it again resumes.

At the end the study's workdir holds ``results.csv`` (every field),
``results.md`` (the main columns, with the published numbers beside ours),
``evaluations.csv`` (every evaluation of every run: its learning curve),
``test_error.png`` (test error vs epoch and vs simulated wall-clock time, one
line per run), ``train_loss.png`` and ``staleness.png`` (the staleness
distribution of every run's schedule).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import ml_collections

from stalesgd.studies.definitions import Study, Variant, study_run
from stalesgd import plots
from stalesgd.config import protocol_options, validate_config
from stalesgd.workdir import check_same_run
from stalesgd.data.dataset import KNOWN_NUM_CLASSES
from stalesgd.metrics import METRICS_FILENAME, read_jsonl
from stalesgd import train
from stalesgd.train import SCHEDULE_FILENAME, SUMMARY_FILENAME
from stalesgd.schedule import Schedule

DIVERGED_FILENAME = "diverged.json"
EVALUATIONS_FILENAME = "evaluations.csv"
EVALUATION_COLUMNS = ("variant", "epoch", "step", "sim_time", "test_error", "test_loss", "train_accuracy",
                      "train_loss")
TABLE_COLUMNS = ("variant", "n", "epochs", "test_error", "published_test_error", "test_accuracy", "sim_time",
                 "staleness_mean", "staleness_max", "status")


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


def run_variant(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> RunOutcome:
  """Trains one variant in ``workdir``, or reads back the result of an earlier sweep.

  Args:
    config: the run's config.
    workdir: the run's own directory.

  Returns:
    The outcome; a diverged run is an outcome, not an error.
  """
  summary_path, diverged_path = workdir / SUMMARY_FILENAME, workdir / DIVERGED_FILENAME
  if summary_path.exists():
    summary = json.loads(summary_path.read_text())
    if not summary.get("preempted"):
      return RunOutcome(summary, reused=True)
  if diverged_path.exists():
    record = json.loads(diverged_path.read_text())
    return RunOutcome(None, diverged_at=record["update"], message=record["message"], reused=True)
  workdir.mkdir(parents=True, exist_ok=True)
  try:
    return RunOutcome(train.train_and_evaluate(config, str(workdir)))
  except train.TrainingDiverged as error:
    diverged_path.write_text(json.dumps({"update": error.update, "message": str(error)}, indent=2))
    return RunOutcome(None, diverged_at=error.update, message=str(error))


def chance_error(config: ml_collections.ConfigDict) -> float | None:
  """Test error (%) of a constant prediction: what a diverged run is recorded with (None if unknown)."""
  num_classes = KNOWN_NUM_CLASSES.get(config.dataset)
  return None if num_classes is None else 100.0 * (1.0 - 1.0 / num_classes)


def result_row(variant: Variant, config: ml_collections.ConfigDict, outcome: RunOutcome, workdir: pathlib.Path,
               command: str) -> dict[str, Any]:
  """One table row: the variant, its settings, our result, the published one, and how to rerun it."""
  row: dict[str, Any] = {
      "variant": variant.label,
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
    error = chance_error(config)
    row.update(updates=outcome.diverged_at, epochs=None, test_error=error,
               test_accuracy=None if error is None else 1.0 - error / 100.0,
               sim_time=_simulated_time_at(workdir, outcome.diverged_at),
               status=f"diverged at update {outcome.diverged_at}")
  else:
    row.update({field: summary.get(field) for field in ("updates", "epochs", "test_error", "test_accuracy",
                                                         "train_accuracy", "sim_time", "wall_time",
                                                         "staleness_mean", "staleness_max")})
    row["status"] = "preempted" if outcome.preempted else "ok"
  for field, value in variant.published.items():
    row[plots.PUBLISHED_PREFIX + field] = value
  row.update(workdir=str(workdir), command=command)
  return row


def _simulated_time_at(workdir: pathlib.Path, update: int) -> float | None:
  path = workdir / SCHEDULE_FILENAME
  if update < 0 or not path.exists():
    return None
  update_time = Schedule.load(path).update_time
  return float(update_time[min(update, update_time.shape[0] - 1)])


def evaluation_rows(runs: Sequence[plots.Run]) -> list[dict[str, Any]]:
  """One row per evaluation of every run (its learning curve): `EVALUATION_COLUMNS`."""
  return [{"variant": run.label, **{column: record.get(column) for column in EVALUATION_COLUMNS[1:]}}
          for run in runs for record in run.records if "test_error" in record]


def write_report(study: Study, rows: Sequence[dict[str, Any]], workdir: pathlib.Path) -> str:
  """Writes the tables and plots of a finished grid; returns the Markdown table."""
  plots.write_results_table(rows, workdir / "results.csv")
  columns = [column for column in TABLE_COLUMNS if any(row.get(column) is not None for row in rows)]
  plots.write_results_table(rows, workdir / "results.md", columns=columns)
  runs, staleness = [], {}
  for row in rows:
    run_dir = pathlib.Path(row["workdir"])
    metrics_path = run_dir / METRICS_FILENAME
    records = read_jsonl(metrics_path) if metrics_path.exists() else []
    runs.append(plots.Run(row["variant"], records))
    if (run_dir / SCHEDULE_FILENAME).exists():
      staleness[row["variant"]] = Schedule.load(run_dir / SCHEDULE_FILENAME).gradient_staleness
  plots.write_results_table(evaluation_rows(runs), workdir / EVALUATIONS_FILENAME, columns=EVALUATION_COLUMNS)
  plots.plot_curves(runs, workdir / "test_error.png", y="test_error", title=study.title)
  plots.plot_curves(runs, workdir / "train_loss.png", y="train_loss", title=study.title)
  if staleness:
    plots.plot_staleness_histograms(staleness, workdir / "staleness.png", title=study.title)
  return plots.markdown_table(rows, columns)


def run_study(study: Study, workdir: str | pathlib.Path, *, quick: bool = False, data_source: str | None = None,
              data_dir: str | None = None, num_epochs: float | None = None,
              variants: Sequence[str] | None = None, echo=print) -> SweepResult:
  """Runs (or resumes) every variant of ``study`` in turn, then writes the report.

  Every config is built and validated, and checked against the config of any
  earlier run in its directory, before the first run: a bad setting stops the
  sweep at once instead of after hours, and results of another setting are
  never reused.

  Args:
    study: the study.
    workdir: the study's directory; variant ``v`` runs in ``workdir/v.slug``.
    quick: the CPU-sized version (see `study_run`).
    data_source: read the paper's data set from this source.
    data_dir: that source's directory.
    num_epochs: epochs per run, overriding the study's.
    variants: run only these variants, by slug (their directory names, e.g.
      ``"15_softsync_a0_sigma"``), in the study's order; None runs them all.
    echo: where progress lines go.

  Returns:
    The rows and the Markdown table (`SweepResult`).
  """
  workdir = pathlib.Path(workdir)
  chosen = study.select(variants)
  runs = [study_run(study, variant, quick=quick, data_source=data_source, data_dir=data_dir, num_epochs=num_epochs)
          for variant in chosen]
  for variant, (config, _) in zip(chosen, runs):
    validate_config(config, num_devices=jax.device_count())
    check_same_run(config, workdir / variant.slug)
  rows = []
  for index, (variant, (config, command)) in enumerate(zip(chosen, runs), start=1):
    run_dir = workdir / variant.slug
    echo(f"[{index}/{len(runs)}] {variant.label}: {command} --workdir={run_dir}")
    outcome = run_variant(config, run_dir)
    if outcome.reused:
      echo(f"  reused the finished run in {run_dir}")
    if outcome.diverged_at is not None:
      echo(f"  diverged at update {outcome.diverged_at}; recorded, continuing")
    if outcome.preempted:
      echo(f"  preempted: the sweep stops here; run the same command again to resume from {run_dir}")
      return SweepResult(rows, None)
    rows.append(result_row(variant, config, outcome, run_dir, command))
  return SweepResult(rows, write_report(study, rows, workdir))
