"""Checkpoints for exact resumption, and a SIGTERM guard for preemptible jobs.

`Checkpointer` wraps orbax-checkpoint's `CheckpointManager`. A checkpoint holds
two items:

* ``state``: a pytree of arrays (weights, the ring buffer of past weights,
  optimizer states, PRNG keys), possibly sharded over a mesh. It is restored
  with the shardings of a target pytree, so a buffer sharded along a
  ``learners`` axis comes back sharded identically (also across processes).
* ``metadata``: a JSON object (schedule position, seeds, the config, metrics so
  far), written by the primary process only.

Atomicity comes from orbax: a step is written into ``<step>.orbax-checkpoint-tmp``
and renamed to ``<step>`` only once every item of every process is complete, so
a run killed in the middle of a save (even by SIGKILL) restores the previous
complete step. Leftover temporary directories are ignored and deleted when the
next `Checkpointer` opens the directory.

`PreemptionGuard` turns SIGTERM (what SLURM, Kubernetes and cloud schedulers
send before killing a job) into a flag the training loop polls at its "is it
time?" checks; the loop then saves and exits with status 0. On several
processes the decision to stop must be the same everywhere, or one process
would wait forever in a collective save the others never start; see
`PreemptionGuard` for how that is agreed.

Every method of `Checkpointer` (and `PreemptionGuard.should_stop`) must be
called by all processes, in the same order, with the same step.
"""

from __future__ import annotations

import os
import signal
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers

from stalesgd.metrics import to_json_value

PyTree = Any
_STATE = "state"
_METADATA = "metadata"


def _check_optional_positive_int(name: str, value: Any) -> None:
  if value is None:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} = {value!r}; allowed: None or an int >= 1")


