"""Data: tfds / npz / embedded sources, normalisation, and per-learner mini-batches.

``load_dataset(name, source=..., data_dir=..., normalization=...)`` returns a
`Dataset`; `LearnerBatches` makes each learner's k-th mini-batch a pure function
of (seed, learner, k); `evaluation_batches` and `precise_bn_batches` feed
evaluation.
"""

from __future__ import annotations

from stalesgd.data._dataset import Dataset, DatasetNotPreparedError
from stalesgd.data._evaluation_batches import evaluation_batches, evaluation_indices, precise_bn_batches
from stalesgd.data._learner_batches import LearnerBatches
from stalesgd.data._loading import SOURCES, load_dataset
from stalesgd.data._normalization import NORMALIZATIONS, Normalization, fit_normalization
from stalesgd.data._sources import ArraySource, ImageSource, LazyImageSource

__all__ = [
  "ArraySource",
  "Dataset",
  "DatasetNotPreparedError",
  "ImageSource",
  "LazyImageSource",
  "LearnerBatches",
  "NORMALIZATIONS",
  "Normalization",
  "SOURCES",
  "evaluation_batches",
  "evaluation_indices",
  "fit_normalization",
  "load_dataset",
  "precise_bn_batches",
]
