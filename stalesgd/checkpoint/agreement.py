"""Agreement across JAX processes on a per-process flag (one small collective when there are several).

`Checkpointer.restore` needs every process to resume from the same step and decides with this. Every
process must call it at the same points, in the same order.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def all_processes(flag: bool) -> bool:
  """Whether ``flag`` holds on every process (one small collective when there are several)."""
  if jax.process_count() == 1:
    return flag
  return bool(np.all(multihost_utils.process_allgather(np.int32(flag))))
