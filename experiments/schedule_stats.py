r"""Staleness and runtime statistics of the synchronization protocols, from the timing model alone.

One protocol (prints a table row, writes a staleness histogram)::

  python -m experiments.schedule_stats --protocol=softsync --learners=30 --n=4 \
      --updates=20000 --output_dir=runs/schedule_stats

The sweep (timing model only, no training; its figures: the README, *Results*): Zhang et al.'s setting (arXiv
1511.05950, Fig. 1: lambda = 30, n in {1, 2, 4, 10, 15, 30}; <sigma> ~ n and
P(sigma > 2n) ~ 0) and a runtime comparison of every protocol with and
without stragglers (speedup over one learner; Zhang et al. report 22-28x at
lambda = 30)::

  python -m experiments.schedule_stats --sweep --output_dir=runs/schedule_stats

Writes ``staleness_histogram.png`` and ``summary.json`` (one protocol), or
``zhang_softsync_staleness.png``, ``protocol_speedup.png`` and ``sweep.json``
(sweep) under ``--output_dir``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags, logging

from stalesgd import schedule as schedule_lib
from stalesgd.reports import _plots as plots
from stalesgd.reports import _schedule_plots as schedule_plots
from stalesgd.schedule import _summary as statistics

ZHANG_LEARNERS = 30
ZHANG_SOFTSYNC_N = (1, 2, 4, 10, 15, 30)

_PROTOCOL = flags.DEFINE_enum("protocol", "softsync", schedule_lib.PROTOCOLS, "Protocol to simulate.")
_LEARNERS = flags.DEFINE_integer("learners", ZHANG_LEARNERS, "lambda learners (M workers for all-reduce protocols).")
_N = flags.DEFINE_integer("n", None, "n of n-softsync (softsync, drop_stale).")
_S = flags.DEFINE_integer("s", None, "SSP staleness bound in clocks.")
_BACKUP = flags.DEFINE_integer("backup", None, "Backup workers b (backup).")
_MAX_STALENESS = flags.DEFINE_integer("max_staleness", None, "Drop gradients staler than this (drop_stale).")
_STALENESS = flags.DEFINE_integer("staleness", None, "All-reduce staleness S (s3gd, dcs3gd).")
_OVERLAP = flags.DEFINE_bool("overlap", None, "Overlap all-reduce and compute (s3gd, dcs3gd).")

_COMPUTE_TIME = flags.DEFINE_float("compute_time", 1.0, "Mean seconds per mini-batch gradient.")
_JITTER = flags.DEFINE_enum("jitter", "lognormal", schedule_lib.JITTERS, "Per-step jitter law.")
_JITTER_SIGMA = flags.DEFINE_float("jitter_sigma", 0.1, "Log-normal sigma (lognormal, straggler).")
_STRAGGLER_PROB = flags.DEFINE_float(
  "straggler_prob", 0.02, "Probability of a straggling step (with --jitter=straggler, and --sweep's stragglers)."
)
_STRAGGLER_FACTOR = flags.DEFINE_float(
  "straggler_factor", 5.0, "Slowdown of a straggling step (with --jitter=straggler, and --sweep's stragglers)."
)
_SPEED_FACTOR_SIGMA = flags.DEFINE_float("speed_factor_sigma", 0.0, "Log-normal sigma of per-learner speed factors.")
_TRACE = flags.DEFINE_string("trace", None, "Trace file of speed factors (.npy/.csv; see TimingModel).")
_LATENCY = flags.DEFINE_float("latency", 0.0, "Seconds per message.")
_BANDWIDTH = flags.DEFINE_float("bandwidth", math.inf, "Bytes per second per link.")
_MODEL_BYTES = flags.DEFINE_integer("model_bytes", 0, "Bytes per gradient or weights message.")
_SERVER_SHARDS = flags.DEFINE_integer("server_shards", 1, "Parameter-server nodes.")
_APPLY_TIME = flags.DEFINE_float("apply_time", 0.0, "Server seconds per update.")

_UPDATES = flags.DEFINE_integer("updates", 20_000, "Server updates to simulate (one protocol).")
_SWEEP_GRADIENTS = flags.DEFINE_integer("sweep_gradients", 200_000, "Applied gradients per run in --sweep.")
_SEED = flags.DEFINE_integer("seed", 0, "Simulation seed.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/schedule_stats", "Where to write plots and JSON.")
_SWEEP = flags.DEFINE_bool("sweep", False, "Run the Zhang et al. sweep and the protocol runtime comparison.")

# (summary key, column title, format, width) of the printed table.
_COLUMNS = (
  ("run", "run", "{}", 28),
  ("contributions_per_update", "c", "{}", 4),
  ("mean_staleness", "<σ>", "{:.2f}", 7),
  ("max_staleness", "max σ", "{}", 6),
  ("p_staleness_above_2n", "P(σ>2n)", "{:.1e}", 8),
  ("updates_per_second", "updates/s", "{:.2f}", 10),
  ("speedup", "speedup", "{:.1f}", 8),
  ("dropped_fraction", "dropped", "{:.1%}", 8),
  ("utilisation", "busy", "{:.1%}", 6),
)


def timing_from_flags(*, stragglers: bool | None = None) -> schedule_lib.TimingModel:
  """The `TimingModel` the flags describe; ``stragglers`` overrides --jitter's choice."""
  jitter = _JITTER.value
  if stragglers is not None:
    jitter = "straggler" if stragglers else ("lognormal" if jitter == "straggler" else jitter)
  straggler = {"straggler_prob": _STRAGGLER_PROB.value, "straggler_factor": _STRAGGLER_FACTOR.value}
  return schedule_lib.TimingModel(
    compute_time=_COMPUTE_TIME.value,
    jitter=jitter,
    jitter_sigma=_JITTER_SIGMA.value,
    speed_factor_sigma=_SPEED_FACTOR_SIGMA.value,
    trace=_TRACE.value,
    latency=_LATENCY.value,
    bandwidth=_BANDWIDTH.value,
    model_bytes=_MODEL_BYTES.value,
    server_shards=_SERVER_SHARDS.value,
    apply_time=_APPLY_TIME.value,
    **(straggler if jitter == "straggler" else {}),
  )


