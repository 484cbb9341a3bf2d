"""Data sets read with ``tfds.data_source`` (ArrayRecord random access; no TensorFlow).

CIFAR-10, MNIST and Fashion-MNIST are read once into memory (`ArraySource`):
decoding every PNG once is cheaper than decoding on every mini-batch, and the
normalisation statistics need a full pass anyway. ImageNet (``imagenet2012``,
whose ``validation`` split serves as the test split) stays a `LazyImageSource`
whose JPEGs are decoded and cropped per requested example, on ``data_workers`` threads.

Nothing here downloads: ``tfds.data_source(..., download=False)`` only opens a
prepared data set, and when that fails the error says whether the data set is
missing from ``data_dir`` or prepared in a format without random access.
`stalesgd.data.prepare` writes such a data set from local files, offline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stalesgd.data._dataset import DatasetNotPreparedError
from stalesgd.data._sources import ArraySource, ImageSource, LazyImageSource

TFDS_SPLITS = {
  "cifar10": ("train", "test"),
  "mnist": ("train", "test"),
  "fashion_mnist": ("train", "test"),
  "imagenet2012": ("train", "validation"),
}
LAZY_TFDS_DATASETS = ("imagenet2012",)


def _not_prepared(name: str, data_dir: str | None, error: Exception) -> DatasetNotPreparedError:
  import tensorflow_datasets as tfds

  where = f"data_dir={data_dir!r}" if data_dir else "the default tfds data_dir (~/tensorflow_datasets)"
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    return DatasetNotPreparedError(
      f"dataset {name!r} is not prepared in {where} (looked in {builder.data_dir}). stalesgd never "
      "downloads: convert a local copy with `python -m stalesgd.data.prepare "
      f"{name} --from=DIR --data_dir=DATA_DIR` (docs/data.md lists the accepted files), or on a machine "
      f"with network run tfds.builder({name!r}, data_dir=DATA_DIR).download_and_prepare("
      "file_format='array_record'); then pass DATA_DIR as data_dir. Or use source='npz' (local arrays) "
      f"or source='embedded' (dataset 'digits'). tfds said: {error}"
    )
  return DatasetNotPreparedError(
    f"dataset {name!r} in {where} is prepared as {builder.info.file_format}, which has no random "
    "access: re-prepare it into another data_dir with download_and_prepare(file_format='array_record') "
    f"or, from local files, `python -m stalesgd.data.prepare {name} --from=DIR --data_dir=DATA_DIR`. "
    f"tfds said: {error}"
  )


def _materialise(examples: Any) -> ArraySource:
  # One pass: indexing a tfds data source decodes the whole example, image included.
  decoded = [examples[index] for index in range(len(examples))]
  images = np.stack([np.asarray(example["image"], np.uint8) for example in decoded])
  labels = np.array([int(example["label"]) for example in decoded], np.int32)
  return ArraySource(images, labels)


def load_tfds_splits(
  name: str, data_dir: str | None, *, image_size: int = 224, data_workers: int = 1
) -> tuple[ImageSource, ImageSource, int]:
  """(train, test, num_classes) of a prepared tfds data set.

  Args:
    name: one of `TFDS_SPLITS`.
    data_dir: tfds data directory (None: tfds's default).
    image_size: side of the crops of lazily read data sets (ImageNet).
    data_workers: decoding threads of lazily read data sets (`LazyImageSource`).

  Raises:
    DatasetNotPreparedError: when the data set is not prepared for random access.
  """
  import tensorflow_datasets as tfds  # Deferred: only this source needs it.

  if name not in TFDS_SPLITS:
    raise ValueError(f"dataset {name!r} is not available from tfds here; choose from {sorted(TFDS_SPLITS)}")
  lazy = name in LAZY_TFDS_DATASETS
  decoders = {"image": tfds.decode.SkipDecoding()} if lazy else None
  try:
    train, test = tfds.data_source(
      name, split=list(TFDS_SPLITS[name]), data_dir=data_dir, download=False, decoders=decoders
    )
  except (ValueError, NotImplementedError, AssertionError, OSError) as error:
    raise _not_prepared(name, data_dir, error) from error
  num_classes = tfds.builder(name, data_dir=data_dir).info.features["label"].num_classes
  if lazy:
    return (
      LazyImageSource(train, image_size=image_size, workers=data_workers),
      LazyImageSource(test, image_size=image_size, workers=data_workers),
      num_classes,
    )
  return _materialise(train), _materialise(test), num_classes
