"""Data: tfds / npz / embedded sources, normalisation, and per-learner mini-batches.

``load_dataset(name, source=..., data_dir=..., normalization=...)`` returns a
`Dataset`; `LearnerBatches` makes each learner's k-th mini-batch a pure function
of (seed, learner, k). Private: the sources (``_sources``, ``_tfds_source``,
``_npz_source``, ``_python_source``), normalisation (``_normalization``) and the
evaluation batches (``_evaluation_batches``).
"""

from __future__ import annotations

from stalesgd.data._dataset import Dataset, DatasetNotPreparedError
from stalesgd.data._learner_batches import LearnerBatches
from stalesgd.data._loading import load_dataset

__all__ = [
  "Dataset",
  "DatasetNotPreparedError",
  "LearnerBatches",
  "load_dataset",
]
