"""What the benchmark scripts share: where a figure was measured, and how to time side by side.

On a shared machine, absolute times drift with other jobs' load. The scripts
therefore time their programs in turn within each round and report medians
of per-round ratios, which every program's slow phases affect alike.
"""

from __future__ import annotations

import os
import pathlib
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from stalesgd import engine as engine_lib
from stalesgd.configs import rudra_cifar10
from stalesgd.training._build_run import build_run
from stalesgd.training._config_readers import contributions_per_update
from stalesgd.training._provenance import cpu_identity


def machine_description() -> dict[str, Any]:
  """Where the numbers were measured (recorded in every benchmark's JSON)."""
  devices = jax.devices()
  return {
    "platform": devices[0].platform,
    "device_kind": devices[0].device_kind,
    "num_devices": len(devices),
    "num_processes": jax.process_count(),
    "host_cpus": os.cpu_count(),
    "processor": platform.processor() or platform.machine(),
    # The CPU's name, family and vector instruction sets: a virtual machine may show two generations by one name.
    **cpu_identity(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    # Other jobs on a shared host inflate absolute times; the paired ratios are robust to it.
    "load_average_1_5_15_min": list(os.getloadavg()),
  }


def run_part(name: str, command: list[str], timeout: int, env: Mapping[str, str]) -> dict[str, Any]:
  """Runs one benchmark part, a program in its own process (``name`` heads its log lines); returns its wall
  seconds, ``status`` (the exit status, or ``"timeout"`` after ``timeout`` seconds) and the tail of its output."""
  print(f"[{name}] {' '.join(command[2:])}", flush=True)
  start = time.perf_counter()
  try:
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    status, output = completed.returncode, completed.stdout + completed.stderr
  except subprocess.TimeoutExpired as expired:
    status = "timeout"
    output = (
      (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) else (expired.stdout or "")
    )
  seconds = time.perf_counter() - start
  print(f"[{name}] status {status} after {seconds:.0f} s", flush=True)
  return {"seconds": seconds, "status": status, "output_tail": output[-2000:]}


def time_interleaved(
  programs: Mapping[str, Callable[[], Any]], steps_per_round: int, rounds: int
) -> dict[str, list[float]]:
  """Seconds per step of each program in every round; the programs alternate within a round.

  Each program is called once first to compile and warm up. A program's
  result is waited for (`jax.block_until_ready`) after its steps of a round.
  """
  for run in programs.values():
    jax.block_until_ready(run())
  samples = {name: [] for name in programs}
  for _ in range(rounds):
    for name, run in programs.items():
      start = time.perf_counter()
      for _ in range(steps_per_round):
        result = run()
      jax.block_until_ready(result)
      samples[name].append((time.perf_counter() - start) / steps_per_round)
  return samples


def paired_ratio(samples: Mapping[str, list[float]], numerator: str, denominator: str) -> float:
  """Median over rounds of the per-round ratio of two programs' step times."""
  return statistics.median(top / bottom for top, bottom in zip(samples[numerator], samples[denominator]))


def cifar10_data_dir(data_dir: str | None, scratch: pathlib.Path, train_examples: int) -> str:
  """``data_dir`` if given (real cifar10_{train,test}.npz), else random images of that layout under ``scratch``."""
  if data_dir is not None:
    return data_dir
  directory = scratch / "data"
  directory.mkdir(exist_ok=True)
  write_random_cifar10(directory, train_examples)
  return str(directory)


def write_random_cifar10(directory: pathlib.Path, train_examples: int) -> None:
  """cifar10_{train,test}.npz of uniform random pixels and labels, CIFAR-10's layout."""
  rng = np.random.default_rng(0)
  for split, size in (("train", train_examples), ("test", max(1, train_examples // 5))):
    np.savez(
      directory / f"cifar10_{split}.npz",
      images=rng.integers(0, 256, (size, 32, 32, 3), np.uint8),
      labels=rng.integers(0, 10, size).astype(np.int64),
    )


# The training-loop benchmarks' runs: Rudra's solver and network, mu = 4 per learner.
BATCH_PER_LEARNER = 4
# The zoo's networks for 32x32x3 images, which the benchmarks' random CIFAR-shaped data fit (AlexNet and the
# ImageNet ResNets are built for 224-227 pixels).
CIFAR_SIZED_MODELS = ("cifar10_full", "mlp", "small_cnn", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110")


def parse_case(case: str) -> tuple[str, int, int]:
  """``"async:8"`` -> ("async", n=1, lambda=8); ``"softsync4:32"`` -> ("softsync", 4, 32)."""
  protocol, _, learners = case.partition(":")
  if protocol == "async":
    n = 1
  elif protocol.startswith("softsync") and protocol.removeprefix("softsync").isdigit():
    protocol, n = "softsync", int(protocol.removeprefix("softsync"))
  else:
    raise ValueError(f"case {case!r}: the protocol must be 'async' or 'softsyncN' (e.g. softsync4)")
  if not learners.isdigit() or int(learners) < 1:
    raise ValueError(f"case {case!r}: the number of learners after ':' must be a positive integer")
  return protocol, n, int(learners)


def benchmark_config(protocol: str, n: int, learners: int, data_dir: str, train_examples: int = 50_000):
  """Rudra's solver for ``protocol`` at ``learners``, one epoch, evaluated once at the end,
  logged often enough (at least 8 records) to time the loop's steady state."""
  config = rudra_cifar10.paper_config()
  config.protocol, config.n, config.learners = protocol, n, learners
  config.batch_per_learner = BATCH_PER_LEARNER
  config.staleness_rule = "inverse"
  config.data_source, config.data_dir = "npz", data_dir
  config.timing.jitter = "deterministic"
  config.num_epochs, config.eval_every_epochs = 1.0, 1.0
  updates = train_examples // (BATCH_PER_LEARNER * contributions_per_update(config))
  config.log_every_updates = int(min(256, max(4, updates // 8)))
  return config


class EngineChunks:
  """The engine executing the run's blocks in order, about ``gradients`` gradients per call."""

  def __init__(self, config, gradients: int):
    run = build_run(config)
    self.engine = engine_lib.Engine(run.model.loss_fn, run.optimizer, has_aux=True)
    self.plan = self.engine.plan(run.schedule)
    self.batches = run.batches
    per_block = np.diff(self.plan.block_starts) * run.schedule.contributions_per_update
    self.blocks_per_chunk = max(1, int(round(gradients / np.median(per_block))))
    self.per_block = per_block
    self.state = self.engine.init(run.params, self.plan)
    self.block = 0

  def __call__(self) -> int:
    """Runs the next chunk; returns the number of gradients it applied."""
    stop = self.block + self.blocks_per_chunk
    if stop > self.plan.num_blocks:
      raise RuntimeError("the run's schedule is too short for the requested rounds; lower --rounds")
    self.state = self.engine.run(self.state, self.plan, self.batches, start_block=self.block, stop_block=stop)
    jax.block_until_ready(self.state.params)
    applied = int(self.per_block[self.block : stop].sum())
    self.block = stop
    return applied
