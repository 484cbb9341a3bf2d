"""Data sets read with ``tfds.data_source`` (ArrayRecord random access; no TensorFlow).

Any prepared tfds image-classification data set: an image feature and a class-label feature (``"image"`` and
``"label"`` unless ``image_key`` / ``label_key`` say otherwise), two splits (`TFDS_SPLITS` knows those of the
papers' data sets; others default to ``train`` / ``test``, or ``train_split`` / ``test_split``), and the class
count from its ``DatasetInfo``. A name that is neither a tfds data set nor prepared in ``data_dir`` is refused
with the list of what ``data_dir`` holds.

Small data sets are read once into memory (`ArraySource`):
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
DEFAULT_SPLITS = ("train", "test")
LAZY_TFDS_DATASETS = ("imagenet2012",)


def prepared_datasets(data_dir: str | None) -> list[str]:
  """Names of the data sets prepared in a tfds ``data_dir`` (``<name>/<version>/dataset_info.json``)."""
  import tensorflow_datasets as tfds
  from etils import epath

  root = epath.Path(data_dir) if data_dir else epath.Path(tfds.core.constants.DATA_DIR)
  if not root.is_dir():
    return []
  return sorted(
    entry.name
    for entry in root.iterdir()
    if entry.is_dir()
    and any((version / "dataset_info.json").exists() for version in entry.iterdir() if version.is_dir())
  )


def _unknown(name: str, data_dir: str | None) -> ValueError:
  where = f"data_dir={data_dir!r}" if data_dir else "the default tfds data_dir"
  return ValueError(
    f"config.dataset={name!r} is neither a tfds data set nor prepared in {where}; prepared there: "
    f"{prepared_datasets(data_dir) or 'none'}. Or use data_source='npz' (local arrays), 'python' (a function by "
    "import path) or 'embedded' ('digits')"
  )


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


def _materialise(examples: Any, image_key: str, label_key: str) -> ArraySource:
  # One pass: indexing a tfds data source decodes the whole example, image included.
  decoded = [examples[index] for index in range(len(examples))]
  images = np.stack([np.asarray(example[image_key], np.uint8) for example in decoded])
  labels = np.array([int(example[label_key]) for example in decoded], np.int32)
  return ArraySource(images, labels)


def _check_features(name: str, features: Any, image_key: str, label_key: str) -> int:
  """The class count of ``label_key``; raises ValueError naming the keys the data set has."""
  import tensorflow_datasets as tfds

  keys = sorted(features.keys()) if hasattr(features, "keys") else []
  for field, key in (("image_key", image_key), ("label_key", label_key)):
    if key not in keys:
      raise ValueError(f"config.{field}={key!r} is not a feature of tfds data set {name!r}; its features: {keys}")
  if not isinstance(features[image_key], tfds.features.Image):
    kind = type(features[image_key]).__name__
    raise ValueError(f"config.image_key={image_key!r} of tfds data set {name!r} is a {kind}, not an Image")
  label = features[label_key]
  if not isinstance(label, tfds.features.ClassLabel):
    raise ValueError(
      f"config.label_key={label_key!r} of tfds data set {name!r} is a {type(label).__name__}, not a ClassLabel "
      "(a class count); allowed: an image-classification data set"
    )
  return int(label.num_classes)


def load_tfds_splits(
  name: str,
  data_dir: str | None,
  *,
  image_size: int = 224,
  data_workers: int = 1,
  train_split: str | None = None,
  test_split: str | None = None,
  image_key: str = "image",
  label_key: str = "label",
) -> tuple[ImageSource, ImageSource, int]:
  """(train, test, num_classes) of a prepared tfds data set.

  Args:
    name: any tfds image-classification data set prepared in ``data_dir``.
    data_dir: tfds data directory (None: tfds's default).
    image_size: side of the crops of lazily read data sets (ImageNet).
    data_workers: decoding threads of lazily read data sets (`LazyImageSource`).
    train_split, test_split: the splits to train and evaluate on (None: `TFDS_SPLITS`, or train / test).
    image_key, label_key: the image and class-label features.

  Raises:
    DatasetNotPreparedError: when the data set is not prepared for random access.
    ValueError: an unknown name (listing what ``data_dir`` holds), or features that are not an image and a
      class label.
  """
  import tensorflow_datasets as tfds  # Deferred: only this source needs it.

  default_train, default_test = TFDS_SPLITS.get(name, DEFAULT_SPLITS)
  splits = [train_split or default_train, test_split or default_test]
  try:
    builder = tfds.builder(name, data_dir=data_dir)  # also one prepared in data_dir by an unregistered builder
  except tfds.core.registered.DatasetNotFoundError as error:
    raise _unknown(name, data_dir) from error
  lazy = name in LAZY_TFDS_DATASETS
  decoders = {image_key: tfds.decode.SkipDecoding()} if lazy else None
  try:
    num_classes = _check_features(name, builder.info.features, image_key, label_key)
    known_splits = builder.info.splits  # empty until the data set is prepared
    unknown_splits = [split for split in splits if known_splits and split not in known_splits]
    if unknown_splits:
      raise ValueError(
        f"tfds data set {name!r} has no split(s) {unknown_splits}; its splits: {sorted(builder.info.splits)}"
      )
    train, test = tfds.data_source(name, split=splits, data_dir=data_dir, download=False, decoders=decoders)
  except (NotImplementedError, AssertionError, OSError) as error:
    raise _not_prepared(name, data_dir, error) from error
  except ValueError as error:
    if str(error).startswith(("config.", "tfds data set")):
      raise
    raise _not_prepared(name, data_dir, error) from error
  if lazy:
    return (
      LazyImageSource(train, image_size=image_size, workers=data_workers),
      LazyImageSource(test, image_size=image_size, workers=data_workers),
      num_classes,
    )
  return _materialise(train, image_key, label_key), _materialise(test, image_key, label_key), num_classes
