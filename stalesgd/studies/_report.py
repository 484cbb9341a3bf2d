"""The report of a finished study: tables over seeds, learning curves with bands, and the claims' decisions.

Written into the study's workdir by `stalesgd.studies.run_study` (and by
``stalesgd-reproduce --gather`` after a job array):

* ``runs.csv``: one row per run (variant x seed): its settings, results, final
  value (mean of its last `Study.last_evaluations` test errors), status,
  directory and command, with no absolute path of the machine (the directory
  relative to the study's, the data directory as ``$DATA_DIR``:
  `stalesgd.studies._portable_paths`);
* ``results.csv`` / ``results.md``: one row per variant: the final value's
  mean ± std over seeds with min/max, the published number beside it, and the
  means of the other summary fields;
* ``evaluations.csv``: every evaluation of every run (its learning curve);
  ``evaluations_over_seeds.csv``: per variant and evaluation epoch, mean, std,
  min and max over seeds;
* ``decisions.md`` / ``decisions.json``: every `Claim`: the rule, the paired
  95 % interval, and the decision;
* ``preregistration.json``: whether the claims were fixed before every run
  began, computed from what the runs recorded (`stalesgd.studies._registration`):
  ``pre-registered``, or exploratory with the reasons;
* ``bands.md``, for a study with `Study.bands` (the demo): per variant, the
  band its seeds' values fall in; this, with the decisions without their
  intervals, is then what the command prints, so that the printed text is
  the same on machines whose rounding moves the numbers within their bands;
* ``test_error.png`` (mean over seeds with a ± std band, against epochs and
  simulated time), ``train_loss.png``, ``staleness.png``;
* ``README.md``: the command, code, host, data, wall times, the table, the
  decisions and the plots, with a hand-kept *Notes* section a new report keeps
  (`stalesgd.studies._results_readme`).
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import read_jsonl
from stalesgd.reports import _plots as plots
from stalesgd.reports import _tables as tables
from stalesgd.schedule import Schedule
from stalesgd.studies import _divergence as divergence
from stalesgd.studies import _portable_paths as portable
from stalesgd.studies import _registration as registrations
from stalesgd.studies import _results_readme as results_readme
from stalesgd.studies import _seed_statistics as statistics
from stalesgd.studies._study import Claim, Study
from stalesgd.training._provenance import SOURCE_ROOT
from stalesgd.training._runners import DECENTRALIZED_DIAGNOSTICS

RUNS_FILENAME = "runs.csv"
EVALUATIONS_FILENAME = "evaluations.csv"
EVALUATIONS_OVER_SEEDS_FILENAME = "evaluations_over_seeds.csv"
DECISIONS_FILENAME = "decisions.md"
PREREGISTRATION_FILENAME = "preregistration.json"  # the grid's `registration_of`: status and reasons
EVALUATION_COLUMNS = (
  "variant",
  "seed",
  "epoch",
  "step",
  "sim_time",
  "test_error",
  "test_loss",
  "train_accuracy",
  "train_loss",
  "correction_ratio",
  "displacement_norm",
)
SEED_CURVE_FIELDS = ("test_error", "test_loss", "train_loss")
# Per-variant means of these run fields, where the runs have them (DC-S3GD's per-learner diagnostics included).
MEAN_FIELDS = (
  "epochs",
  "sim_time",
  "wall_time",
  "staleness_mean",
  "staleness_max",
  "correction_ratio",
  "displacement_norm",
)
FINAL = "final_test_error"
LAST = "last_test_error"  # a run's last evaluation alone (`Study.report_last_evaluation`)


def run_records(row: Mapping[str, Any]) -> list[dict[str, Any]]:
  """The metric records of the run a row describes (empty if it left none)."""
  path = pathlib.Path(row["workdir"]) / run_directory.METRICS
  return read_jsonl(path) if path.exists() else []


def evaluations(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """The records that carry a test evaluation, in order."""
  return [record for record in records if _number(record.get("test_error")) is not None]


def run_final_value(row: Mapping[str, Any], records: Sequence[Mapping[str, Any]], last: int) -> float | None:
  """A run's value: the mean of its last ``last`` test errors; a diverged run's is its recorded (chance) error."""
  if str(row.get("status", "")).startswith("diverged"):
    return _number(row.get("test_error"))
  curve = [float(record["test_error"]) for record in evaluations(records)]
  return statistics.final_value(curve, last) if curve else _number(row.get("test_error"))


DIVERGED_PREFIX = "diverged"
# A claim's decision where no seed has a value of both arms: one arm was never run in this grid, or no seed has
# both (e.g. every run of one arm diverged).
NOT_RUN = "not run"
NO_PAIRED_RUNS = "not decided (no paired runs)"


def is_diverged(row: Mapping[str, Any]) -> bool:
  """Whether a run diverged: a non-finite loss (`run_variant`) or the collapse rule (`mark_collapse`)."""
  return str(row.get("status", "")).startswith(DIVERGED_PREFIX)


def mark_collapse(row: dict[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
  """Marks a finished run that fell back to chance for good as diverged (`divergence.collapse_update`)."""
  chance = divergence.chance_loss(pathlib.Path(row["workdir"]))
  if is_diverged(row) or chance is None:
    return
  update = divergence.collapse_update(records, chance)
  if update is not None:
    row["status"] = f"{DIVERGED_PREFIX}: back at chance loss from update {update}"


def _number(value: Any) -> float | None:
  if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
    return float(value)
  return None


# DC-S3GD's per-run diagnostics (the runner's list), shown to three significant digits: a correction may be 1e-6
# of the gradient.
DIAGNOSTICS = DECENTRALIZED_DIAGNOSTICS


def _mean_diagnostics(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """The mean over a run's logged records of DC-S3GD's diagnostics (absent for other protocols)."""
  means = {}
  for field in DIAGNOSTICS:
    values = [_number(record.get(field)) for record in records]
    values = [value for value in values if value is not None]
    if values:
      means[field] = sum(values) / len(values)
  return means


def variant_rows(study: Study, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """One row per variant (study order): the final value over seeds, published numbers, field means."""
  table = []
  order = [variant.label for variant in study.variants]
  for label in [label for label in order if any(row["variant"] == label for row in rows)]:
    runs = [row for row in rows if row["variant"] == label]
    finals = [row[FINAL] for row in runs if row.get(FINAL) is not None and not is_diverged(row)]
    diverged = sum(is_diverged(row) for row in runs)
    entry: dict[str, Any] = {"variant": label, "n": runs[0].get("n"), "seeds": len(runs)}
    if finals:
      values = statistics.spread(finals)
      entry.update(
        {
          FINAL: values.mean,
          f"{FINAL}_std": values.std,
          f"{FINAL}_min": values.low,
          f"{FINAL}_max": values.high,
          "final (mean ± std)": values.format() + (f"; {diverged} diverged" if diverged else ""),
        }
      )
    elif diverged:
      entry["final (mean ± std)"] = f"all {diverged} diverged"
    for field, value in runs[0].items():
      if field.startswith(tables.PUBLISHED_PREFIX):
        entry[field] = value
    for field in MEAN_FIELDS:
      present = [_number(row.get(field)) for row in runs]
      present = [value for value in present if value is not None]
      if present:
        entry[field] = sum(present) / len(present)
    statuses = [str(row["status"]) for row in runs]
    entry["status"] = ", ".join(f"{statuses.count(status)} {status}" for status in dict.fromkeys(statuses))
    table.append(entry)
  return table


def band_of(value: float | None, bands: Sequence[tuple[float, float, str]]) -> str:
  """The label of the band holding ``value`` (inclusive ends), or why there is none."""
  if value is None:
    return "no value"
  for low, high, label in bands:
    if low <= value <= high:
      return label
  return f"outside every band ({value:.1f})"


def band_table(study: Study, rows: Sequence[Mapping[str, Any]]) -> str:
  """Per variant, the band of `Study.bands` that every seed's value falls in (Markdown), for coarse output."""
  table = []
  for label in dict.fromkeys(row["variant"] for row in rows):
    runs = [row for row in rows if row["variant"] == label]
    found = sorted({band_of(row.get(FINAL), study.bands) for row in runs})
    table.append(
      {
        "variant": label,
        "seeds": len(runs),
        f"test error, mean of the last {study.last_evaluations} evaluations": found[0]
        if len(found) == 1
        else "seeds in different bands: " + "; ".join(found),
      }
    )
  return tables.markdown_table(table)


