"""Random-access image sources: in-memory arrays and lazily decoded examples.

A source holds one split and answers ``read(indices) -> (images uint8 [n, H, W,
C], labels int32 [n])`` for any integer index array, so mini-batches are built
by numpy fancy indexing. Small data sets (CIFAR-10, MNIST, the embedded digits)
live in memory as an `ArraySource`; ImageNet is a `LazyImageSource` that decodes
and crops each requested example (on a pool of threads) and is never materialised.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from stalesgd.data._center_crop import decode_and_center_crop
from stalesgd.data._inception_crop import CropDraws, decode_inception_crop


class ImageSource(Protocol):
  """One split of an image classification data set, with random access."""

  image_shape: tuple[int, int, int]
  float_inputs: bool
  """Whether the inputs are float32 values rather than uint8 pixels (only `ArraySource` holds such)."""

  def __len__(self) -> int: ...

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
  """A split held in memory as uint8 images [N, H, W, C] and integer labels [N] (or float targets [N]).

  Inputs that are not pixels (e.g. feature vectors: shape [N, 1, D]) are float32 instead of uint8; they are taken
  as they are (``normalization="raw"``, no augmentation: `float_inputs`).

  Attributes:
    images: uint8 (or float32, finite) [N, H, W, C] (a [N, H, W] input gains a channel axis).
    labels: int32 [N] class indices; float32 [N] targets where a split holds float labels (a regression
      with a user's loss function, `stalesgd.models.ModelSpec.loss`).
    image_shape: (H, W, C).
  """

  def __init__(self, images: np.ndarray, labels: np.ndarray):
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim == 3:
      images = images[..., None]
    if images.dtype not in (np.uint8, np.float32) or images.ndim != 4:
      raise ValueError(
        "images must be uint8 [N, H, W] or [N, H, W, C] (float32 for inputs that are not pixels); got dtype "
        f"{images.dtype}, shape {images.shape}"
      )
    if images.dtype == np.float32 and not np.all(np.isfinite(images)):
      raise ValueError("float32 inputs must be finite")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0] or not np.issubdtype(labels.dtype, np.number):
      raise ValueError(
        f"labels must be integers [N] (or float targets [N]) with N = {images.shape[0]} images; got dtype "
        f"{labels.dtype}, shape {labels.shape}"
      )
    if np.issubdtype(labels.dtype, np.floating):
      if not np.all(np.isfinite(labels)):
        raise ValueError("float targets must be finite")
      labels = labels.astype(np.float32)
    else:
      if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be >= 0; got minimum {labels.min()}")
      labels = labels.astype(np.int32)
    self.images = images
    self.labels = labels
    self.image_shape = tuple(images.shape[1:])

  def __len__(self) -> int:
    return self.images.shape[0]

  @property
  def float_inputs(self) -> bool:
    """Whether the inputs are float32 values rather than uint8 pixels."""
    return self.images.dtype == np.float32

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    indices = _check_indices(indices, len(self))
    return self.images[indices], self.labels[indices]


class LazyImageSource:
  """A split read example by example from a random-access sequence (e.g. tfds), decoded on ``workers`` threads.

  Each ``examples[i]`` is a mapping with ``"image"`` (encoded bytes or a uint8
  array) and ``"label"``. `read` gives the evaluation centre crop
  (`decode_and_center_crop`); `read_inception_crops` the training crops of
  `stalesgd.data._inception_crop`, from the original images. Records are read
  in the calling thread; decoding and cropping run on a pool of ``workers``
  threads (Pillow releases the GIL while it decodes and resizes), each image
  written to its own row, so the arrays do not depend on ``workers``. Nothing is
  cached, so memory stays constant.

  Attributes:
    examples: the random-access sequence.
    image_shape: (image_size, image_size, 3).
    workers: decoding threads (1: the calling thread decodes).
  """

  float_inputs = False  # decoded JPEG pixels

  def __init__(
    self,
    examples: Sequence[Mapping[str, Any]],
    *,
    image_size: int = 224,
    resize_size: int | None = None,
    workers: int = 1,
  ):
    resize_size = resize_size if resize_size is not None else round(image_size * 256 / 224)
    if image_size < 1 or resize_size < image_size:
      raise ValueError(f"need 1 <= image_size <= resize_size; got image_size={image_size}, resize_size={resize_size}")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
      raise ValueError(f"workers (decoding threads) must be a positive int; got {workers!r}")
    self.examples = examples
    self.image_size, self.resize_size, self.workers = image_size, resize_size, int(workers)
    self.image_shape = (image_size, image_size, 3)
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # started on first use

  def __len__(self) -> int:
    return len(self.examples)

  def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centre crops (evaluation) and labels of the given examples."""
    return self._decode(
      indices, lambda position, image: decode_and_center_crop(image, self.image_size, self.resize_size)
    )

  def read_inception_crops(self, indices: np.ndarray, draws: CropDraws) -> tuple[np.ndarray, np.ndarray]:
    """Training crops and labels: example ``indices[i]`` cropped and flipped as row i of ``draws`` says."""
    if draws.uniforms.shape[0] != np.size(indices) or draws.flips.shape[0] != np.size(indices):
      raise ValueError(f"need one draw per index; got {draws.uniforms.shape[0]} draws for {np.size(indices)} indices")
    return self._decode(
      indices,
      lambda position, image: decode_inception_crop(
        image, draws.uniforms[position], bool(draws.flips[position]), self.image_size, self.resize_size
      ),
    )

  def _decode(self, indices: np.ndarray, decode: Callable[[int, Any], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    indices = _check_indices(indices, len(self))
    examples = [self.examples[int(index)] for index in indices]
    images = np.empty((len(examples), *self.image_shape), np.uint8)
    labels = np.array([int(example["label"]) for example in examples], np.int32)

    def decode_into(position: int) -> None:
      images[position] = decode(position, examples[position]["image"])

    if self.workers == 1 or len(examples) < 2:
      for position in range(len(examples)):
        decode_into(position)
    else:
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="stalesgd-decode")
      for _ in self._pool.map(decode_into, range(len(examples))):  # re-raises a decoding error here
        pass
    return images, labels
