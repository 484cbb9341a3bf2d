"""Agreement across JAX processes: on a per-process flag, and on a point all have reached.

`Checkpointer.restore` needs every process to resume from the same step, and `PreemptionGuard.should_stop`
every process to stop at the same step; both decide with these (one small collective when there are several
processes, none with one). Every process must call them at the same points, in the same order.
"""

from __future__ import annotations

import jax
import numpy as np
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
