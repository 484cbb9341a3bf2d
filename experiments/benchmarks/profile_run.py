r"""Where a user's run spends its wall clock: host timers, compilation times and a host profile.

Runs `stalesgd.training.train_and_evaluate` once (the training benchmark's config:
Rudra's solver, deterministic timing, CIFAR-10-shaped npz data) and prints

* the run's own ``wall_time_breakdown`` (start-up, training, evaluation,
  checkpoints; `stalesgd.training._loop`);
* every XLA compilation and its seconds (JAX's ``jax_log_compiles``), so that a
  program compiled more than once, or an eager operation compiled inside the
  loop, shows up by name;
* the top functions of a ``cProfile`` of the host (cumulative time): the host
  work per block (batch preparation, global arrays, metric reads) next to the
  time spent waiting for devices (``block_until_ready``, ``device_get``).

With ``--trace_dir`` it also writes a `jax.profiler` trace (TensorBoard's
profile plugin or Perfetto reads it) of a window of training blocks. This is
the method behind the README's *Performance* notes; the trace is not committed.

Usage::

  python -m experiments.benchmarks.profile_run --case=async:32 --updates=3000
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import cProfile
import io
import logging as python_logging
import pathlib
import pstats
import re
import tempfile

import jax
from absl import app, flags, logging

from experiments.benchmarks.common import benchmark_config, cifar10_data_dir, parse_case
from stalesgd.training._config_readers import contributions_per_update
from stalesgd.training._loop import train_and_evaluate

_CASE = flags.DEFINE_string("case", "async:32", "protocol:learners, as in experiments.benchmarks.training.")
_UPDATES = flags.DEFINE_integer("updates", 3000, "Server updates to run.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "cifar10_{train,test}.npz; default: random images.")
_TOP = flags.DEFINE_integer("top", 25, "Host functions to list.")
_TRACE_DIR = flags.DEFINE_string("trace_dir", None, "Also write a jax.profiler trace here.")

_COMPILE_LINE = re.compile(r"Finished XLA compilation of (.+) in ([0-9.]+) sec")


class _CompileLog(python_logging.Handler):
  """Collects JAX's "Finished XLA compilation of NAME in S sec" messages."""

  def __init__(self):
    super().__init__()
    self.compiles: list[tuple[str, float]] = []

  def emit(self, record):
    match = _COMPILE_LINE.search(record.getMessage())
    if match:
      self.compiles.append((match.group(1), float(match.group(2))))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  protocol, n, learners = parse_case(_CASE.value)
  with tempfile.TemporaryDirectory(prefix="stalesgd_profile_") as scratch:
    scratch = pathlib.Path(scratch)
    data_dir = cifar10_data_dir(_DATA_DIR.value, scratch, 50_000)
    config = benchmark_config(protocol, n, learners, data_dir)
    config.num_epochs = _UPDATES.value * config.batch_per_learner * contributions_per_update(config) / 50_000
    config.eval_every_epochs = config.num_epochs

    compile_log = _CompileLog()
    jax_logger = python_logging.getLogger("jax")
    jax_logger.addHandler(compile_log)
    jax_logger.setLevel(python_logging.WARNING)
    jax_logger.propagate = False  # to this handler only, not to the console
    jax.config.update("jax_log_compiles", True)
    profiler = cProfile.Profile()
    if _TRACE_DIR.value:
      jax.profiler.start_trace(_TRACE_DIR.value)
    profiler.enable()
    try:
      summary = train_and_evaluate(config, str(scratch / "run"))
    finally:
      profiler.disable()
      if _TRACE_DIR.value:
        jax.profiler.stop_trace()
      jax.config.update("jax_log_compiles", False)
      jax_logger.removeHandler(compile_log)
      jax_logger.propagate = True

  print("\nwall-time breakdown (s):")
  for key, value in summary["wall_time_breakdown"].items():
    print(f"  {key:>22}: {value:.2f}" if isinstance(value, float) else f"  {key:>22}: {value}")
  total = sum(seconds for _, seconds in compile_log.compiles)
  print(f"\n{len(compile_log.compiles)} XLA compilations, {total:.1f} s in all (longest first):")
  for name, seconds in sorted(compile_log.compiles, key=lambda item: -item[1])[:15]:
    print(f"  {seconds:7.2f} s  {name}")
  text = io.StringIO()
  pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(_TOP.value)
  print("\nhost profile (cumulative):")
  print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
  app.run(main)
