"""experiments/benchmarks/compile_speed.py: the machine's yardstick, end to end at two programs a round."""

from __future__ import annotations

import json
import statistics

import jax
import pytest

from experiments.benchmarks import compile_speed
from stalesgd.training._provenance import CPU_IDENTITY_FIELDS
from tests.helpers.programs import output_tail, run_program


@pytest.mark.slow  # a subprocess
def test_the_program_writes_every_rounds_figures_their_medians_and_the_cpu_model(tmp_path):
  output = tmp_path / "compile_speed.json"
  completed = run_program("experiments.benchmarks.compile_speed", "--programs=1", "--repeats=3", f"--output={output}")
  assert completed.returncode == 0, output_tail(completed)
  report = json.loads(output.read_text())
  assert report["programs_per_round"] == 2  # two programs per shape
  for kind in ("cpu", "wall"):
    rounds = report[f"{kind}_seconds_per_program"]
    assert len(rounds) == 3 and all(seconds > 0 for seconds in rounds)
    assert report[f"median_{kind}_seconds_per_program"] == statistics.median(rounds)
  machine = report["machine"]
  assert machine["platform"] == "cpu" and machine["cpu_model"] and set(CPU_IDENTITY_FIELDS) <= machine.keys()
  assert "host" not in report  # the machine record holds the processor's identity once


def test_measuring_leaves_the_persistent_cache_setting_as_it_found_it():
  before = jax.config.jax_enable_compilation_cache
  compile_speed.measure(shapes=1, repeats=1)
  assert jax.config.jax_enable_compilation_cache == before
