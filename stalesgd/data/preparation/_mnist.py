"""MNIST and Fashion-MNIST from their IDX files (gzipped or not) or from npz arrays.

Both data sets ship as the same four IDX files: ``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and
``t10k-labels-idx1-ubyte``, usually with ``.gz``; some mirrors write
``train-images.idx3-ubyte``, which is accepted too. An IDX file is two zero
bytes, a type byte (0x08: unsigned bytes, the only type these files use), the
number of dimensions, each dimension as a big-endian uint32, then the data in
row-major order.
"""

from __future__ import annotations

import gzip
import os

import numpy as np

from stalesgd.data._npz_source import load_npz_splits
from stalesgd.data._sources import ArraySource
from stalesgd.data.preparation._layouts import Layout, find_layout, npz_layout

NAMES = ("mnist", "fashion_mnist")
# split -> (images, labels) file stems.
IDX_STEMS = {
  "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
  "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_UNSIGNED_BYTE = 0x08


def _accepted_names(stem: str) -> tuple[str, ...]:
  dotted = stem.replace("-idx", ".idx")
  return (f"{stem}.gz", stem, f"{dotted}.gz", dotted)


IDX_LAYOUT = Layout(
  "IDX files", tuple(_accepted_names(stem) for split in ("train", "test") for stem in IDX_STEMS[split])
)


def read_idx(path: str) -> np.ndarray:
  """The uint8 array of an IDX file (``.gz`` files are decompressed)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as file:
    data = file.read()
  if len(data) < 4 or data[0] or data[1]:
    raise ValueError(f"{path}: not an IDX file (it must start with two zero bytes, a type byte and a rank)")
  if data[2] != _UNSIGNED_BYTE:
    raise ValueError(f"{path}: IDX element type 0x{data[2]:02x} is not supported; MNIST uses 0x08 (uint8)")
  rank = data[3]
  header = 4 + 4 * rank
  shape = tuple(int(size) for size in np.frombuffer(data[4:header], dtype=">u4"))
  if len(shape) != rank or len(data) - header != int(np.prod(shape)):
    raise ValueError(f"{path}: the header announces shape {shape}, but {len(data) - header} data bytes follow")
  return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_splits(name: str, from_dir: str) -> tuple[str, dict[str, ArraySource]]:
  """(what was read, {"train": ..., "test": ...}) of MNIST or Fashion-MNIST in ``from_dir``.

  Raises:
    MissingInputError: neither the IDX files nor the npz arrays are complete.
    ValueError: ``name`` is not one of `NAMES`, or a file is malformed.
  """
  if name not in NAMES:
    raise ValueError(f"IDX files hold {NAMES}; got {name!r}")
  layout, paths = find_layout(name, from_dir, (IDX_LAYOUT, npz_layout(name)))
  directory = os.path.dirname(paths[0])
  if layout is IDX_LAYOUT:
    arrays = [read_idx(path) for path in paths]
    splits = {}
    for split, (images, labels) in zip(("train", "test"), (arrays[:2], arrays[2:])):
      if images.ndim != 3 or labels.ndim != 1:
        raise ValueError(
          f"{name} {split}: IDX images must be [N, H, W] and labels [N]; got {images.shape} and {labels.shape}"
        )
      splits[split] = ArraySource(images, labels)
  else:
    train, test = load_npz_splits(name, directory)
    splits = {"train": train, "test": test}
  return f"{layout.description} in {directory}", splits