def protocol_options_from_flags() -> dict[str, Any]:
  """The protocol options given on the command line (simulate rejects misplaced ones)."""
  given = {
    "n": _N.value,
    "s": _S.value,
    "backup": _BACKUP.value,
    "max_staleness": _MAX_STALENESS.value,
    "staleness": _STALENESS.value,
    "overlap": _OVERLAP.value,
  }
  return {name: value for name, value in given.items() if value is not None}


def run_label(protocol: str, options: dict[str, Any]) -> str:
  """A short name such as ``softsync(n=4)``."""
  return protocol + (f"({', '.join(f'{name}={value}' for name, value in options.items())})" if options else "")


def simulate_logged(
  protocol: str, *, learners: int, num_updates: int, timing: schedule_lib.TimingModel, **options: Any
) -> schedule_lib.Schedule:
  """`simulate` with progress logged every 10% and the wall time at the end."""
  label = run_label(protocol, options)
  started = time.perf_counter()
  next_tenth = 1

  def progress(done: int, total: int) -> None:
    nonlocal next_tenth
    if 10 * done >= next_tenth * total:
      logging.info("%s: %d/%d updates (%.1f s)", label, done, total, time.perf_counter() - started)
      next_tenth = 10 * done // total + 1

  schedule = schedule_lib.simulate(
    protocol, learners=learners, num_updates=num_updates, seed=_SEED.value, timing=timing, progress=progress, **options
  )
  logging.info("%s: %d updates simulated in %.1f s", label, num_updates, time.perf_counter() - started)
  return schedule


def summary_row(label: str, schedule: schedule_lib.Schedule) -> dict[str, Any]:
  """`statistics.summarize` plus the run label."""
  return {"run": label, **statistics.summarize(schedule)}


def format_table(rows: Sequence[dict[str, Any]]) -> str:
  """Fixed-width table of summary rows (NaN shows as '-')."""
  header = "  ".join(title.rjust(width) for _, title, _, width in _COLUMNS)
  lines = [header, "-" * len(header)]
  for row in rows:
    cells = []
    for key, _, template, width in _COLUMNS:
      value = row[key]
      is_missing = isinstance(value, float) and math.isnan(value)
      cells.append(("-" if is_missing else template.format(value)).rjust(width))
    lines.append("  ".join(cells))
  return "\n".join(lines)


def _write_json(path: str, payload: Any) -> None:
  with open(path, "w") as file:
    json.dump(payload, file, indent=2, allow_nan=True)


def run_one(output_dir: str, timing: schedule_lib.TimingModel, options: dict[str, Any]) -> list[dict[str, Any]]:
  """Simulates the protocol the flags name with ``options``; writes its histogram and summary."""
  protocol = _PROTOCOL.value
  label = run_label(protocol, options)
  schedule = simulate_logged(protocol, learners=_LEARNERS.value, num_updates=_UPDATES.value, timing=timing, **options)
  rows = [summary_row(label, schedule)]
  plots.plot_staleness_histograms(
    {label: schedule.gradient_staleness},
    os.path.join(output_dir, "staleness_histogram.png"),
    title=f"{label}, λ = {_LEARNERS.value}",
  )
  _write_json(os.path.join(output_dir, "summary.json"), {"rows": rows, "timing": schedule.options["timing"]})
  return rows