class Checkpointer:
  """Saves and restores (state pytree, JSON metadata) pairs under a directory.

  Example::

    with Checkpointer(workdir / "checkpoints", save_interval_seconds=600) as checkpointer:
      restored = checkpointer.restore(initial_state)
      state, metadata = restored if restored else (initial_state, {"next_update": 0})
      for update in range(metadata["next_update"], num_updates):
        state = train_step(state, ...)
        checkpointer.save(update + 1, state, {"next_update": update + 1})
      checkpointer.save(num_updates, state, {...}, force=True)

  Saves are asynchronous: `save` returns once the arrays are copied to host
  memory (the caller may then donate or overwrite them) and a background thread
  writes them. `wait` and `close` block until every started save is on disk.
  """

  def __init__(self,
               directory: str | os.PathLike[str],
               *,
               max_to_keep: int | None = 3,
               save_interval_steps: int | None = None,
               save_interval_seconds: int | None = None):
    """Opens (and creates) a checkpoint directory.

    Args:
      directory: where the step directories live. Local paths are made
        absolute; URLs such as ``gs://...`` are passed to orbax as they are.
      max_to_keep: how many of the latest checkpoints to keep; None keeps all.
      save_interval_steps: `save` without ``force`` writes only when ``step``
        is a multiple of this.
      save_interval_seconds: `save` without ``force`` writes only when at
        least this many seconds passed since the previous checkpoint (decided
        on the primary process and broadcast, so all processes agree). With
        both intervals set, either one triggers a save; with neither, every
        `save` call writes.

    Raises:
      ValueError: if a count or interval is not a positive int.
    """
    _check_optional_positive_int("max_to_keep", max_to_keep)
    _check_optional_positive_int("save_interval_steps", save_interval_steps)
    _check_optional_positive_int("save_interval_seconds", save_interval_seconds)
    directory = os.fspath(directory)
    if "://" not in directory:
      directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=checkpoint_managers.LatestN(max_to_keep),
        create=True,
        cleanup_tmp_directories=True,
        enable_async_checkpointing=True,
        save_decision_policy=_save_decision_policy(save_interval_steps, save_interval_seconds),
    )
    self._manager = ocp.CheckpointManager(directory, options=options, item_names=(_STATE, _METADATA))

  @property
  def directory(self) -> str:
    return os.fspath(self._manager.directory)

  def latest_step(self) -> int | None:
    """The step of the newest complete checkpoint, or None if there is none."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    """Steps of all complete checkpoints kept, in increasing order."""
    return sorted(self._manager.all_steps())

  def should_save(self, step: int) -> bool:
    """Whether `save` (without ``force``) would write at ``step``.

    True when the save interval says so; False if ``step`` is already saved.
    (Preemption is `PreemptionGuard`'s decision, followed by a forced save.)
    """
    return self._manager.should_save(step)

  def save(self, step: int, state: PyTree, metadata: Mapping[str, Any], *, force: bool = False) -> bool:
    """Starts saving ``state`` and ``metadata`` as checkpoint ``step``.

    Args:
      step: the checkpoint's step (for stalesgd, the number of server updates
        applied so far).
      state: pytree of jax.Array / numpy arrays / PRNG keys; sharded arrays are
        written shard by shard by the processes that hold them.
      metadata: JSON-compatible mapping; numpy and JAX scalars and arrays are
        converted (see `stalesgd.metrics.to_json_value`).
      force: save even if the intervals say it is not time (e.g. at the end of
        training or on preemption).

    Returns:
      Whether a save was started. False when it is not time, or when ``step``
      is already saved (so saving again on preemption right after a regular
      save is harmless).

    Raises:
      ValueError: if ``step`` is negative or metadata is not JSON-compatible.
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
      raise ValueError(f"step = {step!r}; allowed: an int >= 0")
    if not isinstance(metadata, Mapping):
      raise ValueError(f"metadata has type {type(metadata).__name__}; allowed: a mapping with str keys")
    json_metadata = to_json_value(metadata, name="metadata")
    step = int(step)
    if step in self._manager.all_steps():
      return False
    return self._manager.save(
        step,
        args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardSave(state),
            _METADATA: ocp.args.JsonSave(json_metadata),
        }),
        force=force,
    )

  def restore(self, target_state: PyTree, *, step: int | None = None) -> tuple[PyTree, dict[str, Any]] | None:
    """Restores a checkpoint into the structure, dtypes and shardings of a target.

    Args:
      target_state: a pytree with the same structure as the saved state, whose
        leaves are arrays or `jax.ShapeDtypeStruct` s; each restored array gets
        the leaf's shape, dtype and sharding (so a target sharded over a mesh
        is restored sharded, each process reading only its shards).
      step: which checkpoint; None means the latest.

    Returns:
      ``(state, metadata)``, or None if there is no complete checkpoint.

    Raises:
      ValueError: if ``step`` is given but not among the saved steps.
    """
    if step is None:
      step = self.latest_step()
      if step is None:
        return None
    elif step not in self._manager.all_steps():
      raise ValueError(f"step = {step!r} is not a saved checkpoint; allowed: one of {self.all_steps()}")
    abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardRestore(abstract_state),
            _METADATA: ocp.args.JsonRestore(),
        }),
    )
    return restored[_STATE], dict(restored[_METADATA])

  def wait(self) -> None:
    """Blocks until every started save is complete on disk; raises its error if one failed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases orbax's threads."""
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()


def _save_decision_policy(save_interval_steps: int | None,
                          save_interval_seconds: int | None) -> checkpoint_managers.SaveDecisionPolicy:
  """Orbax policy: the configured intervals, or every call, plus JAX's preemption sync point."""
  policies: list[checkpoint_managers.SaveDecisionPolicy] = [
      checkpoint_managers.PreemptionCheckpointingPolicy()
  ]
  if save_interval_steps is not None:
    policies.append(checkpoint_managers.FixedIntervalPolicy(save_interval_steps))
  if save_interval_seconds is not None:
    policies.append(
        checkpoint_managers.ContinuousCheckpointingPolicy(minimum_interval_secs=save_interval_seconds))
  if save_interval_steps is None and save_interval_seconds is None:
    policies.append(checkpoint_managers.FixedIntervalPolicy(1))
  return checkpoint_managers.AnySavePolicy(policies)


