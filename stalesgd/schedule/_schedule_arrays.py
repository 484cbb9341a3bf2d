"""The `Schedule`: what an emulated cluster did, as plain numpy arrays.

A schedule is the output of the timing model (`stalesgd.schedule.simulate`) and
the input of the engine (`stalesgd.engine`). It knows nothing about JAX or
models. Notation follows Rudra (Gupta et al., arXiv 1509.04210): the server's
timestamp t counts applied updates (w_0 is the initial model, update u turns
w_u into w_{u+1}); a gradient computed at the weights of timestamp j that is
applied by update u has staleness sigma = u - j >= 0.

Every update applies exactly ``contributions_per_update`` (c) gradients, so the
per-contribution arrays have shape [num_updates, c]; within a row the
contributions are in arrival order, so flattening row-major gives every applied
gradient in arrival order. Gradients the server discarded (drop-stale, backup
workers) are listed separately in the ``dropped_*`` arrays: they never touch the
weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, BinaryIO

import numpy as np

from stalesgd import _validation as validation
from stalesgd.schedule._events import EventTrace

# (field, dtype, number of dimensions) of every array field, for validation
# and serialisation.
_ARRAY_FIELDS = (
  ("learner", np.int32, 2),
  ("timestamp", np.int64, 2),
  ("batch_index", np.int64, 2),
  ("update_time", np.float64, 1),
  ("dropped_learner", np.int32, 1),
  ("dropped_timestamp", np.int64, 1),
  ("dropped_batch_index", np.int64, 1),
  ("dropped_at_update", np.int64, 1),
  ("learner_busy_time", np.float64, 1),
)
_EVENT_PREFIX = "events_"
# The optional data-shard columns (`Schedule.data_stream`, `Schedule.data_offset`): int64 [U, c] each, both or none.
_DATA_FIELDS = ("data_stream", "data_offset")


def _as_array(name: str, value: Any, dtype: type, ndim: int) -> np.ndarray:
  """Converts a field to ``dtype`` without silently truncating values."""
  array = np.asarray(value)
  if array.ndim != ndim:
    raise ValueError(f"Schedule.{name} must have {ndim} dimension(s); got shape {array.shape}")
  integral = np.issubdtype(dtype, np.integer)
  if integral and array.size and not np.issubdtype(array.dtype, np.integer):
    raise ValueError(f"Schedule.{name} must hold integers; got dtype {array.dtype}")
  converted = array.astype(dtype, copy=False)
  if integral and array.size and not np.array_equal(converted, array):
    raise ValueError(f"Schedule.{name} does not fit in {np.dtype(dtype).name}")
  return converted


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """Who computed what, at which weights, and when, for every server update.

  Attributes:
    protocol: protocol name, e.g. ``"softsync"``.
    learners: number of learners: lambda (parameter server) or M (decentralized).
    learner: int32 [U, c], the learner that produced each contribution.
    timestamp: int64 [U, c], server timestamp j of the weights each
      contribution's gradient was computed at (0 <= j <= u).
    batch_index: int64 [U, c], k: the contribution is its learner's k-th
      gradient (0-based) and so consumed that learner's k-th mini-batch.
    update_time: float64 [U], simulated wall-clock seconds at which update u
      is applied.
    dropped_learner: int32 [D], learners of discarded gradients.
    dropped_timestamp: int64 [D], timestamps those gradients were computed at.
    dropped_batch_index: int64 [D], their mini-batch indices.
    dropped_at_update: int64 [D], the server timestamp at which each arrived
      (so its staleness is ``dropped_at_update - dropped_timestamp``).
    learner_busy_time: float64 [learners], simulated seconds each learner
      spent computing gradients (for utilisation).
    total_time: simulated seconds from start to the last update.
    options: JSON-serialisable protocol and timing options, for provenance.
    events: optional `EventTrace` of the simulation (``record_events=True``).
    data_stream: int64 [U, c] or None. None: contribution k of learner m reads
      that learner's own mini-batches (its k-th local run, its inner steps
      k H_m, ..., k H_m + H_m - 1). Given (data shards: each local run takes
      the least-visited shard, `stalesgd.schedule.simulate`'s
      ``data_shards``): the shard each contribution's local run read.
    data_offset: int64 [U, c] or None, with ``data_stream``: the shard's inner
      steps taken by the local runs that took it before this one, so this run
      reads the shard's mini-batches offset, ..., offset + H_m - 1.

  Example:
    >>> from stalesgd import schedule
    >>> run = schedule.simulate("softsync", learners=30, n=15, num_updates=1000, seed=0)
    >>> run.contributions_per_update
    2
    >>> 13 < run.mean_staleness < 16  # <sigma> ~ n
    True
  """

  protocol: str
  learners: int
  learner: np.ndarray
  timestamp: np.ndarray
  batch_index: np.ndarray
  update_time: np.ndarray
  dropped_learner: np.ndarray
  dropped_timestamp: np.ndarray
  dropped_batch_index: np.ndarray
  dropped_at_update: np.ndarray
  learner_busy_time: np.ndarray
  total_time: float
  options: dict[str, Any] = dataclasses.field(default_factory=dict)
  events: EventTrace | None = None
  data_stream: np.ndarray | None = None
  data_offset: np.ndarray | None = None

  def __post_init__(self):
    object.__setattr__(self, "learners", validation.check_integer("Schedule.learners", self.learners, low=1))
    object.__setattr__(self, "total_time", float(self.total_time))
    for name, dtype, ndim in _ARRAY_FIELDS:
      object.__setattr__(self, name, _as_array(name, getattr(self, name), dtype, ndim))
    if (self.data_stream is None) != (self.data_offset is None):
      raise ValueError("Schedule.data_stream and Schedule.data_offset are given together or not at all")
    if self.data_stream is not None:
      for name in _DATA_FIELDS:
        object.__setattr__(self, name, _as_array(name, getattr(self, name), np.int64, 2))
    self._check_shapes()
    self._check_values()

  def _check_shapes(self) -> None:
    grid = self.learner.shape
    for name in ("timestamp", "batch_index") + (_DATA_FIELDS if self.data_stream is not None else ()):
      if getattr(self, name).shape != grid:
        raise ValueError(f"Schedule.{name} must have the shape of learner {grid}; got {getattr(self, name).shape}")
    if self.update_time.shape != grid[:1]:
      raise ValueError(f"Schedule.update_time must have shape {grid[:1]}; got {self.update_time.shape}")
    dropped = self.dropped_learner.shape
    for name in ("dropped_timestamp", "dropped_batch_index", "dropped_at_update"):
      if getattr(self, name).shape != dropped:
        raise ValueError(f"Schedule.{name} must have shape {dropped}; got {getattr(self, name).shape}")
    if self.learner_busy_time.shape != (self.learners,):
      raise ValueError(
        f"Schedule.learner_busy_time must have shape ({self.learners},); got {self.learner_busy_time.shape}"
      )

  def _check_values(self) -> None:
    for name in ("learner", "dropped_learner"):
      values = getattr(self, name)
      if values.size and (values.min() < 0 or values.max() >= self.learners):
        raise ValueError(
          f"Schedule.{name} must lie in [0, learners={self.learners}); got {values.min()}..{values.max()}"
        )
    if self.timestamp.size and (self.timestamp.min() < 0 or self.staleness.min() < 0):
      raise ValueError("Schedule.timestamp must satisfy 0 <= timestamp[u] <= u (staleness >= 0)")
    if np.any(self.dropped_timestamp < 0) or np.any(self.dropped_timestamp > self.dropped_at_update):
      raise ValueError("Schedule.dropped_timestamp must satisfy 0 <= dropped_timestamp <= dropped_at_update")
    if np.any(self.batch_index < 0) or np.any(self.dropped_batch_index < 0):
      raise ValueError("Schedule.batch_index and dropped_batch_index must be >= 0")
    if self.data_stream is not None and (np.any(self.data_stream < 0) or np.any(self.data_offset < 0)):
      raise ValueError("Schedule.data_stream and Schedule.data_offset must be >= 0")
    if np.any(np.diff(self.update_time) < 0):
      raise ValueError("Schedule.update_time must be non-decreasing")

  @property
  def num_updates(self) -> int:
    return int(self.learner.shape[0])

  @property
  def contributions_per_update(self) -> int:
    return int(self.learner.shape[1])

  @property
  def local_steps(self) -> int:
    """H: the inner steps of a contribution the simulation timed (1: one gradient)."""
    return int(self.options.get("local_steps", 1))

  @property
  def learner_local_steps(self) -> np.ndarray | None:
    """int64 [learners]: each learner's H_m under dynamic local updates; None without them (H for all)."""
    steps = self.options.get("learner_local_steps")
    return None if steps is None else np.asarray(steps, np.int64)

  def staleness_of(self, first: int, stop: int) -> np.ndarray:
    """int64 [stop - first, c]: sigma = u - j of each contribution applied by updates u in [first, stop).

    The one place sigma is computed from the schedule (`staleness`, the
    engine's blocks and the training loop's records all read it).
    """
    return np.arange(first, stop, dtype=np.int64)[:, None] - self.timestamp[first:stop]

  @property
  def staleness(self) -> np.ndarray:
    """int64 [U, c]: sigma of each applied contribution."""
    return self.staleness_of(0, self.num_updates)

  @property
  def gradient_staleness(self) -> np.ndarray:
    """int64 [U * c]: staleness of every applied gradient, in arrival order."""
    return self.staleness.reshape(-1)

  @property
  def max_staleness(self) -> int:
    return int(self.staleness.max(initial=0))

  # -- statistics --------------------------------------------------------------

  @property
  def mean_staleness(self) -> float:
    """<sigma>: mean staleness of the applied gradients (0.0 if none)."""
    return float(self.staleness.mean()) if self.timestamp.size else 0.0

  def staleness_histogram(self) -> np.ndarray:
    """int64 [max_staleness + 1]: how many applied gradients have each sigma."""
    return np.bincount(self.gradient_staleness, minlength=1)  # [0] when nothing was applied

  def fraction_staleness_above(self, threshold: float) -> float:
    """P(sigma > threshold) over the applied gradients (e.g. threshold 2n)."""
    return float(np.mean(self.gradient_staleness > threshold)) if self.timestamp.size else 0.0

  @property
  def num_dropped(self) -> int:
    """How many gradients the server discarded."""
    return int(self.dropped_learner.shape[0])

  @property
  def dropped_staleness(self) -> np.ndarray:
    """int64 [D]: staleness each discarded gradient had when it arrived."""
    return self.dropped_at_update - self.dropped_timestamp

  @property
  def utilisation(self) -> np.ndarray:
    """float64 [learners]: fraction of ``total_time`` each learner computed."""
    return self.learner_busy_time / self.total_time if self.total_time > 0 else np.zeros(self.learners)

  @property
  def idle_time(self) -> np.ndarray:
    """float64 [learners]: simulated seconds each learner was not computing."""
    return self.total_time - self.learner_busy_time

  @property
  def updates_per_second(self) -> float:
    """Server updates per simulated second."""
    return self.num_updates / self.total_time if self.total_time > 0 else float("inf")

  @property
  def gradients_per_second(self) -> float:
    """Applied gradients (mini-batches that reach the weights) per simulated second."""
    return self.updates_per_second * self.contributions_per_update

  # -- serialisation -----------------------------------------------------------

  def save(self, path: str | os.PathLike[str] | BinaryIO) -> None:
    """Writes the schedule to ``path`` (an npz file, written at exactly that path), or into a binary file.

    Arrays are stored as they are and the options as JSON, so
    `Schedule.load` returns an identical schedule and a run can be replayed.
    """
    arrays = {name: getattr(self, name) for name, _, _ in _ARRAY_FIELDS}
    if self.data_stream is not None:
      arrays.update({name: getattr(self, name) for name in _DATA_FIELDS})
    if self.events is not None:
      arrays.update({_EVENT_PREFIX + name: values for name, values in self.events.as_arrays().items()})
    with contextlib.ExitStack() as stack:
      file = path if hasattr(path, "write") else stack.enter_context(open(path, "wb"))
      np.savez_compressed(
        file,
        protocol=np.asarray(self.protocol),
        learners=np.asarray(self.learners, dtype=np.int64),
        total_time=np.asarray(self.total_time, dtype=np.float64),
        options=np.asarray(json.dumps(self.options, sort_keys=True)),
        **arrays,
      )

  @classmethod
  def load(cls, path: str | os.PathLike[str] | BinaryIO) -> Schedule:
    """Reads a schedule written by `save` (from a path or a binary file)."""
    with np.load(path, allow_pickle=False) as stored:
      arrays = {name: stored[name] for name, _, _ in _ARRAY_FIELDS}
      arrays.update({name: stored[name] for name in _DATA_FIELDS if name in stored.files})
      event_names = [name for name in stored.files if name.startswith(_EVENT_PREFIX)]
      events = EventTrace(**{name[len(_EVENT_PREFIX) :]: stored[name] for name in event_names}) if event_names else None
      return cls(
        protocol=str(stored["protocol"]),
        learners=int(stored["learners"]),
        total_time=float(stored["total_time"]),
        options=json.loads(str(stored["options"])),
        events=events,
        **arrays,
      )
