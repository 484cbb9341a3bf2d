"""The progress of an unfinished grid, marked as such: every run's test error so far, beside an earlier grid.

A long grid (the 140-epoch CIFAR-10 runs take days of a small machine) is worth looking at before it ends, but a
run is a result only at its last epoch. `write_progress` (``stalesgd-reproduce --progress``) trains nothing and
writes into ``<study workdir>/progress/``:

* ``progress.md``: headed UNFINISHED with the count of finished runs; per run its status (finished, diverged,
  unfinished at epoch e of E, not started), its latest test error, with an earlier grid that grid's test error
  at the same fraction of the schedule, and once finished its final value as the study's rule reads it (the mean
  of its last evaluations); the claims, each decided only once every run of both its arms has
  finished (by the study's rule: `stalesgd.studies._report.decisions`), otherwise the count still to come;
* ``progress.csv``: every evaluation so far, this grid's and the earlier grid's (stretched, below);
* ``preregistration.json``: whether the runs begun so far were pre-registered (`stalesgd.studies._registration`),
  over those that have recorded how they began (a run of older code records its commit when it first stops);
* ``progress.png``: test error against epoch, one line per run; the earlier grid's runs of the same variant and
  seed dashed in the same colour, their epochs stretched to this grid's schedule.

The earlier grid (``--compare_with``) is a finished report's directory (``evaluations.csv``, ``runs.csv``) whose
variants carry the same labels, e.g. the same study's runs at a schedule compressed to 20 epochs. Stretching maps
its epoch e to e * E / E', E being this run's epochs and E' the epochs the earlier run ran (``runs.csv``), so both
runs end, and pass their learning-rate decays, at the same abscissa.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import read_jsonl
from stalesgd.reports import _plots as plots
from stalesgd.reports import _tables as tables
from stalesgd.studies import _portable_paths as portable
from stalesgd.studies import _registration as registrations
from stalesgd.studies import _report as report
from stalesgd.studies import _seed_statistics as statistics
from stalesgd.studies._outcomes import read_outcome
from stalesgd.studies._study import Study
from stalesgd.studies._tasks import Task

PROGRESS_DIRECTORY = "progress"
FINISHED = "finished"


@dataclasses.dataclass(frozen=True)
class RunProgress:
  """How far one run of the grid got.

  Attributes:
    task: the run.
    status: ``finished``, ``diverged at update U``, ``unfinished`` or ``not started``.
    evaluations: its evaluation records so far, in order.
  """

  task: Task
  status: str
  evaluations: Sequence[Mapping[str, Any]]

  @property
  def epochs(self) -> float:
    """The epochs of the whole run (its config)."""
    return float(self.task.config.num_epochs)

  @property
  def end_epoch(self) -> float:
    """Where the run ends: its config's epochs, or a finished run's last evaluation where its last update carried it
    past them (a whole number of updates: 58,334 updates of 120 images end CIFAR-10's 140 epochs at 140.0016)."""
    if self.status == FINISHED and self.evaluations:
      return max(self.epochs, float(self.evaluations[-1]["epoch"]))
    return self.epochs

  def describe(self) -> str:
    if self.status == "unfinished" and self.evaluations:
      return f"unfinished: epoch {float(self.evaluations[-1]['epoch']):.0f} of {self.epochs:g}"
    return self.status


def run_progress(task: Task) -> RunProgress:
  """The status and evaluations so far of ``task``'s directory."""
  metrics = task.directory / run_directory.METRICS
  evaluations = report.evaluations(read_jsonl(metrics)) if metrics.exists() else []
  outcome = read_outcome(task)
  if outcome is not None and outcome.diverged_at is not None:
    status = f"diverged at update {outcome.diverged_at}"
  elif outcome is not None and not outcome.preempted:
    status = FINISHED
  else:
    status = "unfinished" if metrics.exists() else "not started"
  return RunProgress(task, status, evaluations)


def earlier_curves(directory: pathlib.Path) -> dict[tuple[str, int], tuple[float, list[tuple[float, float]]]]:
  """An earlier finished report's curves: per (variant label, seed), the epochs it ran and its (epoch, test
  error) points.

  Raises:
    FileNotFoundError: naming the report's file that is missing.
  """
  tables = {}
  for name in (report.RUNS_FILENAME, report.EVALUATIONS_FILENAME):
    path = directory / name
    if not path.exists():
      raise FileNotFoundError(f"--compare_with={directory}: no {name}; allowed: a finished study's report directory")
    with open(path, newline="", encoding="utf-8") as file:
      tables[name] = list(csv.DictReader(file))
  ran = {(row["variant"], int(row["seed"])): float(row["epochs"]) for row in tables[report.RUNS_FILENAME]}
  curves: dict[tuple[str, int], tuple[float, list[tuple[float, float]]]] = {}
  for row in tables[report.EVALUATIONS_FILENAME]:
    key = (row["variant"], int(row["seed"]))
    if key in ran and row["test_error"]:
      curves.setdefault(key, (ran[key], []))[1].append((float(row["epoch"]), float(row["test_error"])))
  return curves


def stretched(points: Sequence[tuple[float, float]], ran: float, epochs: float) -> list[tuple[float, float]]:
  """``points`` (epoch, value) of a run of ``ran`` epochs with their epochs scaled to a run of ``epochs``: the same
  fraction of the run, end on end (the fraction first: the last point of a finished run lands on ``epochs`` exactly)."""
  return [(epoch / ran * epochs, value) for epoch, value in points]


def _at(points: Sequence[tuple[float, float]], epoch: float) -> float | None:
  """The value of a curve at ``epoch`` (linear between points), None outside its epochs."""
  if not points or not points[0][0] <= epoch <= points[-1][0]:
    return None
  epochs, values = zip(*points)
  return float(np.interp(epoch, epochs, values))


def _claim_rows(study: Study, progress: Sequence[RunProgress]) -> list[dict[str, Any]]:
  """The rows `report.decisions` reads, of the finished runs only (a run is a result only at its end)."""
  rows = []
  for run in progress:
    if run.status != FINISHED:
      continue
    curve = [float(record["test_error"]) for record in run.evaluations]
    row = {"slug": run.task.variant.slug, "seed": run.task.seed, report.FINAL: None, report.LAST: None}
    if curve:
      row[report.FINAL] = statistics.final_value(curve, study.last_evaluations)
      row[report.LAST] = curve[-1]
    rows.append(row)
  return rows


def claim_lines(study: Study, progress: Sequence[RunProgress]) -> list[str]:
  """Each claim decided by the study's rule once every run of both its arms has finished; else how many are left."""
  decided = {entry["claim"]: entry for entry in report.decisions(study, _claim_rows(study, progress))}
  lines = []
  for claim in study.claims:
    arms = [run for run in progress if run.task.variant.slug in (claim.variant, claim.reference)]
    left = sum(run.status != FINISHED for run in arms)
    if not arms:
      lines.append(f"- {claim.statement}: not in this grid's variants.")
    elif left:
      verb = "has" if left == 1 else "have"
      lines.append(f"- {claim.statement}: not decided yet: {left} of its {len(arms)} runs {verb} not finished.")
    else:
      lines.append(report.decisions_markdown([decided[claim.statement]]).strip())
  return lines


def write_progress(
  study: Study, tasks: Sequence[Task], workdir: pathlib.Path, *, compare_with: pathlib.Path | None = None
) -> str:
  """Writes the module docstring's files into ``workdir/progress`` and returns ``progress.md``'s text."""
  progress = [run_progress(task) for task in tasks]
  earlier = earlier_curves(compare_with) if compare_with is not None else {}
  finished = sum(run.status == FINISHED for run in progress)
  out = workdir / PROGRESS_DIRECTORY
  out.mkdir(parents=True, exist_ok=True)
  rows, table = [], []
  # The rule's statistic, of the finished runs only (a run is a result only at its end): what the claims read.
  finals = {(row["slug"], row["seed"]): row[report.FINAL] for row in _claim_rows(study, progress)}
  for run in progress:
    label, seed = run.task.variant.label, run.task.seed
    points = [(float(record["epoch"]), float(record["test_error"])) for record in run.evaluations]
    rows += [{"grid": "this", "variant": label, "seed": seed, "epoch": e, "test_error": v} for e, v in points]
    entry = {"variant": label, "seed": seed, "status": run.describe()}
    entry["latest test error (%)"] = f"{points[-1][1]:.2f}" if points else ""
    if earlier:
      ran, old_points = earlier.get((label, seed), (1.0, []))
      old = stretched(old_points, ran, run.end_epoch)
      rows += [{"grid": "earlier", "variant": label, "seed": seed, "epoch": e, "test_error": v} for e, v in old]
      same_point = _at(old, points[-1][0]) if points else None
      entry["earlier grid at the same point (%)"] = "" if same_point is None else f"{same_point:.2f}"
    final = finals.get((run.task.variant.slug, seed))
    entry[f"final: mean of the last {study.last_evaluations} (%)"] = "" if final is None else f"{final:.2f}"
    table.append(entry)
  tables.write_results_table(rows, out / "progress.csv", columns=("grid", "variant", "seed", "epoch", "test_error"))
  _plot(progress, earlier, out / "progress.png", title=f"{study.title}: UNFINISHED, {finished} of {len(tasks)} runs")
  # A run in flight has recorded its commit only if it registered (a study run of today's code) or stopped once.
  recorded = (run_directory.REGISTRATION, run_directory.SUMMARY, run_directory.DIVERGED)
  begun = [
    {"variant": run.task.variant.label, "seed": run.task.seed, "workdir": str(run.task.directory)}
    for run in progress
    if any((run.task.directory / name).exists() for name in recorded)
  ]
  verdict = (
    report.registration_of(study, begun, tasks[0].registration if tasks else None)
    if begun
    else registrations.Registration(registrations.EXPLORATORY, ("no run has recorded how it began yet",))
  )
  (out / report.PREREGISTRATION_FILENAME).write_text(
    json.dumps({"status": verdict.status, "reasons": list(verdict.reasons), "runs": len(begun)}, indent=2) + "\n",
    encoding="utf-8",
  )
  now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
  comparison = (
    f" Beside each run, the run of the same variant and seed in {portable.portable_path(compare_with, workdir)} at "
    "the same fraction of the schedule (its epochs stretched to this one's)."
    if compare_with is not None
    else ""
  )
  text = "\n".join(
    [
      f"# {study.name}: UNFINISHED, {finished} of {len(tasks)} runs finished ({now})",
      "",
      "A progress report, not a result: a run counts only at its last epoch, and a claim is decided only once "
      f"every run of both its arms has finished.{comparison}",
      "",
      tables.markdown_table(table).strip(),
      "",
      "## Claims",
      "",
      f"Of the {len(begun)} runs that have recorded how they began: {verdict.describe()} "
      "(`stalesgd.studies._registration`).",
      "",
      *claim_lines(study, progress),
      "",
      "![test error against epoch](progress.png)",
      "",
    ]
  )
  (out / "progress.md").write_text(text, encoding="utf-8")
  (out / "progress.json").write_text(
    json.dumps({"finished": finished, "runs": len(tasks), "written": now}, indent=2) + "\n", encoding="utf-8"
  )
  return text


def _plot(progress: Sequence[RunProgress], earlier, path: pathlib.Path, *, title: str) -> None:
  figure = plots.new_figure(figsize=(8, 5), layout="constrained")
  panel = figure.subplots()
  colours = {
    label: f"C{index % 10}" for index, label in enumerate(dict.fromkeys(r.task.variant.label for r in progress))
  }
  for run in progress:
    label, seed = run.task.variant.label, run.task.seed
    colour, first_seed = colours[label], seed == min(r.task.seed for r in progress if r.task.variant.label == label)
    if run.evaluations:
      epochs = [float(record["epoch"]) for record in run.evaluations]
      errors = [float(record["test_error"]) for record in run.evaluations]
      panel.plot(epochs, errors, color=colour, linewidth=1.2, label=label if first_seed else None)
    if (label, seed) in earlier:
      ran, points = earlier[label, seed]
      old = stretched(points, ran, run.end_epoch)
      panel.plot(
        [e for e, _ in old],
        [v for _, v in old],
        color=colour,
        linestyle="--",
        linewidth=0.8,
        label=f"{label}, earlier grid stretched" if first_seed else None,
      )
  panel.set_xlabel(plots.AXIS_LABELS.get("epoch", "epoch"))
  panel.set_ylabel(plots.AXIS_LABELS.get("test_error", "test error"))
  panel.grid(alpha=0.3)
  if panel.get_legend_handles_labels()[0]:
    panel.legend(fontsize="small")
  plots.set_figure_title(figure, title)
  plots.save_figure(figure, path)
