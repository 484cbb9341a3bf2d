r"""Does compressing the schedule change the answer? Per-seed gaps of a grid run compressed and at full length.

Reads the finished runs that two results directories keep (``<dir>/runs/<variant>/seed_<k>/metrics.jsonl`` with
its ``summary.json``): the same study run over a compressed schedule (e.g. ``results/zhang_cifar10_e20_3seeds``,
140 epochs compressed to 20) and at full length (``results/zhang_cifar10_e140_3seeds``). For every variant against
the reference, per seed and at both lengths, the gap in test error (variant - reference, points) by the two
statistics the study reports:

* the mean of the run's last 3 evaluations (the statistic its claims are decided by);
* the run's last evaluation alone (reported beside it, deciding nothing);

and, per variant, length and statistic, the paired 95 % Student-t interval of those per-seed gaps over the seeds
whose two runs have finished (the study's `paired_interval`; none for fewer than 2 seeds).

And for every finished run, the simulated time (the timing model's seconds, ``sim_time``) of its first evaluation
within ``--tolerance`` points of its own final error (the mean of its last 3 evaluations): how long each protocol
takes to get where it ends. Descriptive only: the study's pre-registered rule decides its claims. A run without
``summary.json``, or one that was preempted, has not finished and is left out (a seed counts only once both of its
runs have finished).

Usage::

  python -m experiments.compression_gap --compressed=results/zhang_cifar10_e20_3seeds \
      --full=results/zhang_cifar10_e140_3seeds --reference=hardsync \
      --variants 30_softsync_a0_sigma 15_softsync_a0_sigma [--out=gaps.md] [--figure=gaps.png --margin=2]

``--figure`` draws the per-seed gaps (the mean of the last 3) at both lengths, each seed's two joined by a line,
with each length's paired interval beside its dots and the claim's ``--margin`` shaded around 0.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence

from stalesgd.reports import _plots as plots
from stalesgd.studies import _seed_statistics as seed_statistics

LAST_EVALUATIONS = 3
"""The study's statistic: the mean of a run's last 3 evaluations."""


def evaluations(run: pathlib.Path) -> list[tuple[float, float]] | None:
  """``[(sim_time, test_error), ...]`` of a finished run's evaluations in order, or None if it has not finished."""
  summary = run / "summary.json"
  if not summary.exists() or json.loads(summary.read_text()).get("preempted"):
    return None
  points = []
  for line in (run / "metrics.jsonl").read_text().splitlines():
    record = json.loads(line) if line.strip() else {}
    if "test_error" in record:
      points.append((float(record["sim_time"]), float(record["test_error"])))
  return points or None


def final_error(points: Sequence[tuple[float, float]]) -> float:
  """The mean of the last `LAST_EVALUATIONS` evaluations' test error (the study's `final_value`)."""
  return seed_statistics.final_value([error for _, error in points], LAST_EVALUATIONS)


def time_to_final(points: Sequence[tuple[float, float]], tolerance: float) -> float:
  """The simulated time of the first evaluation within ``tolerance`` points of the run's final error."""
  target = final_error(points) + tolerance
  return next(time for time, error in points if error <= target)


def runs_of(directory: pathlib.Path, variant: str) -> dict[int, list[tuple[float, float]]]:
  """Seed -> evaluations of the variant's finished runs kept in ``directory``."""
  found = {}
  for run in sorted((directory / "runs" / variant).glob("seed_*")):
    points = evaluations(run)
    if points is not None:
      found[int(run.name.removeprefix("seed_"))] = points
  return found


MISSING = "—"
"""A table cell with no finished pair of runs (a gap), or fewer than 2 seeds with one (an interval)."""


def _signed(value: float | None) -> str:
  return MISSING if value is None else f"{value:+.2f}"


