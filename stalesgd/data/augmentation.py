"""Optional training augmentation: random crop from a zero-padded image, random horizontal flip.

The standard CIFAR augmentation (He et al., arXiv 1512.03385 §4.2: pad 4, random
32x32 crop, flip). Off by default: DC-ASGD's Table 1 and Rudra's runs use none.
Vectorised over the whole batch with numpy advanced indexing, on uint8 images
before normalisation (so the padding is black, as in the usual pipelines).
"""

from __future__ import annotations

import numpy as np


def random_crop_and_flip(images: np.ndarray, offsets: np.ndarray, flips: np.ndarray,
                         padding: int) -> np.ndarray:
  """Crops each zero-padded image at its offset and mirrors it where flips is set.

  Args:
    images: uint8 [n, H, W, C].
    offsets: int [n, 2], (row, column) of each crop in the padded image, in
      [0, 2 padding].
    flips: bool [n], mirror left-right.
    padding: zero padding added on every side before cropping.

  Returns:
    uint8 [n, H, W, C].
  """
  count, height, width, _ = images.shape
  padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  rows = offsets[:, 0, None] + np.arange(height)
  columns = offsets[:, 1, None] + np.arange(width)
  columns = np.where(flips[:, None], columns[:, ::-1], columns)
  return padded[np.arange(count)[:, None, None], rows[:, :, None], columns[:, None, :]]


def draw_crop_and_flip(rng: np.random.Generator, count: int, padding: int) -> tuple[np.ndarray, np.ndarray]:
  """Uniform crop offsets in [0, 2 padding]^2 and fair-coin flips for ``count`` images."""
  return rng.integers(0, 2 * padding + 1, size=(count, 2)), rng.random(count) < 0.5
