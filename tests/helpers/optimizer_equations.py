r"""The fixture of the server optimizer's hand-computed pins (`stalesgd.training.build_optimizer`).

The equation pinned here, per parameter leaf, for server update t = 0, 1, ...
with a stack of c contributions k = 1..c (Rudra's Caffe solver, learning rate
modulated per gradient):

  g~_k = DC(g_k)                                    delay compensation of the loss gradient only
  q_k  = s(sigma_k) * (g~_k + wd * m_wd (.) w_t)    weight_decay_placement="modulated" (default)
  avg  = (1/c) sum_k q_k
  v_t  = mu * v_{t-1} + alpha_t * m_lr (.) avg      v_{-1} = 0; the rate enters the buffer (Caffe)
  u_t  = -v_t,  or with nesterov  -(alpha_t * m_lr (.) avg + mu * v_t);   w_{t+1} = w_t + u_t
  alpha_t = learning_rate * lr_decay_factor ** #{b : t >= b},  b = round(epoch * updates_per_epoch)

with ``weight_decay_placement="unmodulated"``: avg = (1/c) sum_k s(sigma_k) g~_k + wd * m_wd (.) w_t.

The tests (tests/training/test_optimizer_solver.py, test_optimizer_delay_compensation.py)
compare `run_updates` (the optimizer a config builds, applied as the engine
applies it) against literals worked out by hand (the arithmetic is in their
comments) or float64 numpy transcriptions of the equation above
(`reference_updates` and the small per-test corrections); nothing computes an
expected value with stalesgd, optax or `build_optimizer`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stalesgd.training._optimizer import build_optimizer
from stalesgd.training._run_config import default_config

RTOL = 1e-6
ATOL = 1e-9

# w_0. Positive weights and gradients keep every sum free of cancellation, so
# float32 results meet rtol 1e-6 against the float64 references.
PARAMS = {"w": [2.0, 1.0], "b": 0.5}

# Loss gradients of three consecutive updates, c = 3 contributions each. Their
# means are round: avg_0 = (w [0.6, 1.0], b 0.5), avg_1 = ([0.3, 0.3], 1.0),
# avg_2 = ([0.4, 0.3], 0.2).
GRADS = [
  {"w": [[0.3, 0.6], [0.6, 0.9], [0.9, 1.5]], "b": [0.2, 0.4, 0.9]},
  {"w": [[0.1, 0.2], [0.2, 0.4], [0.6, 0.3]], "b": [1.0, 0.5, 1.5]},
  {"w": [[0.5, 0.1], [0.4, 0.2], [0.3, 0.6]], "b": [0.1, 0.2, 0.3]},
]
STALENESS = [[0, 2, 4], [1, 3, 6], [2, 5, 8]]

# The weights each contribution was computed at: w_0 minus these offsets (the
# same at every update, so the displacement w_t - w_bak also grows with the
# server's own steps).
STALE_OFFSETS = {"w": [[0.5, -0.25], [1.0, 0.5], [-0.5, 0.75]], "b": [0.25, -0.5, 1.0]}
STALE = {key: np.asarray(PARAMS[key]) - np.asarray(offsets) for key, offsets in STALE_OFFSETS.items()}

# Caffe lr_mult / decay_mult of the fake model, one float per leaf like ModelSpec's.
LR_MULT = {"w": 1.5, "b": 2.0}
WD_MULT = {"w": 2.0, "b": 0.5}

# updates_per_epoch = 2: epoch 0.5 is update 1, epoch 1.0 is update 2.
UPDATES_PER_EPOCH = 2.0


class FakeModel:
  """The two methods `build_optimizer` reads from a model: per-leaf Caffe multipliers."""

  def __init__(self, lr_mult=None, wd_mult=None):
    self.lr_mult = LR_MULT if lr_mult is None else lr_mult
    self.wd_mult = WD_MULT if wd_mult is None else wd_mult
    self.calls = []

  def learning_rate_multipliers(self, params):
    self.calls.append("lr")
    return {key: float(self.lr_mult[key]) for key in params}

  def weight_decay_multipliers(self, params):
    self.calls.append("wd")
    return {key: float(self.wd_mult[key]) for key in params}


def make_config(*, c=3, **fields):
  """default_config(): softsync with 3 learners and n = 1 (c = 3) or async (c = 1), plus ``fields``."""
  config = default_config()
  if c == 3:
    config.protocol, config.learners, config.n = "softsync", 3, 1
  elif c == 1:
    config.protocol, config.learners = "async", 3
  else:
    raise ValueError(c)
  config.model_multipliers = False
  for name, value in fields.items():
    config[name] = value
  return config


def _tree(values, dtype=jnp.float32):
  return {key: jnp.asarray(value, dtype) for key, value in values.items()}


def _numpy(tree):
  return {key: np.asarray(value, np.float64) for key, value in tree.items()}


def run_updates(
  config,
  grads=GRADS,
  staleness=STALENESS,
  *,
  steps=2,
  stale=None,
  learners=None,
  model=None,
  jit=False,
  updates_per_epoch=UPDATES_PER_EPOCH,
):
  """Builds the optimizer at PARAMS and applies ``steps`` consecutive updates as the engine does.

  Update t receives the stack ``grads[t]`` with ``staleness=staleness[t]``,
  ``stale_params`` (``stale[t]``, or the current weights stacked c times: a
  fresh gradient) and ``learner`` (``learners[t]``, or 0..c-1); the returned
  update is applied to the weights before the next one. A scalar
  ``staleness[t]`` makes an unstacked call (grads and stale weights without
  the leading axis). Returns each update as float64 numpy leaves.
  """
  params = _tree(PARAMS)
  optimizer = build_optimizer(
    config, model=FakeModel() if model is None else model, params=params, updates_per_epoch=updates_per_epoch
  )
  state = optimizer.init(params)
  update = jax.jit(optimizer.update) if jit else optimizer.update
  weights, results = params, []
  for t in range(steps):
    sigma = np.asarray(staleness[t])
    stacked = sigma.ndim == 1
    c = sigma.shape[0] if stacked else None
    if stale is not None:
      stale_params = _tree(stale[t])
    elif stacked:
      stale_params = {key: jnp.stack([leaf] * c) for key, leaf in weights.items()}
    else:
      stale_params = weights
    if learners is not None:
      learner = jnp.asarray(learners[t], jnp.int32)
    else:
      learner = jnp.arange(c, dtype=jnp.int32) if stacked else jnp.asarray(0, jnp.int32)
    updates, state = update(
      _tree(grads[t]),
      state,
      weights,
      staleness=jnp.asarray(sigma, jnp.int32),
      stale_params=stale_params,
      learner=learner,
    )
    results.append(_numpy(updates))
    weights = {key: weights[key] + updates[key] for key in weights}
  return results


def reference_updates(
  grads=GRADS,
  *,
  steps=2,
  alphas,
  momentum,
  nesterov=False,
  weights=None,
  penalty=None,
  weight_decay=0.0,
  placement="modulated",
  lr_mult=None,
  wd_mult=None,
  correct=None,
):
  """The equation of the module docstring in float64 numpy, for ``steps`` updates from PARAMS.

  ``alphas[t]`` is alpha_t, ``weights[t]`` the c staleness weights s(sigma_k)
  (1 if None), ``penalty(t, w)`` optional per-coordinate factors of shape
  (c, ...) per leaf (Gap-Aware's q_k), ``correct(t, g, w)`` the delay
  compensation g -> g~ at the current weights w (identity if None).
  """
  w = {key: np.asarray(value, np.float64) for key, value in PARAMS.items()}
  v = {key: np.zeros_like(value) for key, value in w.items()}
  results = []
  for t in range(steps):
    g = {key: np.asarray(value, np.float64) for key, value in grads[t].items()}
    if correct is not None:
      g = correct(t, g, w)
    q = None if penalty is None else penalty(t, w)
    c = len(g["b"])
    s = np.ones(c) if weights is None else np.asarray(weights[t], np.float64)
    u = {}
    for key in w:
      decay = weight_decay * (1.0 if wd_mult is None else wd_mult[key]) * w[key]
      scale = s.reshape((c,) + (1,) * w[key].ndim) * (1.0 if q is None else q[key])
      if placement == "modulated":
        avg = np.mean(scale * (g[key] + decay), axis=0)
      else:
        avg = np.mean(scale * g[key], axis=0) + decay
      step = alphas[t] * (1.0 if lr_mult is None else lr_mult[key]) * avg
      v[key] = momentum * v[key] + step
      u[key] = -(step + momentum * v[key]) if nesterov else -v[key]
    w = {key: w[key] + u[key] for key in w}
    results.append(u)
  return results


def assert_updates_close(actual, expected):
  assert len(actual) == len(expected)
  for t, (got, want) in enumerate(zip(actual, expected)):
    assert sorted(got) == sorted(want)
    for key in want:
      np.testing.assert_allclose(
        got[key], np.asarray(want[key], np.float64), rtol=RTOL, atol=ATOL, err_msg=f"update {t}, leaf {key!r}"
      )


def assert_updates_equal(actual, expected):
  assert len(actual) == len(expected)
  for t, (got, want) in enumerate(zip(actual, expected)):
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=f"update {t}, leaf {key!r}")
