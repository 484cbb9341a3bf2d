"""CRC-32 integrity checks of a checkpoint: computed by `Checkpointer.save`, compared by `Checkpointer.restore`.

orbax and tensorstore notice missing and truncated pieces of a checkpoint, but read changed bytes back as
other weights. So `save` stores, in the metadata under `CHECKSUMS_KEY`:

* ``"state"``: a CRC-32 (with dtype and shape) of every array of the state a process holds whole, in tree
  order (`state_checksums`); a PRNG key counts by its key data;
* ``"metadata"``: a CRC-32 of the metadata itself (`metadata_checksum`);
* ``"process_sharded_state"``, when some array is sharded over processes (no process holds it whole): for
  each such array, one CRC-32 per process over the shards that process holds, gathered at save time
  (`process_sharded_checksums`, a collective).

`check_checksums` compares a restored step with them and raises `_UnreadableCheckpoint` on a mismatch; each
process checks its own shards of a process-sharded array, and `Checkpointer.restore` agrees across
processes on the outcome.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from stalesgd.training.checkpoint._errors import _UnreadableCheckpoint

PyTree = Any
# Metadata key of the CRC-32s written by `Checkpointer.save` (removed from what `restore` returns).
CHECKSUMS_KEY = "_checksums"


def _without_keys(leaf: Any) -> Any:
  """A PRNG key array as its key data (checksums see the bits); any other leaf as it is."""
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(leaf)
  return leaf


def _is_process_sharded(leaf: Any) -> bool:
  """Whether ``leaf`` is split over several processes, so that none holds it whole."""
  return isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and not leaf.is_fully_replicated


def _leaf_array(leaf: Any) -> np.ndarray | None:
  """A leaf as a host array (a PRNG key as its key data), or None when this process does not hold it whole."""
  leaf = _without_keys(leaf)
  if _is_process_sharded(leaf):
    return None  # each process holds only part of it: see `_local_shards_checksum`
  if isinstance(leaf, jax.Array):
    leaf = jax.device_get(leaf) if leaf.is_fully_addressable else leaf.addressable_data(0)
  return np.ascontiguousarray(np.asarray(leaf))


def _crc32(array: np.ndarray, start: int = 0) -> int:
  return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8), start)


def _local_shards_checksum(leaf: jax.Array) -> list[int]:
  """[CRC-32 of this process's layout of ``leaf``, CRC-32 of the bytes of its distinct shards] for a leaf
  sharded over processes.

  The layout (dtype, global shape, the index ranges of the shards held) tells whether a restored leaf is laid
  out as the saved one was, so that its bytes can be compared.
  """
  leaf = _without_keys(leaf)
  shards = {}
  for shard in leaf.addressable_shards:  # devices of one process may hold the same shard: count it once
    ranges = tuple(tuple(piece.indices(size)[:2]) for piece, size in zip(shard.index, leaf.shape))
    shards.setdefault(ranges, shard)
  layout = json.dumps([str(leaf.dtype), list(leaf.shape), sorted(shards)])
  crc = 0
  for ranges in sorted(shards):
    crc = _crc32(np.asarray(shards[ranges].data), crc)
  return [zlib.crc32(layout.encode("utf-8")), crc]


def process_sharded_checksums(state: PyTree) -> dict[str, Any] | None:
  """Every process's `_local_shards_checksum` of every leaf sharded over processes (a collective), or None.

  Returns ``{"processes": P, "leaves": [None, or P x [layout CRC, bytes CRC], per leaf in tree order]}``.
  Every process must call it, in the same order (the state has the same tree and shardings everywhere).
  """
  leaves = jax.tree_util.tree_leaves(state)
  sharded = [index for index, leaf in enumerate(leaves) if _is_process_sharded(leaf)]
  if not sharded:
    return None
  # As int32 bit patterns: JAX (without x64) would wrap int64 CRCs to 32 bits on the way.
  local = np.asarray([_local_shards_checksum(leaves[index]) for index in sharded], np.uint32).view(np.int32)
  gathered = np.asarray(multihost_utils.process_allgather(local)).view(np.uint32)  # [P, sharded leaves, 2]
  table: list[Any] = [None] * len(leaves)
  for position, index in enumerate(sharded):
    table[index] = gathered[:, position].tolist()
  return {"processes": jax.process_count(), "leaves": table}


def state_checksums(state: PyTree) -> list[dict[str, Any] | None]:
  """CRC-32, dtype and shape of every leaf, in tree order (None for a leaf this process does not hold whole)."""
  checksums = []
  for leaf in jax.tree_util.tree_leaves(state):
    array = _leaf_array(leaf)
    checksums.append(
      None if array is None else {"crc32": _crc32(array), "dtype": str(array.dtype), "shape": list(array.shape)}
    )
  return checksums


def metadata_checksum(metadata: Mapping[str, Any]) -> int:
  return zlib.crc32(json.dumps(metadata, sort_keys=True).encode("utf-8"))


def _check_length(what: str, table: Any, leaves: Sequence[Any]) -> None:
  """Raises `_UnreadableCheckpoint` unless ``table`` (``what``, as saved) is a list with one entry per leaf."""
  if not isinstance(table, list) or len(table) != len(leaves):
    count = len(table) if isinstance(table, list) else table
    raise _UnreadableCheckpoint(f"its {what} list {count!r} arrays, the state has {len(leaves)}")


def check_checksums(state: PyTree, metadata: Mapping[str, Any], checksums: Any) -> None:
  """Compares a restored step (``metadata`` without `CHECKSUMS_KEY`) with the ``checksums`` saved with it.

  Raises:
    _UnreadableCheckpoint: naming what does not match.
  """
  if not isinstance(checksums, Mapping) or checksums.get("metadata") != metadata_checksum(metadata):
    raise _UnreadableCheckpoint("its metadata does not match the checksum written with it")
  saved = checksums.get("state")
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  _check_length("checksums", saved, leaves)
  for (path, leaf), expected in zip(leaves, saved):
    array = None if not isinstance(expected, Mapping) else _leaf_array(leaf)
    # A leaf restored into another dtype or shape than it was saved with (a cast the target asked for)
    # has other bytes by design; only a leaf read back as written is compared.
    if (
      array is not None
      and str(array.dtype) == expected.get("dtype")
      and list(array.shape) == expected.get("shape")
      and _crc32(array) != expected.get("crc32")
    ):
      raise _UnreadableCheckpoint(
        f"array {jax.tree_util.keystr(path)} does not match the checksum written with it (its bytes changed on disk)"
      )
  _check_process_shards(leaves, checksums.get("process_sharded_state"))


def _check_process_shards(leaves: Sequence[tuple[Any, Any]], saved: Any) -> None:
  """Compares this process's shards of every process-sharded leaf with the checksums saved for this process.

  Only where the run has as many processes as the one that saved, and this process holds the same shards of
  the same dtype and shape (restoring into another layout reads other bytes by design). Any process raising
  makes every process set the step aside (`Checkpointer.restore` agrees across processes).
  """
  if not isinstance(saved, Mapping) or saved.get("processes") != jax.process_count():
    return
  table = saved.get("leaves")
  _check_length("process-sharded checksums", table, leaves)
  for (path, leaf), expected in zip(leaves, table):
    if expected is None or not _is_process_sharded(leaf):
      continue
    layout, crc = _local_shards_checksum(leaf)
    mine = expected[jax.process_index()] if isinstance(expected, list) else None
    if isinstance(mine, list) and mine[0] == layout and mine[1] != crc:
      raise _UnreadableCheckpoint(
        f"the shards of array {jax.tree_util.keystr(path)} held by process "
        f"{jax.process_index()} do not match the checksum written with them (their bytes "
        "changed on disk)"
      )
