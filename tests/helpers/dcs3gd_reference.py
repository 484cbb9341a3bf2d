"""An independent DC-S3GD oracle: plain Python loops over learners, numpy arithmetic.

It shares no code with `stalesgd.decentral` and is written in the closed form
rather than the implementation's recursive updates: after t steps,

  consensus(t) = w_0 + sum_{k < t-S} mean_j Delta_j(k)
  w_i(t)       = consensus(t) + omega * sum_{t-S <= k < t} Delta_i(k)

and the correction's displacement at step t is what the completed all-reduce
adds to w_i(t) besides the step's own update:

  D_i(t) = consensus(t+1) + omega * sum_{t-S < k < t} Delta_i(k) - w_i(t).

Gradients come from `jax.grad` of the test's loss at float32 weights, one
learner at a time; sums and the optimizer (SGD with momentum, as optax.sgd) run
in float64, so comparisons with the float32 implementation use a tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def _tree_sum(trees: list[dict[str, np.ndarray]], like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {name: sum((tree[name] for tree in trees), np.zeros_like(like[name])) for name in like}


def _norm(array: np.ndarray) -> float:
  return float(np.sqrt(np.sum(np.square(array))))


def run_reference(
  loss_fn: Callable,
  params: dict[str, np.ndarray],
  batches: list[list[Any]],
  *,
  staleness: int,
  dc_lambda: float,
  lambda_mode: str = "constant",
  eager: bool = False,
  learning_rate: float,
  momentum: float,
  mean_square_decay: float = 0.95,
  eps: float = 1e-7,
) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """Runs DC-S3GD for len(batches) steps; batches[t][i] is learner i's batch at step t.

  Returns:
    (consensus weights, [local weights of each learner]) after the last step.
  """
  learners = len(batches[0])
  omega = 1.0 / learners if eager else 1.0
  initial = {name: np.asarray(value, np.float64) for name, value in params.items()}
  history: list[list[dict[str, np.ndarray]]] = []  # history[k][i] = Delta_i(k)
  momenta = [{name: np.zeros_like(value) for name, value in initial.items()} for _ in range(learners)]
  mean_squares = [{name: np.zeros_like(value) for name, value in initial.items()} for _ in range(learners)]
  gradient = jax.grad(lambda weights, batch: loss_fn(weights, batch)[0])

  def consensus(step):
    averaged = [_tree_sum(history[k], initial) for k in range(max(step - staleness, 0))]
    total = _tree_sum(averaged, initial)
    return {name: initial[name] + total[name] / learners for name in initial}

  def own_pending(learner, first, last):
    return _tree_sum([history[k][learner] for k in range(max(first, 0), last)], initial)

  def local(step, learner):
    base, pending = consensus(step), own_pending(learner, step - staleness, step)
    return {name: base[name] + omega * pending[name] for name in initial}

  for step, step_batches in enumerate(batches):
    updates = []
    for learner in range(learners):
      weights = local(step, learner)
      grads = gradient({name: value.astype(np.float32) for name, value in weights.items()}, step_batches[learner])
      grads = {name: np.asarray(value, np.float64) for name, value in grads.items()}
      if staleness > 0 and dc_lambda != 0:
        base, pending = consensus(step + 1), own_pending(learner, step - staleness + 1, step)
        displacement = {name: base[name] + omega * pending[name] - weights[name] for name in initial}
        grads = _corrected(grads, displacement, dc_lambda, lambda_mode, mean_squares[learner], mean_square_decay, eps)
      momenta[learner] = {name: grads[name] + momentum * momenta[learner][name] for name in initial}
      updates.append({name: -learning_rate * momenta[learner][name] for name in initial})
    history.append(updates)
  steps = len(batches)
  return consensus(steps), [local(steps, learner) for learner in range(learners)]


def _corrected(grads, displacement, dc_lambda, lambda_mode, mean_square, decay, eps):
  """g + lambda * g * g * D, with lambda per mode (updates mean_square in place for 'adaptive')."""
  corrected = {}
  for name, grad in grads.items():
    correction = grad * grad * displacement[name]
    if lambda_mode == "constant":
      scale = dc_lambda
    elif lambda_mode == "adaptive":
      mean_square[name] = decay * mean_square[name] + (1 - decay) * grad * grad
      scale = dc_lambda / np.sqrt(mean_square[name] + eps)
    elif lambda_mode == "layerwise":
      denominator = _norm(correction)
      scale = dc_lambda * _norm(grad) / denominator if denominator > 0 else 0.0
    else:
      raise ValueError(lambda_mode)
    corrected[name] = grad + scale * correction
  return corrected
