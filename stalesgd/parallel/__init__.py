"""The mesh and dispatch helpers of the core (jax only).

* `learner_mesh`, `stack_learners`, `global_array`, ... (`._sharding`): one
  learner per device slot on a 1-D mesh over the axis `LEARNERS_AXIS`, and
  the per-process rows of a learner-major array in multi-process runs.
* `DispatchLimiter` (`._dispatch`): bounds how many dispatched programs may be
  in flight before the host waits, so asynchronous dispatch cannot queue
  unbounded device memory.
"""

from stalesgd.parallel._dispatch import DEFAULT_MAX_IN_FLIGHT, DispatchLimiter
from stalesgd.parallel._sharding import (
  LEARNERS_AXIS,
  addressable_learners,
  from_local_rows,
  global_array,
  learner_mesh,
  local_learner_values,
  local_row_range,
  rows_from_batch_fn,
  stack_learners,
)

__all__ = [
  "DEFAULT_MAX_IN_FLIGHT",
  "LEARNERS_AXIS",
  "DispatchLimiter",
  "addressable_learners",
  "from_local_rows",
  "global_array",
  "learner_mesh",
  "local_learner_values",
  "local_row_range",
  "rows_from_batch_fn",
  "stack_learners",
]
