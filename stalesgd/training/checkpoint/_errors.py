"""The checkpoint package's exceptions: `CheckpointError` (public) and the per-step `_UnreadableCheckpoint`."""


class CheckpointError(RuntimeError):
  """A checkpoint could not be written, or no checkpoint in a directory can be read back."""


class _UnreadableCheckpoint(Exception):
  """One step's checkpoint is damaged (raised and caught inside `Checkpointer.restore`)."""
