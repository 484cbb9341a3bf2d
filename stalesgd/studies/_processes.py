"""Runs a study's independent runs as concurrent processes, each on the devices it is given.

A study is a grid of runs that share nothing (variants x seeds), so a sweep can
keep the whole machine busy by running K of them at once (``stalesgd-reproduce
--parallel=K``). Each run is its own process (``stalesgd-reproduce --task=I``,
the same program restricted to one run of the grid), so it is the same
computation as that run alone:

* on a CPU host every process sees all the cores and emulates its learners on
  ``JAX_NUM_CPU_DEVICES`` host devices (`stalesgd.training._device_layout`; the weights
  do not depend on the count). Processes are **never pinned** to cores:
  XLA:CPU splits its work by the number of threads it may use, so pinning a
  process changes its floating-point results (docs/semantics.md, *What a run's
  bits depend on*);
* on a GPU host each process gets its own GPUs through
  ``CUDA_VISIBLE_DEVICES`` (one for a parameter-server protocol, ``learners``
  for a decentralized one, which needs one device per learner); a run starts
  when enough GPUs are free.

The parent process never starts a JAX backend (it would take every GPU's
memory); it only launches, watches and forwards signals: a SIGTERM (or Ctrl-C)
to the sweep is passed on to every running process, which checkpoints and stops
(`stalesgd.training.checkpoint._preemption`), so rerunning the sweep resumes them.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from stalesgd.training._loop import PREEMPTED_EXIT_STATUS

GPU_ENVIRONMENT_VARIABLE = "CUDA_VISIBLE_DEVICES"
CPU_DEVICES_ENVIRONMENT_VARIABLE = "JAX_NUM_CPU_DEVICES"
POLL_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class ProcessTask:
  """One run to execute in its own process.

  Attributes:
    label: how progress lines name it (e.g. ``"hardsync, seed 1"``).
    argv: the command (``[sys.executable, "-m", ...]``).
    log_path: where its stdout and stderr go.
    gpus: GPUs it needs on a GPU host (ignored on a CPU host).
    cpu_devices: host devices it emulates its learners on, on a CPU host.
  """

  label: str
  argv: Sequence[str]
  log_path: pathlib.Path
  gpus: int = 1
  cpu_devices: int = 8


def visible_gpus(
  environ: Mapping[str, str] | None = None, list_gpus: Callable[[], list[str]] | None = None
) -> list[str]:
  """The GPU ids this process may hand out, without starting a JAX backend.

  ``CUDA_VISIBLE_DEVICES`` when it is set (its comma-separated ids; empty: no
  GPU), else the GPUs ``nvidia-smi -L`` lists (none if it is not installed).

  Args:
    environ: the environment (default ``os.environ``).
    list_gpus: returns the ids of every GPU of the host (default: ``nvidia-smi``).
  """
  environ = os.environ if environ is None else environ
  if GPU_ENVIRONMENT_VARIABLE in environ:
    return [gpu.strip() for gpu in environ[GPU_ENVIRONMENT_VARIABLE].split(",") if gpu.strip()]
  return (list_gpus or _nvidia_smi_gpus)()


def _nvidia_smi_gpus() -> list[str]:
  if shutil.which("nvidia-smi") is None:
    return []
  listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False, timeout=60)
  if listing.returncode != 0:
    return []
  return [str(index) for index, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU ")]


def usable_cores() -> int:
  """The cores this process may run on (its affinity mask, where the OS has one)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def automatic_parallelism(num_tasks: int, gpus: Sequence[str], cores: int) -> int:
  """``--parallel=auto``: one process per GPU on a GPU host, else one per usable core; at most one per run."""
  return max(1, min(num_tasks, len(gpus) if gpus else cores))


def child_environment(base: Mapping[str, str], *, gpu_ids: Sequence[str] | None, cpu_devices: int) -> dict[str, str]:
  """The environment of one run's process.

  On a GPU host (``gpu_ids`` given) it sees only its GPUs; on a CPU host it
  emulates ``cpu_devices`` host devices unless the user chose a count
  (``JAX_NUM_CPU_DEVICES`` already in ``base``).
  """
  environment = dict(base)
  if gpu_ids is not None:
    environment[GPU_ENVIRONMENT_VARIABLE] = ",".join(gpu_ids)
  else:
    environment.setdefault(CPU_DEVICES_ENVIRONMENT_VARIABLE, str(cpu_devices))
  return environment


class GpuPool:
  """The free GPUs of a host, handed out to runs and taken back when they end."""

  def __init__(self, gpu_ids: Sequence[str]):
    self._free = list(gpu_ids)
    self.size = len(self._free)

  def acquire(self, count: int) -> list[str] | None:
    """``count`` free GPUs (the lowest ids), or None if fewer are free."""
    if count > len(self._free):
      return None
    taken, self._free = self._free[:count], self._free[count:]
    return taken

  def release(self, gpu_ids: Sequence[str]) -> None:
    self._free = sorted(set(self._free) | set(gpu_ids), key=lambda gpu: (len(gpu), gpu))


