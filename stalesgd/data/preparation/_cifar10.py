"""CIFAR-10 from its distributed batches (python or binary) or from npz arrays.

The two archives Krizhevsky distributes unpack to ``cifar-10-batches-py/``
(``data_batch_1`` .. ``data_batch_5``, ``test_batch``: pickled dicts whose
``data`` is uint8 [10000, 3072] in channel-major order and ``labels`` a list)
and ``cifar-10-batches-bin/`` (``data_batch_1.bin`` .. ``test_batch.bin``:
records of one label byte followed by 3072 image bytes, channel-major). Either
folder, the directory above it, or a directory with the npz arrays of
``source='npz'`` is accepted; training batches are concatenated in order 1..5,
as tfds's own CIFAR-10 builder does.

The python batches are pickles: unpickling runs code chosen by whoever made the
file, so convert only copies from a source you trust.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from stalesgd.data._npz_source import load_npz_splits
from stalesgd.data._sources import ArraySource
from stalesgd.data.preparation._layouts import Layout, find_layout, npz_layout

NAME = "cifar10"
# The class names of batches.meta, in label order.
LABEL_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_BATCHES = tuple(f"data_batch_{index}" for index in range(1, 6))
TEST_BATCH = "test_batch"
ARCHIVE_FOLDERS = ("cifar-10-batches-py", "cifar-10-batches-bin")
_SIDE, _CHANNELS = 32, 3
_IMAGE_BYTES = _SIDE * _SIDE * _CHANNELS

PYTHON_LAYOUT = Layout("CIFAR-10 python batches", tuple((batch,) for batch in (*TRAIN_BATCHES, TEST_BATCH)))
BINARY_LAYOUT = Layout("CIFAR-10 binary batches", tuple((f"{batch}.bin",) for batch in (*TRAIN_BATCHES, TEST_BATCH)))


def _channel_major_to_images(data: np.ndarray, path: str) -> np.ndarray:
  if data.ndim != 2 or data.shape[1] != _IMAGE_BYTES:
    raise ValueError(f"{path}: image data must be [N, {_IMAGE_BYTES}] bytes; got shape {data.shape}")
  return data.reshape(-1, _CHANNELS, _SIDE, _SIDE).transpose(0, 2, 3, 1)


def read_python_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, 32, 32, 3], labels [N]) of one pickled batch."""
  with open(path, "rb") as file:
    batch = pickle.load(file, encoding="bytes")  # Python 2 pickles: keys are bytes.
  if not isinstance(batch, dict):
    raise ValueError(f"{path}: expected a pickled dict with 'data' and 'labels'; got {type(batch).__name__}")
  batch = {key.decode() if isinstance(key, bytes) else key: value for key, value in batch.items()}
  missing = {"data", "labels"} - set(batch)
  if missing:
    raise ValueError(f"{path}: the pickled batch lacks {sorted(missing)}; it has {sorted(map(str, batch))}")
  images = _channel_major_to_images(np.asarray(batch["data"], np.uint8), path)
  labels = np.asarray(batch["labels"], np.int64)
  if labels.shape != (images.shape[0],):
    raise ValueError(f"{path}: {images.shape[0]} images but labels of shape {labels.shape}")
  return images, labels


def read_binary_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [N, 32, 32, 3], labels [N]) of one binary batch."""
  records = np.fromfile(path, dtype=np.uint8)
  if records.size % (1 + _IMAGE_BYTES):
    raise ValueError(
      f"{path}: {records.size} bytes is not a whole number of {1 + _IMAGE_BYTES}-byte "
      "records (one label byte, then 3072 image bytes)"
    )
  records = records.reshape(-1, 1 + _IMAGE_BYTES)
  return _channel_major_to_images(records[:, 1:], path), records[:, 0].astype(np.int64)


def _concatenate(parts: list[tuple[np.ndarray, np.ndarray]]) -> ArraySource:
  return ArraySource(np.concatenate([images for images, _ in parts]), np.concatenate([labels for _, labels in parts]))


def read_splits(from_dir: str) -> tuple[str, dict[str, ArraySource]]:
  """(what was read, {"train": 50,000 examples, "test": 10,000}) from ``from_dir``.

  Raises:
    MissingInputError: no accepted layout is complete in ``from_dir`` (or its
      ``cifar-10-batches-*`` folder).
    ValueError: a file is malformed.
  """
  layout, paths = find_layout(NAME, from_dir, (PYTHON_LAYOUT, BINARY_LAYOUT, npz_layout(NAME)), ARCHIVE_FOLDERS)
  directory = os.path.dirname(paths[0])
  if layout is PYTHON_LAYOUT or layout is BINARY_LAYOUT:
    read = read_python_batch if layout is PYTHON_LAYOUT else read_binary_batch
    parts = [read(path) for path in paths]
    splits = {"train": _concatenate(parts[:-1]), "test": _concatenate(parts[-1:])}
  else:
    train, test = load_npz_splits(NAME, directory)
    splits = {"train": train, "test": test}
  return f"{layout.description} in {directory}", splits
