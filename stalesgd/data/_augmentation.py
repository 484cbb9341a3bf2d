"""Optional training augmentation: random crop from a zero-padded image, random horizontal flip.

The standard CIFAR augmentation (He et al., arXiv 1512.03385 §4.2: pad 4, random
32x32 crop, flip). Off by default: DC-ASGD's Table 1 and Rudra's runs use none.
Vectorised over the whole batch with numpy advanced indexing, on uint8 images
before normalisation (so the padding is black, as in the usual pipelines).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from stalesgd.data._counter_hash import sample_hashes


def random_crop_and_flip(images: np.ndarray, offsets: np.ndarray, flips: np.ndarray, padding: int) -> np.ndarray:
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
  # Every crop of every image as a strided view [n, 2p+1, 2p+1, C, H, W]: picking
  # one per image copies only the selected pixels, with no index arrays the
  # size of the crops (as gathering by index would need).
  windows = sliding_window_view(padded, (height, width), axis=(1, 2))
  crops = np.ascontiguousarray(windows[np.arange(count), offsets[:, 0], offsets[:, 1]].transpose(0, 2, 3, 1))
  crops[flips] = crops[flips, :, ::-1]
  return crops


def draw_crop_and_flip(keys: np.ndarray, batch_size: int, padding: int) -> tuple[np.ndarray, np.ndarray]:
  """Crop offsets and flips of every sample of every batch, from the batches' keys.

  For sample j of a batch with key K (`stalesgd.data._counter_hash.batch_keys`),
  h = mix(K ^ mix(j + 2^63)) (`sample_hashes`); the row and column offsets are 16-bit fields of h
  modulo 2 padding + 1 (uniform up to a 2^-16 bias) and the flip is one bit.

  Args:
    keys: uint64 [S], one per batch.
    batch_size: samples per batch (mu).
    padding: crop padding; offsets lie in [0, 2 padding].

  Returns:
    (offsets int64 [S * batch_size, 2], flips bool [S * batch_size]), batch-major.
  """
  hashes = sample_hashes(keys, batch_size)
  choices = np.uint64(2 * padding + 1)
  rows = (hashes & np.uint64(0xFFFF)) % choices
  columns = ((hashes >> np.uint64(16)) & np.uint64(0xFFFF)) % choices
  flips = ((hashes >> np.uint64(32)) & np.uint64(1)).astype(bool)
  return np.stack([rows, columns], axis=1).astype(np.int64), flips
