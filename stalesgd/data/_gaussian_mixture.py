"""The mixture of mixtures of Gaussians of Liu et al.'s toy setting (arXiv 2401.09135), as DeepMind's asyncdiloco
notebook (``AsyncLocalSGDToyExample.ipynb``) generates it.

K = clusters_per_class x num_classes Gaussians in D dimensions: centre k is a standard normal draw scaled to unit
length, and its N // K points are ``noise`` x a standard normal draw plus the centre; cluster k belongs to class
k // clusters_per_class. The notebook's "big" data: N = 128,000, 8 clusters per class, 4 classes, D = 512, noise
0.5, drawn with numpy's legacy generator seeded 42 (``np.random.seed(42)``: the centres first, then the clusters'
points in order), so the arrays here are the notebook's. Its evaluation set is 10,000 of those same training
points, drawn with Python's ``random`` seeded 42 after it shuffled the indices into four data shards; `liu_toy` keeps
both, so the test split is the notebook's too.

For ``config.data_source = "python"`` with ``config.dataset = "stalesgd.data._gaussian_mixture:liu_toy"`` (float32
inputs [N, 1, D], taken as they are: ``config.normalization = "raw"``).
"""

from __future__ import annotations

import random

import numpy as np

LIU_TOY = {"num_points": 128_000, "clusters_per_class": 8, "num_classes": 4, "dim": 512, "noise": 0.5}
LIU_TOY_SEED = 42
LIU_TOY_SHARDS = 4
LIU_TOY_EVALUATION_POINTS = 10_000


def gaussian_mixture(
  num_points: int, clusters_per_class: int, num_classes: int, dim: int, noise: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """(points float64 [K (N // K), dim], labels int64) in cluster order, with ``np.random.RandomState(seed)``."""
  generator = np.random.RandomState(seed)
  clusters = clusters_per_class * num_classes
  per_cluster = num_points // clusters
  centres = generator.randn(clusters, dim)
  centres = centres / np.linalg.norm(centres, axis=1, keepdims=True)
  points = np.concatenate([noise * generator.randn(per_cluster, dim) + centres[k][None] for k in range(clusters)])
  labels = np.repeat(np.arange(num_classes), per_cluster * clusters_per_class)
  return points, labels


def notebook_indices(num_points: int, shards: int, evaluation_points: int, seed: int) -> tuple[list, list[int]]:
  """The notebook's shards (a shuffle of the indices cut into ``shards`` equal parts) and its evaluation indices
  (a sample of all indices), with Python's ``random.Random(seed)`` in that order."""
  generator = random.Random(seed)
  order = list(range(num_points))
  generator.shuffle(order)
  size = num_points // shards
  shard_indices = [order[s * size : (s + 1) * size] for s in range(shards)]
  return shard_indices, generator.sample(range(num_points), evaluation_points)


def liu_toy() -> dict:
  """The notebook's big data set: 128,000 training points (all of them) and its 10,000 evaluation points."""
  points, labels = gaussian_mixture(**LIU_TOY, seed=LIU_TOY_SEED)
  _, evaluation = notebook_indices(len(points), LIU_TOY_SHARDS, LIU_TOY_EVALUATION_POINTS, LIU_TOY_SEED)
  inputs = points.astype(np.float32)[:, None, :]
  return {
    "train": (inputs, labels),
    "test": (inputs[evaluation], labels[evaluation]),
    "num_classes": LIU_TOY["num_classes"],
  }
