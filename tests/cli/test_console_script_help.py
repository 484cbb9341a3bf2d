"""`--help` prints the program's usage however it is started (issue: a console script printed an empty usage line,
because absl reads the docstring of ``__main__``, the wrapper pip writes)."""

import os
import pathlib
import subprocess
import sys

import pytest

SCRIPTS = {"stalesgd-train": "Runs one training job", "stalesgd-reproduce": "Runs a reproduction study's grid"}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_the_console_script_prints_its_programs_usage(script):
  path = pathlib.Path(sys.executable).parent / script
  if not path.exists():
    pytest.skip(f"{script} is not installed beside {sys.executable}")
  shown = subprocess.run(
    [str(path), "--help"], capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300
  )
  # absl's --help exits with status 1 after printing; what it printed is the test.
  assert shown.stdout.lstrip().startswith(SCRIPTS[script]), shown.stdout[:300]