@dataclasses.dataclass
class _Running:
  task: ProcessTask
  process: subprocess.Popen
  gpu_ids: list[str] | None
  started: float
  log_file: object


def run_in_processes(
  tasks: Sequence[ProcessTask],
  *,
  parallel: int,
  gpu_ids: Sequence[str] = (),
  environ: Mapping[str, str] | None = None,
  echo: Callable[[str], None] = print,
  poll_seconds: float = POLL_SECONDS,
  describe: Callable[[int], str] | None = None,
) -> dict[int, int]:
  """Runs ``tasks`` with at most ``parallel`` processes at a time, in order; returns each task's exit status.

  A task that needs more GPUs than the host has is refused before anything
  starts. After a failed or preempted task (nonzero status; preempted is
  `stalesgd.training.PREEMPTED_EXIT_STATUS`) no new task starts and the running
  ones finish. A SIGTERM or SIGINT to this process is forwarded to
  every running task (which checkpoints and stops); tasks not yet started are
  left out of the result.

  Args:
    tasks: the runs.
    parallel: the most processes at once (>= 1).
    gpu_ids: the host's GPUs to hand out (empty on a CPU host).
    environ: the base environment of every process (default ``os.environ``).
    echo: where progress lines go.
    poll_seconds: how often the processes are checked.
    describe: what a task that exited with status 0 left behind, by task index
      (e.g. ``"finished: test error 2.3"``, ``"preempted"``); default
      ``"finished"``.

  Returns:
    ``{task index: exit status}`` for every task that ran.

  Raises:
    ValueError: if ``parallel`` < 1 or a task needs more GPUs than there are.
  """
  if parallel < 1:
    raise ValueError(f"parallel={parallel}; allowed: an integer >= 1")
  pool = GpuPool(gpu_ids)
  if gpu_ids:
    for task in tasks:
      if task.gpus > pool.size:
        raise ValueError(
          f"{task.label} needs {task.gpus} GPUs; this host has {pool.size} ({list(gpu_ids)}); "
          "allowed: runs needing at most that many (a decentralized run needs one per learner)"
        )
  base = dict(os.environ if environ is None else environ)
  pending = list(enumerate(tasks))
  running: dict[int, _Running] = {}
  statuses: dict[int, int] = {}
  stopping = {"signal": None}

  def forward(signum, frame):
    stopping["signal"] = signum
    for entry in running.values():
      if entry.process.poll() is None:
        entry.process.send_signal(signal.SIGTERM)

  previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
  try:
    while pending or running:
      while (
        pending
        and len(running) < parallel
        and stopping["signal"] is None
        and all(status == 0 for status in statuses.values())
      ):
        index, task = pending[0]
        assigned = pool.acquire(task.gpus) if gpu_ids else None
        if gpu_ids and assigned is None:
          break  # wait for GPUs to come free
        pending.pop(0)
        task.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(task.log_path, "a", encoding="utf-8")
        process = subprocess.Popen(
          list(task.argv),
          stdout=log_file,
          stderr=subprocess.STDOUT,
          env=child_environment(base, gpu_ids=assigned, cpu_devices=task.cpu_devices),
        )
        running[index] = _Running(task, process, assigned, time.monotonic(), log_file)
        where = f"GPUs {','.join(assigned)}" if assigned else f"{task.cpu_devices} host devices"
        echo(f"  started {task.label} (pid {process.pid}, {where}; log {task.log_path})")
      if not pending and not running:
        break
      if stopping["signal"] is not None or any(status != 0 for status in statuses.values()):
        pending.clear()
      time.sleep(poll_seconds)
      for index in list(running):
        entry = running[index]
        status = entry.process.poll()
        if status is None:
          continue
        entry.log_file.close()
        if entry.gpu_ids:
          pool.release(entry.gpu_ids)
        statuses[index] = status
        del running[index]
        minutes = (time.monotonic() - entry.started) / 60
        if status in (0, PREEMPTED_EXIT_STATUS):
          ended = (describe(index) if describe else "finished") if status == 0 else "preempted (checkpointed)"
        else:
          ended = f"FAILED (exit status {status})"
        echo(
          f"  {ended}: {entry.task.label} after {minutes:.1f} min"
          + ("" if status == 0 else f"; see {entry.task.log_path}")
        )
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  if stopping["signal"] is not None:
    echo(f"  stopped by signal {stopping['signal']}: every running process was asked to checkpoint and stop")
  return statuses


def python_module_command(module: str, flags: Sequence[str]) -> list[str]:
  """``[this Python, -m, module, *flags]``: a child runs the same interpreter and environment as the sweep."""
  return [sys.executable, "-m", module, *flags]
