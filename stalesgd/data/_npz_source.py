"""Local arrays: ``<data_dir>/<name>_train.npz`` and ``<data_dir>/<name>_test.npz``.

Each file holds ``images`` (uint8 [N, H, W] or [N, H, W, C]) and ``labels``
(integers [N]), the layout docs/data.md describes (with a recipe from the CIFAR-10 python
batches); for machines without a network.

Both files are checked when they are loaded, before anything is built or
compiled: a file that is not a readable npz archive (truncated, overwritten,
pickled), missing arrays, wrong dtypes or shapes, an empty split, labels out
of range, and train and test images of different shapes each raise a
ValueError naming the file and what is allowed.
"""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

from stalesgd.data._dataset import KNOWN_NUM_CLASSES, DatasetNotPreparedError
from stalesgd.data._sources import ArraySource

NPZ_SPLITS = ("train", "test")
_LAYOUT = "arrays 'images' uint8 [N,H,W(,C)] and 'labels' integers [N]"


def npz_path(data_dir: str, name: str, split: str) -> str:
  """The file holding one split."""
  return os.path.join(data_dir, f"{name}_{split}.npz")


def _read_arrays(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(images, labels) as stored in ``path``; raises ValueError naming the file if it cannot be read."""
  try:
    with zipfile.ZipFile(path) as archive:  # np.load would take a non-zip file for a .npy or a pickle
      members = archive.namelist()
    with np.load(path, allow_pickle=False) as arrays:
      missing = {"images", "labels"} - set(arrays.files)
      if missing:
        raise ValueError(f"{path} lacks array(s) {sorted(missing)}; it has {sorted(arrays.files)}; allowed: {_LAYOUT}")
      return arrays["images"], arrays["labels"]  # reading checks each member's CRC-32
  except ValueError as error:
    if str(error).startswith(path):
      raise
    raise ValueError(
      f"{path} cannot be read as an npz file ({error}); allowed: an np.savez archive of "
      f"{_LAYOUT}, without object arrays"
    ) from error
  except (OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as error:
    detail = f"{type(error).__name__}: {error}"
    if "members" in locals():
      detail += f"; its members are {members}"
    raise ValueError(
      f"{path} is not a readable npz file, truncated or corrupt? ({detail}); allowed: an np.savez archive of {_LAYOUT}"
    ) from error


def _check_split(path: str, images: np.ndarray, labels: np.ndarray, num_classes: int | None) -> None:
  """Dtypes, shapes and label range of one split, with messages naming the file."""
  if images.dtype != np.uint8:
    detail = ""
    if np.issubdtype(images.dtype, np.floating):
      non_finite = int(np.count_nonzero(~np.isfinite(images)))
      detail = f" ({non_finite} of its pixels are NaN or infinite)" if non_finite else ""
    raise ValueError(
      f"{path}: 'images' has dtype {images.dtype}{detail}; allowed: uint8 pixels 0-255 "
      "(convert with np.clip(images, 0, 255).astype(np.uint8) after checking the values)"
    )
  if images.ndim not in (3, 4) or 0 in images.shape[1:]:
    raise ValueError(f"{path}: 'images' has shape {images.shape}; allowed: [N, H, W] or [N, H, W, C] with H, W, C >= 1")
  if images.shape[0] == 0:
    raise ValueError(f"{path}: 'images' holds no example (shape {images.shape}); allowed: N >= 1")
  if not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"{path}: 'labels' has dtype {labels.dtype}; allowed: integers (class indices)")
  if labels.shape != (images.shape[0],):
    raise ValueError(
      f"{path}: 'labels' has shape {labels.shape}; allowed: [N] = ({images.shape[0]},), one label per image"
    )
  low, high = int(labels.min()), int(labels.max())
  if low < 0 or (num_classes is not None and high >= num_classes):
    allowed = f"0 to {num_classes - 1}" if num_classes is not None else ">= 0"
    raise ValueError(f"{path}: 'labels' range from {low} to {high}; allowed: {allowed}")


def load_npz_splits(name: str, data_dir: str | None) -> tuple[ArraySource, ArraySource]:
  """(train, test) sources read from ``<data_dir>/<name>_{train,test}.npz``.

  Raises:
    DatasetNotPreparedError: when ``data_dir`` is missing or a file is absent.
    ValueError: naming the file, when it is not a readable npz archive, lacks
      ``images`` / ``labels``, or they are malformed (dtype, shape, empty,
      labels negative or beyond the data set's known class count), or when
      the two files' images differ in shape.
  """
  if not data_dir:
    raise DatasetNotPreparedError(
      f"data_dir is required for source='npz': the directory holding {name}_train.npz and "
      f"{name}_test.npz (arrays 'images' uint8 [N,H,W(,C)] and 'labels' [N])"
    )
  splits, paths = [], []
  for split in NPZ_SPLITS:
    path = npz_path(data_dir, name, split)
    if not os.path.isfile(path):
      raise DatasetNotPreparedError(
        f"dataset {name!r}: {path} does not exist (data_dir={data_dir!r}); write it with arrays "
        "'images' uint8 [N,H,W(,C)] and 'labels' [N] (docs/data.md has a recipe for CIFAR-10), or use "
        "source='tfds' with a prepared tfds data_dir"
      )
    images, labels = _read_arrays(path)
    _check_split(path, images, labels, KNOWN_NUM_CLASSES.get(name))
    splits.append(ArraySource(images, labels))
    paths.append(path)
  train, test = splits
  if train.image_shape != test.image_shape:
    raise ValueError(
      f"{paths[1]}: images of shape {test.image_shape} (H, W, C), but {paths[0]} has "
      f"{train.image_shape}; allowed: the same image shape in both files"
    )
  return train, test
