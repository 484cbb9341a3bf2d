"""Runs one Python program as N JAX processes on 127.0.0.1 and collects what they wrote.

Reusable by any multi-process test (DC-S3GD, the engine, ...): the program is a
module (``python -m``) or a script path; each process gets
``--coordinator_address=127.0.0.1:<free port> --num_processes=N
--process_id=<i> --output=<dir>/process_<i>.npz`` after the caller's
arguments, runs on ``devices_per_process`` forced host CPU devices with gloo
collectives, and the harness enforces one wall-clock timeout for all of them.
The program is expected to join the run with those flags (`add_process_flags`
and `initialize_process` do both) and to write its results (e.g. final
weights) to the ``--output`` file with `numpy.savez`.

Test files import it by full name::

  from tests.helpers import multiprocess_harness
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np

REPOSITORY_ROOT = pathlib.Path(__file__).resolve().parents[2]  # tests/helpers/ -> the repository


@dataclasses.dataclass
class ProcessResult:
  """What one process did.

  Attributes:
    process_id: its index.
    returncode: exit status (negative: killed by that signal); None if the
      harness had to kill it at the timeout.
    elapsed: seconds from the start of all processes to this one's exit.
    stdout: its standard output.
    stderr: its standard error.
    outputs: the arrays of its ``--output`` npz, or None if it wrote none.
  """

  process_id: int
  returncode: int | None
  elapsed: float
  stdout: str
  stderr: str
  outputs: dict[str, np.ndarray] | None

  @property
  def timed_out(self) -> bool:
    return self.returncode is None

  def describe(self) -> str:
    """A summary for assertion messages: status and the tail of stderr."""
    tail = "\n".join(self.stderr.strip().splitlines()[-15:])
    return (
      f"process {self.process_id}: returncode={self.returncode} after {self.elapsed:.1f}s\n"
      f"--- stdout ---\n{self.stdout[-2000:]}\n--- stderr (tail) ---\n{tail}"
    )


def add_process_flags(parser: argparse.ArgumentParser, *, heartbeat_timeout: int) -> None:
  """Adds, to a child program's parser, the flags `run_processes` passes and the timeouts.

  Args:
    parser: the child's argument parser.
    heartbeat_timeout: the default of ``--heartbeat_timeout``: seconds after
      which a silent peer is declared dead.
  """
  parser.add_argument("--coordinator_address")
  parser.add_argument("--num_processes", type=int)
  parser.add_argument("--process_id", type=int)
  parser.add_argument("--initialization_timeout", type=int, default=60)
  parser.add_argument("--heartbeat_timeout", type=int, default=heartbeat_timeout)


def initialize_process(args: argparse.Namespace) -> None:
  """Joins the run with the flags of `add_process_flags` (`stalesgd.cluster.initialize`)."""
  from stalesgd.cluster import _distributed as distributed  # children only

  distributed.initialize(
    args.coordinator_address,
    args.num_processes,
    args.process_id,
    initialization_timeout=args.initialization_timeout,
    heartbeat_timeout=args.heartbeat_timeout,
  )


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


def process_environment(devices_per_process: int, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
  """The environment of one child: CPU only, N host devices, gloo, the repository importable."""
  env = {
    name: value
    for name, value in os.environ.items()
    if not name.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "JAX_COORDINATOR"))
    and name not in ("JOB_COMPLETION_INDEX", "XLA_FLAGS")
  }
  env.update(
    {
      "JAX_PLATFORMS": "cpu",
      "JAX_NUM_CPU_DEVICES": str(devices_per_process),
      "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
      "PYTHONPATH": os.pathsep.join([str(REPOSITORY_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
      "PYTHONUNBUFFERED": "1",
      "TF_CPP_MIN_LOG_LEVEL": "3",
    }
  )
  env.update(extra_env or {})
  return env


def run_processes(
  target: str,
  args: Sequence[str] = (),
  *,
  num_processes: int,
  devices_per_process: int,
  timeout: float,
  output_dir: os.PathLike,
  extra_env: Mapping[str, str] | None = None,
  stop_all_on_failure: bool = True,
  failure_grace: float = 2.0,
) -> list[ProcessResult]:
  """Starts ``num_processes`` copies of ``target`` and waits for all of them (or the timeout).

  Args:
    target: a module name (run with ``python -m``) or a path ending in ``.py``.
    args: arguments placed before the per-process flags.
    num_processes: how many processes.
    devices_per_process: forced host CPU devices in each.
    timeout: seconds for the whole group; processes still alive then are
      killed and reported with ``returncode=None``.
    output_dir: where the ``process_<i>.npz`` files go.
    extra_env: environment variables added to each child's.
    stop_all_on_failure: when one process fails, kill the others after
      ``failure_grace`` seconds instead of waiting for them to notice (they
      would otherwise block in a collective until the heartbeat timeout).
      Pass False to observe how survivors react to a dead peer.
    failure_grace: seconds granted to the others after a failure.

  Returns:
    One `ProcessResult` per process, in process order.
  """
  output_dir = pathlib.Path(output_dir)
  output_dir.mkdir(parents=True, exist_ok=True)
  coordinator = f"127.0.0.1:{free_port()}"
  program = [sys.executable, target] if target.endswith(".py") else [sys.executable, "-m", target]
  env = process_environment(devices_per_process, extra_env)
  logs = []
  processes = []
  start = time.monotonic()
  for process_id in range(num_processes):
    output = output_dir / f"process_{process_id}.npz"
    output.unlink(missing_ok=True)
    stdout = open(output_dir / f"process_{process_id}.stdout", "w+")
    stderr = open(output_dir / f"process_{process_id}.stderr", "w+")
    logs.append((stdout, stderr, output))
    command = (
      program
      + list(args)
      + [
        f"--coordinator_address={coordinator}",
        f"--num_processes={num_processes}",
        f"--process_id={process_id}",
        f"--output={output}",
      ]
    )
    # A new session per child, so a timeout can kill the child and anything it started.
    processes.append(
      subprocess.Popen(command, cwd=REPOSITORY_ROOT, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    )
  ended = _wait(processes, start, timeout, stop_all_on_failure, failure_grace)
  results = []
  for process_id, (process, (stdout, stderr, output)) in enumerate(zip(processes, logs)):
    stdout.seek(0)
    stderr.seek(0)
    outputs = None
    if output.exists():
      with np.load(output) as archive:
        outputs = {name: archive[name] for name in archive.files}
    results.append(
      ProcessResult(
        process_id=process_id,
        returncode=ended[process_id][0],
        elapsed=ended[process_id][1],
        stdout=stdout.read(),
        stderr=stderr.read(),
        outputs=outputs,
      )
    )
    stdout.close()
    stderr.close()
  return results


def _wait(
  processes: list[subprocess.Popen], start: float, timeout: float, stop_all_on_failure: bool, failure_grace: float
) -> dict[int, tuple[int | None, float]]:
  """Polls until every process exits; kills stragglers at the deadline. Returns {id: (rc, elapsed)}."""
  ended: dict[int, tuple[int | None, float]] = {}
  deadline = start + timeout
  while len(ended) < len(processes):
    now = time.monotonic()
    for process_id, process in enumerate(processes):
      if process_id not in ended and process.poll() is not None:
        ended[process_id] = (process.returncode, now - start)
        if stop_all_on_failure and process.returncode != 0:
          deadline = min(deadline, now + failure_grace)
    if now >= deadline:
      for process_id, process in enumerate(processes):
        if process_id not in ended:
          os.killpg(process.pid, signal.SIGKILL)
          process.wait()
          ended[process_id] = (None, time.monotonic() - start)
      break
    time.sleep(0.05)
  return ended
