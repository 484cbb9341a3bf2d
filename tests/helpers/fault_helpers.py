"""What the fault-injection tests share: tiny configs on npz digits, damaging a checkpoint, comparing runs.

Runs are `train_helpers` runs (``tiny_run_config`` variants) with the data read
from the npz copy of the embedded digits; comparisons are those of
``tests/training/test_train_resume.py``: the final weights' digest, and
``metrics.jsonl`` record by record without the wall-clock fields.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from stalesgd.data._embedded import load_digits_splits
from stalesgd.training._loop import train_and_evaluate
from tests.helpers.train_helpers import (
  WALL_CLOCK_FIELDS,
  event_scalars,
  read_metrics,
  read_summary,
  tiny_config,
)


def write_digits_npz(directory: pathlib.Path) -> pathlib.Path:
  """``digits_{train,test}.npz`` in ``directory`` (uint8 images, int32 labels); returns ``directory``."""
  train, test = load_digits_splits()
  for split, source in (("train", train), ("test", test)):
    np.savez(directory / f"digits_{split}.npz", images=source.images, labels=source.labels)
  return directory


def fault_config(variant: str, digits_npz: pathlib.Path, **overrides: Any) -> ml_collections.ConfigDict:
  """`train_helpers.tiny_config` reading the digits from the npz files."""
  return tiny_config(variant, data_source="npz", data_dir=str(digits_npz), **overrides)


def npz_flags(digits_npz: pathlib.Path) -> list[str]:
  """The command-line overrides that make `tiny_run_config` read the npz digits."""
  return ["--config.data_source=npz", f"--config.data_dir={digits_npz}"]


def train_in_process(config: ml_collections.ConfigDict, workdir: os.PathLike) -> dict[str, Any]:
  return train_and_evaluate(config, str(workdir))


def without_wall_clock(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  return [{field: value for field, value in record.items() if field not in WALL_CLOCK_FIELDS} for record in records]


def assert_same_run(workdir: pathlib.Path, reference: dict[str, Any], reference_dir: pathlib.Path) -> None:
  """The run in ``workdir`` ended with the reference's weights, metrics records and TensorBoard scalars."""
  summary = read_summary(workdir)
  assert not summary["preempted"] and summary["updates"] == reference["updates"]
  assert summary["params_sha256"] == reference["params_sha256"]
  assert without_wall_clock(read_metrics(workdir)) == without_wall_clock(read_metrics(reference_dir))
  shown = lambda directory: {
    tag: points for tag, points in event_scalars(directory, apply_purges=True).items() if tag not in WALL_CLOCK_FIELDS
  }
  ours, theirs = shown(workdir), shown(reference_dir)
  differences = {
    tag: (
      sorted(set(ours.get(tag, [])) ^ set(theirs.get(tag, [])))[:4],
      len(ours.get(tag, [])),
      len(theirs.get(tag, [])),
    )
    for tag in ours.keys() | theirs.keys()
    if ours.get(tag) != theirs.get(tag)
  }
  assert not differences, f"TensorBoard scalars differ (tag: first differing points, counts ours/theirs): {differences}"


def state_files(checkpoint: pathlib.Path) -> list[pathlib.Path]:
  """The files of a checkpoint's ``state`` item, largest (the arrays' data) first."""
  files = [path for path in (checkpoint / "state").rglob("*") if path.is_file()]
  return sorted(files, key=lambda path: (-path.stat().st_size, str(path)))


def flip_one_bit(path: pathlib.Path, offset: int) -> None:
  """Flips the lowest bit of one byte: what a bad disk sector or a stray write does."""
  with open(path, "r+b") as file:
    file.seek(offset)
    byte = file.read(1)
    file.seek(offset)
    file.write(bytes([byte[0] ^ 1]))


def leaf_arrays(tree) -> list[np.ndarray]:
  """``tree``'s leaves as numpy arrays, a PRNG key as its key data (so that keys compare bit for bit)."""
  return [
    np.asarray(jax.random.key_data(leaf) if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf)
    for leaf in jax.tree.leaves(tree)
  ]


def _orbax_leaves(state_directory: pathlib.Path) -> list[np.ndarray]:
  """A plain orbax restore of a ``state`` item in its saved layout (no checksums), as `leaf_arrays`."""
  return leaf_arrays(ocp.StandardCheckpointer().restore(state_directory))


def _flip_is_read(state_directory: pathlib.Path, path: pathlib.Path, offset: int, intact: list[np.ndarray]) -> bool:
  """Whether flipping ``offset`` of ``path`` makes a plain orbax restore fail or return other values (on a copy)."""
  with tempfile.TemporaryDirectory() as scratch:
    copy = pathlib.Path(scratch) / state_directory.name
    shutil.copytree(state_directory, copy)
    flip_one_bit(copy / path.relative_to(state_directory), offset)
    try:
      damaged = _orbax_leaves(copy)
    except Exception:  # orbax (tensorstore) read the byte and refused it: any error type
      return True
  return len(damaged) != len(intact) or not all(np.array_equal(a, b) for a, b in zip(damaged, intact))


def flip_a_bit_a_restore_reads(checkpoint: pathlib.Path) -> tuple[pathlib.Path, int]:
  """Flips one bit of a checkpoint's state data at a byte a restore reads; returns the file and offset.

  A fixed offset does not do: an OCDBT checkpoint keeps bytes no restore reads (each process's own data files
  beside the merged ones, and stretches of files that are read), and where they lie changes from run to run
  with the timing of the asynchronous writes. So candidate bytes (the middle of each data file, largest file first,
  then its eighths) are tried on a copy, judged by a plain orbax restore without our checksums: the first whose
  flip makes that restore fail or return other values is flipped in place. On a one-file state (a single
  save) the first candidate, the middle of the arrays' data, is read back silently as other weights.
  """
  state_directory = checkpoint / "state"
  intact = _orbax_leaves(state_directory)
  data_files = [path for path in state_files(checkpoint) if path.parent.name == "d"]
  for path in data_files:
    size = path.stat().st_size
    for offset in dict.fromkeys([size // 2] + [size * eighth // 8 for eighth in (1, 3, 5, 7, 2, 6)]):
      if _flip_is_read(state_directory, path, offset, intact):
        flip_one_bit(path, offset)
        return path, offset
  raise AssertionError(f"no candidate byte of {state_directory}'s data files changes what orbax restores")
