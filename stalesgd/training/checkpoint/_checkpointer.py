"""`Checkpointer`: saves and restores (state pytree, JSON metadata) pairs with orbax-checkpoint.

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

Damage after the fact (a truncated, overwritten or deleted file) is caught on
restore: orbax and tensorstore notice missing and truncated pieces, and the
CRC-32s of `stalesgd.training.checkpoint._integrity`, stored in the metadata at save
time, catch changed bytes that would otherwise be read back as wrong weights.
`restore` then warns, naming the step and why, and falls back to the next
older step (so keep at least 2 checkpoints); the unreadable step directory is
renamed to ``<step>.unreadable`` (kept for inspection, out of orbax's way).
When no checkpoint can be read, it raises `CheckpointError` rather than letting
a run start again from scratch. A save that fails (disk full, directory
read-only) raises `CheckpointError` naming the directory and the newest intact
step.

Every checkpoint records its format and the stalesgd version that wrote it
(`stalesgd.training.checkpoint._format`). One of an older format is read
through the format's migrations when they are renames of tree keys; one
that cannot be (a newer format, or a state of another structure) raises
`CheckpointError` naming the version that wrote it, and its files stay.

Every method of `Checkpointer` must be called by all processes, in the same
order, with the same step.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from stalesgd import _validation as validation
from stalesgd._key_paths import key_path_names
from stalesgd.records._metrics import to_json_value
from stalesgd.records._paths import is_url
from stalesgd.training.checkpoint import _format
from stalesgd.training.checkpoint._agreement import (
  all_processes,
  barrier,
  is_barrier_error,
  join_skipped_restore_barrier,
)
from stalesgd.training.checkpoint._errors import CheckpointError, _UnreadableCheckpoint
from stalesgd.training.checkpoint._integrity import (
  CHECKSUMS_KEY,
  check_checksums,
  metadata_checksum,
  process_sharded_checksums,
  state_checksums,
)

PyTree = Any
_STATE = "state"
_METADATA = "metadata"
UNREADABLE_SUFFIX = ".unreadable"

# The package's name, as before the module was split out of it: warnings are filtered by this name.
_LOG = logging.getLogger("stalesgd.training.checkpoint")


def _first_line(error: BaseException) -> str:
  """An exception's message, cut at its first line (tensorstore appends long source locations)."""
  text = str(error).strip()
  return text.splitlines()[0] if text else repr(error)


_RESERVED_KEYS = (CHECKSUMS_KEY, _format.FORMAT_KEY, _format.WRITER_KEY)  # written by `save` itself


