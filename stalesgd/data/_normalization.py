"""Input normalisation: x_float = (x_uint8 - offset) * scale, fitted once on the train split.

Kinds, and who uses them:

* ``"per_pixel_mean"``: raw 0..255 pixels minus the per-pixel mean image of the
  training set, no scaling (Caffe's ``mean_file``; Rudra's ``cifar10_full``,
  whose learning rate 0.001 assumes this input scale).
* ``"per_channel"``: scale to [0, 1], subtract the per-channel mean and divide
  by the per-channel standard deviation of the training set: the usual
  preprocessing of the CIFAR ResNets (He et al.; DC-ASGD's ResNet-20, whose paper
  states only "no data augmentation").
* ``"unit"``: scale to [0, 1] (small models on MNIST and digits).
* ``"raw"``: 0..255 as floats.

Statistics come from one vectorised pass over an in-memory training split
(`ArraySource`), in float64 chunks. A lazy source (ImageNet) is never read in
full: its per-channel statistics are the standard ImageNet training-set values
(mean 0.485, 0.456, 0.406; std 0.229, 0.224, 0.225 of [0, 1] RGB), and the
per-pixel mean is not available for it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stalesgd.data._sources import ArraySource, ImageSource

NORMALIZATIONS = ("per_pixel_mean", "per_channel", "unit", "raw")
IMAGENET_CHANNEL_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_CHANNEL_STD = np.array([0.229, 0.224, 0.225])
_CHUNK = 8192


@dataclasses.dataclass(frozen=True, eq=False)
class Normalization:
  """x_float32 = (x_uint8 - offset) * scale, broadcast over [..., H, W, C].

  Attributes:
    kind: one of `NORMALIZATIONS`.
    offset: float32, shape [H, W, C] or [C] or [].
    scale: float32, shape [C] or [].
  """

  kind: str
  offset: np.ndarray
  scale: np.ndarray

  def __call__(self, images: np.ndarray) -> np.ndarray:
    """Normalised float32 images, same shape as ``images``."""
    return (images.astype(np.float32) - self.offset) * self.scale


def _training_moments(images: np.ndarray, *, squares: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
  """Per-pixel mean image and per-channel mean of squares (None unless ``squares``), in [0, 255] units.

  The sums are of integers and exact (int64 for uint8 images), so they equal
  float64 sums of the same values bit for bit, faster.
  """
  integer = np.issubdtype(images.dtype, np.integer)
  accumulate = np.int64 if integer else np.float64
  pixel_sum = np.zeros(images.shape[1:], accumulate)
  square_sum = np.zeros(images.shape[-1], accumulate)
  by_histogram = images.dtype == np.uint8
  values = np.arange(256, dtype=np.int64)
  for start in range(0, images.shape[0], _CHUNK):
    chunk = images[start : start + _CHUNK]
    pixel_sum += chunk.sum(axis=0, dtype=accumulate)
    if squares and by_histogram:  # sum of v^2 = sum over the 256 values of count(v) v^2
      for channel in range(images.shape[-1]):
        counts = np.bincount(chunk[..., channel].reshape(-1), minlength=256)
        square_sum[channel] += counts @ np.square(values)
    elif squares:
      square_sum += np.square(chunk.astype(accumulate)).sum(axis=(0, 1, 2))
  count = images.shape[0]
  mean_image = pixel_sum.astype(np.float64) / count
  if not squares:
    return mean_image, None
  return mean_image, square_sum.astype(np.float64) / (count * images.shape[1] * images.shape[2])


def fit_normalization(kind: str, train: ImageSource) -> Normalization:
  """The normalisation of ``kind`` with statistics of the training split.

  Args:
    kind: one of `NORMALIZATIONS`.
    train: the training split.

  Returns:
    A `Normalization`.
  """
  if kind not in NORMALIZATIONS:
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}; got {kind!r}")
  if train.float_inputs and kind != "raw":
    raise ValueError(
      f"normalization={kind!r} for float32 inputs; allowed: 'raw' (the others are of 0..255 pixels; inputs that "
      "are not pixels are taken as they are)"
    )
  if kind == "raw":
    return Normalization(kind, np.float32(0.0), np.float32(1.0))
  if kind == "unit":
    return Normalization(kind, np.float32(0.0), np.float32(1 / 255))
  if isinstance(train, ArraySource):
    mean_image, channel_square_mean = _training_moments(train.images, squares=kind != "per_pixel_mean")
    channel_mean = mean_image.mean(axis=(0, 1))
    if channel_square_mean is not None:
      channel_std = np.sqrt(np.maximum(channel_square_mean - np.square(channel_mean), 0.0)) / 255
    channel_mean = channel_mean / 255
  elif kind == "per_channel" and train.image_shape[-1] == 3:
    mean_image, channel_mean, channel_std = None, IMAGENET_CHANNEL_MEAN, IMAGENET_CHANNEL_STD
  else:
    raise ValueError(
      f"normalization={kind!r} needs an in-memory training split; for a lazily read "
      "data set (imagenet2012) use 'per_channel', 'unit' or 'raw'"
    )
  if kind == "per_pixel_mean":
    return Normalization(kind, mean_image.astype(np.float32), np.float32(1.0))
  return Normalization(
    kind, (255 * channel_mean).astype(np.float32), (1 / (255 * np.maximum(channel_std, 1e-8))).astype(np.float32)
  )
