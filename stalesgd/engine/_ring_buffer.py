"""The staleness queue: past server weights kept on device in a ring buffer.

Every contribution is computed at the exact weights its learner pulled,
w_j = weights after j server updates. With maximal staleness sigma_max, only
w_{t - sigma_max}, ..., w_t are ever read, so a ring of depth sigma_max + 1
indexed by ``timestamp mod depth`` holds them all: one copy per distinct
version, not one per learner (a parameter server emulated naively keeps one
backup per learner, as DC-ASGD's server does).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any


class RingBuffer(NamedTuple):
  """Past weights; every leaf has shape [depth, *param.shape].

  Slot ``t mod depth`` holds w_t for the ``depth`` most recent timestamps t.
  """

  weights: PyTree


def ring_depth(ring: RingBuffer) -> int:
  return int(jax.tree_util.tree_leaves(ring.weights)[0].shape[0])


def ring_init(params: PyTree, depth: int) -> RingBuffer:
  """A ring of ``depth`` slots holding w_0 = ``params`` at timestamp 0.

  The other slots also start as copies of w_0; they are only read after being
  written, which the block planner guarantees.
  """
  if depth < 1:
    raise ValueError(f"ring depth must be >= 1, got {depth}")
  return RingBuffer(jax.tree_util.tree_map(lambda leaf: jnp.repeat(leaf[None], depth, axis=0), params))


def ring_read(ring: RingBuffer, timestamps: jax.Array) -> PyTree:
  """Weights at ``timestamps`` (int array of any shape) stacked along its axes."""
  slots = timestamps % ring_depth(ring)
  return jax.tree_util.tree_map(lambda leaf: leaf[slots], ring.weights)


def ring_write(ring: RingBuffer, timestamp: jax.Array, params: PyTree) -> RingBuffer:
  """Stores w_timestamp = ``params``, replacing w_{timestamp - depth}."""
  slot = timestamp % ring_depth(ring)
  return RingBuffer(jax.tree_util.tree_map(lambda leaf, new: leaf.at[slot].set(new), ring.weights, params))


def ring_bytes(ring: RingBuffer) -> int:
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(ring.weights))
