"""The schedule command-line tools run end to end: `experiments.schedule_stats` and its benchmark."""

from __future__ import annotations

import json

import pytest

from tests.helpers.programs import run_program


@pytest.mark.slow
def test_one_protocol_prints_its_table_and_writes_a_histogram(tmp_path):
  result = run_program(
    "experiments.schedule_stats",
    "--protocol=softsync",
    "--learners=30",
    "--n=4",
    "--updates=3000",
    f"--output_dir={tmp_path}",
  )
  assert result.returncode == 0, result.stderr
  row = next(line for line in result.stdout.splitlines() if "softsync(n=4)" in line).split()
  assert row[1] == "7"  # c = floor(30 / 4)
  assert abs(float(row[2]) - 4) <= 0.8  # <sigma> ~ n
  assert (tmp_path / "staleness_histogram.png").read_bytes()[:4] == b"\x89PNG"
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["rows"][0]["contributions_per_update"] == 7


@pytest.mark.slow
def test_sweep_covers_zhang_et_al_and_the_straggler_comparison(tmp_path):
  result = run_program("experiments.schedule_stats", "--sweep", "--sweep_gradients=3000", f"--output_dir={tmp_path}")
  assert result.returncode == 0, result.stderr
  sweep = json.loads((tmp_path / "sweep.json").read_text())
  assert [row["run"] for row in sweep["zhang_softsync"]] == [f"softsync(n={n})" for n in (1, 2, 4, 10, 15, 30)]
  runtime = {condition: {row["run"]: row for row in rows} for condition, rows in sweep["runtime"].items()}
  assert set(runtime) == {"no stragglers", "stragglers"}
  # Stragglers hold up the barrier protocols, not the asynchronous ones.
  assert runtime["stragglers"]["hardsync"]["speedup"] < runtime["no stragglers"]["hardsync"]["speedup"] - 5
  assert runtime["stragglers"]["async"]["speedup"] == pytest.approx(30, rel=0.05)
  for name in ("zhang_softsync_staleness.png", "protocol_speedup.png"):
    assert (tmp_path / name).stat().st_size > 0
  assert "updates/s" in result.stdout and "stragglers" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
  "flags,message",
  [
    (("--protocol=hardsync", "--n=3"), "protocol 'hardsync' does not take option(s) ['n']"),
    (("--latency=-1",), "latency=-1.0; allowed: a finite number >= 0"),
    (("--sweep", "--n=2"), "--sweep runs its own protocols and options"),
  ],
)
def test_bad_flags_fail_before_simulating(tmp_path, flags, message):
  result = run_program("experiments.schedule_stats", *flags, f"--output_dir={tmp_path}")
  assert result.returncode != 0
  assert message in result.stdout + result.stderr
  assert not (tmp_path / "staleness_histogram.png").exists()


@pytest.mark.slow
def test_benchmark_reports_every_protocol(tmp_path):
  output = tmp_path / "schedule_benchmark.json"
  result = run_program(
    "experiments.benchmarks.schedule", "--arrivals=3000", "--repeats=1", "--learners=8", f"--output={output}"
  )
  assert result.returncode == 0, result.stderr
  report = json.loads(output.read_text())
  assert {row["protocol"] for row in report["rows"]} >= {
    "hardsync",
    "softsync",
    "async",
    "ssp",
    "backup",
    "drop_stale",
    "allreduce_sync",
    "s3gd",
    "dcs3gd",
  }
  assert all(row["arrivals"] >= 2_900 and row["arrivals_per_second"] > 0 for row in report["rows"])
  assert report["machine"]["host_cpus"] >= 1  # the field every benchmark shares (benchmarks/common.py)
  assert report["machine"]["cpu_model"]  # with the CPU's identity (cpu_identity)
