"""`make demo` prints what the README prints, and no row moves when the floating-point results do.

The demo's printed table shows, per variant, the band (learns: < 10 % test error; fails: > 80 %) that every
seed's value (the mean of its last 3 evaluations) falls in (`Study.bands`), so it reads the same wherever the
floating-point results move the numbers within their bands. This test runs it as `make demo` does (3 seeds, 2
processes), then seed 0 again with XLA:CPU's code limited to SSE4.2 (`--xla_cpu_max_isa=SSE4_2`: 128-bit vectors,
so other summation orders than the AVX/AVX-512 code of today's machines, as on another processor), and asserts
every band the same, the first table equal to the README's, and, as a control, that the perturbation did change
every run's training losses (pinning to one core or turning off Eigen's threads, tried before, changed no bit:
docs/studies.md).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
README_TABLE = re.compile(r"<!-- demo table -->\n(.*?)<!-- end demo table -->", re.DOTALL)


def _demo_command(workdir: pathlib.Path, *, seeds: int, cache: pathlib.Path, xla_flags: str | None = None):
  """The command and environment of `make demo` (seeds > 1, 2 processes) or of one seed's runs, one at a time.

  With a persistent compilation cache shared by the runs (seeds 1 and 2 load the programs seed 0 compiled, as a
  user's second `make demo` would): it changes no bit (an executable is loaded, not other code compiled), and
  XLA's flags are part of its key, so the perturbed runs compile their own code (the control below checks that
  their losses changed)."""
  environment = {key: value for key, value in os.environ.items() if key != "JAX_NUM_CPU_DEVICES"}
  environment.update(
    JAX_COMPILATION_CACHE_DIR=str(cache),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
  )
  if xla_flags is not None:
    environment["XLA_FLAGS"] = f"{environment.get('XLA_FLAGS', '')} {xla_flags}".strip()
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.reproduce",
    "--study=demo",
    f"--workdir={workdir}",
    f"--seeds={seeds}",
    "--parallel=2" if seeds > 1 else "--parallel=1",
  ]
  return command, environment


def _demo(workdir: pathlib.Path, *, seeds: int, cache: pathlib.Path) -> str:
  command, environment = _demo_command(workdir, seeds=seeds, cache=cache)
  ran = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=1200, env=environment)
  assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
  return ran.stdout


def _bands(table: str) -> dict[str, str]:
  rows = [line.strip("|").split("|") for line in table.strip().splitlines()[2:]]
  return {cells[0].strip(): cells[-1].strip() for cells in rows}


@pytest.mark.slow
def test_make_demo_prints_the_readme_table_and_no_row_moves_under_perturbations(tmp_path):
  printed = _demo(tmp_path / "demo", seeds=3, cache=tmp_path / "jax_cache")
  table = (tmp_path / "demo" / "bands.md").read_text()
  assert table in printed
  readme = README_TABLE.search((REPOSITORY / "README.md").read_text())
  assert readme, "README.md has no <!-- demo table --> block"
  assert readme.group(1).strip() == table.strip(), "README's demo table differs from what make demo prints"
  bands = _bands(table)
  assert set(bands.values()) == {"learns (< 10 %)", "fails (> 80 %)"}, bands
  # Seed 0 again on narrower vector code: each run's training losses must differ from the same run's above (else
  # the check below would prove nothing; a run that diverged leaves no weights to compare), and its band must not.
  perturbed = tmp_path / "sse4_2"
  command, environment = _demo_command(
    perturbed, seeds=1, cache=tmp_path / "jax_cache", xla_flags="--xla_cpu_max_isa=SSE4_2"
  )
  ran = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=1200, env=environment)
  assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
  assert _bands((perturbed / "bands.md").read_text()) == bands
  changed = {
    run_directory.parent.name: _losses(run_directory)
    != _losses(tmp_path / "demo" / run_directory.relative_to(perturbed))
    for run_directory in perturbed.glob("*/seed_0")
  }
  assert len(changed) == len(bands) and all(changed.values()), changed


def _losses(run_directory: pathlib.Path) -> list[tuple[int, float]]:
  """The run's logged training losses, by update."""
  records = [json.loads(line) for line in (run_directory / "metrics.jsonl").read_text().splitlines()]
  return [(record["step"], record["train_loss"]) for record in records if "train_loss" in record]
