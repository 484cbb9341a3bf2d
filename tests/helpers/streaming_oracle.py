r"""Streaming DiLoCo in plain numpy, one inner step at a time: an oracle written from the algorithm's text.

Written from the text of Douillard et al., *Streaming DiLoCo with overlapping communication* (arXiv 2501.18512),
as the task that asked for this oracle states it, with the one-round-delayed step as in PCCL's asynchronous DiLoCo
and Kale et al.'s baseline, and eager updates as docs/algorithms.md §4 and §7 state Kale et al.'s (arXiv
2502.12996) rule:

* M learners each keep local weights theta_m and an inner optimizer state, and run inner steps without pause;
  H inner steps per round, P fragments (P divides H).
* After inner step k H / P of a round, fragment k - 1 is synced: Delta_m,p = Theta_p - theta_m,p, and
  mean_m Delta_m,p is in flight.
* tau inner steps after its sync (0 <= tau <= H) the mean lands: Theta_p <- Theta_p + OuterOpt_p(mean) with the
  fragment's own outer state, then theta_m,p <- alpha theta_m,p + (1 - alpha) Theta_p at the local weights reached
  by then.
* At one step boundary the syncs come first (they read the local weights the steps reached), then the means that
  land there are applied. tau = H, P = 1, alpha = 0: round r's mean is applied at the end of round r + 1, after
  round r + 1's Delta was taken.
* Eager updates: no mean waits to be applied; at every sync of fragment p each learner steps its own Theta_m,p
  and outer state with Delta~ = mean(previous sync of p) + (Delta_m,p - Delta_m,p(previous sync of p)) / M (zeros
  before the first), then mixes its local copy with alpha.

Shared with stalesgd: nothing but the documented fragment rule, leaf i of the weights in ``jax.tree`` flatten
order is in fragment i mod P. It is derived here from that rule (``jax.tree`` flattens a dict by sorted keys), not
imported; nothing here imports stalesgd, and there is no event list: the loop below keeps a queue of in-flight
means with the inner step they land at, and at each step boundary first syncs, then applies the means that land.

The learners' agreement, a diagnostic of the library's (docs/algorithms.md §7), is computed here from its
definition, the mean pairwise dot product of the pseudo-gradients over their mean squared norm,
sum_{m != k} Delta_m . Delta_k / ((M - 1) sum_m ||Delta_m||^2), pooled over the syncs a round counts: its own, except
a round-end sync whose mean is taken at the next round's start (tau > 0 or eager updates), which counts there.

The model is linear least squares over four arrays, so P can be 1, 2 or 4: for a mini-batch (x [n, 9], y [n]),
prediction = x[:, 0:3] a + x[:, 3:7] vec(b) + c + x[:, 7:9] d with a [3], b [2, 2] (row-major), c a scalar, d [2];
loss 0.5 mean((prediction - y)^2). The inner optimizer is SGD (u = -eta g) or heavy-ball momentum SGD (v <- g +
beta v, u = -eta v); the outer one Nesterov SGD on the pseudo-gradient, as docs/algorithms.md §7 states the
library's DiLoCo default: v <- Delta + beta v, Theta <- Theta - eta (Delta + beta v). Everything in float64.
"""

from __future__ import annotations

import numpy as np

FEATURES, BATCH = 9, 4
SHAPES = {"a": (3,), "b": (2, 2), "c": (), "d": (2,)}


def initial_weights(seed=0):
  """The four arrays, float32 (what both runs start from)."""
  rng = np.random.default_rng(seed)
  return {key: np.asarray(rng.normal(size=shape), np.float32) for key, shape in SHAPES.items()}


def streams(learners, steps, seed=0):
  """Every learner's mini-batches (x [steps, BATCH, FEATURES], y [steps, BATCH]), float32: its k-th inner step
  overall reads row k. y is a noisy linear function of x, so the runs make progress."""
  rng = np.random.default_rng(seed)
  truth = rng.normal(size=FEATURES)
  out = []
  for _ in range(learners):
    x = rng.normal(size=(steps, BATCH, FEATURES))
    y = x @ truth + 0.5 + 0.1 * rng.normal(size=(steps, BATCH))
    out.append((x.astype(np.float32), y.astype(np.float32)))
  return out


def prediction(weights, x):
  return x[:, 0:3] @ weights["a"] + x[:, 3:7] @ weights["b"].reshape(4) + weights["c"] + x[:, 7:9] @ weights["d"]


def loss_and_gradient(weights, x, y):
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  residual = prediction(weights, x) - y
  n = len(y)
  gradient = {
    "a": x[:, 0:3].T @ residual / n,
    "b": (x[:, 3:7].T @ residual / n).reshape(2, 2),
    "c": np.mean(residual),
    "d": x[:, 7:9].T @ residual / n,
  }
  return 0.5 * np.mean(residual**2), gradient


