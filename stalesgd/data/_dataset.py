"""`Dataset`: the train and test splits, their classes, and the input normalisation.

What `stalesgd.data.load_dataset` returns and everything downstream
(`LearnerBatches`, `evaluation_batches`, the trainer's config checks) reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from stalesgd.data._normalization import Normalization
from stalesgd.data._sources import ImageSource

# Class counts of well-known names, so that a small npz file missing a class is
# still read with the right number of outputs; other names infer max label + 1.
KNOWN_NUM_CLASSES = {"cifar10": 10, "mnist": 10, "fashion_mnist": 10, "digits": 10, "imagenet2012": 1000}


class DatasetNotPreparedError(ValueError):
  """The requested data is not on this machine; the message says what to do."""


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """An image classification data set ready for mini-batching.

  Attributes:
    name: e.g. ``"cifar10"``.
    source: where it was read from: ``"tfds"``, ``"npz"``, ``"embedded"`` or ``"python"``.
    train: the training split.
    test: the evaluation split (tfds ``imagenet2012``: ``validation``; with ``evaluation_split`` "validation",
      examples held out of the training data, `stalesgd.data._validation_split`).
    num_classes: number of classes; None for float targets (a task other than classification).
    normalization: uint8 -> float32 input transform, fitted on ``train``.
    evaluation_split: what ``test`` holds: ``"test"`` (the data set's test split) or ``"validation"`` (held out of
      its training split, the test split set aside unread). A run's ``test_*`` metrics are on this split.
  """

  name: str
  source: str
  train: ImageSource
  test: ImageSource
  num_classes: int | None
  normalization: Normalization
  evaluation_split: str = "test"

  def __post_init__(self):
    if self.train.image_shape != self.test.image_shape:
      raise ValueError(f"train and test image shapes differ: {self.train.image_shape} vs {self.test.image_shape}")

  @property
  def image_shape(self) -> tuple[int, int, int]:
    """(height, width, channels) of every image."""
    return tuple(self.train.image_shape)

  @property
  def num_train(self) -> int:
    return len(self.train)

  @property
  def num_test(self) -> int:
    return len(self.test)

  @property
  def chance_test_error(self) -> float | None:
    """Test error (%) of always predicting the test split's most frequent class: 100 (1 - max_c n_c / N).

    A diverged run is recorded with it. A lazily read split (ImageNet) is not scanned for its labels: it is
    taken as balanced, 100 (1 - 1 / num_classes). None for float targets.
    """
    if self.num_classes is None:  # float targets: no classes to guess
      return None
    labels = getattr(self.test, "labels", None)
    if labels is None or len(labels) == 0:
      return 100.0 * (1.0 - 1.0 / self.num_classes)
    return 100.0 * (1.0 - np.bincount(np.asarray(labels)).max() / len(labels))

  def content_sha256(self) -> dict[str, str] | None:
    """sha256 of each in-memory split: key name then bytes, over ``images`` (as stored) and ``labels``.

    Labels are hashed as uint8 when every class index fits (as the data's own files store them, so the
    digest of the CIFAR-10 and MNIST npz copies is the one their READMEs publish), int32 otherwise. None for
    a lazily read split (ImageNet's JPEGs, which tfds checksums itself).
    """
    digests = {}
    for name, split in (("train", self.train), ("test", self.test)):
      images, labels = getattr(split, "images", None), getattr(split, "labels", None)
      if images is None or labels is None:
        return None
      labels = np.asarray(labels)
      fits = labels.dtype.kind in "iu" and (labels.size == 0 or (labels.min() >= 0 and labels.max() < 256))
      digest = hashlib.sha256()
      digest.update(b"images")
      digest.update(np.ascontiguousarray(images).tobytes())
      digest.update(b"labels")
      digest.update(np.ascontiguousarray(labels.astype(np.uint8 if fits else labels.dtype)).tobytes())
      digests[name] = digest.hexdigest()
    return digests

  def description(self) -> dict[str, Any]:
    """What the data is, from the data, as JSON values: a run's ``dataset.json`` (``evaluation_split`` only where
    it is not the test split)."""
    held_out = {} if self.evaluation_split == "test" else {"evaluation_split": self.evaluation_split}
    return {
      **held_out,
      "name": self.name,
      "source": self.source,
      "num_classes": self.num_classes,
      "num_train": self.num_train,
      "num_test": self.num_test,
      "image_shape": list(self.image_shape),
      "chance_test_error": self.chance_test_error,
      "content_sha256": self.content_sha256(),
    }

  def preprocess(self, images: np.ndarray) -> np.ndarray:
    """uint8 [..., H, W, C] -> normalised float32."""
    return self.normalization(images)
