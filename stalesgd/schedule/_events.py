"""An optional log of a parameter-server simulation's events, for checking invariants.

``simulate(..., record_events=True)`` attaches an `EventTrace` to the
`Schedule`: every time a learner starts computing a gradient and every time the
server receives one. From it a test can replay each learner's clock at every
event (e.g. the SSP bound of Ho et al., NIPS 2013) or the arrival order of the
gradients a backup-worker server dropped.
"""

from __future__ import annotations

import dataclasses

import numpy as np

START = 0
"""Event kind: a learner starts computing a gradient at the weights it pulled."""
ARRIVE = 1
"""Event kind: the server receives (processes) a learner's gradient."""

_DTYPES = {"time": np.float64, "kind": np.int8, "learner": np.int32, "batch_index": np.int64, "timestamp": np.int64}


@dataclasses.dataclass(frozen=True, eq=False)
class EventTrace:
  """Events in simulated-time order (ties keep the order they were decided in).

  Attributes:
    time: float64 [E], simulated seconds of the event.
    kind: int8 [E], `START` or `ARRIVE`.
    learner: int32 [E], the learner concerned.
    batch_index: int64 [E], which of the learner's gradients (0-based).
    timestamp: int64 [E], for `START` the server timestamp of the weights the
      gradient is computed at; for `ARRIVE` the server timestamp when it
      arrives (the update it would join).
  """

  time: np.ndarray
  kind: np.ndarray
  learner: np.ndarray
  batch_index: np.ndarray
  timestamp: np.ndarray

  def __post_init__(self):
    lengths = set()
    for name, dtype in _DTYPES.items():
      values = np.asarray(getattr(self, name), dtype=dtype)
      if values.ndim != 1:
        raise ValueError(f"EventTrace.{name} must be one-dimensional; got shape {values.shape}")
      lengths.add(values.shape[0])
      object.__setattr__(self, name, values)
    if len(lengths) > 1:
      raise ValueError(f"EventTrace arrays must have equal lengths; got {sorted(lengths)}")

  @classmethod
  def from_unsorted(cls, time, kind, learner, batch_index, timestamp) -> EventTrace:
    """Builds a trace from events listed in decision order, sorting by time stably."""
    order = np.argsort(np.asarray(time, dtype=np.float64), kind="stable")
    columns = (time, kind, learner, batch_index, timestamp)
    return cls(*(np.asarray(column)[order] for column in columns))

  def counts_after_each_event(self, kind: int, learners: int) -> np.ndarray:
    """How many events of ``kind`` each learner has had, after each event.

    With ``kind=START`` this is each learner's clock in the sense of Ho et al.
    (the number of gradients it has begun); with ``kind=ARRIVE`` the number the
    server has received from it.

    Returns:
      int64 [E, learners]: row e counts events 0..e of that kind per learner.
    """
    hits = np.zeros((self.time.shape[0], learners), dtype=np.int64)
    rows = np.flatnonzero(self.kind == kind)
    hits[rows, self.learner[rows]] = 1
    return np.cumsum(hits, axis=0)

  def as_arrays(self) -> dict[str, np.ndarray]:
    """The five arrays by field name (for serialisation)."""
    return {name: getattr(self, name) for name in _DTYPES}
