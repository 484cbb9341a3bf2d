"""LearnerBatches: purity in (seed, learner, k), epoch coverage, augmentation, validation."""

from __future__ import annotations

import numpy as np
import pytest

from stalesgd.data import Dataset, LearnerBatches
from stalesgd.data._augmentation import draw_crop_and_flip, random_crop_and_flip
from stalesgd.data._counter_hash import AUGMENTATION_STREAM, DROPOUT_STREAM, batch_keys
from stalesgd.data._normalization import fit_normalization
from stalesgd.data._sources import ArraySource


def _dataset(num_train=24, image_shape=(4, 4, 3), seed=0):
  rng = np.random.default_rng(seed)
  train = ArraySource(rng.integers(0, 256, (num_train, *image_shape), dtype=np.uint8), rng.integers(0, 10, num_train))
  test = ArraySource(rng.integers(0, 256, (5, *image_shape), dtype=np.uint8), rng.integers(0, 10, 5))
  return Dataset(
    name="synthetic",
    source="npz",
    train=train,
    test=test,
    num_classes=10,
    normalization=fit_normalization("raw", train),
  )


def test_same_seed_learner_and_k_give_the_same_batch_in_any_order():
  dataset = _dataset()
  first = LearnerBatches(dataset, batch_per_learner=2, learners=3, seed=7)
  second = LearnerBatches(dataset, batch_per_learner=2, learners=3, seed=7)
  forward = first(np.array([0, 1, 2, 0]), np.array([0, 0, 0, 9]))
  # A different instance, queried in another order after other epochs were cached.
  second(np.array([2]), np.array([40]))
  backward = second(np.array([0, 2, 1, 0]), np.array([9, 0, 0, 0]))
  np.testing.assert_array_equal(forward["image"][[3, 2, 1, 0]], backward["image"])
  np.testing.assert_array_equal(forward["label"][[3, 2, 1, 0]], backward["label"])
  other_seed = LearnerBatches(dataset, batch_per_learner=2, learners=3, seed=8)
  assert not np.array_equal(
    other_seed.sample_indices(np.arange(3), np.zeros(3, np.int64)),
    first.sample_indices(np.arange(3), np.zeros(3, np.int64)),
  )


@pytest.mark.parametrize("batch_per_learner", [2, 3])
def test_learners_sweep_each_epoch_once_with_disjoint_samples(batch_per_learner):
  dataset = _dataset(num_train=24)
  batches = LearnerBatches(dataset, batch_per_learner=batch_per_learner, learners=2, seed=1)
  # 24 samples / (mu x 2) = 6 (mu = 2) or 4 (mu = 3) rounds of k per epoch.
  rounds = 24 // (2 * batch_per_learner)
  for epoch in range(2):
    learner, k = np.meshgrid(np.arange(2), np.arange(rounds * epoch, rounds * (epoch + 1)))
    indices = batches.sample_indices(learner.ravel(), k.ravel())
    np.testing.assert_array_equal(np.sort(indices.ravel()), np.arange(24))
  assert not np.array_equal(batches.epoch_permutation(0), batches.epoch_permutation(1))


def test_batches_straddling_epochs_follow_the_concatenated_permutations():
  dataset = _dataset(num_train=10)
  batches = LearnerBatches(dataset, batch_per_learner=4, learners=1, seed=3)
  indices = batches.sample_indices(np.zeros(5, np.int64), np.arange(5)).ravel()
  expected = np.concatenate([batches.epoch_permutation(epoch) for epoch in range(2)])
  np.testing.assert_array_equal(indices, expected)


def test_images_and_labels_are_the_normalised_training_examples():
  dataset = _dataset()
  batches = LearnerBatches(dataset, batch_per_learner=3, learners=2, seed=0)
  batch = batches(np.array([1]), np.array([2]))
  indices = batches.sample_indices(np.array([1]), np.array([2]))[0]
  assert batch["image"].dtype == np.float32 and batch["label"].dtype == np.int32
  np.testing.assert_array_equal(batch["image"][0], dataset.train.images[indices].astype(np.float32))
  np.testing.assert_array_equal(batch["label"][0], dataset.train.labels[indices])