def gap_rows(compressed: pathlib.Path, full: pathlib.Path, reference: str, variants: Sequence[str]) -> list[dict]:
  """One row per variant and seed: the gaps at both lengths by both statistics (None where a run is missing)."""
  rows = []
  for variant in variants:
    by_length = {}
    for name, directory in (("compressed", compressed), ("full", full)):
      ours, theirs = runs_of(directory, variant), runs_of(directory, reference)
      by_length[name] = {
        seed: (final_error(ours[seed]) - final_error(theirs[seed]), ours[seed][-1][1] - theirs[seed][-1][1])
        for seed in ours.keys() & theirs.keys()
      }
    for seed in sorted(by_length["compressed"].keys() | by_length["full"].keys()):
      short, long = by_length["compressed"].get(seed), by_length["full"].get(seed)
      rows.append(
        {
          "variant": variant,
          "seed": seed,
          "compressed_last3": None if short is None else short[0],
          "full_last3": None if long is None else long[0],
          "compressed_last": None if short is None else short[1],
          "full_last": None if long is None else long[1],
        }
      )
  return rows


GAP_COLUMNS = ("compressed_last3", "full_last3", "compressed_last", "full_last")
"""The four per-seed gaps of a `gap_rows` row: both lengths by both statistics."""


def interval_rows(gaps: Sequence[dict]) -> list[dict]:
  """One row per variant of ``gaps``: each column's paired 95 % interval over its seeds (None below 2 seeds)."""
  rows = []
  for variant in dict.fromkeys(row["variant"] for row in gaps):
    mine = [row for row in gaps if row["variant"] == variant]
    rows.append(
      {
        "variant": variant,
        **{
          column: seed_statistics.paired_interval([row[column] for row in mine if row[column] is not None])
          for column in GAP_COLUMNS
        },
      }
    )
  return rows


def _interval(interval: seed_statistics.Interval | None) -> str:
  return interval.format(compact=True) if interval is not None else MISSING


def time_rows(full: pathlib.Path, names: Sequence[str], tolerance: float) -> list[dict]:
  """One row per finished run of ``names``: its final error and the simulated time it first came within
  ``tolerance`` of it, and its whole simulated time."""
  rows = []
  for variant in names:
    for seed, points in sorted(runs_of(full, variant).items()):
      rows.append(
        {
          "variant": variant,
          "seed": seed,
          "final": final_error(points),
          "time_to_final": time_to_final(points, tolerance),
          "total_time": points[-1][0],
        }
      )
  return rows


def markdown(gaps: Sequence[dict], times: Sequence[dict], reference: str, tolerance: float) -> str:
  lines = [
    f"Gap to {reference} in test error (points; variant - reference), per seed: the mean of the last "
    f"{LAST_EVALUATIONS} evaluations (the decision's statistic) and the last evaluation alone; {MISSING}: the "
    "variant's or the reference's run of that seed has not finished at that length.",
    "",
    "| variant | seed | compressed, last 3 | full, last 3 | compressed, last | full, last |",
    "|---|--:|--:|--:|--:|--:|",
  ]
  for row in gaps:
    lines.append(
      f"| {row['variant']} | {row['seed']} | {_signed(row['compressed_last3'])} | {_signed(row['full_last3'])} | "
      f"{_signed(row['compressed_last'])} | {_signed(row['full_last'])} |"
    )
  lines += [
    "",
    "Per variant, the paired 95 % interval of those gaps over the seeds whose two runs have finished (their "
    "number in parentheses; the study's rule reads the full-length one of the last 3 against its margin; "
    f"{MISSING}: fewer than 2 such seeds).",
    "",
    "| variant | compressed, last 3 | full, last 3 | compressed, last | full, last |",
    "|---|--:|--:|--:|--:|",
  ]
  for row in interval_rows(gaps):
    lines.append(f"| {row['variant']} | " + " | ".join(_interval(row[column]) for column in GAP_COLUMNS) + " |")
  lines += [
    "",
    f"Simulated time (s) to the first evaluation within {tolerance:g} point{'' if tolerance == 1 else 's'} of the "
    f"run's final error (the mean of its last {LAST_EVALUATIONS}), at full length.",
    "",
    "| variant | seed | final error (%) | time to it (s) | whole run (s) |",
    "|---|--:|--:|--:|--:|",
  ]
  for row in times:
    lines.append(
      f"| {row['variant']} | {row['seed']} | {row['final']:.2f} | {row['time_to_final']:.1f} | "
      f"{row['total_time']:.1f} |"
    )
  return "\n".join(lines) + "\n"


