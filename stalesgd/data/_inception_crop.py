"""Inception-style random-resized crop and horizontal flip of ImageNet training images.

The ImageNet training augmentation of Szegedy et al., "Going deeper with
convolutions" (CVPR 2015, §6: patches of 8%-100% of the image area with aspect
ratio in [3/4, 4/3]), in the form of big_vision's
``decode_jpeg_and_inception_crop`` and the flax ImageNet example: for an image
of W x H pixels and attempts t = 0, ..., 9 with uniforms (a_t, r_t, x_t, y_t)
in [0, 1),

  area   A_t = W H (0.08 + 0.92 a_t)
  ratio  rho_t = exp(log(3/4) + (log(4/3) - log(3/4)) r_t)     (log-uniform)
  size   w_t = round(sqrt(A_t rho_t)),  h_t = round(sqrt(A_t / rho_t))

the first attempt with 1 <= w_t <= W and 1 <= h_t <= H is cropped at

  left = floor(x_t (W - w_t + 1)),  top = floor(y_t (H - h_t + 1))

and resized (bilinear, antialiased) to image_size x image_size; if no attempt
fits, the evaluation centre crop is used (`decode_and_center_crop`, as the flax
example falls back to). The result is mirrored left-right when the flip bit is
set (probability 1/2).

Determinism rule: the 40 uniforms and the flip bit of sample j of global batch
g are read from counter-based hashes of (seed, g, j) (`draw_inception_crops`
over `stalesgd.data._counter_hash` keys), never from a global RNG, so the same
(seed, g, j) gives the same pixels in any process, after any resume and with
any number of decoding threads. Crops are computed in the original image's
pixel coordinates from its header alone; a JPEG is then decoded at the
smallest DCT scale that still leaves the crop at least image_size pixels wide
and high (Pillow's "draft" mode), which is several times faster for the large
photos of ImageNet and changes no crop.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from stalesgd.data._center_crop import decode_and_center_crop, open_image
from stalesgd.data._counter_hash import sample_hashes, splitmix64

MIN_AREA, MAX_AREA = 0.08, 1.0
MIN_RATIO, MAX_RATIO = 3 / 4, 4 / 3
ATTEMPTS = 10
_FIELDS = 4  # area, log-ratio, left, top
# Counters of the per-sample draws: 4 uniforms per attempt, then the flip. The
# 2^62 offset keeps them apart from the sample counters (j + 2^63) of `sample_hashes`.
_DRAW_COUNTERS = np.arange(ATTEMPTS * _FIELDS + 1, dtype=np.uint64) | np.uint64(1 << 62)


class CropDraws(NamedTuple):
  """The random draws of n samples' Inception crops.

  Attributes:
    uniforms: float64 [n, ATTEMPTS, 4] in [0, 1): (area, log-ratio, left, top)
      of every attempt.
    flips: bool [n], mirror left-right.
  """

  uniforms: np.ndarray
  flips: np.ndarray


def draw_inception_crops(keys: np.ndarray, batch_size: int) -> CropDraws:
  """Every sample's crop uniforms and flip, from its batch's key (batch-major).

  For sample j of a batch with key K (`stalesgd.data._counter_hash.batch_keys`
  of the augmentation stream), h = `sample_hashes` (K, j); draw c is
  mix(h ^ mix(c + 2^62)), a uniform being its top 53 bits / 2^53 (exactly
  representable in float64) and the flip its lowest bit.

  Args:
    keys: uint64 [S], one per batch.
    batch_size: samples per batch (mu).

  Returns:
    `CropDraws` of S * batch_size samples.
  """
  hashes = sample_hashes(keys, batch_size)
  draws = splitmix64(hashes[:, None] ^ splitmix64(_DRAW_COUNTERS)[None, :])
  uniforms = (draws[:, :-1] >> np.uint64(11)).astype(np.float64) * 2.0**-53
  flips = (draws[:, -1] & np.uint64(1)).astype(bool)
  return CropDraws(uniforms.reshape(-1, ATTEMPTS, _FIELDS), flips)


def crop_window(width: int, height: int, uniforms: np.ndarray) -> tuple[int, int, int, int] | None:
  """(left, top, crop width, crop height) of the first attempt that fits in W x H; None if none does.

  Args:
    width, height: the image's size in pixels (W, H).
    uniforms: float [ATTEMPTS, 4] in [0, 1), one (area, log-ratio, left, top)
      row per attempt (any number of rows is accepted).
  """
  log_low, log_high = math.log(MIN_RATIO), math.log(MAX_RATIO)
  for area_u, ratio_u, left_u, top_u in np.asarray(uniforms, np.float64).tolist():
    area = width * height * (MIN_AREA + (MAX_AREA - MIN_AREA) * area_u)
    ratio = math.exp(log_low + (log_high - log_low) * ratio_u)
    crop_width, crop_height = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
    if 1 <= crop_width <= width and 1 <= crop_height <= height:
      return (
        math.floor(left_u * (width - crop_width + 1)),
        math.floor(top_u * (height - crop_height + 1)),
        crop_width,
        crop_height,
      )
  return None


def decode_inception_crop(
  image: Any, uniforms: np.ndarray, flip: bool, image_size: int, resize_size: int
) -> np.ndarray:
  """Encoded (JPEG/PNG bytes) or decoded image -> its Inception crop, uint8 [image_size, image_size, 3].

  Args:
    image: the original image (not a centre crop of it).
    uniforms: float [ATTEMPTS, 4], this sample's row of `CropDraws.uniforms`.
    flip: mirror the crop left-right.
    image_size: side of the output.
    resize_size: shorter side before the fallback centre crop.
  """
  picture = open_image(image)
  width, height = picture.size
  window = crop_window(width, height, uniforms)
  if window is None:
    crop = decode_and_center_crop(image, image_size, resize_size)
  else:
    left, top, crop_width, crop_height = window
    # Decode at the smallest DCT scale leaving the crop >= image_size on both sides (a no-op for non-JPEGs).
    picture.draft("RGB", (math.ceil(width * image_size / crop_width), math.ceil(height * image_size / crop_height)))
    scale_x, scale_y = picture.size[0] / width, picture.size[1] / height
    box = (left * scale_x, top * scale_y, (left + crop_width) * scale_x, (top + crop_height) * scale_y)
    crop = np.asarray(picture.convert("RGB").resize((image_size, image_size), Image.BILINEAR, box=box), np.uint8)
  return np.ascontiguousarray(crop[:, ::-1]) if flip else crop