def test_augmentation_is_deterministic_and_changes_images():
  dataset = _dataset(num_train=64, image_shape=(8, 8, 3))
  plain = LearnerBatches(dataset, batch_per_learner=16, learners=2, seed=0)
  augmented = LearnerBatches(dataset, batch_per_learner=16, learners=2, seed=0, augment=True)
  args = (np.array([0, 1]), np.array([1, 1]))
  first, second = augmented(*args), augmented(*args)
  np.testing.assert_array_equal(first["image"], second["image"])
  np.testing.assert_array_equal(first["label"], plain(*args)["label"])
  assert not np.array_equal(first["image"], plain(*args)["image"])


def test_crop_and_flip_against_explicit_slicing():
  images = np.random.default_rng(0).integers(0, 256, (3, 5, 6, 2), dtype=np.uint8)
  padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)))
  offsets = np.array([[2, 2], [0, 4], [3, 1]])
  flips = np.array([False, True, False])
  out = random_crop_and_flip(images, offsets, flips, padding=2)
  np.testing.assert_array_equal(out[0], images[0])  # centre offset: the identity
  np.testing.assert_array_equal(out[1], padded[1, 0:5, 4:10][:, ::-1])
  np.testing.assert_array_equal(out[2], padded[2, 3:8, 1:7])


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(batch_per_learner=0, learners=2, seed=0), "batch_per_learner must be a positive int"),
    (dict(batch_per_learner=2, learners=0, seed=0), "learners must be a positive int"),
    (dict(batch_per_learner=2, learners=2, seed=-1), "seed must be a non-negative int"),
    (dict(batch_per_learner=2, learners=2, seed=0, crop_padding=-1), "crop_padding must be >= 0"),
    (dict(batch_per_learner=2.5, learners=2, seed=0), "batch_per_learner must be a positive int; got 2.5"),
    (dict(batch_per_learner=True, learners=2, seed=0), "batch_per_learner must be a positive int; got True"),
    (dict(batch_per_learner=2, learners=2, seed=True), "seed must be a non-negative int; got True"),
    (dict(batch_per_learner=2, learners=2, seed=1.5), "seed must be a non-negative int; got 1.5"),
  ],
)
def test_bad_constructor_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    LearnerBatches(_dataset(), **kwargs)


@pytest.mark.parametrize(
  "learner, k, match",
  [
    ([0, 3], [0, 0], r"learner must lie in \[0, 3\)"),
    ([0, 1], [0, -1], "k must be >= 0"),
    ([0.5], [0], "integer arrays"),
    ([[0, 1]], [[0, 0]], "1-D integer arrays"),
    ([0, 4], [0, 0], r"learner must lie in \[0, 3\); got range \[0, 4\]"),
    ([-1, 0], [0, 0], r"learner must lie in \[0, 3\); got range \[-1, 0\]"),
  ],
)
def test_bad_learner_or_k(learner, k, match):
  batches = LearnerBatches(_dataset(), batch_per_learner=2, learners=3, seed=0)
  with pytest.raises(ValueError, match=match):
    batches(np.array(learner), np.array(k))


def test_augmentation_draws_are_pure_and_cover_every_offset():
  global_batches = np.arange(200)
  keys = batch_keys(3, AUGMENTATION_STREAM, global_batches)
  offsets, flips = draw_crop_and_flip(keys, 16, padding=4)
  again_offsets, again_flips = draw_crop_and_flip(keys[::-1], 16, padding=4)
  np.testing.assert_array_equal(offsets.reshape(200, 16, 2)[::-1], again_offsets.reshape(200, 16, 2))
  np.testing.assert_array_equal(flips.reshape(200, 16)[::-1], again_flips.reshape(200, 16))
  assert offsets.shape == (3200, 2) and flips.shape == (3200,)
  for axis in range(2):
    counts = np.bincount(offsets[:, axis], minlength=9)
    assert counts.size == 9 and counts.min() > 3200 / 9 * 0.8, counts
  assert 0.45 < flips.mean() < 0.55
  other_seed, _ = draw_crop_and_flip(batch_keys(4, AUGMENTATION_STREAM, global_batches), 16, padding=4)
  assert not np.array_equal(other_seed, offsets)


def test_batch_keys_differ_by_seed_stream_and_batch():
  keys = {
    name: batch_keys(*args, np.arange(1000))
    for name, args in {
      "base": (0, AUGMENTATION_STREAM),
      "seed": (1, AUGMENTATION_STREAM),
      "stream": (0, DROPOUT_STREAM),
    }.items()
  }
  assert all(np.unique(value).size == 1000 for value in keys.values())
  assert np.intersect1d(keys["base"], keys["seed"]).size == 0
  assert np.intersect1d(keys["base"], keys["stream"]).size == 0
  np.testing.assert_array_equal(keys["base"][[5, 7]], batch_keys(0, AUGMENTATION_STREAM, np.array([5, 7])))


