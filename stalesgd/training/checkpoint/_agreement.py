"""Agreement across JAX processes: on a per-process flag, and on a point all have reached.

`Checkpointer.restore` needs every process to resume from the same step, and `PreemptionGuard.should_stop`
every process to stop at the same step; both decide with these (one small collective when there are several
processes, none with one). Every process must call them at the same points, in the same order, which is why a
process whose orbax read failed joins the barrier orbax's restore ends in (`join_skipped_restore_barrier`).
"""

from __future__ import annotations

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils


def _gathered(flag: bool) -> np.ndarray:
  """``flag`` of every process, as int32s."""
  return multihost_utils.process_allgather(np.int32(flag))


def all_processes(flag: bool) -> bool:
  """Whether ``flag`` holds on every process."""
  if jax.process_count() == 1:
    return flag
  return bool(np.all(_gathered(flag)))


def any_process(flag: bool) -> bool:
  """Whether ``flag`` holds on at least one process."""
  if jax.process_count() == 1:
    return flag
  return bool(np.any(_gathered(flag)))


def barrier(name: str) -> None:
  """Returns once every process has reached the barrier ``name`` (at once with a single process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def is_barrier_error(error: BaseException) -> bool:
  """Whether ``error`` is a barrier that found the processes at different points (JAX's name check)."""
  return isinstance(error, AssertionError) and "sync_global_devices name mismatch" in str(error)


def join_skipped_restore_barrier(manager: ocp.CheckpointManager) -> None:
  """Joins the barrier that ends orbax's restore, for a process whose read raised before it.

  orbax's ``Checkpointer.restore`` reads, then waits in a barrier across
  processes (``Checkpointer:restore``, orbax 0.12.8). A process whose read
  fails (its shards unreadable, the others' fine) raises before that barrier
  while the others wait in it; its next collective, the agreement on whether
  every process could read the step, would then pair with their barrier: a
  name mismatch, or a hang. Joining the barrier here keeps every process's
  sequence of collectives the same.
  """
  checkpointer = manager._checkpointer  # orbax keeps the barrier's key here
  ocp.multihost.sync_global_processes(
    ocp.multihost.unique_barrier_key("Checkpointer:restore", prefix=checkpointer._barrier_sync_key_prefix),
    processes=checkpointer._active_processes,
  )
