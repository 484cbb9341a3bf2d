"""The numpy references of local runs and synchronous DiLoCo, and their least-squares problem.

Written out in float64 from the equations (stalesgd/transforms/_local_run.py, docs/algorithms.md §7), never by
calling the code under test: SGD u = -eta g; momentum SGD (optax.trace) v <- g + beta v, u = -eta v; Nesterov SGD
v <- g + beta v, u = -eta (g + beta v). The loss is linear least squares, L(w, b; x, y) = 0.5 mean((x w + b - y)^2),
whose gradient is (x^T r / n, mean r) with r = x w + b - y. RTOL and ATOL are the float32-against-float64
tolerances of tests/transforms/test_local_run.py (its docstring says why).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

RTOL, ATOL = 1e-6, 1e-7
FEATURES, BATCH = 3, 4


def least_squares(params, batch):
  x, y = batch
  residual = x @ params["w"] + params["b"] - y
  return 0.5 * jnp.mean(residual**2)


def numpy_loss_and_gradient(params, batch):
  x, y = (np.asarray(part, np.float64) for part in batch)
  residual = x @ params["w"] + params["b"] - y
  return 0.5 * np.mean(residual**2), {"w": x.T @ residual / len(y), "b": np.mean(residual)}


def initial_params(seed=0):
  rng = np.random.default_rng(seed)
  return {"w": rng.normal(size=FEATURES).astype(np.float32), "b": np.float32(rng.normal())}


def batch_stream(seed, steps):
  """A learner's mini-batches, leaves [steps, BATCH, ...]: its k-th inner step overall reads row k."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(steps, BATCH, FEATURES)).astype(np.float32)
  y = rng.normal(size=(steps, BATCH)).astype(np.float32)
  return x, y


def as_float64(tree):
  return jax.tree.map(lambda leaf: np.asarray(leaf, np.float64), tree)


def numpy_inner_run(params, velocity, batches, eta, beta, nesterov=False):
  """theta_0 - theta_H, theta_H, the velocity after the run, and the losses; beta = None is plain SGD."""
  start = as_float64(params)
  weights = dict(start)
  losses = []
  x, y = batches
  for i in range(len(y)):
    loss, grads = numpy_loss_and_gradient(weights, (x[i], y[i]))
    losses.append(loss)
    if beta is None:
      steps = grads
    else:
      velocity = {k: grads[k] + beta * velocity[k] for k in grads}
      steps = {k: grads[k] + beta * velocity[k] for k in grads} if nesterov else velocity
    weights = {k: weights[k] - eta * steps[k] for k in weights}
  delta = {k: start[k] - weights[k] for k in start}
  return delta, weights, velocity, np.asarray(losses)


def assert_tree_close(actual, expected, rtol=RTOL, atol=ATOL):
  for key in expected:
    np.testing.assert_allclose(np.asarray(actual[key], np.float64), expected[key], rtol=rtol, atol=atol, err_msg=key)


def assert_trees_equal(actual, expected):
  for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(a, b)


def numpy_diloco(params, streams, rounds, steps, inner_eta, outer_eta, outer_beta):
  """Synchronous DiLoCo in numpy: every learner m runs SGD(inner_eta) from theta on its batches r H .. r H + H - 1,
  Delta_bar = mean_m (theta - theta_{m,H}), then Nesterov: v <- Delta_bar + beta v, theta <- theta - eta
  (Delta_bar + beta v). Returns theta after each round, and each round's Delta_m and losses [M, H]."""
  theta = as_float64(params)
  velocity = {k: np.zeros_like(v) for k, v in theta.items()}
  history = []
  for r in range(rounds):
    deltas, losses = [], []
    for x, y in streams:
      delta, _, _, learner_losses = numpy_inner_run(
        theta, None, (x[r * steps : (r + 1) * steps], y[r * steps : (r + 1) * steps]), inner_eta, None
      )
      deltas.append(delta)
      losses.append(learner_losses)
    mean = {k: np.mean([delta[k] for delta in deltas], axis=0) for k in theta}
    velocity = {k: mean[k] + outer_beta * velocity[k] for k in theta}
    theta = {k: theta[k] - outer_eta * (mean[k] + outer_beta * velocity[k]) for k in theta}
    history.append((theta, deltas, np.asarray(losses)))
  return history


def learner_batches(streams, r, steps):
  """Round r's batches of every learner, leaves [M, H, ...]: learner m's rows r H .. r H + H - 1."""
  return tuple(np.stack([stream[part][r * steps : (r + 1) * steps] for stream in streams]) for part in range(2))


def numpy_parameter_server(params, schedule, streams, steps, inner_eta, inner_beta, server_eta, server_beta, reset):
  """A parameter server applying local runs, in numpy, one update at a time.

  Update u averages its c contributions' Delta and applies momentum SGD (optax.trace: v <- Delta_bar + beta v,
  theta <- theta - eta v). Contribution (learner m, timestamp j, batch index k) runs momentum SGD (inner_beta
  None: plain SGD) from theta_j on m's batches k H .. k H + H - 1 of ``streams[m]``, from the velocity m's
  previous contribution left (zero at first, and every time with ``reset``). Returns theta after every update.
  """
  per_learner = np.broadcast_to(np.asarray(steps), (len(streams),))  # H, or H_m per learner (dynamic)
  history = [as_float64(params)]
  velocity_server = {k: np.zeros_like(v) for k, v in history[0].items()}
  zeros = {k: np.zeros_like(v) for k, v in history[0].items()}
  inner_velocity = {}
  for update in range(schedule.num_updates):
    deltas = []
    for slot in range(schedule.contributions_per_update):
      learner = int(schedule.learner[update, slot])
      k, taken = int(schedule.batch_index[update, slot]), int(per_learner[learner])
      x, y = streams[learner]
      batches = (x[k * taken : (k + 1) * taken], y[k * taken : (k + 1) * taken])
      start = zeros if reset or inner_beta is None else inner_velocity.get(learner, zeros)
      theta_j = history[int(schedule.timestamp[update, slot])]
      delta, _, velocity, _ = numpy_inner_run(theta_j, start, batches, inner_eta, inner_beta)
      inner_velocity[learner] = velocity
      deltas.append(delta)
    mean = {k: np.mean([delta[k] for delta in deltas], axis=0) for k in history[0]}
    velocity_server = {k: mean[k] + server_beta * velocity_server[k] for k in mean}
    history.append({k: history[-1][k] - server_eta * velocity_server[k] for k in mean})
  return history


def stream_batch_fn(streams):
  """The engine's ``batch_fn(learner, index)`` over per-learner streams: learner m's mini-batch i is row i."""

  def batch_fn(learners, indices):
    x = np.stack([streams[m][0][i] for m, i in zip(learners, indices)])
    y = np.stack([streams[m][1][i] for m, i in zip(learners, indices)])
    return x, y

  return batch_fn