def gap_figure(gaps: Sequence[dict], reference: str, *, margin: float | None = None):
  """A `matplotlib.figure.Figure`, one panel per variant: its per-seed gaps (the mean of the last 3) at the
  compressed and the full length, each seed's two joined by a line, each length's paired 95 % interval as a bar
  beside its dots, 0 as a line and ``[-margin, +margin]`` shaded. A seed missing at one length is a lone dot; a
  length with fewer than 2 seeds has no bar; without any gap, one panel that says so."""
  variants = list(dict.fromkeys(row["variant"] for row in gaps))
  intervals = {row["variant"]: row for row in interval_rows(gaps)}
  figure = plots.new_figure(figsize=(3.2 * max(len(variants), 1) + 0.6, 3.8), layout="constrained")
  axes = figure.subplots(1, max(len(variants), 1), sharey=True, squeeze=False)[0]
  lengths = tuple(zip(GAP_COLUMNS[:2], ("compressed", "full length")))  # the mean of the last 3 at each length
  for panel, variant in zip(axes, variants):
    if margin is not None:
      panel.axhspan(-margin, margin, color="0.9", zorder=0, label=f"margin ±{margin:g}")
    panel.axhline(0.0, color="0.5", linewidth=0.8, zorder=1)
    for index, row in enumerate(row for row in gaps if row["variant"] == variant):
      values = [row[column] for column, _ in lengths]
      colour = f"C{index % 10}"
      seen = [(position, value) for position, value in enumerate(values) if value is not None]
      panel.plot(*zip(*seen), marker="o", color=colour, label=f"seed {row['seed']}", zorder=3)
    for position, (column, _) in enumerate(lengths):
      interval = intervals[variant][column]
      if interval is not None:
        panel.errorbar(
          position + 0.15,
          interval.mean,
          yerr=[[interval.mean - interval.low], [interval.high - interval.mean]],
          fmt="s",
          color="black",
          capsize=4,
          zorder=4,
          label="paired 95 % interval" if not panel.containers else None,  # one legend entry per panel
        )
    panel.set_xticks(range(len(lengths)), [label for _, label in lengths])
    panel.set_xlim(-0.4, len(lengths) - 0.4)
    panel.set_title(variant, fontsize=9)
    panel.grid(axis="y", alpha=0.3)
  axes[0].set_ylabel(f"gap in test error (points)\nto {reference}")  # two lines: a slug outgrows one panel
  if variants:
    axes[0].legend(fontsize=7, loc="best")
  else:
    axes[0].text(0.5, 0.5, "no finished pair of runs yet", ha="center", va="center", transform=axes[0].transAxes)
  return figure


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--compressed", type=pathlib.Path, required=True, help="results directory, compressed run")
  parser.add_argument("--full", type=pathlib.Path, required=True, help="results directory, full-length run")
  parser.add_argument("--reference", required=True, help="the reference variant's directory name, e.g. hardsync")
  parser.add_argument("--variants", nargs="+", required=True, help="the variants compared with it")
  parser.add_argument("--tolerance", type=float, default=1.0, help="points above the final error (default 1)")
  parser.add_argument("--out", type=pathlib.Path, help="write the tables here (default: print)")
  parser.add_argument("--figure", type=pathlib.Path, help="also draw the per-seed gaps here (PNG)")
  parser.add_argument("--margin", type=float, help="the claim's margin in points, shaded in the figure")
  arguments = parser.parse_args(argv)
  for directory in (arguments.compressed, arguments.full):
    if not (directory / "runs").is_dir():
      parser.error(f"{directory} keeps no runs/ (a results directory of a study's finished runs)")
  if not arguments.tolerance >= 0:
    parser.error(f"--tolerance={arguments.tolerance}; allowed: a number >= 0")
  if arguments.margin is not None and not arguments.margin > 0:
    parser.error(f"--margin={arguments.margin}; allowed: a number > 0")
  gaps = gap_rows(arguments.compressed, arguments.full, arguments.reference, arguments.variants)
  times = time_rows(arguments.full, [arguments.reference, *arguments.variants], arguments.tolerance)
  text = markdown(gaps, times, arguments.reference, arguments.tolerance)
  if arguments.out is None:
    sys.stdout.write(text)
  else:
    arguments.out.write_text(text)
  if arguments.figure is not None:
    arguments.figure.parent.mkdir(parents=True, exist_ok=True)
    gap_figure(gaps, arguments.reference, margin=arguments.margin).savefig(arguments.figure, format="png", dpi=120)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
