"""The engine benchmark runs and writes every field the README's performance table is built from."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

REPOSITORY_ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUIRED_KEYS = ("protocol", "learners", "engine_grads_per_s", "sync_grads_per_s", "naive_grads_per_s",
                 "cost_ratio_vs_sync", "speedup_vs_naive", "ring_buffer_bytes", "param_bytes", "max_staleness")


def test_quick_engine_benchmark_writes_the_issue_fields(tmp_path):
  output = tmp_path / "engine_benchmark.json"
  environment = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"}
  completed = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.engine", "--quick", "--learners=8", "--repeats=1",
       f"--output={output}"],
      cwd=REPOSITORY_ROOT, env=environment, capture_output=True, text=True, timeout=600)
  assert completed.returncode == 0, completed.stderr[-3000:]
  result = json.loads(output.read_text())
  assert result["machine"]["num_devices"] == 8
  rows = result["rows"]
  assert {row["protocol"] for row in rows} == {"async", "4-softsync"}
  for row in rows:
    assert set(REQUIRED_KEYS) <= set(row)
    assert row["learners"] == 8
    assert min(row["engine_grads_per_s"], row["sync_grads_per_s"], row["naive_grads_per_s"]) > 0
    assert row["ring_buffer_bytes"] == (row["max_staleness"] + 1) * row["param_bytes"]
  assert "cost/sync" in completed.stdout  # the printed table
