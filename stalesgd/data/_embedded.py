"""The embedded default data set: scikit-learn's 8x8 handwritten ``digits``.

1,797 real 8x8 grey-scale images of the digits 0-9 (the UCI "Optical
Recognition of Handwritten Digits" test set), shipped inside the scikit-learn
wheel, so it needs no download. Pixel values 0..16 are mapped to uint8 0..255
(x * 255 / 16, rounded). Fixed split: a permutation seeded with 0 puts 300
images in the test split and 1,497 in the training split, identical on every
machine.

Checked for a better image data set shipped inside a pip package: the project's
environment holds scikit-learn's ``digits`` (its other bundled sets are not
images), matplotlib's sample data (pictures, no labelled set) and nothing in
tensorflow-datasets (which only downloads). Fashion-MNIST is a Debian package,
not a pip one, and MNIST/CIFAR-10 reach a machine only as files
(`stalesgd.data` reads them through tfds or npz).
"""

from __future__ import annotations

import numpy as np

from stalesgd.data._sources import ArraySource

EMBEDDED_DATASETS = ("digits",)
DIGITS_TEST_SIZE = 300
DIGITS_SPLIT_SEED = 0


def load_digits_splits() -> tuple[ArraySource, ArraySource]:
  """(train, test) of scikit-learn's digits as uint8 [N, 8, 8, 1] and int32 labels."""
  from sklearn.datasets import load_digits  # Deferred: sklearn import costs about a second.

  digits = load_digits()
  images = np.rint(digits.images * (255 / 16)).astype(np.uint8)[..., None]
  order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(images.shape[0])
  test, train = order[:DIGITS_TEST_SIZE], order[DIGITS_TEST_SIZE:]
  return ArraySource(images[train], digits.target[train]), ArraySource(images[test], digits.target[test])