def decisions(study: Study, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """Every claim of ``study`` decided from the runs: rule, paired interval, decision (`Claim`).

  With `Study.report_last_evaluation`, each entry also carries the paired interval of the last evaluation
  alone (``last_evaluation_interval``, from the rows' `LAST`), which decides nothing. A claim one of whose arms
  has no run in ``rows`` is `NOT_RUN` (its ``not_run``: the slugs missing), not a decision with an empty gap.
  """
  decided = []
  for claim in study.claims:
    seeds, gaps = _paired_gaps(claim, rows, FINAL)
    left_out = [
      f"{row['variant']} seed {row['seed']} ({row['status']})"
      for row in rows
      if row["slug"] in (claim.variant, claim.reference) and is_diverged(row)
    ]
    entry: dict[str, Any] = {
      "claim": claim.statement,
      "rule": claim.rule(study.last_evaluations),
      "variant": claim.variant,
      "reference": claim.reference,
      "seeds": len(seeds),
    }
    if not seeds:
      missing = [slug for slug in (claim.variant, claim.reference) if not any(row["slug"] == slug for row in rows)]
      entry.update(decision=NOT_RUN if missing else NO_PAIRED_RUNS, gap=None, low=None, high=None)
      if missing:
        entry["not_run"] = missing
      if left_out:
        entry["diverged_left_out"] = left_out
      decided.append(entry)
      continue
    interval = statistics.paired_interval(gaps)
    entry.update(
      gap=statistics.spread(gaps).mean,
      low=interval and interval.low,
      high=interval and interval.high,
      interval=_interval_text(gaps),
    )
    entry["decision"] = claim.decide(entry["low"], entry["high"])
    if left_out:
      entry["diverged_left_out"] = left_out
    if study.report_last_evaluation:
      _, last_gaps = _paired_gaps(claim, rows, LAST)
      entry["last_evaluation_interval"] = _interval_text(last_gaps) if last_gaps else "none"
    decided.append(entry)
  return decided


def _paired_gaps(claim: Claim, rows: Sequence[Mapping[str, Any]], field: str) -> tuple[list[int], list[float]]:
  """The seeds run by both the claim's variant and its reference, and per seed variant - reference of ``field``."""
  by_slug_seed = {(row["slug"], row["seed"]): None if is_diverged(row) else row.get(field) for row in rows}
  seeds = sorted(
    seed
    for slug, seed in by_slug_seed
    if slug == claim.variant
    and by_slug_seed.get((claim.reference, seed)) is not None
    and by_slug_seed[slug, seed] is not None
  )
  return seeds, [by_slug_seed[claim.variant, seed] - by_slug_seed[claim.reference, seed] for seed in seeds]


def _interval_text(gaps: Sequence[float]) -> str:
  interval = statistics.paired_interval(gaps)
  return interval.format() if interval else f"{gaps[0]:+.2f} (1 seed: no interval)"


def registration_of(
  study: Study, rows: Sequence[Mapping[str, Any]], registration: Mapping[str, Any] | None
) -> registrations.Registration:
  """Whether the grid of ``rows`` was pre-registered (`stalesgd.studies._registration.judge`), each older run's
  commit read from this source tree's repository."""
  runs = [
    registrations.evidence_of(f"{row['variant']}, seed {row['seed']}", pathlib.Path(row["workdir"])) for row in rows
  ]
  repository = SOURCE_ROOT.parent
  return registrations.judge(
    study,
    runs,
    registration=registration,
    claims_at=lambda commit: registrations.claims_at_commit(repository, commit, study.name),
  )


def decisions_markdown(decided: Sequence[Mapping[str, Any]]) -> str:
  """The decisions as Markdown: one bullet per claim with its rule, interval and decision."""
  if not decided:
    return "This study states no claim to decide.\n"
  lines = []
  for entry in decided:
    if "interval" in entry:
      gap = f" Gap {entry['interval']}."
    elif entry.get("not_run"):
      gap = f" No run of {' or '.join(f'`{slug}`' for slug in entry['not_run'])} in this grid."
    else:
      gap = " No seed has a value of both arms."
    lines.append(
      f"- **{entry['claim']}**: {entry['decision']}.{gap} Rule: {entry['rule']}."
      + (
        f" The last evaluation alone (decides nothing): gap {entry['last_evaluation_interval']}."
        if "last_evaluation_interval" in entry
        else ""
      )
      + (
        " Left out, diverged (a diverged run is no error rate): " + "; ".join(entry["diverged_left_out"]) + "."
        if entry.get("diverged_left_out")
        else ""
      )
    )
  return "\n".join(lines) + "\n"


def seed_curves(
  rows: Sequence[Mapping[str, Any]], records_of: Mapping[int, Sequence[Mapping[str, Any]]]
) -> list[dict[str, Any]]:
  """Per variant and evaluation, over its seeds: mean, std, min and max of `SEED_CURVE_FIELDS` and sim_time.

  The k-th evaluations of a variant's seeds are grouped (their epochs differ in the last digits where the
  schedule's updates end at other points), at their mean epoch; ``seeds`` counts the runs that reached it.
  """
  grouped: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
  for index, row in enumerate(rows):
    for position, record in enumerate(evaluations(records_of[index])):
      grouped.setdefault((row["variant"], position), []).append(record)
  curves = []
  for (label, position), records in grouped.items():
    entry: dict[str, Any] = {
      "variant": label,
      "evaluation": position + 1,
      "epoch": sum(float(record["epoch"]) for record in records) / len(records),
      "seeds": len(records),
    }
    for field in SEED_CURVE_FIELDS + ("sim_time",):
      values = [_number(record.get(field)) for record in records]
      values = [value for value in values if value is not None]
      if values:
        values_spread = statistics.spread(values)
        entry.update(
          {
            f"{field}_mean": values_spread.mean,
            f"{field}_std": values_spread.std,
            f"{field}_min": values_spread.low,
            f"{field}_max": values_spread.high,
          }
        )
    curves.append(entry)
  order = list(dict.fromkeys(row["variant"] for row in rows))
  curves.sort(key=lambda entry: (order.index(entry["variant"]), entry["evaluation"]))
  return curves


def bands(curves: Sequence[Mapping[str, Any]], field: str) -> list[plots.Band]:
  """The `plots.Band` of every variant for ``field`` (mean ± std over seeds; min/max as the faint range)."""
  result = []
  for label in dict.fromkeys(entry["variant"] for entry in curves):
    points = [entry for entry in curves if entry["variant"] == label and f"{field}_mean" in entry]
    if points:
      result.append(
        plots.Band(
          label,
          {"epoch": [entry["epoch"] for entry in points], "sim_time": [entry.get("sim_time_mean") for entry in points]},
          mean=[entry[f"{field}_mean"] for entry in points],
          std=[entry[f"{field}_std"] or 0.0 for entry in points],
          low=[entry[f"{field}_min"] for entry in points],
          high=[entry[f"{field}_max"] for entry in points],
        )
      )
  return result


def write_report(
  study: Study,
  rows: Sequence[dict[str, Any]],
  workdir: pathlib.Path,
  *,
  command: str | None = None,
  registration: Mapping[str, Any] | None = None,
) -> str:
  """Writes every file of the module docstring and returns the per-variant Markdown table and the decisions.

  The rows carry every run's settings (`result_row` of the sweep); ``command`` is the study's command line,
  recorded in ``README.md``; ``registration`` is the grid's registration record now (`registration_of`).
  """
  records_of = {index: run_records(row) for index, row in enumerate(rows)}
  for index, row in enumerate(rows):
    mark_collapse(row, records_of[index])
    row[FINAL] = run_final_value(row, records_of[index], study.last_evaluations)
    if study.report_last_evaluation:
      row[LAST] = run_final_value(row, records_of[index], 1)
    row.update(_mean_diagnostics(records_of[index]))
  tables.write_results_table([portable.portable_row(row, workdir) for row in rows], workdir / RUNS_FILENAME)
  table = variant_rows(study, rows)
  tables.write_results_table(table, workdir / "results.csv")
  columns = [
    column
    for column in (
      "variant",
      "n",
      "seeds",
      "epochs",
      "final (mean ± std)",
      f"{FINAL}_min",
      f"{FINAL}_max",
      "published_test_error",
      "sim_time",
      "staleness_mean",
      "correction_ratio",
      "displacement_norm",
      "status",
    )
    if any(entry.get(column) is not None for entry in table)
  ]
  markdown = tables.markdown_table(table, columns, column_formats={field: "{:.3g}" for field in DIAGNOSTICS})
  (workdir / "results.md").write_text(markdown, encoding="utf-8")
  evaluation_rows = [
    {
      "variant": row["variant"],
      "seed": row["seed"],
      **{column: record.get(column) for column in EVALUATION_COLUMNS[2:]},
    }
    for index, row in enumerate(rows)
    for record in evaluations(records_of[index])
  ]
  tables.write_results_table(evaluation_rows, workdir / EVALUATIONS_FILENAME, columns=EVALUATION_COLUMNS)
  curves = seed_curves(rows, records_of)
  tables.write_results_table(curves, workdir / EVALUATIONS_OVER_SEEDS_FILENAME)
  decided = decisions(study, rows)
  verdict = registration_of(study, rows, registration)
  (workdir / PREREGISTRATION_FILENAME).write_text(
    json.dumps({"status": verdict.status, "reasons": list(verdict.reasons)}, indent=2) + "\n", encoding="utf-8"
  )
  decisions_text = decisions_markdown(decided)
  (workdir / DECISIONS_FILENAME).write_text(decisions_text, encoding="utf-8")
  (workdir / "decisions.json").write_text(json.dumps(decided, indent=2) + "\n", encoding="utf-8")
  most = max(row["seed"] for row in rows) + 1
  subtitle = f"{study.title} ({most} seed{'s' if most > 1 else ''} per variant at most; band: ± std)"
  for field, name in (("test_error", "test_error.png"), ("train_loss", "train_loss.png")):
    plots.plot_bands(bands(curves, field), workdir / name, y=field, title=subtitle)
  staleness = {}
  for row in rows:
    schedule_path = pathlib.Path(row["workdir"]) / run_directory.SCHEDULE
    if row["variant"] not in staleness and schedule_path.exists():
      staleness[row["variant"]] = Schedule.load(schedule_path).gradient_staleness
  if staleness:
    plots.plot_staleness_histograms(staleness, workdir / run_directory.STALENESS, title=study.title)
  results_readme.write_readme(
    study,
    rows,
    workdir,
    table=markdown,
    decisions=decisions_text,
    command=None if command is None else portable.portable_text(command, workdir),
    registration=verdict.describe(),
  )
  if study.bands:
    coarse = band_table(study, rows)
    (workdir / "bands.md").write_text(coarse, encoding="utf-8")
    return coarse + "\n" + "\n".join(f"- {entry['claim']}: {entry['decision']}" for entry in decided) + "\n"
  return markdown + "\n" + decisions_text
