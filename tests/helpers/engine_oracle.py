"""The oracle for engine tests: a naive parameter server, one event at a time.

It keeps every past weight version in a Python dict, computes each gradient
alone (one jitted gradient call per contribution, at the weights the
contribution's learner pulled, on that learner's own mini-batch) and applies
the updates in schedule order with plain optax calls. Nothing is batched,
sharded or buffered, so it is slow and obviously right; every engine test
compares against it.

Written from the parameter-server protocol's text (docs/algorithms.md: a contribution's gradient is computed at
the weight version its learner pulled, and an update u that applies it sees staleness sigma = u - that version).
It computes sigma itself from the version whose weights it used, never through `Schedule.staleness` /
`staleness_of`, which the engine's blocks read. What it shares with the code under test: the schedule's raw
arrays (timestamp, learner, batch_index: the input, not the engine) and the optimizer object the test builds (the
transforms are pinned by their own equations, tests/helpers/optimizer_equations.py; here they are the same on
both sides on purpose, so a difference is the engine's).

Also holds the tiny models and data the engine tests share.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from stalesgd.schedule import Schedule

NUM_EXAMPLES = 512
BATCH_PER_LEARNER = 4


def run_oracle(loss_fn, optimizer, params, schedule: Schedule, batch_fn, *, num_updates: int | None = None):
  """Final weights after walking ``schedule`` update by update."""
  num_updates = schedule.num_updates if num_updates is None else num_updates
  gradient = jax.jit(jax.grad(loss_fn))
  apply_update = jax.jit(
    lambda params, state, grads, staleness, stale, learner: _apply(
      optimizer, params, state, grads, staleness, stale, learner
    )
  )
  history = {0: jax.tree_util.tree_map(jnp.asarray, params)}
  weights, state = history[0], optimizer.init(history[0])
  for update in range(num_updates):
    grads, stale, sigma = [], [], []
    for slot in range(schedule.contributions_per_update):
      version = int(schedule.timestamp[update, slot])
      sigma.append(update - version)  # the versions applied since this gradient's weights were pulled
      learner = schedule.learner[update, slot : slot + 1]
      batch = batch_fn(learner, schedule.batch_index[update, slot : slot + 1])
      grads.append(gradient(history[version], jax.tree_util.tree_map(lambda leaf: leaf[0], batch)))
      stale.append(history[version])
    weights, state = apply_update(
      weights,
      state,
      _stack(grads),
      jnp.asarray(sigma, jnp.int32),
      _stack(stale),
      jnp.asarray(schedule.learner[update], jnp.int32),
    )
    history[update + 1] = weights
  return weights


def _apply(optimizer, params, state, grads, staleness, stale_params, learner):
  updates, state = optimizer.update(
    grads, state, params, staleness=staleness, stale_params=stale_params, learner=learner
  )
  return optax.apply_updates(params, updates), state


def _stack(trees):
  return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)


class Data:
  """A small regression/classification set; batches are pure in (learner, k)."""

  def __init__(self, input_shape, num_classes=4, seed=0):
    rng = np.random.default_rng(seed)
    self.inputs = rng.normal(size=(NUM_EXAMPLES,) + tuple(input_shape)).astype(np.float32)
    self.labels = rng.integers(0, num_classes, size=NUM_EXAMPLES).astype(np.int32)

  def __call__(self, learner, batch_index):
    learner = np.asarray(learner, np.int64)
    batch_index = np.asarray(batch_index, np.int64)
    first = (batch_index * 131 + learner * 37) % NUM_EXAMPLES
    indices = (first[:, None] + np.arange(BATCH_PER_LEARNER)[None]) % NUM_EXAMPLES
    return {"x": self.inputs[indices], "y": self.labels[indices]}


def _cross_entropy(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def mlp_params(seed=0, features=6, hidden=16, classes=4):
  rng = np.random.default_rng(seed)
  return {
    "w1": (rng.normal(size=(features, hidden)) / np.sqrt(features)).astype(np.float32),
    "b1": np.zeros(hidden, np.float32),
    "w2": (rng.normal(size=(hidden, classes)) / np.sqrt(hidden)).astype(np.float32),
    "b2": np.zeros(classes, np.float32),
  }


def mlp_loss(params, batch):
  hidden = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
  return _cross_entropy(hidden @ params["w2"] + params["b2"], batch["y"])


def cnn_params(seed=0, channels=4, classes=4):
  rng = np.random.default_rng(seed)
  return {
    "conv": (rng.normal(size=(3, 3, 1, channels)) / 3.0).astype(np.float32),
    "conv_bias": np.zeros(channels, np.float32),
    "dense": (rng.normal(size=(4 * 4 * channels, classes)) / 8.0).astype(np.float32),
    "dense_bias": np.zeros(classes, np.float32),
  }


def cnn_loss(params, batch):
  hidden = jax.lax.conv_general_dilated(
    batch["x"], params["conv"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  hidden = jax.nn.relu(hidden + params["conv_bias"])
  hidden = jax.lax.reduce_window(hidden, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
  logits = hidden.reshape(hidden.shape[0], -1) @ params["dense"] + params["dense_bias"]
  return _cross_entropy(logits, batch["y"])


MODELS = {
  "mlp": (mlp_loss, mlp_params, (6,)),
  "cnn": (cnn_loss, cnn_params, (8, 8, 1)),
}


def max_relative_error(actual, expected) -> float:
  errors = jax.tree_util.tree_map(
    lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(np.asarray(b))), 1e-30)),
    actual,
    expected,
  )
  return max(jax.tree_util.tree_leaves(errors))
