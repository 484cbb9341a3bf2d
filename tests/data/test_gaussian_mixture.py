"""Liu et al.'s toy data (stalesgd/data/_gaussian_mixture.py) against the asyncdiloco notebook's own statements,
written out here (numpy's legacy generator and Python's random, seeded 42), at small sizes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from stalesgd.data import LearnerBatches, load_dataset
from stalesgd.data._gaussian_mixture import gaussian_mixture, notebook_indices


def notebook_make_data(n, clusters_per_class, num_classes, dim, ep, seed):
  """The notebook's make_data after np.random.seed(seed), line by line."""
  np.random.seed(seed)
  k = clusters_per_class * num_classes
  n_per_cluster = n // k
  n_per_class = n_per_cluster * clusters_per_class
  centers = np.random.randn(k, dim)
  centers = centers / np.linalg.norm(centers, axis=1, keepdims=True)
  x = np.concatenate([ep * np.random.randn(n_per_cluster, dim) + centers[i].reshape(1, -1) for i in range(k)])
  y = np.concatenate([i * np.ones(n_per_class, dtype="int32") for i in range(num_classes)])
  return x, y


def test_the_points_and_labels_are_the_notebooks():
  points, labels = gaussian_mixture(num_points=96, clusters_per_class=3, num_classes=4, dim=5, noise=0.5, seed=42)
  x, y = notebook_make_data(96, 3, 4, 5, 0.5, 42)
  np.testing.assert_array_equal(points, x)
  np.testing.assert_array_equal(labels, y)
  # Cluster k (8 points each) is class k // 3.
  assert labels.tolist() == [k // 3 for k in range(12) for _ in range(8)]


def test_the_shards_and_the_evaluation_points_are_the_notebooks():
  shards, evaluation = notebook_indices(num_points=1000, shards=4, evaluation_points=100, seed=42)
  random.seed(42)  # the notebook: random.shuffle, cut into shards, then random.sample of all indices
  total = list(range(1000))
  random.shuffle(total)
  assert shards == [total[i * 250 : (i + 1) * 250] for i in range(4)]
  assert evaluation == random.sample(list(range(1000)), 100)
  assert sorted(index for shard in shards for index in shard) == list(range(1000))


def small_toy():
  points, labels = gaussian_mixture(num_points=64, clusters_per_class=2, num_classes=4, dim=6, noise=0.5, seed=42)
  inputs = points.astype(np.float32)[:, None, :]
  _, evaluation = notebook_indices(len(points), 4, 16, 42)
  return {"train": (inputs, labels), "test": (inputs[evaluation], labels[evaluation]), "num_classes": 4}


def test_it_loads_through_the_python_source_as_float_features():
  dataset = load_dataset(f"{__name__}:small_toy", source="python", normalization="raw")
  assert dataset.image_shape == (1, 6, 1) and dataset.num_classes == 4 and dataset.num_train == 64
  batch = LearnerBatches(dataset, batch_per_learner=8, learners=4, seed=0)(learner=np.array([1]), k=np.array([0]))
  assert batch["image"].dtype == np.float32 and batch["image"].shape == (1, 8, 1, 6, 1)
  with pytest.raises(ValueError, match="allowed: 'raw'"):
    load_dataset(f"{__name__}:small_toy", source="python", normalization="unit")