SignalHandler = Callable[[int, types.FrameType | None], Any] | int | None


class PreemptionGuard:
  """Context manager that turns termination signals into a flag the loop polls.

  Example::

    with PreemptionGuard() as guard:
      for step in range(first_step, num_steps):
        state = train_step(state)
        if guard.should_stop(step):
          checkpointer.save(step, state, metadata, force=True)
          checkpointer.wait()
          return  # and the process exits with status 0

  How the stop decision is made: Python handlers for ``signals`` set a flag
  on the process that receives one; ``should_stop`` returns it, OR-ed over all
  processes with a `process_allgather` when there are several (one small
  collective per call, so every process must call it at the same steps). The
  previous handlers are restored on exit.

  JAX's own preemption service (on by default in `jax.distributed.initialize`)
  is deliberately not used: it agrees on one sync step and answers True only
  when ``should_stop`` is called with exactly that step, but orbax's
  checkpoint manager queries the same service with its own step numbers (the
  server's update count, which jumps by a whole wave per call in the engine),
  so the two sequences mixed and the sync point was missed: a SIGTERM'd
  multi-process parameter-server run trained on to the end. The guard's
  handlers replace JAX's for as long as the guard is active, so JAX never sees
  the notice and orbax never reports a preemption of its own.
  """

  def __init__(self, signals: Sequence[int] = (signal.SIGTERM,)):
    """Prepares the guard; handlers are installed by ``__enter__``.

    Args:
      signals: the signals that request a stop, e.g. also ``signal.SIGUSR1``
        for SLURM's ``--signal=USR1@120`` early warning.

    Raises:
      ValueError: if ``signals`` is empty or holds something that is not a
        catchable signal.
    """
    signals = tuple(signals)
    if not signals:
      raise ValueError("signals = (); allowed: a non-empty sequence of signal numbers")
    catchable = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
    for signal_number in signals:
      if signal_number not in catchable:
        raise ValueError(f"signals contains {signal_number!r}; allowed: catchable signals such as "
                         "signal.SIGTERM, signal.SIGUSR1 (not SIGKILL or SIGSTOP)")
    self._signals = signals
    self._received: int | None = None
    self._previous_handlers: dict[int, SignalHandler] = {}
    self._active = False

  @property
  def received_signal(self) -> int | None:
    """The signal this process received (None if none)."""
    return self._received

  def __enter__(self) -> PreemptionGuard:
    if self._active:
      raise RuntimeError("PreemptionGuard is already active; it cannot be entered twice")
    for signal_number in self._signals:
      self._previous_handlers[signal_number] = signal.signal(signal_number, self._handle)
    self._active = True
    return self

  def __exit__(self, *exc_info: object) -> None:
    for signal_number, handler in self._previous_handlers.items():
      # getsignal returns None for a handler installed outside Python; the
      # closest Python can restore is the default action.
      signal.signal(signal_number, signal.SIG_DFL if handler is None else handler)
    self._previous_handlers.clear()
    self._active = False

  def should_stop(self, step: int) -> bool:
    """Whether the loop should save and exit now.

    Args:
      step: the current step; all processes must call this at the same
        steps (it is part of the call's contract, not used to decide).

    Returns:
      True if a stop was requested (on any process, when there are several).

    Raises:
      RuntimeError: if the guard is not active (use it as a context manager).
    """
    if not self._active:
      raise RuntimeError("PreemptionGuard.should_stop called outside its `with` block")
    del step
    if jax.process_count() > 1:
      flags = multihost_utils.process_allgather(np.int32(self._received is not None))
      return bool(np.any(flags))
    return self._received is not None

  def _handle(self, signal_number: int, frame: types.FrameType | None) -> None:
    del frame  # The loop reacts at its next check; nothing to do here.
    self._received = signal_number
