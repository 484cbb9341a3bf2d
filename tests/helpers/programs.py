"""The repository's command-line programs run as a user runs them: ``python -m MODULE FLAGS`` in its root."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.multiprocess_harness import REPOSITORY_ROOT


def run_program(
  module: str, *flags: str, timeout: float = 300, cpu_devices: int | None = None
) -> subprocess.CompletedProcess:
  """``python -m module flags`` in the repository root on JAX's CPU backend (``cpu_devices`` host devices when
  given), its output captured as text and its status returned, not checked; killed after ``timeout`` seconds."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  if cpu_devices is not None:
    env["JAX_NUM_CPU_DEVICES"] = str(cpu_devices)
  return subprocess.run(
    [sys.executable, "-m", module, *flags],
    cwd=REPOSITORY_ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def output_tail(completed: subprocess.CompletedProcess, chars: int = 3000) -> str:
  """The last ``chars`` characters of a finished program's stdout and of its stderr: a failed assertion's message."""
  return completed.stdout[-chars:] + completed.stderr[-chars:]
