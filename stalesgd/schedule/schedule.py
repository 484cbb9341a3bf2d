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

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Schedule:
  """Who computed what, at which weights, and when, for every server update.

  Attributes:
    protocol: protocol name, e.g. ``"softsync"``.
    learners: number of learners (lambda) or decentralized workers (M).
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

  @property
  def num_updates(self) -> int:
    return int(self.learner.shape[0])

  @property
  def contributions_per_update(self) -> int:
    return int(self.learner.shape[1])

  @property
  def staleness(self) -> np.ndarray:
    """int64 [U, c]: sigma of each applied contribution."""
    return np.arange(self.num_updates, dtype=np.int64)[:, None] - self.timestamp

  @property
  def gradient_staleness(self) -> np.ndarray:
    """int64 [U * c]: staleness of every applied gradient, in arrival order."""
    return self.staleness.reshape(-1)

  @property
  def max_staleness(self) -> int:
    return int(self.staleness.max(initial=0))
