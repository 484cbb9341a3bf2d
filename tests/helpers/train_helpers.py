"""What the training-loop tests share: tiny configs, reading a run's outputs, starting ``stalesgd-train``.

A run's outputs are read back the way a user would: ``metrics.jsonl`` with
`stalesgd.records.read_jsonl`, ``summary.json`` with `json`, TensorBoard event
files record by record (the TFRecord framing, without TensorFlow).

Command-line runs are subprocesses of ``python -m stalesgd.cli.train`` (or of
`workers.paced_main`, the same program with a pause per block) in the repository
root, with the environment of the multi-process harness (CPU, repository on
``PYTHONPATH``, no launcher variables leaking in) and a persistent compilation
cache shared by the test session: the same program compiled by several
processes is compiled once, and a cached executable computes the same bits.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
import time
from typing import Any

import ml_collections
import pytest
from tensorboardX.proto import event_pb2

from stalesgd.records._metrics import read_jsonl
from tests.helpers import multiprocess_harness, tiny_run_config
from tests.helpers.workers import paced_main

REPOSITORY_ROOT = multiprocess_harness.REPOSITORY_ROOT
CONFIG_FILE = pathlib.Path(tiny_run_config.__file__).resolve()
PACED_MAIN = paced_main.__name__  # a module: ``python -m``, or launch/local.sh's LAUNCH_MODULE
SUMMARY_FIELDS = {
  "label",
  "protocol",
  "learners",
  "batch_per_learner",
  "updates",
  "epochs",
  "test_accuracy",
  "test_error",
  "train_accuracy",
  "sim_time",
  "wall_time",
  "staleness_mean",
  "staleness_max",
  "dropped_gradients",
  "params_sha256",
  "preempted",
}


def tiny_config(variant: str | None = None, **overrides: Any) -> ml_collections.ConfigDict:
  """`tiny_run_config.get_config(variant)` with fields replaced (dotted names for nested ones)."""
  config = tiny_run_config.get_config(variant)
  config.update_from_flattened_dict(overrides)
  return config


def read_metrics(workdir: os.PathLike) -> list[dict[str, Any]]:
  return read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")


def read_summary(workdir: os.PathLike) -> dict[str, Any]:
  return json.loads((pathlib.Path(workdir) / "summary.json").read_text())


def evaluation_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  return [record for record in records if "test_accuracy" in record]


def event_scalars(workdir: os.PathLike, *, apply_purges: bool = False) -> dict[str, list[tuple[int, float]]]:
  """Every scalar in the run's TensorBoard event files: tag -> [(step, value)] in file order.

  With ``apply_purges``, what TensorBoard shows: a session-start event at step s
  (tensorboardX's ``purge_step``, written by a resumed run) hides every earlier
  event at a step >= s.
  """
  scalars: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(pathlib.Path(workdir).glob("events.out.tfevents.*"), key=lambda path: path.stat().st_mtime_ns):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      # A record: uint64 length, uint32 CRC of the length, payload, uint32 CRC of the payload.
      (length,) = struct.unpack("<Q", data[offset : offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
      offset += 12 + length + 4
      if apply_purges and event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
        scalars = {
          tag: [(step, value) for step, value in points if step < event.step] for tag, points in scalars.items()
        }
      for value in event.summary.value:
        if value.WhichOneof("value") == "simple_value":
          scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


def event_hparams(workdir: os.PathLike) -> tuple[dict[str, object], list[str], list[str]]:
  """What TensorBoard's HParams dashboard reads from a run's event files: (hparams of the session start, the
  experiment's hparam names in order, its metric tags)."""
  from tensorboardX.proto import plugin_hparams_pb2

  hparams: dict[str, object] = {}
  names: list[str] = []
  metrics: list[str] = []
  for path in sorted(pathlib.Path(workdir).glob("events.out.tfevents.*"), key=lambda path: path.stat().st_mtime_ns):
    data, offset = path.read_bytes(), 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset : offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
      offset += 12 + length + 4
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name != "hparams":
          continue
        content = plugin_hparams_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
        if content.HasField("experiment"):
          names = [info.name for info in content.experiment.hparam_infos]
          metrics = [info.name.tag for info in content.experiment.metric_infos]
        if content.HasField("session_start_info"):
          for name, entry in content.session_start_info.hparams.items():
            hparams[name] = getattr(entry, entry.WhichOneof("kind"))
  return hparams, names, metrics


def complete_checkpoints(workdir: os.PathLike) -> list[int]:
  """Steps of a run's complete checkpoints (orbax renames a step's directory to its number once it is whole)."""
  directory = pathlib.Path(workdir) / "checkpoints"
  if not directory.exists():
    return []
  return sorted(int(path.name) for path in directory.iterdir() if path.name.isdigit())


def main_environment(compilation_cache: os.PathLike, devices_per_process: int = 8) -> dict[str, str]:
  """The environment of a ``stalesgd.cli.train`` subprocess: host CPU devices, a shared compilation cache."""
  return multiprocess_harness.process_environment(
    devices_per_process=devices_per_process,
    extra_env={
      "JAX_COMPILATION_CACHE_DIR": str(compilation_cache),
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    },
  )


def main_command(
  workdir: os.PathLike, variant: str, *overrides: str, seconds_per_block: float | None = None
) -> list[str]:
  """``stalesgd.cli.train`` on a `tiny_run_config` variant, optionally paced (see `workers.paced_main`)."""
  program = [sys.executable, "-m", "stalesgd.cli.train"]
  if seconds_per_block is not None:
    program = [sys.executable, "-m", PACED_MAIN, str(seconds_per_block)]
  return program + [f"--config={CONFIG_FILE}:{variant}", f"--workdir={workdir}", *overrides]


def start_main(command: list[str], log_path: os.PathLike, compilation_cache: os.PathLike) -> subprocess.Popen:
  """Starts a command in the repository root with its output (both streams) going to ``log_path``."""
  with open(log_path, "ab") as log:
    return subprocess.Popen(
      command,
      cwd=REPOSITORY_ROOT,
      env=main_environment(compilation_cache),
      stdout=log,
      stderr=subprocess.STDOUT,
      start_new_session=True,
    )


def run_main(command: list[str], compilation_cache: os.PathLike, timeout: float) -> subprocess.CompletedProcess:
  """Runs a command to completion in the repository root and returns its captured output."""
  return subprocess.run(
    command,
    cwd=REPOSITORY_ROOT,
    env=main_environment(compilation_cache),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def log_tail(log_path: os.PathLike, lines: int = 30) -> str:
  text = pathlib.Path(log_path).read_text(errors="replace") if pathlib.Path(log_path).exists() else ""
  return "\n".join(text.splitlines()[-lines:])


WALL_CLOCK_FIELDS = ("wall_time", "images_per_s")  # metrics that differ between identical runs
PHASE_TIMEOUT = 120.0  # seconds; a command-line phase normally takes 3-10 s


def wait_for_checkpoint_after(workdir: pathlib.Path, step: int, process: subprocess.Popen, log: pathlib.Path) -> int:
  """Waits until the running process has a complete checkpoint beyond ``step``; returns its step."""
  deadline = time.monotonic() + PHASE_TIMEOUT
  while time.monotonic() < deadline:
    newer = [saved for saved in complete_checkpoints(workdir) if saved > step]
    if newer:
      return newer[-1]
    if process.poll() is not None:
      pytest.fail(
        f"the run exited with status {process.returncode} before checkpointing past update {step}:\n{log_tail(log)}"
      )
    time.sleep(0.01)
  process.kill()
  pytest.fail(f"no checkpoint past update {step} within {PHASE_TIMEOUT} s:\n{log_tail(log)}")


def finish(process: subprocess.Popen, log: pathlib.Path, timeout: float = PHASE_TIMEOUT, what: str = "the run") -> int:
  """The exit status of a running process (killed, and the test failed, after ``timeout`` seconds)."""
  try:
    return process.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
    pytest.fail(f"{what} did not end within {timeout:.0f} s:\n{log_tail(log, lines=60)}")
