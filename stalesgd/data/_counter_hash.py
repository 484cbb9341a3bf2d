"""Counter-based random bits: a pure function of (seed, stream, global batch number).

Per-batch randomness (augmentation draws, dropout seeds) must be recomputable
from (seed, learner, k) alone, in any order and in any process, and cheap for a
whole block of batches at once. Hashing the counters with SplitMix64's output
function (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014), vectorised in numpy, gives that; a numpy Generator per batch would
cost more than the batch itself.
"""

from __future__ import annotations

import numpy as np

AUGMENTATION_STREAM, DROPOUT_STREAM = 1, 2


def splitmix64(values: np.ndarray) -> np.ndarray:
  """SplitMix64's bijective 64-bit mixer, elementwise on uint64."""
  with np.errstate(over="ignore"):
    mixed = np.asarray(values).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    mixed = (mixed ^ (mixed >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    mixed = (mixed ^ (mixed >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return mixed ^ (mixed >> np.uint64(31))


def batch_keys(seed: int, stream: int, global_batches: np.ndarray) -> np.ndarray:
  """uint64 [S]: key = mix(mix(mix(seed) ^ stream) + g) for each global batch g.

  Chained rather than XOR-ed hashes of the counters, so that (seed, g) pairs
  cannot cancel (mix(seed) ^ mix(g) would make (0, 1) and (1, 0) collide).
  """
  with np.errstate(over="ignore"):
    base = splitmix64(splitmix64(np.array([seed], np.uint64)) ^ np.uint64(stream))
    return splitmix64(base + np.asarray(global_batches, np.uint64))


def sample_hashes(keys: np.ndarray, batch_size: int) -> np.ndarray:
  """uint64 [S * batch_size]: h = mix(K ^ mix(j + 2^63)) for sample j of each batch key K, batch-major.

  One independent 64-bit hash per sample of every batch: the per-sample draws
  of the augmentations (`stalesgd.data._augmentation`,
  `stalesgd.data._inception_crop`) are read from these.
  """
  sample_keys = splitmix64(np.arange(batch_size, dtype=np.uint64) | np.uint64(1 << 63))
  return splitmix64(np.asarray(keys, np.uint64)[:, None] ^ sample_keys[None, :]).reshape(-1)
