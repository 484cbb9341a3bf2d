"""`LearnerBatches`: each learner's k-th mini-batch as a pure function of (seed, learner, k).

The rule (so that a schedule, a checkpoint or another process can recompute any
batch without state): learner l's k-th gradient uses global batch number

  g = k * learners + l,

whose mu samples are positions g mu, ..., g mu + mu - 1 of the endless
concatenation of per-epoch permutations of the training split, epoch e permuted
by a numpy Generator seeded with (seed, 0, e). So the learners together sweep
the data once per epoch, different learners never share a sample within an
epoch, and the same (seed, learner, k) always gives the same batch, however the
emulated cluster interleaves them. Optional augmentation draws each sample's
crop and flip, and optional dropout seeds come, from counter-based hashes of
(seed, g) (`stalesgd.data._counter_hash`): sample j of global batch g gets the
same pixels however many threads decode it. The augmentation is the data set's
kind's (`LearnerBatches.augmentation`): pad-and-crop for splits in memory, the
Inception crop for lazily decoded ImageNet.

Fast on the host: a call is one fancy-indexing gather plus a vectorised
normalisation; the permutations of the few most recent epochs are cached.
"""

from __future__ import annotations

import collections

import numpy as np

from stalesgd.data._augmentation import draw_crop_and_flip, random_crop_and_flip
from stalesgd.data._counter_hash import AUGMENTATION_STREAM, DROPOUT_STREAM, batch_keys
from stalesgd.data._dataset import Dataset
from stalesgd.data._inception_crop import draw_inception_crops
from stalesgd.data._sources import LazyImageSource

_PERMUTATION_STREAM = 0
# What ``augment=True`` does, by the kind of training split (`LearnerBatches.augmentation`).
NO_AUGMENTATION, PAD_CROP, INCEPTION_CROP = "none", "pad_crop_flip", "inception_crop_flip"


