"""`experiments.benchmarks.decentral` runs end to end and reports what its docstring promises."""

from __future__ import annotations

import json

import pytest

from tests.helpers.programs import output_tail, run_program

PROGRAMS = ("compute_only", "allreduce_sync", "s3gd", "dcs3gd")


@pytest.mark.slow
def test_benchmark_times_every_program_and_reads_the_overlap_verdict(tmp_path):
  # small_cnn and one round: seconds, not the minute of the real benchmark.
  output = tmp_path / "decentral_benchmark.json"
  result = run_program(
    "experiments.benchmarks.decentral",
    "--model=small_cnn",
    "--rounds=1",
    "--batch_per_worker=2",
    f"--output={output}",
    cpu_devices=8,
  )
  assert result.returncode == 0, output_tail(result)
  report = json.loads(output.read_text())
  assert report["machine"]["num_devices"] == 8
  assert set(report["median_step_seconds"]) == set(PROGRAMS)
  assert all(seconds > 0 for seconds in report["median_step_seconds"].values())
  assert all(len(report["step_seconds_per_round"][name]) == 1 for name in PROGRAMS)
  assert set(report["ratios"]) == {
    "allreduce_sync_over_compute_only",
    "s3gd_over_compute_only",
    "dcs3gd_over_compute_only",
    "dcs3gd_over_allreduce_sync",
    "dcs3gd_over_s3gd",
  }
  # The stale protocols' weight all-reduce reads only the carried queue; the synchronous one cannot.
  assert report["overlap"]["dcs3gd"]["overlap_ready"] and report["overlap"]["s3gd"]["overlap_ready"]
  assert not report["overlap"]["allreduce_sync"]["overlap_ready"]
  assert "DC-S3GD weight all-reduce: overlap-ready" in result.stdout
