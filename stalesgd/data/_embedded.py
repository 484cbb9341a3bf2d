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

import gzip
import importlib.util
import pathlib

import numpy as np

from stalesgd.data._sources import ArraySource

EMBEDDED_DATASETS = ("digits",)
DIGITS_TEST_SIZE = 300
DIGITS_SPLIT_SEED = 0


DIGITS_FILE = ("datasets", "data", "digits.csv.gz")  # inside the installed scikit-learn package


def digits_file() -> pathlib.Path:
  """The gzipped CSV scikit-learn's ``load_digits`` reads (1,797 rows: 64 pixel values 0..16, then the label).

  Found without importing scikit-learn (which imports scipy: about 2 s of every run's start-up); a missing
  package or file is an error naming both."""
  spec = importlib.util.find_spec("sklearn")
  locations = list(spec.submodule_search_locations or []) if spec is not None else []
  for location in locations:
    path = pathlib.Path(location).joinpath(*DIGITS_FILE)
    if path.is_file():
      return path
  raise FileNotFoundError(
    f"the embedded digits data set is sklearn/{'/'.join(DIGITS_FILE)} of the scikit-learn package, not found in "
    f"{locations or 'any installed scikit-learn'}: install scikit-learn (a dependency of stalesgd)"
  )


def load_digits_splits() -> tuple[ArraySource, ArraySource]:
  """(train, test) of scikit-learn's digits as uint8 [N, 8, 8, 1] and integer labels.

  The values of ``sklearn.datasets.load_digits()`` (its file, parsed as it parses it: ``np.loadtxt`` of the CSV,
  the last column the label), read without importing scikit-learn."""
  with gzip.open(digits_file(), mode="rt", encoding="utf-8") as text:
    table = np.loadtxt(text, delimiter=",")
  labels = table[:, -1].astype(int, copy=False)
  images = np.rint(table[:, :-1].reshape(-1, 8, 8) * (255 / 16)).astype(np.uint8)[..., None]
  order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(images.shape[0])
  test, train = order[:DIGITS_TEST_SIZE], order[DIGITS_TEST_SIZE:]
  return ArraySource(images[train], labels[train]), ArraySource(images[test], labels[test])