def _positive_int(value: int, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive int; got {value!r}")
  return int(value)


class LearnerBatches:
  """Mini-batches of ``batch_per_learner`` (mu) samples for ``learners`` (lambda) learners.

  ``augmentation`` says what the training batches get: ``"none"``,
  ``"pad_crop_flip"`` (``augment`` on a split in memory) or
  ``"inception_crop_flip"`` (``augment`` on a lazily decoded split).

  Example:
    >>> from stalesgd.data import LearnerBatches, load_dataset
    >>> batches = LearnerBatches(load_dataset("digits", source="embedded"),
    ...                          batch_per_learner=4, learners=8, seed=0)
    >>> batch = batches(learner=np.array([0, 3]), k=np.array([5, 5]))
    >>> batch["image"].shape, batch["label"].shape
    ((2, 4, 8, 8, 1), (2, 4))
  """

  def __init__(
    self,
    dataset: Dataset,
    *,
    batch_per_learner: int,
    learners: int,
    seed: int,
    augment: bool = False,
    crop_padding: int = 4,
    dropout_seeds: bool = False,
    cached_epochs: int = 4,
  ):
    """Args:
    dataset: the data set; its training split is batched.
    batch_per_learner: mu, samples per mini-batch.
    learners: lambda, number of learners sharing the data.
    seed: non-negative int; with (learner, k) it determines every batch.
    augment: the training augmentation of the data set's kind: for a split
      held in memory (CIFAR-10, MNIST, npz) a random crop of the
      zero-padded image (``crop_padding``) and a horizontal flip
      (`stalesgd.data._augmentation`); for a lazily decoded split (tfds
      ImageNet, a `LazyImageSource`) the Inception random-resized crop of
      the original image and a flip (`stalesgd.data._inception_crop`).
    crop_padding: padding of the in-memory random crop, in pixels.
    dropout_seeds: add ``"dropout_seed"`` (uint32 [S]) to every batch, for
      models whose `ModelSpec.uses_dropout`.
    cached_epochs: how many epoch permutations to keep.
    """
    self.batch_per_learner = _positive_int(batch_per_learner, "batch_per_learner")
    self.learners = _positive_int(learners, "learners")
    self.cached_epochs = _positive_int(cached_epochs, "cached_epochs")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    if crop_padding < 0:
      raise ValueError(f"crop_padding must be >= 0; got {crop_padding!r}")
    if dataset.num_train < 1:
      raise ValueError(f"dataset {dataset.name!r} has an empty training split")
    self.dataset, self.seed = dataset, int(seed)
    self.augment, self.crop_padding = bool(augment), int(crop_padding)
    lazy = isinstance(dataset.train, LazyImageSource)
    if self.augment and dataset.train.float_inputs:
      raise ValueError(
        f"augment=True for dataset {dataset.name!r}, whose inputs are float32 values, not pixels; allowed: False"
      )
    self.augmentation = NO_AUGMENTATION if not self.augment else INCEPTION_CROP if lazy else PAD_CROP
    self.dropout_seeds = bool(dropout_seeds)
    self._permutations: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

  def epoch_permutation(self, epoch: int) -> np.ndarray:
    """The order of the training split in ``epoch`` (cached)."""
    permutation = self._permutations.get(epoch)
    if permutation is None:
      generator = np.random.default_rng((self.seed, _PERMUTATION_STREAM, epoch))
      permutation = generator.permutation(self.dataset.num_train)
      self._permutations[epoch] = permutation
      if len(self._permutations) > self.cached_epochs:
        self._permutations.popitem(last=False)
    else:
      self._permutations.move_to_end(epoch)
    return permutation

  def global_batch(self, learner: np.ndarray, k: np.ndarray) -> np.ndarray:
    """g = k * learners + learner, int64 [S], after validating the arguments."""
    learner, k = np.broadcast_arrays(np.atleast_1d(np.asarray(learner)), np.atleast_1d(np.asarray(k)))
    if learner.ndim != 1 or not (np.issubdtype(learner.dtype, np.integer) and np.issubdtype(k.dtype, np.integer)):
      raise ValueError(
        f"learner and k must be 1-D integer arrays of one length; got shapes "
        f"{learner.shape}, {k.shape} and dtypes {learner.dtype}, {k.dtype}"
      )
    if learner.size and (learner.min() < 0 or learner.max() >= self.learners):
      raise ValueError(f"learner must lie in [0, {self.learners}); got range [{learner.min()}, {learner.max()}]")
    if k.size and k.min() < 0:
      raise ValueError(f"k must be >= 0; got minimum {k.min()}")
    return k.astype(np.int64) * self.learners + learner.astype(np.int64)

  def sample_indices(self, learner: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Training-split indices of each batch's samples, int64 [S, mu]."""
    return self._indices_of_global_batches(self.global_batch(learner, k))

  def _indices_of_global_batches(self, global_batches: np.ndarray) -> np.ndarray:
    positions = global_batches[:, None] * self.batch_per_learner + np.arange(self.batch_per_learner)
    epochs, within = np.divmod(positions, self.dataset.num_train)
    indices = np.empty_like(positions)
    for epoch in np.unique(epochs):
      in_epoch = epochs == epoch
      indices[in_epoch] = self.epoch_permutation(int(epoch))[within[in_epoch]]
    return indices

  def __call__(self, learner: np.ndarray, k: np.ndarray) -> dict[str, np.ndarray]:
    """The mini-batches of learners ``learner[s]`` at their ``k[s]``-th gradients.

    Args:
      learner: int [S], learner ids in [0, learners).
      k: int [S], per-learner batch counters (0-based).

    Returns:
      ``{"image": float32 [S, mu, H, W, C], "label": int32 [S, mu]}``, normalised,
      plus ``"dropout_seed"`` uint32 [S] when ``dropout_seeds``.
    """
    global_batches = self.global_batch(learner, k)
    indices = self._indices_of_global_batches(global_batches)
    if self.augmentation == INCEPTION_CROP:
      draws = draw_inception_crops(batch_keys(self.seed, AUGMENTATION_STREAM, global_batches), self.batch_per_learner)
      images, labels = self.dataset.train.read_inception_crops(indices.reshape(-1), draws)
    else:
      images, labels = self.dataset.train.read(indices.reshape(-1))
    if self.augmentation == PAD_CROP:
      offsets, flips = draw_crop_and_flip(
        batch_keys(self.seed, AUGMENTATION_STREAM, global_batches), self.batch_per_learner, self.crop_padding
      )
      images = random_crop_and_flip(images, offsets, flips, self.crop_padding)
    shape = indices.shape
    batch = {
      "image": self.dataset.preprocess(images).reshape(*shape, *images.shape[1:]),
      "label": labels.reshape(shape),
    }
    if self.dropout_seeds:
      keys = batch_keys(self.seed, DROPOUT_STREAM, global_batches)
      batch["dropout_seed"] = (keys >> np.uint64(32)).astype(np.uint32)
    return batch
