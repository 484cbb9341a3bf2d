"""`load_dataset`: one entry point for every data source.

* ``source="tfds"``: any image-classification data set prepared in a
  tensorflow-datasets ``data_dir`` (``cifar10``, ``mnist``, ``fashion_mnist``,
  ``imagenet2012``, ...), with configurable splits and feature keys
  (`stalesgd.data._tfds_source`);
* ``source="npz"``: ``<data_dir>/<dataset>_{train,test}.npz`` for any name
  (`stalesgd.data._npz_source`);
* ``source="python"``: ``dataset`` is the import path of a function returning
  in-memory arrays (`stalesgd.data._python_source`);
* ``source="embedded"``: ``digits``, shipped with scikit-learn
  (`stalesgd.data._embedded`).

Arguments are checked and missing data reported (`DatasetNotPreparedError`,
naming ``dataset`` / ``data_dir`` and what to do) before anything is read;
nothing is ever downloaded.
"""

from __future__ import annotations

import numpy as np

from stalesgd.data._dataset import KNOWN_NUM_CLASSES, Dataset
from stalesgd.data._embedded import EMBEDDED_DATASETS, load_digits_splits
from stalesgd.data._normalization import NORMALIZATIONS, fit_normalization
from stalesgd.data._npz_source import load_npz_splits
from stalesgd.data._python_source import load_python_splits
from stalesgd.data._tfds_source import load_tfds_splits
from stalesgd.data._validation_split import hold_out_validation
from stalesgd.utils._import_path import is_import_path

SOURCES = ("tfds", "npz", "embedded", "python")


def _check_arguments(name: str, source: str, normalization: str) -> None:
  if source not in SOURCES:
    raise ValueError(f"source must be one of {SOURCES}; got {source!r}")
  if normalization not in NORMALIZATIONS:
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}; got {normalization!r}")
  if (source == "python") != is_import_path(name):
    raise ValueError(
      f"dataset {name!r} with source={source!r}: an import path 'package.module:function' goes with "
      "source='python', and only there"
    )
  if source == "embedded" and name not in EMBEDDED_DATASETS:
    raise ValueError(f"dataset {name!r} is not embedded; the embedded data sets are {EMBEDDED_DATASETS}")


def load_dataset(
  name: str,
  *,
  source: str = "tfds",
  data_dir: str | None = None,
  normalization: str = "per_channel",
  image_size: int = 224,
  data_workers: int = 1,
  train_split: str | None = None,
  test_split: str | None = None,
  image_key: str = "image",
  label_key: str = "label",
  validation_fraction: float = 0.0,
) -> Dataset:
  """Loads a data set and fits its input normalisation on the training split.

  Args:
    name: data set name (``dataset`` in configs), e.g. ``"cifar10"``, ``"digits"``;
      with ``source="python"``, ``"package.module:function"``.
    source: ``"tfds"``, ``"npz"``, ``"embedded"`` or ``"python"``.
    data_dir: tfds data directory, or the directory of the npz files.
    normalization: ``"per_pixel_mean"`` (Caffe/Rudra), ``"per_channel"``
      (ResNets), ``"unit"`` or ``"raw"``; see `stalesgd.data._normalization`.
    image_size: crop side for ImageNet (ignored by the in-memory data sets).
    data_workers: threads decoding ImageNet's JPEGs (ignored by the in-memory
      data sets); the images do not depend on it.
    train_split, test_split: tfds splits (None: the data set's usual ones).
    image_key, label_key: tfds features holding the image and the class label.
    validation_fraction: 0 evaluates on the test split; in (0, 1), on that share of the training split held out
      (`stalesgd.data._validation_split.hold_out_validation`), training on the rest and never reading the test
      split (the returned ``test`` is the validation split, ``evaluation_split`` says so).

  Returns:
    The `Dataset`.

  Raises:
    ValueError: bad arguments.
    DatasetNotPreparedError: the data is not on this machine (a ValueError).
  """
  _check_arguments(name, source, normalization)
  if source == "tfds":
    train, test, num_classes = load_tfds_splits(
      name,
      data_dir,
      image_size=image_size,
      data_workers=data_workers,
      train_split=train_split,
      test_split=test_split,
      image_key=image_key,
      label_key=label_key,
    )
  elif source == "python":
    train, test, num_classes = load_python_splits(name)
  elif source == "npz":
    train, test = load_npz_splits(name, data_dir)
    largest_label = int(max(np.max(train.labels, initial=0), np.max(test.labels, initial=0)))
    num_classes = KNOWN_NUM_CLASSES.get(name, largest_label + 1)
    if largest_label >= num_classes:
      raise ValueError(f"dataset {name!r} has {num_classes} classes but its npz labels reach {largest_label}")
  else:
    train, test = load_digits_splits()
    num_classes = 10
  evaluation_split = "test"
  if validation_fraction:
    train, test = hold_out_validation(train, validation_fraction)
    evaluation_split = "validation"
  return Dataset(
    name=name,
    source=source,
    train=train,
    test=test,
    num_classes=num_classes,
    normalization=fit_normalization(normalization, train),
    evaluation_split=evaluation_split,
  )
