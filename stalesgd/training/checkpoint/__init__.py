"""Checkpoints for exact resumption, and a SIGTERM guard for preemptible jobs.

* `Checkpointer` (`stalesgd.training.checkpoint._checkpointer`): saves and restores (state pytree, JSON metadata)
  pairs with orbax-checkpoint: save cadence, atomic steps, restore into a target's shardings, fallback to
  an older step when the newest is damaged, `CheckpointError` when a save fails or nothing can be read.
* CRC-32 integrity checks (`stalesgd.training.checkpoint._integrity`): per array, of the metadata, and per process
  over its shards of an array sharded over processes; computed at save time, compared on restore.
* `PreemptionGuard` (`stalesgd.training.checkpoint._preemption`): turns SIGTERM into a flag the training loop polls,
  agreed on by all processes, so the loop saves and the program exits with status 75.
* `stalesgd.training.checkpoint._agreement`: whether a per-process flag holds on all processes (one collective).
* `stalesgd.training.checkpoint._errors`: `CheckpointError`.

Every method of `Checkpointer` (and `PreemptionGuard.should_stop`) must be
called by all processes, in the same order, with the same step. Warnings go to
the ``stalesgd.training.checkpoint`` logger.
"""

from stalesgd.training.checkpoint._checkpointer import Checkpointer
from stalesgd.training.checkpoint._errors import CheckpointError
from stalesgd.training.checkpoint._preemption import PreemptionGuard

__all__ = [
  "CheckpointError",
  "Checkpointer",
  "PreemptionGuard",
]