def test_dropout_seeds_are_pure_per_learner_batch():
  batches = LearnerBatches(_dataset(), batch_per_learner=2, learners=3, seed=0, dropout_seeds=True)
  first = batches(np.array([0, 1, 2]), np.array([4, 4, 4]))["dropout_seed"]
  assert first.dtype == np.uint32 and first.shape == (3,) and np.unique(first).size == 3
  np.testing.assert_array_equal(batches(np.array([2, 0]), np.array([4, 4]))["dropout_seed"], first[[2, 0]])
  assert "dropout_seed" not in LearnerBatches(_dataset(), batch_per_learner=2, learners=3, seed=0)(
    np.array([0]), np.array([0])
  )


def test_the_smallest_valid_arguments_are_accepted():
  """A one-example training split, no crop padding, one cached epoch (recomputed when another is read)."""
  one = LearnerBatches(_dataset(num_train=1), batch_per_learner=3, learners=1, seed=0, crop_padding=0)
  assert one.sample_indices(np.array([0]), np.array([0])).tolist() == [[0, 0, 0]]
  batches = LearnerBatches(_dataset(), batch_per_learner=2, learners=3, seed=0, cached_epochs=1)
  first = batches.epoch_permutation(0).copy()
  batches.epoch_permutation(1)
  np.testing.assert_array_equal(batches.epoch_permutation(0), first)


def test_the_permutation_cache_keeps_the_most_recent_epochs():
  batches = LearnerBatches(_dataset(), batch_per_learner=2, learners=3, seed=0, cached_epochs=2)
  for epoch in (0, 1, 2, 1, 3):
    batches.epoch_permutation(epoch)
  assert list(batches._permutations) == [1, 3]


def test_a_dropout_seed_is_the_high_half_of_its_batch_key():
  """The counter-based key of global batch g = k lambda + learner in the dropout stream, bits 32-63."""
  batches = LearnerBatches(_dataset(), batch_per_learner=2, learners=3, seed=7, dropout_seeds=True)
  seeds = batches(np.array([0, 2]), np.array([4, 5]))["dropout_seed"]
  keys = batch_keys(7, DROPOUT_STREAM, np.array([12, 17]))
  np.testing.assert_array_equal(seeds, (keys // np.uint64(2**32)).astype(np.uint32))


def test_defaults_pad_crops_by_4_pixels_and_cache_4_epochs():
  batches = LearnerBatches(_dataset(), batch_per_learner=2, learners=3, seed=0)
  assert (batches.crop_padding, batches.cached_epochs) == (4, 4)


def test_an_empty_training_split_is_refused():
  with pytest.raises(ValueError, match="dataset 'synthetic' has an empty training split"):
    LearnerBatches(_dataset(num_train=0), batch_per_learner=2, learners=3, seed=0)


def test_float_inputs_are_read_as_they_are_and_refuse_augmentation():
  rng = np.random.default_rng(0)
  train = ArraySource(rng.normal(size=(6, 2, 2, 1)).astype(np.float32), rng.integers(0, 2, 6))
  dataset = Dataset(
    name="floats", source="npz", train=train, test=train, num_classes=2, normalization=fit_normalization("raw", train)
  )
  batch = LearnerBatches(dataset, batch_per_learner=2, learners=1, seed=0)(np.array([0]), np.array([0]))
  assert batch["image"].shape == (1, 2, 2, 2, 1)
  with pytest.raises(ValueError, match="augment=True for dataset 'floats'"):
    LearnerBatches(dataset, batch_per_learner=2, learners=1, seed=0, augment=True)


def test_an_epochs_order_is_numpys_permutation_in_stream_0():
  """Epoch e's order is ``np.random.default_rng((seed, 0, e)).permutation(N)`` (stream 0 of the seed)."""
  batches = LearnerBatches(_dataset(num_train=24), batch_per_learner=2, learners=3, seed=5)
  for epoch in (0, 3):
    np.testing.assert_array_equal(
      batches.epoch_permutation(epoch), np.random.default_rng((5, 0, epoch)).permutation(24)
    )


def test_options_are_keyword_only():
  with pytest.raises(TypeError):
    LearnerBatches(_dataset(), 2, 3, 0, True)
