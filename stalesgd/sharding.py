"""Global arrays from host data, the same way on one process or many.

In a multi-process run a `jax.Array` spans devices of several processes; each
process may only provide the shards of its own devices. These helpers build
such arrays from host data that every process can compute (the schedule, the
weights at initialisation, an evaluation batch), and from per-process slices of
a leading axis (each process's own learners' mini-batches).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding


def global_array(host: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array from a host array that every process holds in full."""
  host = np.asarray(host)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def local_row_range(sharding: NamedSharding, rows: int) -> tuple[int, int]:
  """[low, high): the rows of a leading axis of size ``rows`` this process's devices hold.

  Assumes, as a 1-D mesh ordered by process guarantees, that they are contiguous.
  """
  index_map = sharding.addressable_devices_indices_map((rows,))
  starts = [index[0].start or 0 for index in index_map.values()]
  stops = [rows if index[0].stop is None else index[0].stop for index in index_map.values()]
  return min(starts), max(stops)


def from_local_rows(local: np.ndarray, low: int, rows: int, sharding: NamedSharding) -> jax.Array:
  """A global array of ``rows`` rows, given only this process's rows ``local`` = rows[low:high]."""
  local = np.asarray(local)

  def shard(index):
    first = index[0]
    start = (first.start or 0) - low
    stop = (rows if first.stop is None else first.stop) - low
    return local[(slice(start, stop),) + tuple(index[1:])]

  return jax.make_array_from_callback((rows,) + local.shape[1:], sharding, shard)


def rows_from_batch_fn(batch_fn: Callable[[np.ndarray, np.ndarray], Any], learner: np.ndarray,
                       batch_index: np.ndarray, sharding: NamedSharding) -> Any:
  """Mini-batches for rows (learner[i], batch_index[i]) as global arrays split along the rows.

  Each process calls ``batch_fn`` once, with only the rows its own devices hold,
  so no process reads another's data.
  """
  rows = learner.shape[0]
  low, high = local_row_range(sharding, rows)
  local = batch_fn(learner[low:high], batch_index[low:high])

  def to_global(leaf):
    if np.shape(leaf)[0] != high - low:
      raise ValueError(f"batch_fn returned a leaf with leading axis {np.shape(leaf)[0]}, expected {high - low} "
                       "(one entry per requested (learner, batch_index) pair)")
    return from_local_rows(leaf, low, rows, sharding)

  return jax.tree_util.tree_map(to_global, local)
