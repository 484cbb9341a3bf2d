"""The oracle for engine tests: a naive parameter server, one event at a time.

It keeps every past weight version in a Python dict, computes each gradient
alone (one jitted gradient call per contribution, at the weights the
contribution's learner pulled, on that learner's own mini-batch) and applies
the updates in schedule order with a server optimizer written in numpy. Nothing
is batched, sharded or buffered, so it is slow and obviously right; every engine
test compares against it.

Written from the parameter-server protocol's text, docs/algorithms.md §1: a learner pulls w_t with its timestamp
t, computes its gradient there and pushes it; update u that applies a gradient computed at timestamp j sees
staleness sigma = u - j. The version j of each contribution is read from the pulls in the schedule's event trace
(`contribution_versions`: the START event of learner m's k-th gradient records the timestamp of the weights it
pulled), never from ``Schedule.timestamp`` or ``Schedule.staleness`` / ``staleness_of``, which the engine's blocks
read; sigma = u - j is computed here. The server optimizer (`server_step`) is the equations of docs/algorithms.md
§1-§2 in float64 numpy: DC-ASGD-a (Zheng et al.; MeanSquare blended once per update with the mean g*g over its c
gradients, docs/semantics.md §6), Zhang et al.'s alpha0/sigma (eq. 3) and average (eq. 2), then optax.sgd's
momentum v <- avg + mu v, w <- w - alpha v.

What it shares with the code under test: the schedule (its input: which learners' k-th gradients update u
applies, in arrival order, and the event trace a simulation with ``record_events=True`` attaches) and the loss;
gradients are `jax.grad` at float32 weights, the rest is numpy. It imports nothing from stalesgd.

Also holds the tiny models and data the engine tests share.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

NUM_EXAMPLES = 512
BATCH_PER_LEARNER = 4

# EventTrace.kind as documented there: a learner starts computing at the weights it pulled (START), the server
# receives its gradient (ARRIVE). Written out, not imported.
PULL, PUSH = 0, 1


def contribution_versions(schedule) -> tuple[np.ndarray, np.ndarray]:
  """(version j, staleness u - j), int64 [U, c] each, of every applied contribution, from the pulls and pushes.

  Learner m's k-th gradient is computed at the weights its k-th pull returned; the trace's START event of (m, k)
  records their server timestamp. Update u applies row u's contributions, so sigma = u - j. As the protocol says,
  a gradient reaches the server after it was computed and is applied once it has: j <= (server timestamp at its
  push) <= u, checked here.
  """
  events = schedule.events
  if events is None:
    raise ValueError(
      "the engine oracle reads who pulled which version from the event trace: simulate(..., record_events=True)"
    )
  pulled, pushed = {}, {}
  for kind, learner, k, timestamp in zip(
    events.kind.tolist(), events.learner.tolist(), events.batch_index.tolist(), events.timestamp.tolist()
  ):
    record = pulled if kind == PULL else pushed if kind == PUSH else None
    if record is None or (learner, k) in record:
      raise ValueError(f"event of kind {kind} for learner {learner}'s gradient {k}: unknown kind or seen twice")
    record[(learner, k)] = timestamp
  updates, contributions = schedule.learner.shape
  versions = np.zeros((updates, contributions), np.int64)
  for update in range(updates):
    for slot in range(contributions):
      key = (int(schedule.learner[update, slot]), int(schedule.batch_index[update, slot]))
      versions[update, slot] = pulled[key]
      if not pulled[key] <= pushed[key] <= update:
        raise ValueError(
          f"learner {key[0]}'s gradient {key[1]}: pulled at {pulled[key]}, pushed at {pushed[key]}, applied by {update}"
        )
  return versions, np.arange(updates, dtype=np.int64)[:, None] - versions


def server_step(
  weights,
  velocity,
  mean_square,
  grads,
  stale,
  staleness,
  *,
  learning_rate,
  momentum,
  staleness_rule,
  dc_lambda,
  dc_decay,
  dc_eps,
):
  """One server update in float64 numpy (dicts of arrays; ``grads`` and ``stale`` lists of c dicts).

  DC-ASGD-a when ``dc_lambda`` is not None: MeanSquare <- m MeanSquare + (1 - m) mean_k g_k * g_k, then
  g~_k = g_k + lambda0 / sqrt(MeanSquare + eps) * g_k * g_k * (w - w_bak,k). s(sigma) = 1/sigma for sigma > 0 and 1
  at 0 with ``staleness_rule="inverse"``, 1 with None. avg = (1/c) sum_k s(sigma_k) g~_k; v <- avg + mu v;
  w <- w - alpha v. Returns (weights, velocity, mean_square).
  """
  c = len(grads)
  if staleness_rule is None:
    scales = [1.0] * c
  elif staleness_rule == "inverse":
    scales = [1.0 / sigma if sigma > 0 else 1.0 for sigma in staleness]
  else:
    raise ValueError(staleness_rule)
  new_weights, new_velocity, new_mean_square = {}, {}, {}
  for name, w in weights.items():
    g = [grad[name] for grad in grads]
    if dc_lambda is not None:
      new_mean_square[name] = dc_decay * mean_square[name] + (1.0 - dc_decay) * sum(x * x for x in g) / c
      rate = dc_lambda / np.sqrt(new_mean_square[name] + dc_eps)
      g = [x + rate * x * x * (w - old[name]) for x, old in zip(g, stale)]
    average = sum(scale * x for scale, x in zip(scales, g)) / c
    new_velocity[name] = average + momentum * velocity[name]
    new_weights[name] = w - learning_rate * new_velocity[name]
  return new_weights, new_velocity, new_mean_square


def run_oracle(
  loss_fn,
  params,
  schedule,
  batch_fn,
  *,
  learning_rate: float,
  momentum: float,
  staleness_rule: str | None = None,
  dc_lambda: float | None = None,
  dc_decay: float = 0.95,
  dc_eps: float = 1e-7,
  num_updates: int | None = None,
):
  """Final weights (float64 numpy) after walking ``schedule`` update by update with `server_step`."""
  num_updates = schedule.num_updates if num_updates is None else num_updates
  versions, staleness = contribution_versions(schedule)
  gradient = jax.jit(jax.grad(loss_fn))
  weights = {name: np.asarray(value, np.float64) for name, value in params.items()}
  history = {0: weights}
  velocity = {name: np.zeros_like(value) for name, value in weights.items()}
  mean_square = {name: np.zeros_like(value) for name, value in weights.items()}
  for update in range(num_updates):
    grads, stale = [], []
    for slot in range(schedule.contributions_per_update):
      pulled = history[int(versions[update, slot])]
      learner = schedule.learner[update, slot : slot + 1]
      batch = jax.tree_util.tree_map(
        lambda leaf: leaf[0], batch_fn(learner, schedule.batch_index[update, slot : slot + 1])
      )
      at = {name: jnp.asarray(value, jnp.float32) for name, value in pulled.items()}
      grads.append({name: np.asarray(value, np.float64) for name, value in gradient(at, batch).items()})
      stale.append(pulled)
    weights, velocity, mean_square = server_step(
      weights,
      velocity,
      mean_square,
      grads,
      stale,
      staleness[update].tolist(),
      learning_rate=learning_rate,
      momentum=momentum,
      staleness_rule=staleness_rule,
      dc_lambda=dc_lambda,
      dc_decay=dc_decay,
      dc_eps=dc_eps,
    )
    history[update + 1] = weights
  return weights


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
