"""`make demo` prints what the README prints, and no row moves under the perturbations this machine can make.

The demo's printed table shows, per variant, the band (learns: < 10 % test error; fails: > 80 %) that every
seed's value (the mean of its last 3 evaluations) falls in (`Study.bands`), so it reads the same wherever the
floating-point results move the numbers within their bands. This test runs it as `make demo` does (3 seeds, 2
processes), then seed 0 again pinned to one core (`taskset -c 0`, which changes XLA:CPU's threads and so its
rounding) and with Eigen's multi-threading off (`--xla_cpu_multi_thread_eigen=false`), those two at once, and
asserts every band the same, and the first table equal to the README's.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
README_TABLE = re.compile(r"<!-- demo table -->\n(.*?)<!-- end demo table -->", re.DOTALL)


def _demo_command(workdir: pathlib.Path, *, seeds: int, prefix=(), xla_flags: str | None = None):
  """The command and environment of `make demo` (seeds > 1, 2 processes) or of one seed's runs, one at a time."""
  environment = {key: value for key, value in os.environ.items() if key != "JAX_NUM_CPU_DEVICES"}
  if xla_flags is not None:
    environment["XLA_FLAGS"] = f"{environment.get('XLA_FLAGS', '')} {xla_flags}".strip()
  command = [
    *prefix,
    sys.executable,
    "-m",
    "stalesgd.cli.reproduce",
    "--study=demo",
    f"--workdir={workdir}",
    f"--seeds={seeds}",
    "--parallel=2" if seeds > 1 else "--parallel=1",
  ]
  return command, environment


def _demo(workdir: pathlib.Path, *, seeds: int) -> str:
  command, environment = _demo_command(workdir, seeds=seeds)
  ran = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=1200, env=environment)
  assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
  return ran.stdout


def _bands(table: str) -> dict[str, str]:
  rows = [line.strip("|").split("|") for line in table.strip().splitlines()[2:]]
  return {cells[0].strip(): cells[-1].strip() for cells in rows}


@pytest.mark.slow
def test_make_demo_prints_the_readme_table_and_no_row_moves_under_perturbations(tmp_path):
  printed = _demo(tmp_path / "demo", seeds=3)
  table = (tmp_path / "demo" / "bands.md").read_text()
  assert table in printed
  readme = README_TABLE.search((REPOSITORY / "README.md").read_text())
  assert readme, "README.md has no <!-- demo table --> block"
  assert readme.group(1).strip() == table.strip(), "README's demo table differs from what make demo prints"
  bands = _bands(table)
  assert set(bands.values()) == {"learns (< 10 %)", "fails (> 80 %)"}, bands
  perturbations = {
    "one_core": {"prefix": ("taskset", "-c", "0")},
    "eigen_single_threaded": {"xla_flags": "--xla_cpu_multi_thread_eigen=false"},
  }
  if shutil.which("taskset") is None:
    pytest.skip("taskset is not installed")
  # The two perturbed demos at once (one seed each, its runs one at a time): each is its own process tree, and
  # neither perturbation depends on the machine being otherwise idle.
  running = {}
  for name, perturbation in perturbations.items():
    command, environment = _demo_command(tmp_path / name, seeds=1, **perturbation)
    log = open(tmp_path / f"{name}.log", "w", encoding="utf-8")  # closed below
    running[name] = (
      subprocess.Popen(command, cwd=REPOSITORY, stdout=log, stderr=subprocess.STDOUT, env=environment),
      log,
    )
  for name, (process, log) in running.items():
    status = process.wait(timeout=1200)
    log.close()
    assert status == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    assert _bands((tmp_path / name / "bands.md").read_text()) == bands, name
