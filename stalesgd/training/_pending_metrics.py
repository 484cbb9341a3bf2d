"""Per-update metrics between two log records: read from the device only when a record is due.

Reading device arrays waits for the computation, so the training loop keeps
each block's metrics (`stalesgd.training._runners.RunnerMetrics`) here and reads them back only at
log, evaluation and checkpoint points; in between the host runs ahead. Reading
back checks the losses: a non-finite one stops the run with `TrainingDiverged`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from stalesgd.training._config_readers import epochs_applied
from stalesgd.training._runners import RunnerMetrics, Schedule  # the schedule a runner runs


class TrainingDiverged(FloatingPointError):
  """The training loss became non-finite; ``update`` is the first update whose loss was."""

  def __init__(self, message: str, update: int):
    super().__init__(message)
    self.update = update


class PendingMetrics:
  """Per-update metrics since the last log record, turned into one record on `flush`.

  Reading device arrays waits for the computation, so blocks are only read at
  log, evaluation and checkpoint points; in between the host runs ahead. A
  checkpoint reads the pending blocks back and stores them (`snapshot`), so that
  a resumed run writes the very records an uninterrupted one writes: a record
  covers the updates between two log points, whatever checkpoints fell between.
  """

  def __init__(self, schedule: Schedule, examples_per_update: int, per_epoch: float, applied: np.ndarray | None = None):
    """``applied``: the examples applied by the end of each update under dynamic local updates
    (`stalesgd.training._config_readers.applied_examples`); None: ``examples_per_update`` each, ``per_epoch``
    updates per epoch."""
    self.schedule, self.examples_per_update, self.per_epoch = schedule, examples_per_update, per_epoch
    self.applied = applied
    self._blocks: list[tuple[int, int, RunnerMetrics]] = []
    # Updates [first, stop) already on the host: (first, stop, float32 losses, float32 lr scales,
    # {diagnostic name: float32 values}).
    self._read: tuple[int, int, np.ndarray, np.ndarray, dict[str, np.ndarray]] | None = None
    self._since_update: int | None = None
    self._since_wall: float | None = None

  def add(self, first: int, stop: int, metrics: RunnerMetrics) -> None:
    self._blocks.append((first, stop, metrics))

  def start(self, update: int, wall_time: float) -> None:
    self._since_update, self._since_wall = update, wall_time

  def _read_back(self) -> None:
    """Moves the pending blocks to the host; raises `TrainingDiverged` on a non-finite loss."""
    if not self._blocks:
      return
    losses, scales = ([self._read[2]], [self._read[3]]) if self._read else ([], [])
    diagnostics = {name: [values] for name, values in self._read[4].items()} if self._read else {}
    for first, stop, metrics in self._blocks:
      count = stop - first
      loss = np.asarray(jax.device_get(metrics.loss))[:count].mean(axis=1)
      bad = np.flatnonzero(~np.isfinite(loss))
      if bad.size:
        update = first + int(bad[0])
        raise TrainingDiverged(
          f"the training loss became {loss[bad[0]]} at update {update} (epoch {self.epoch(update):.3f}); "
          "stopping. Lower config.learning_rate or add a staleness rule; the last checkpoint in the workdir "
          "holds the last good weights",
          update=update,
        )
      losses.append(loss)
      scales.append(np.asarray(jax.device_get(metrics.lr_scale))[:count])
      for name, values in (metrics.diagnostics or {}).items():
        diagnostics.setdefault(name, []).append(np.asarray(jax.device_get(values), np.float32).reshape(-1)[:count])
    first = self._read[0] if self._read else self._blocks[0][0]
    self._read = (
      first,
      self._blocks[-1][1],
      np.concatenate(losses),
      np.concatenate(scales),
      {name: np.concatenate(values) for name, values in diagnostics.items()},
    )
    self._blocks.clear()

  def snapshot(self) -> dict[str, Any] | None:
    """The pending updates' metrics as JSON for a checkpoint (None if there are none); checks the losses."""
    self._read_back()
    if self._read is None:
      return None
    first, stop, losses, scales, diagnostics = self._read
    snapshot = {"first": first, "stop": stop, "losses": losses.tolist(), "lr_scales": scales.tolist()}
    if diagnostics:
      snapshot["diagnostics"] = {name: values.tolist() for name, values in diagnostics.items()}
    return snapshot

  def restore(self, snapshot: dict[str, Any] | None) -> None:
    """Takes back what `snapshot` saved (float32, as read from the device, so records are bit-identical)."""
    self._blocks.clear()
    self._read = (
      None
      if snapshot is None
      else (
        int(snapshot["first"]),
        int(snapshot["stop"]),
        np.asarray(snapshot["losses"], np.float32),
        np.asarray(snapshot["lr_scales"], np.float32),
        {name: np.asarray(values, np.float32) for name, values in snapshot.get("diagnostics", {}).items()},
      )
    )

  def _examples(self, first: int, stop: int) -> int:
    if self.applied is None:
      return (stop - first) * self.examples_per_update
    return int(self.applied[stop] - self.applied[first])

  def epoch(self, update: int) -> float:
    """The epochs of examples applied by the end of ``update`` updates (the run's clock, `epochs_applied`)."""
    return float(epochs_applied(update, self.per_epoch, self.applied, self.examples_per_update))

  def flush(self, wall_time: float) -> dict[str, float]:
    """The record of the updates since the last flush; raises on a non-finite loss."""
    self._read_back()
    if self._read is None:
      return {}
    first, stop, losses, scales, diagnostics = self._read
    self._read = None
    staleness = self.schedule.staleness_of(first, stop)  # only this interval's rows
    elapsed = max(wall_time - self._since_wall, 1e-9)
    record = {
      "train_loss": float(losses.mean()),
      "lr_scale": float(scales.mean()),
      "staleness_mean": float(staleness.mean()),
      "staleness_max": int(staleness.max()),
      "epoch": self.epoch(stop),
      "sim_time": float(self.schedule.update_time[stop - 1]),
      "wall_time": wall_time,
      "images_per_s": self._examples(self._since_update, stop) / elapsed,
      **{name: float(values.mean()) for name, values in diagnostics.items()},
    }
    self.start(stop, wall_time)
    return record
