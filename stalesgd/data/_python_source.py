"""A user's data by import path: ``config.data_source = "python"``, ``config.dataset = "my_package.data:load"``.

The function is called without arguments and returns in-memory arrays, like ``keras.datasets.*.load_data()``:

* ``((train_images, train_labels), (test_images, test_labels))``, or
* a mapping ``{"train": (images, labels), "test": (images, labels)}``, optionally with ``"num_classes"``
  (otherwise the largest label + 1).

Images are uint8 [N, H, W] or [N, H, W, C] (float32 for inputs that are not pixels, e.g. feature vectors [N, 1, D],
taken as they are: ``config.normalization = "raw"``, no augmentation) and labels integers in [0, num_classes), or
float targets [N] for
another task (a regression) trained with a loss function of the user's (``config.loss``; `ArraySource` checks
them). Errors name ``config.dataset`` and what is wrong, at load time, before anything is compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from stalesgd.data._sources import ArraySource
from stalesgd.utils._import_path import load_callable

FIELD = "config.dataset"
_FORM = (
  "((train_images, train_labels), (test_images, test_labels)) or {'train': (images, labels), 'test': (images, "
  "labels), 'num_classes': optional int}"
)


def _pair(value: Any, split: str, path: str) -> tuple[Any, Any]:
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise ValueError(f"{FIELD}={path!r}: its {split} split is a {type(value).__name__}; allowed: {_FORM}")
  return value[0], value[1]


def load_python_splits(path: str) -> tuple[ArraySource, ArraySource, int | None]:
  """(train, test, num_classes) from the function at ``path`` (module docstring: what it returns).

  Float labels are targets of a task other than classification (``num_classes`` None): they need a loss
  function of the user's (``config.loss``).

  Raises:
    ValueError: naming ``config.dataset``: cannot import or call it, it returned another form, the arrays are
      not uint8 images and integer labels, or a label is out of range.
  """
  loader = load_callable(path, field=FIELD)
  returned = loader()
  num_classes = None
  if isinstance(returned, Mapping):
    missing = sorted({"train", "test"} - set(returned))
    if missing:
      raise ValueError(f"{FIELD}={path!r} returned a mapping without {missing}; allowed: {_FORM}")
    train, test, num_classes = returned["train"], returned["test"], returned.get("num_classes")
  elif isinstance(returned, (tuple, list)) and len(returned) == 2:
    train, test = returned
  else:
    raise ValueError(f"{FIELD}={path!r} returned a {type(returned).__name__}; allowed: {_FORM}")
  splits = []
  for split, value in (("train", train), ("test", test)):
    images, labels = _pair(value, split, path)
    try:
      splits.append(ArraySource(np.asarray(images), np.asarray(labels)))
    except ValueError as error:
      raise ValueError(f"{FIELD}={path!r}, {split} split: {error}") from error
  if splits[0].float_inputs != splits[1].float_inputs:
    raise ValueError(
      f"{FIELD}={path!r}: one split's inputs are float32 values and the other's uint8 pixels; allowed: both alike"
    )
  kinds = {np.issubdtype(source.labels.dtype, np.floating) for source in splits}
  if kinds == {True}:  # float targets: no classes (a regression, with a loss function of the user's)
    if num_classes is not None:
      raise ValueError(f"{FIELD}={path!r}: num_classes = {num_classes!r} with float targets; allowed: none")
    return splits[0], splits[1], None
  if len(kinds) > 1:
    raise ValueError(f"{FIELD}={path!r}: one split has float targets and the other integer labels")
  largest = max(int(source.labels.max(initial=0)) for source in splits)
  if num_classes is None:
    num_classes = largest + 1
  if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
    raise ValueError(f"{FIELD}={path!r}: num_classes = {num_classes!r}; allowed: an int >= 2")
  if largest >= num_classes:
    raise ValueError(f"{FIELD}={path!r}: labels reach {largest}, but num_classes = {num_classes}")
  return splits[0], splits[1], int(num_classes)
