"""Random-access image sources: in-memory arrays and lazily decoded examples.

A source holds one split and answers ``read(indices) -> (images uint8 [n, H, W,
C], labels int32 [n])`` for any integer index array, so mini-batches are built
by numpy fancy indexing. Small data sets (CIFAR-10, MNIST, the embedded digits)
live in memory as an `ArraySource`; ImageNet is a `LazyImageSource` that decodes,
resizes and centre-crops each requested example and is never materialised.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from PIL import Image


class ImageSource(Protocol):
  """One split of an image classification data set, with random access."""

  image_shape: tuple[int, int, int]

  def __len__(self) -> int:
    ...

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, H, W, C], labels int32 [n]) of the given examples."""
    ...


def _check_indices(indices: np.ndarray, size: int) -> np.ndarray:
  indices = np.asarray(indices)
  if indices.ndim != 1 or not np.issubdtype(indices.dtype, np.integer):
    raise ValueError(f"indices must be a 1-D integer array; got dtype {indices.dtype}, shape {indices.shape}")
  if indices.size and (indices.min() < 0 or indices.max() >= size):
    raise ValueError(f"indices must lie in [0, {size}); got range [{indices.min()}, {indices.max()}]")
  return indices


class ArraySource:
  """A split held in memory as uint8 images [N, H, W, C] and integer labels [N].

  Attributes:
    images: uint8 [N, H, W, C] (a [N, H, W] input gains a channel axis).
    labels: int32 [N].
    image_shape: (H, W, C).
  """

  def __init__(self, images: np.ndarray, labels: np.ndarray):
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim == 3:
      images = images[..., None]
    if images.dtype != np.uint8 or images.ndim != 4:
      raise ValueError("images must be uint8 [N, H, W] or [N, H, W, C]; "
                       f"got dtype {images.dtype}, shape {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0] or not np.issubdtype(labels.dtype, np.integer):
      raise ValueError(f"labels must be integers [N] with N = {images.shape[0]} images; "
                       f"got dtype {labels.dtype}, shape {labels.shape}")
    if labels.size and labels.min() < 0:
      raise ValueError(f"labels must be >= 0; got minimum {labels.min()}")
    self.images = images
    self.labels = labels.astype(np.int32)
    self.image_shape = tuple(images.shape[1:])

  def __len__(self) -> int:
    return self.images.shape[0]

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    indices = _check_indices(indices, len(self))
    return self.images[indices], self.labels[indices]


def decode_and_center_crop(image: Any, image_size: int, resize_size: int) -> np.ndarray:
  """Encoded (JPEG/PNG bytes) or decoded image -> uint8 [image_size, image_size, 3].

  Resizes the shorter side to ``resize_size`` (bilinear), then takes the
  central ``image_size`` square: the standard ImageNet evaluation crop
  (256 -> 224). JPEGs are decoded at a reduced DCT scale when that is still
  larger than the target ("draft" mode), which is several times faster for
  ImageNet's large photos.
  """
  if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3:
    picture = Image.fromarray(image)
  else:
    picture = Image.open(io.BytesIO(bytes(image)))
    picture.draft("RGB", (resize_size, resize_size))
  picture = picture.convert("RGB")
  width, height = picture.size
  scale = resize_size / min(width, height)
  new_width, new_height = max(resize_size, round(width * scale)), max(resize_size, round(height * scale))
  picture = picture.resize((new_width, new_height), Image.BILINEAR)
  left, top = (new_width - image_size) // 2, (new_height - image_size) // 2
  return np.asarray(picture.crop((left, top, left + image_size, top + image_size)), dtype=np.uint8)


class LazyImageSource:
  """A split read example by example from a random-access sequence (e.g. tfds).

  Each ``examples[i]`` is a mapping with ``"image"`` (encoded bytes or a uint8
  array) and ``"label"``; `read` decodes only the requested examples with
  `decode_and_center_crop`. Nothing is cached, so memory stays constant.

  Attributes:
    examples: the random-access sequence.
    image_shape: (image_size, image_size, 3).
  """

  def __init__(self, examples: Sequence[Mapping[str, Any]], *, image_size: int = 224,
               resize_size: int | None = None):
    resize_size = resize_size if resize_size is not None else round(image_size * 256 / 224)
    if image_size < 1 or resize_size < image_size:
      raise ValueError(f"need 1 <= image_size <= resize_size; got image_size={image_size}, "
                       f"resize_size={resize_size}")
    self.examples = examples
    self.image_size, self.resize_size = image_size, resize_size
    self.image_shape = (image_size, image_size, 3)

  def __len__(self) -> int:
    return len(self.examples)

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    indices = _check_indices(indices, len(self))
    images = np.empty((indices.size, *self.image_shape), np.uint8)
    labels = np.empty((indices.size,), np.int32)
    for position, index in enumerate(indices):
      example = self.examples[int(index)]
      images[position] = decode_and_center_crop(example["image"], self.image_size, self.resize_size)
      labels[position] = int(example["label"])
    return images, labels
