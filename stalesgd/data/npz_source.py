"""Local arrays: ``<data_dir>/<name>_train.npz`` and ``<data_dir>/<name>_test.npz``.

Each file holds ``images`` (uint8 [N, H, W] or [N, H, W, C]) and ``labels``
(integers [N]), the layout docs/data.md describes (with a recipe from the CIFAR-10 python
batches); for machines without a network.
"""

from __future__ import annotations

import os

import numpy as np

from stalesgd.data.dataset import DatasetNotPreparedError
from stalesgd.data.sources import ArraySource

NPZ_SPLITS = ("train", "test")


def npz_path(data_dir: str, name: str, split: str) -> str:
  """The file holding one split."""
  return os.path.join(data_dir, f"{name}_{split}.npz")


def load_npz_splits(name: str, data_dir: str | None) -> tuple[ArraySource, ArraySource]:
  """(train, test) sources read from ``<data_dir>/<name>_{train,test}.npz``.

  Raises:
    DatasetNotPreparedError: when ``data_dir`` is missing or a file is absent.
    ValueError: when a file lacks ``images`` / ``labels`` or they are malformed.
  """
  if not data_dir:
    raise DatasetNotPreparedError(
        f"data_dir is required for source='npz': the directory holding {name}_train.npz and "
        f"{name}_test.npz (arrays 'images' uint8 [N,H,W(,C)] and 'labels' [N])")
  splits = []
  for split in NPZ_SPLITS:
    path = npz_path(data_dir, name, split)
    if not os.path.isfile(path):
      raise DatasetNotPreparedError(
          f"dataset {name!r}: {path} does not exist (data_dir={data_dir!r}); write it with arrays "
          "'images' uint8 [N,H,W(,C)] and 'labels' [N] (docs/data.md has a recipe for CIFAR-10), or use "
          "source='tfds' with a prepared tfds data_dir")
    with np.load(path) as arrays:
      missing = {"images", "labels"} - set(arrays.files)
      if missing:
        raise ValueError(f"{path} lacks array(s) {sorted(missing)}; it has {sorted(arrays.files)}")
      splits.append(ArraySource(arrays["images"], arrays["labels"]))
  return splits[0], splits[1]
