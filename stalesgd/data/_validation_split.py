"""A validation split carved from the training data, for choosing settings without ever reading the test set.

`hold_out_validation` takes ``round(fraction * N)`` examples of the training split as the evaluation split and
trains on the rest. Which examples: the first of a permutation of ``range(N)`` drawn with
``numpy.random.default_rng(VALIDATION_SPLIT_SEED)``, a constant, so that every run and every seed of a pilot holds
out the same examples whatever its own seed; both parts keep the training split's order. A study's pilot
(`stalesgd.studies._pilot`) scores its runs on this split, and the test split is set aside unread.
"""

from __future__ import annotations

import numpy as np

from stalesgd.data._sources import ArraySource, ImageSource

VALIDATION_SPLIT_SEED = 20250101  # fixed: the held-out examples do not depend on a run's seed


def hold_out_validation(train: ImageSource, fraction: float) -> tuple[ArraySource, ArraySource]:
  """(the training examples kept, the validation examples) of an in-memory training split.

  Args:
    train: the training split; it must be held in memory (an `ArraySource`).
    fraction: the share of its examples held out, in (0, 1); at least one example on each side.

  Raises:
    ValueError: a fraction out of range, a split too small for it, or a split read lazily (ImageNet's JPEGs).
  """
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"validation_fraction={fraction!r}; allowed: a number in (0, 1), or 0 for no validation split")
  if not isinstance(train, ArraySource):
    raise ValueError(
      f"validation_fraction={fraction!r} needs a training split held in memory (CIFAR-10, MNIST, npz, the "
      "digits, a python source); allowed for a lazily read split (ImageNet): 0"
    )
  size = len(train)
  held_out = int(round(fraction * size))
  if not 0 < held_out < size:
    raise ValueError(
      f"validation_fraction={fraction!r} of {size} training examples holds out {held_out}; allowed: a fraction "
      "that leaves at least one example on each side"
    )
  order = np.random.default_rng(VALIDATION_SPLIT_SEED).permutation(size)
  validation, kept = np.sort(order[:held_out]), np.sort(order[held_out:])
  return (
    ArraySource(train.images[kept], train.labels[kept]),
    ArraySource(train.images[validation], train.labels[validation]),
  )
