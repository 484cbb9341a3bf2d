"""A process that dies by SIGKILL in the middle of an asynchronous save.

Run as ``python -m tests.helpers.workers.sigkill_during_save_worker DIRECTORY``. It completes
checkpoint 1, starts checkpoint 2 (16 MB of random floats, so the background
write is still going) and kills itself before the save can finish. The test then
checks that checkpoint 1, not a half-written 2, is what gets restored.
"""

from __future__ import annotations

import os
import signal
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax.numpy as jnp
import numpy as np

from stalesgd.training.checkpoint import Checkpointer

VALUES_SHAPE = (1024, 4096)


def state_at(step: int) -> dict[str, np.ndarray]:
  """The state saved as checkpoint ``step``: seeded random weights."""
  return {"weights": np.random.default_rng(step).standard_normal(VALUES_SHAPE, dtype=np.float32)}


def main() -> None:
  checkpointer = Checkpointer(sys.argv[1])
  checkpointer.save(1, {"weights": jnp.asarray(state_at(1)["weights"])}, {"next_update": 1})
  checkpointer.wait()
  checkpointer.save(2, {"weights": jnp.asarray(state_at(2)["weights"])}, {"next_update": 2})
  os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
  main()
