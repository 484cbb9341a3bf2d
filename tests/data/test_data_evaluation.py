"""Evaluation batches (padding, mask, coverage, subsets) and precise-BN batches."""

from __future__ import annotations

import numpy as np
import pytest

from stalesgd.data import Dataset
from stalesgd.data._evaluation_batches import evaluation_batches, evaluation_indices, precise_bn_batches
from stalesgd.data._normalization import fit_normalization
from stalesgd.data._sources import ArraySource


def _dataset(num_train=30, num_test=11):
  rng = np.random.default_rng(0)

  def split(count):
    return ArraySource(rng.integers(0, 256, (count, 3, 3, 1), dtype=np.uint8), np.arange(count) % 4)

  train = split(num_train)
  return Dataset(
    name="synthetic",
    source="npz",
    train=train,
    test=split(num_test),
    num_classes=4,
    normalization=fit_normalization("unit", train),
  )


def test_test_split_is_covered_once_with_a_padded_masked_last_batch():
  dataset = _dataset()
  batches = list(evaluation_batches(dataset, batch_size=4))
  assert len(batches) == 3
  assert all(batch["image"].shape == (4, 3, 3, 1) for batch in batches)
  np.testing.assert_array_equal(batches[-1]["mask"], [True, True, True, False])
  np.testing.assert_array_equal(batches[-1]["image"][3], 0.0)
  images = np.concatenate([batch["image"][batch["mask"]] for batch in batches])
  np.testing.assert_array_equal(images, dataset.preprocess(dataset.test.images))
  np.testing.assert_allclose(images, dataset.test.images / 255, rtol=1e-6)
  labels = np.concatenate([batch["label"][batch["mask"]] for batch in batches])
  np.testing.assert_array_equal(labels, dataset.test.labels)


def test_train_subset_is_fixed_sorted_and_distinct():
  dataset = _dataset()
  subset = evaluation_indices(dataset, split="train", num_examples=7)
  np.testing.assert_array_equal(subset, evaluation_indices(dataset, split="train", num_examples=7))
  assert subset.size == np.unique(subset).size == 7 and np.all(np.diff(subset) > 0)
  assert not np.array_equal(subset, np.arange(7))
  total = sum(
    int(batch["mask"].sum()) for batch in evaluation_batches(dataset, batch_size=3, split="train", num_examples=7)
  )
  assert total == 7


def test_precise_bn_batches_are_distinct_deterministic_training_batches():
  dataset = _dataset()
  batches = precise_bn_batches(dataset, batch_size=4, num_batches=3, seed=5)
  again = precise_bn_batches(dataset, batch_size=4, num_batches=3, seed=5)
  assert len(batches) == 3 and batches[0]["image"].shape == (4, 3, 3, 1)
  for batch, same in zip(batches, again):
    np.testing.assert_array_equal(batch["image"], same["image"])
  rows = np.concatenate([batch["image"].reshape(4, -1) for batch in batches])
  assert np.unique(rows, axis=0).shape[0] == 12


@pytest.mark.parametrize(
  "call, match",
  [
    (lambda d: list(evaluation_batches(d, batch_size=0)), "batch_size must be >= 1"),
    (lambda d: evaluation_indices(d, split="validation"), "split must be one of"),
    (lambda d: evaluation_indices(d, num_examples=0), "num_examples must be >= 1"),
    (lambda d: precise_bn_batches(d, batch_size=16, num_batches=2), "exceeds the 30 training"),
  ],
)
def test_bad_arguments(call, match):
  with pytest.raises(ValueError, match=match):
    call(_dataset())
