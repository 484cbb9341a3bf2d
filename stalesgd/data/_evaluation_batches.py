"""Deterministic evaluation batches, and training batches for precise batch norm.

`evaluation_batches` walks the test split (or a fixed subset of the training
split) in fixed-size batches; the last batch is padded with zeros and carries a
``mask`` so that metrics weight only real examples and every batch has one
shape (one compilation). `precise_bn_batches` gives the few training batches
from which `stalesgd.models.ModelSpec.batch_stats_for_eval` recomputes
batch-norm statistics (use the training mini-batch size).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from stalesgd.data._dataset import Dataset

EVALUATION_SPLITS = ("test", "train")


def evaluation_indices(
  dataset: Dataset, *, split: str = "test", num_examples: int | None = None, subset_seed: int = 0
) -> np.ndarray:
  """The examples an evaluation visits, in order.

  All of the split when ``num_examples`` is None or covers it; otherwise a
  fixed random subset (numpy Generator seeded with ``subset_seed``), sorted.
  """
  if split not in EVALUATION_SPLITS:
    raise ValueError(f"split must be one of {EVALUATION_SPLITS}; got {split!r}")
  size = dataset.num_test if split == "test" else dataset.num_train
  if num_examples is not None and num_examples < 1:
    raise ValueError(f"num_examples must be >= 1 or None; got {num_examples!r}")
  if num_examples is None or num_examples >= size:
    return np.arange(size)
  return np.sort(np.random.default_rng(subset_seed).permutation(size)[:num_examples])


def evaluation_batches(
  dataset: Dataset, *, batch_size: int, split: str = "test", num_examples: int | None = None, subset_seed: int = 0
) -> Iterator[dict[str, np.ndarray]]:
  """Yields ``{"image": float32 [B, H, W, C], "label": int32 [B], "mask": bool [B]}``.

  Args:
    dataset: the data set.
    batch_size: B; the last batch is zero-padded to B with ``mask`` False.
    split: ``"test"`` or ``"train"``.
    num_examples: evaluate a fixed subset of this size (None: the whole split).
    subset_seed: seed of that subset.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1; got {batch_size!r}")
  indices = evaluation_indices(dataset, split=split, num_examples=num_examples, subset_seed=subset_seed)
  source = dataset.test if split == "test" else dataset.train
  for start in range(0, indices.size, batch_size):
    chunk = indices[start : start + batch_size]
    images, labels = source.read(chunk)
    padding = batch_size - chunk.size
    yield {
      "image": np.pad(dataset.preprocess(images), ((0, padding),) + ((0, 0),) * 3),
      "label": np.pad(labels, (0, padding)),
      "mask": np.arange(batch_size) < chunk.size,
    }


def precise_bn_batches(
  dataset: Dataset, *, batch_size: int, num_batches: int, seed: int = 0
) -> list[dict[str, np.ndarray]]:
  """``num_batches`` distinct training batches of ``batch_size`` (fixed by ``seed``), no augmentation.

  Returns:
    A list of ``{"image": float32 [B, H, W, C], "label": int32 [B]}``.
  """
  if batch_size < 1 or num_batches < 1:
    raise ValueError(f"batch_size and num_batches must be >= 1; got {batch_size!r}, {num_batches!r}")
  if batch_size * num_batches > dataset.num_train:
    raise ValueError(
      f"batch_size * num_batches = {batch_size * num_batches} exceeds the {dataset.num_train} training examples"
    )
  order = np.random.default_rng(seed).permutation(dataset.num_train)[: batch_size * num_batches]
  batches = []
  for chunk in order.reshape(num_batches, batch_size):
    images, labels = dataset.train.read(chunk)
    batches.append({"image": dataset.preprocess(images), "label": labels})
  return batches