def _num_updates_for(protocol: str, learners: int, options: dict[str, Any]) -> int:
  contributions = schedule_lib.contributions_per_update(protocol, learners=learners, **options)
  return -(-_SWEEP_GRADIENTS.value // contributions)


def zhang_softsync_sweep(output_dir: str, timing: schedule_lib.TimingModel) -> list[dict[str, Any]]:
  """lambda = 30, n in {1, 2, 4, 10, 15, 30}: staleness table and histograms."""
  rows, staleness = [], {}
  for n in ZHANG_SOFTSYNC_N:
    label = run_label("softsync", {"n": n})
    schedule = simulate_logged(
      "softsync",
      learners=ZHANG_LEARNERS,
      n=n,
      timing=timing,
      num_updates=_num_updates_for("softsync", ZHANG_LEARNERS, {"n": n}),
    )
    rows.append(summary_row(label, schedule))
    staleness[f"{n}-softsync"] = schedule.gradient_staleness
  plots.plot_staleness_histograms(
    staleness,
    os.path.join(output_dir, "zhang_softsync_staleness.png"),
    title=f"n-softsync staleness, λ = {ZHANG_LEARNERS} (Zhang et al. Fig. 1 setting)",
  )
  return rows


def comparison_protocols(learners: int) -> list[tuple[str, dict[str, Any]]]:
  """The protocols of the runtime comparison, with representative options."""
  return [
    ("hardsync", {}),
    ("softsync", {"n": 1}),
    ("softsync", {"n": min(4, learners)}),
    ("async", {}),
    ("ssp", {"s": 3}),
    ("backup", {"backup": max(1, learners // 10)} if learners > 1 else {"backup": 0}),
    ("drop_stale", {"max_staleness": learners}),
    ("allreduce_sync", {}),
    ("s3gd", {"staleness": 1}),
  ]


def runtime_comparison(output_dir: str) -> dict[str, list[dict[str, Any]]]:
  """Every protocol with and without stragglers: tables and a speedup bar chart."""
  learners = _LEARNERS.value
  tables, speedups = {}, {}
  for condition, stragglers in (("no stragglers", False), ("stragglers", True)):
    timing = timing_from_flags(stragglers=stragglers)
    rows = []
    for protocol, options in comparison_protocols(learners):
      schedule = simulate_logged(
        protocol, learners=learners, timing=timing, num_updates=_num_updates_for(protocol, learners, options), **options
      )
      rows.append(summary_row(run_label(protocol, options), schedule))
    tables[condition] = rows
    speedups[condition] = {row["run"]: row["speedup"] for row in rows}
  schedule_plots.plot_protocol_comparison(
    speedups,
    os.path.join(output_dir, "protocol_speedup.png"),
    ylabel="speedup over one learner",
    title=f"λ = {learners}; stragglers: p = {_STRAGGLER_PROB.value}, {_STRAGGLER_FACTOR.value}x slower",
  )
  return tables


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:  # bad flag values fail here, with the argument and its range, before any simulation
    timing = timing_from_flags()  # built once and passed down: construction reads any --trace file
    options = protocol_options_from_flags()
    if not _SWEEP.value:
      schedule_lib.contributions_per_update(_PROTOCOL.value, learners=_LEARNERS.value, **options)
    elif options:
      raise ValueError(f"--sweep runs its own protocols and options; drop {sorted(options)}")
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  output_dir = _OUTPUT_DIR.value
  os.makedirs(output_dir, exist_ok=True)
  if not _SWEEP.value:
    print(format_table(run_one(output_dir, timing, options)))
    return
  zhang = zhang_softsync_sweep(output_dir, timing)
  print(f"n-softsync, λ = {ZHANG_LEARNERS} (Zhang et al.: <σ> ≈ n, P(σ > 2n) < 1e-4)")
  print(format_table(zhang))
  tables = runtime_comparison(output_dir)
  for condition, rows in tables.items():
    print(f"\nRuntime, λ = {_LEARNERS.value}, {condition}")
    print(format_table(rows))
  _write_json(
    os.path.join(output_dir, "sweep.json"), {"zhang_softsync": zhang, "runtime": tables, "timing": timing.to_dict()}
  )


if __name__ == "__main__":
  app.run(main)