def streaming_diloco(
  weights,
  batches,
  rounds,
  steps,
  fragments,
  delay,
  mix,
  inner_eta,
  outer_eta,
  outer_beta,
  inner_beta=None,
  eager=False,
):
  """``rounds`` rounds of H = ``steps`` inner steps of M = len(batches) learners (module docstring).

  Args:
    weights: the starting weights (``SHAPES``), every copy of Theta and theta starts there.
    batches: per learner (x, y) with ``rounds * steps`` rows.
    fragments, delay, mix: P, tau, alpha.
    inner_eta, inner_beta: the inner SGD's rate, and its heavy-ball momentum (None: plain SGD).
    outer_eta, outer_beta: the outer Nesterov SGD's rate and momentum.
    eager: Kale et al.'s eager updates (``delay`` is then unused).

  Returns:
    One dict per round, taken after its last inner step and that boundary's events: ``outer`` (every learner's
    Theta_m; equal copies without eager), ``local`` (every theta_m), ``norms`` (per learner, the square root of
    the sum of ||Delta_m,p||^2 over the syncs of the round), ``losses`` (per learner, the mean loss of its inner
    steps in the round, each at the weights the step started from), ``agreement`` (module docstring: 1 for one
    learner or no pseudo-gradient).
  """
  learners = len(batches)
  keys = sorted(weights)  # jax.tree flattens a dict by sorted keys
  fragment_keys = [[key for index, key in enumerate(keys) if index % fragments == p] for p in range(fragments)]
  every = steps // fragments
  outer = [{key: np.asarray(value, np.float64) for key, value in weights.items()} for _ in range(learners)]
  local = [dict(copy) for copy in outer]
  inner_velocity = [{key: np.zeros_like(value) for key, value in copy.items()} for copy in outer]
  outer_velocity = [{key: np.zeros_like(value) for key, value in copy.items()} for copy in outer]
  queue = []  # (the inner step it lands at, fragment, mean): in flight
  previous_mean = {key: np.zeros_like(value) for key, value in outer[0].items()}  # eager only
  previous_own = [{key: np.zeros_like(value) for key, value in copy.items()} for copy in outer]

  def outer_step(m, p, direction):
    """Theta_m,p <- Theta_m,p + OuterOpt_p(direction) (Nesterov SGD), then theta_m,p mixed with alpha."""
    for key in fragment_keys[p]:
      outer_velocity[m][key] = direction[key] + outer_beta * outer_velocity[m][key]
      outer[m][key] = outer[m][key] - outer_eta * (direction[key] + outer_beta * outer_velocity[m][key])
      local[m][key] = mix * local[m][key] + (1 - mix) * outer[m][key]

  round_end_carried = eager or delay > 0  # the round-end sync's mean is taken at the next round's start
  counted, carried = [], None  # per counted sync, every learner's Delta of its fragment
  records = []
  squares = np.zeros(learners)
  losses = [[] for _ in range(learners)]
  for t in range(1, rounds * steps + 1):  # t: inner steps done
    for m, (x, y) in enumerate(batches):
      loss, gradient = loss_and_gradient(local[m], x[t - 1], y[t - 1])
      losses[m].append(loss)
      if inner_beta is None:
        update = gradient
      else:
        inner_velocity[m] = {key: gradient[key] + inner_beta * inner_velocity[m][key] for key in keys}
        update = inner_velocity[m]
      local[m] = {key: local[m][key] - inner_eta * update[key] for key in keys}
    # First the sync at this boundary, if any: it reads the local weights the steps reached.
    position = (t - 1) % steps + 1
    if position % every == 0:
      p = position // every - 1
      deltas = [{key: outer[m][key] - local[m][key] for key in fragment_keys[p]} for m in range(learners)]
      for m in range(learners):
        squares[m] += sum(np.sum(value**2) for value in deltas[m].values())
      mean = {key: np.mean([delta[key] for delta in deltas], axis=0) for key in fragment_keys[p]}
      if round_end_carried and position == steps:
        carried = deltas
      else:
        counted.append(deltas)
      if eager:
        for m in range(learners):
          fresh = {key: previous_mean[key] + (deltas[m][key] - previous_own[m][key]) / learners for key in mean}
          outer_step(m, p, fresh)
          previous_own[m].update(deltas[m])
        previous_mean.update(mean)
      else:
        queue.append((t + delay, p, mean))
    # Then the means that land at this boundary, in the order they were sent.
    landing = [(p, mean) for at, p, mean in queue if at == t]
    queue = [entry for entry in queue if entry[0] != t]
    for p, mean in landing:
      for m in range(learners):
        outer_step(m, p, mean)
    if position == steps:
      records.append(
        {
          "outer": [dict(copy) for copy in outer],
          "local": [dict(copy) for copy in local],
          "norms": np.sqrt(squares),
          "losses": np.asarray([np.mean(values) for values in losses]),
          "agreement": agreement(counted),
        }
      )
      counted, carried = ([carried] if carried is not None else []), None
      squares = np.zeros(learners)
      losses = [[] for _ in range(learners)]
  return records


def agreement(syncs):
  """sum_{m != k} Delta_m . Delta_k / ((M - 1) sum_m ||Delta_m||^2) over ``syncs`` (each a list of M dicts of
  arrays); 1 for M = 1 or when every Delta is zero."""
  learners = len(syncs[0]) if syncs else 1
  pairs = total = 0.0
  for deltas in syncs:
    for m in range(learners):
      for k in range(learners):
        dot = sum(float(np.sum(deltas[m][key] * deltas[k][key])) for key in deltas[m])
        if m == k:
          total += dot
        else:
          pairs += dot
  if learners == 1 or total == 0:
    return 1.0
  return pairs / ((learners - 1) * total)
