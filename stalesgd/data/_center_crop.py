"""Opening an encoded or decoded image, and the ImageNet evaluation centre crop.

`decode_and_center_crop` is what a lazily read split (`stalesgd.data._sources.LazyImageSource`)
gives for evaluation, and what the training crop (`stalesgd.data._inception_crop`)
falls back to.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image


def open_image(image: Any) -> Image.Image:
  """A picture from encoded bytes (JPEG/PNG; only the header is parsed here) or a uint8 [H, W, C] array."""
  if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3:
    return Image.fromarray(image)
  return Image.open(io.BytesIO(bytes(image)))


def decode_and_center_crop(image: Any, image_size: int, resize_size: int) -> np.ndarray:
  """Encoded (JPEG/PNG bytes) or decoded image -> uint8 [image_size, image_size, 3].

  Resizes the shorter side to ``resize_size`` (bilinear), then takes the
  central ``image_size`` square: the standard ImageNet evaluation crop
  (256 -> 224). JPEGs are decoded at a reduced DCT scale when that is still
  larger than the target ("draft" mode), which is several times faster for
  ImageNet's large photos.
  """
  picture = open_image(image)
  picture.draft("RGB", (resize_size, resize_size))  # a no-op for arrays and non-JPEGs
  picture = picture.convert("RGB")
  width, height = picture.size
  scale = resize_size / min(width, height)
  new_width, new_height = max(resize_size, round(width * scale)), max(resize_size, round(height * scale))
  picture = picture.resize((new_width, new_height), Image.BILINEAR)
  left, top = (new_width - image_size) // 2, (new_height - image_size) // 2
  return np.asarray(picture.crop((left, top, left + image_size, top + image_size)), dtype=np.uint8)