def _leaves_by_path(tree: PyTree) -> dict[_format.KeyPath, Any]:
  """``{key path: leaf}``, the path as `key_path_names` spells it (alike in a saved tree and today's)."""
  return {key_path_names(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


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

  def __init__(
    self,
    directory: str | os.PathLike[str],
    *,
    max_to_keep: int | None = 3,
    save_interval_steps: int | None = None,
    save_interval_seconds: int | None = None,
  ):
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
    for name, value in (
      ("max_to_keep", max_to_keep),
      ("save_interval_steps", save_interval_steps),
      ("save_interval_seconds", save_interval_seconds),
    ):
      validation.check_integer(name, value, low=1, optional=True, builtin_only=True)
    directory = os.fspath(directory)
    if not is_url(directory):
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
        converted (see `stalesgd.records._metrics.to_json_value`).
      force: save even if the intervals say it is not time (e.g. at the end of
        training or on preemption).

    Returns:
      Whether a save was started. False when it is not time, or when ``step``
      is already saved (so saving again on preemption right after a regular
      save is harmless).

    Raises:
      ValueError: if ``step`` is negative or metadata is not JSON-compatible
        (or uses the reserved key `CHECKSUMS_KEY`).
      CheckpointError: if this save or the previous one (written in the
        background) failed, e.g. the disk is full or the directory read-only;
        the message names the directory and the newest intact step.
    """
    validation.check_integer("step", step, low=0)
    if not isinstance(metadata, Mapping):
      raise ValueError(f"metadata has type {type(metadata).__name__}; allowed: a mapping with str keys")
    reserved = [key for key in _RESERVED_KEYS if key in metadata]
    if reserved:
      raise ValueError(
        f"metadata keys {reserved} are reserved for the checkpoint's own checksums and format; allowed: any "
        f"str key but {list(_RESERVED_KEYS)}"
      )
    json_metadata = to_json_value(metadata, name="metadata")
    json_metadata.update({_format.FORMAT_KEY: _format.FORMAT, _format.WRITER_KEY: _format.stalesgd_version()})
    step = int(step)
    if step in self._manager.all_steps():
      return False
    with self._reporting_write_errors(f"while saving checkpoint {step}"):
      if not self._manager.should_save(step) and not force:
        return False
      sharded_checksums = process_sharded_checksums(state)  # a collective: before anything may raise
      self._check_writable()
      if jax.process_index() == 0:  # only the primary process writes the metadata
        json_metadata[CHECKSUMS_KEY] = {"state": state_checksums(state), "metadata": metadata_checksum(json_metadata)}
        if sharded_checksums is not None:
          json_metadata[CHECKSUMS_KEY]["process_sharded_state"] = sharded_checksums
      return self._manager.save(
        step,
        args=ocp.args.Composite(
          **{
            _STATE: ocp.args.StandardSave(state),
            _METADATA: ocp.args.JsonSave(json_metadata),
          }
        ),
        force=force,
      )

  def restore(self, target_state: PyTree, *, step: int | None = None) -> tuple[PyTree, dict[str, Any]] | None:
    """Restores a checkpoint into the structure, dtypes and shardings of a target.

    Without ``step``, the newest checkpoint that reads back whole: a damaged
    one (a piece missing or truncated, or bytes that no longer match the
    checksums written with it) is reported with a warning naming its step and
    the reason, renamed to ``<step>.unreadable`` (so that it no longer counts
    as the latest, nor blocks a new save of that step), and the next older one
    is tried. Warnings go to the ``stalesgd.training.checkpoint`` logger.

    Args:
      target_state: a pytree with the same structure as the saved state, whose
        leaves are arrays or `jax.ShapeDtypeStruct` s; each restored array gets
        the leaf's shape, dtype and sharding (so a target sharded over a mesh
        is restored sharded, each process reading only its shards).
      step: which checkpoint; None means the newest readable one.

    Returns:
      ``(state, metadata)``, or None if there is no complete checkpoint.

    Raises:
      ValueError: if ``step`` is given but not among the saved steps.
      CheckpointError: if checkpoints exist but none can be read (or the one
        ``step`` names cannot): resuming from an older state, or from scratch,
        is then the user's decision, not a silent one.
    """
    abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    if step is not None:
      if step not in self._manager.all_steps():
        raise ValueError(f"step = {step!r} is not a saved checkpoint; allowed: one of {self.all_steps()}")
      try:
        return self._restore_step(step, abstract_state)
      except _UnreadableCheckpoint as error:
        raise CheckpointError(f"checkpoint {step} in {self.directory} cannot be read: {error}") from error
    steps = sorted(self._manager.all_steps(), reverse=True)
    if not steps:
      return None
    unreadable: list[tuple[int, str]] = []
    for candidate in steps:
      error: _UnreadableCheckpoint | None = None
      try:
        restored = self._restore_step(candidate, abstract_state)
      except _UnreadableCheckpoint as caught:
        error = caught
      # Every process must resume from the same step: one that cannot read its part rules the step out.
      if not all_processes(error is None):
        reason = str(error) if error is not None else "another process could not read its part"
        _LOG.warning(
          "checkpoint %d in %s is unreadable (%s); %s",
          candidate,
          self.directory,
          reason,
          "falling back to the previous checkpoint" if candidate != steps[-1] else "no older one is left",
        )
        unreadable.append((candidate, reason))
        continue
      if unreadable:
        moved = self._set_aside([bad for bad, _ in unreadable])
        _LOG.warning(
          "resuming from checkpoint %d in %s: the newer checkpoint(s) %s could not be read and were renamed to %s",
          candidate,
          self.directory,
          [bad for bad, _ in unreadable],
          moved,
        )
      return restored
    details = "; ".join(f"step {bad}: {reason}" for bad, reason in unreadable)
    raise CheckpointError(
      f"no checkpoint in {self.directory} can be read ({details}). Refusing to start again from scratch: "
      "move the directory away to do that (config.keep_checkpoints >= 2 keeps an older checkpoint to fall "
      "back to)"
    )

  def _restore_step(self, step: int, abstract_state: PyTree) -> tuple[PyTree, dict[str, Any]]:
    """Reads one step, migrating an older format, and checks it against its checksums.

    The metadata (format, writer, checksums) and the saved tree's layout are read first, straight from the
    step's files; then orbax restores the state in the layout they call for.

    Raises:
      _UnreadableCheckpoint: the step is damaged (a missing, truncated or changed piece).
      CheckpointError: the step is whole but this version cannot resume it (a newer format, or a state of
        another structure than ``abstract_state`` that no migration explains).
    """
    step_directory = self._manager.directory / str(step)
    with self._reading():
      saved_metadata = ocp.JsonCheckpointHandler().restore(step_directory / _METADATA)
      saved_layout = ocp.StandardCheckpointHandler().metadata(step_directory / _STATE)
      if not isinstance(saved_metadata, Mapping):
        raise TypeError(f"its metadata is a {type(saved_metadata).__name__}, not a JSON object")
    layout_target, rebuild = self._layout_for(
      step, saved_metadata, getattr(saved_layout, "tree", saved_layout), abstract_state
    )
    with self._reading():
      restored = self._manager.restore(
        step, args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(layout_target)})
      )
    state, metadata = rebuild(restored[_STATE]), dict(saved_metadata)
    checksums = metadata.pop(CHECKSUMS_KEY, None)
    if checksums is not None:  # checkpoints written before checksums existed are taken as they are
      check_checksums(state, metadata, checksums)
    for key in (_format.FORMAT_KEY, _format.WRITER_KEY):  # the caller gets back the metadata it saved
      metadata.pop(key, None)
    return state, metadata

  def _layout_for(
    self, step: int, metadata: Mapping[str, Any], saved_layout: PyTree, abstract_state: PyTree
  ) -> tuple[PyTree, Any]:
    """The restore target in the saved layout, and the function that turns what it reads into today's layout.

    The saved state's key paths, after the migrations from the saved format (renames), must be
    ``abstract_state``'s; the target is the saved tree with today's leaves (shapes, dtypes, shardings) put at
    the (renamed) places, and the restored values are put back into today's structure by path.
    """
    where = f"checkpoint {step} in {self.directory}, written by {_format.writer(metadata)},"
    try:
      migrations = _format.migrations_from(_format.saved_format(metadata))
    except ValueError as error:
      raise CheckpointError(
        f"{where} cannot be read by stalesgd {_format.stalesgd_version()} ({error}): resume it with the version that "
        "wrote it or a later one, or start this version in another workdir"
      ) from error
    saved, wanted = _leaves_by_path(saved_layout), _leaves_by_path(abstract_state)
    # Always through the saved layout, even when every leaf's path is today's: a state may have gained a
    # field without leaves (EngineState.inner_states is () without kept inner states), which changes the tree's
    # structure but no leaf, and orbax refuses a target whose structure differs from the saved one.
    renamed = {_format.migrated_path(path, migrations): path for path in saved}
    if renamed.keys() != wanted.keys():
      only_saved = sorted("/".join(path) for path in renamed.keys() - wanted.keys())
      only_wanted = sorted("/".join(path) for path in wanted.keys() - renamed.keys())
      raise CheckpointError(
        f"{where} holds a state of another structure than this run's (keys only in the checkpoint: "
        f"{only_saved[:4]}; only in this run: {only_wanted[:4]}), and no migration of format "
        f"{_format.saved_format(metadata)} to {_format.FORMAT} explains it. Resume it with the version that "
        "wrote it (its summary.json records it under provenance), or start this version in another workdir"
      )
    to_saved = {saved_path: today for today, saved_path in renamed.items()}
    layout_target = jax.tree_util.tree_map_with_path(
      lambda path, _: wanted[to_saved[key_path_names(path)]], saved_layout
    )

    def rebuild(restored: PyTree) -> PyTree:
      values = {to_saved[path]: value for path, value in _leaves_by_path(restored).items()}
      return jax.tree_util.tree_map_with_path(lambda path, _: values[key_path_names(path)], abstract_state)

    return layout_target, rebuild

  @contextlib.contextmanager
  def _reading(self):
    """Turns a failure to read part of a step into `_UnreadableCheckpoint`.

    Each attempt to read a step ends in orbax's restore barrier on every process (see
    `join_skipped_restore_barrier`); a process whose read fails before or inside orbax's restore joins it.
    """
    try:
      yield
    except Exception as error:  # orbax and tensorstore raise ValueError, OSError, KeyError, JSONDecodeError...
      if jax.process_count() > 1 and not is_barrier_error(error):  # the other processes may wait in it
        join_skipped_restore_barrier(self._manager)
      raise _UnreadableCheckpoint(f"{type(error).__name__}: {_first_line(error)}") from error

  def _set_aside(self, steps: Sequence[int]) -> list[str]:
    """Renames unreadable step directories to ``<step>.unreadable`` (primary process); returns the new paths."""
    targets = []
    for step in steps:
      source = self._manager.directory / str(step)
      target, copies = source.parent / f"{step}{UNREADABLE_SUFFIX}", 1
      while target.exists():
        copies += 1
        target = source.parent / f"{step}{UNREADABLE_SUFFIX}.{copies}"
      targets.append((source, target))
    barrier("stalesgd_checkpoint_set_aside_names")  # every process has chosen the names before any is taken
    if jax.process_index() == 0:
      for source, target in targets:
        if source.exists():
          source.rename(target)
    barrier("stalesgd_checkpoint_set_aside")
    self._manager.reload()
    return [os.fspath(target) for _, target in targets]

  def wait(self) -> None:
    """Blocks until every started save is complete on disk.

    Raises:
      CheckpointError: if a save failed (naming the directory and the newest intact step).
    """
    with self._reporting_write_errors("while waiting for the checkpoints being written"):
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases orbax's threads.

    Raises:
      CheckpointError: if a save failed (naming the directory and the newest intact step).
    """
    with self._reporting_write_errors("while closing the checkpointer"):
      self._manager.close()

  def _check_writable(self) -> None:
    """Creates and removes a file in a local checkpoint directory; raises OSError if it cannot.

    A save that orbax cannot even start (a read-only directory) leaves its
    background threads waiting, which would hold the dying process at exit;
    this check fails first, before any of them is started.
    """
    directory = os.fspath(self._manager.directory)
    if is_url(directory):
      return
    probe = os.path.join(directory, f".write_check.{os.getpid()}")
    with open(probe, "wb"):
      pass
    os.remove(probe)

  @contextlib.contextmanager
  def _reporting_write_errors(self, when: str):
    """Turns an orbax/tensorstore write failure into a `CheckpointError` that says what is still intact.

    A save is written in the background, so its failure surfaces at the next
    `save`, `wait` or `close`; ``when`` says which call noticed it.
    """
    try:
      yield
    except (ValueError, OSError) as error:
      try:
        self._manager.reload()
        intact = self.all_steps()
      except Exception:  # the report must not fail in its turn
        intact = []
      kept = (
        f"the newest complete checkpoint, {intact[-1]}, is intact and a restart resumes from it"
        if intact
        else "no complete checkpoint exists yet"
      )
      raise CheckpointError(
        f"writing a checkpoint in {self.directory} failed, noticed {when} ({type(error).__name__}: "
        f"{_first_line(error)}); {kept}. Fix the cause (disk space, quota, permissions), then restart"
      ) from error

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()


def _save_decision_policy(
  save_interval_steps: int | None, save_interval_seconds: int | None
) -> checkpoint_managers.SaveDecisionPolicy:
  """Orbax policy: the configured intervals, or every call, plus JAX's preemption sync point."""
  policies: list[checkpoint_managers.SaveDecisionPolicy] = [checkpoint_managers.PreemptionCheckpointingPolicy()]
  if save_interval_steps is not None:
    policies.append(checkpoint_managers.FixedIntervalPolicy(save_interval_steps))
  if save_interval_seconds is not None:
    policies.append(checkpoint_managers.ContinuousCheckpointingPolicy(minimum_interval_secs=save_interval_seconds))
  if save_interval_steps is None and save_interval_seconds is None:
    policies.append(checkpoint_managers.FixedIntervalPolicy(1))
  return checkpoint_managers.AnySavePolicy(policies)
