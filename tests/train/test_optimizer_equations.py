r"""Hand-computed pins of every field of the server optimizer (`stalesgd.optimizer.build_optimizer`).

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

Expected values are literals worked out by hand (the arithmetic is in the
comments) or float64 numpy transcriptions of the equation above
(`reference_updates` and the small per-test corrections); nothing here
computes an expected value with stalesgd, optax or `build_optimizer`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd.config import default_config
from stalesgd.config import validate_config
from stalesgd.optimizer import build_optimizer

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


def run_updates(config, grads=GRADS, staleness=STALENESS, *, steps=2, stale=None, learners=None,
                model=None, jit=False, updates_per_epoch=UPDATES_PER_EPOCH):
  """Builds the optimizer at PARAMS and applies ``steps`` consecutive updates as the engine does.

  Update t receives the stack ``grads[t]`` with ``staleness=staleness[t]``,
  ``stale_params`` (``stale[t]``, or the current weights stacked c times: a
  fresh gradient) and ``learner`` (``learners[t]``, or 0..c-1); the returned
  update is applied to the weights before the next one. A scalar
  ``staleness[t]`` makes an unstacked call (grads and stale weights without
  the leading axis). Returns each update as float64 numpy leaves.
  """
  params = _tree(PARAMS)
  optimizer = build_optimizer(config, model=FakeModel() if model is None else model, params=params,
                              updates_per_epoch=updates_per_epoch)
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
    updates, state = update(_tree(grads[t]), state, weights, staleness=jnp.asarray(sigma, jnp.int32),
                            stale_params=stale_params, learner=learner)
    results.append(_numpy(updates))
    weights = {key: weights[key] + updates[key] for key in weights}
  return results


def reference_updates(grads=GRADS, *, steps=2, alphas, momentum, nesterov=False, weights=None,
                      penalty=None, weight_decay=0.0, placement="modulated", lr_mult=None, wd_mult=None,
                      correct=None):
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
      np.testing.assert_allclose(got[key], np.asarray(want[key], np.float64), rtol=RTOL, atol=ATOL,
                                 err_msg=f"update {t}, leaf {key!r}")


def assert_updates_equal(actual, expected):
  assert len(actual) == len(expected)
  for t, (got, want) in enumerate(zip(actual, expected)):
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=f"update {t}, leaf {key!r}")


# ------------------------------------------------------------------ the solver


@pytest.mark.parametrize("learning_rate, expected", [
    # Momentum 0: u_t = -alpha * avg_t.
    (0.1, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.03, -0.03], "b": -0.1}]),
    (0.05, [{"w": [-0.03, -0.05], "b": -0.025}, {"w": [-0.015, -0.015], "b": -0.05}]),
])
def test_learning_rate_scales_the_step(learning_rate, expected):
  """Catches a learning rate that is ignored, applied twice, or not negated (u = +alpha g)."""
  config = make_config(learning_rate=learning_rate, momentum=0.0)
  assert_updates_close(run_updates(config), expected)


@pytest.mark.parametrize("momentum, expected", [
    # v_0 = 0.1 avg_0 = ([0.06, 0.1], 0.05); v_1 = mu v_0 + 0.1 avg_1; v_2 = mu v_1 + 0.1 avg_2.
    # mu 0.5:  v_1 = ([0.03+0.03, 0.05+0.03], 0.025+0.1), v_2 = ([0.03+0.04, 0.04+0.03], 0.0625+0.02)
    (0.5, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.06, -0.08], "b": -0.125},
           {"w": [-0.07, -0.07], "b": -0.0825}]),
    # mu 0.25: v_1 = ([0.015+0.03, 0.025+0.03], 0.0125+0.1), v_2 = ([0.01125+0.04, 0.01375+0.03], 0.028125+0.02)
    (0.25, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.045, -0.055], "b": -0.1125},
            {"w": [-0.05125, -0.04375], "b": -0.048125}]),
])
def test_momentum_accumulates_the_buffer(momentum, expected):
  """Catches a momentum that is ignored, scaled (e.g. 0.9 mu), or a buffer that is reset each update."""
  config = make_config(learning_rate=0.1, momentum=momentum)
  assert_updates_close(run_updates(config, steps=3), expected)


@pytest.mark.parametrize("nesterov, expected", [
    (False, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.06, -0.08], "b": -0.125}]),
    # u_t = -(alpha avg_t + mu v_t), mu 0.5: u_0 = -([0.06, 0.1] + 0.5 [0.06, 0.1], 0.05 + 0.025);
    # u_1 = -([0.03 + 0.03, 0.03 + 0.04], 0.1 + 0.0625).
    (True, [{"w": [-0.09, -0.15], "b": -0.075}, {"w": [-0.06, -0.07], "b": -0.1625}]),
])
def test_nesterov_looks_ahead_through_the_buffer(nesterov, expected):
  """Catches an ignored nesterov flag, or Nesterov's look-ahead taken on the old buffer v_{t-1}."""
  config = make_config(learning_rate=0.1, momentum=0.5, nesterov=nesterov)
  assert_updates_close(run_updates(config), expected)


@pytest.mark.parametrize("lr_decay_epochs, lr_decay_factor, expected", [
    # Boundary round(0.5 * 2) = 1: alpha = 0.1, 0.05, 0.05 (mu 0.5). The buffer keeps alpha_0's part:
    # v_1 = 0.5 v_0 + 0.05 avg_1 = ([0.03+0.015, 0.05+0.015], 0.025+0.05),
    # v_2 = 0.5 v_1 + 0.05 avg_2 = ([0.0225+0.02, 0.0325+0.015], 0.0375+0.01).
    ((0.5,), 0.5, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.045, -0.065], "b": -0.075},
                   {"w": [-0.0425, -0.0475], "b": -0.0475}]),
    # Boundary round(0.3 * 2) = round(0.6) = 1: the same as epoch 0.5.
    ((0.3,), 0.5, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.045, -0.065], "b": -0.075},
                   {"w": [-0.0425, -0.0475], "b": -0.0475}]),
    # Boundary 1 with factor 0.2: alpha = 0.1, 0.02, 0.02.
    # v_1 = ([0.03+0.006, 0.05+0.006], 0.025+0.02), v_2 = ([0.018+0.008, 0.028+0.006], 0.0225+0.004).
    ((0.5,), 0.2, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.036, -0.056], "b": -0.045},
                   {"w": [-0.026, -0.034], "b": -0.0265}]),
    # Boundary 2: alpha = 0.1, 0.1, 0.05; v_2 = 0.5 v_1 + 0.05 avg_2 = ([0.03+0.02, 0.04+0.015], 0.0625+0.01).
    ((1.0,), 0.5, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.06, -0.08], "b": -0.125},
                   {"w": [-0.05, -0.055], "b": -0.0725}]),
    # Boundaries 1 and 2 (given unsorted): alpha = 0.1, 0.05, 0.025;
    # v_2 = 0.5 v_1 + 0.025 avg_2 = ([0.0225+0.01, 0.0325+0.0075], 0.0375+0.005).
    ((1.0, 0.5), 0.5, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.045, -0.065], "b": -0.075},
                       {"w": [-0.0325, -0.04], "b": -0.0425}]),
])
def test_learning_rate_decay_at_boundaries_inside_the_buffer(lr_decay_epochs, lr_decay_factor, expected):
  """Catches wrong boundaries (epochs not converted with updates_per_epoch, off by one: t > b), an
  ignored lr_decay_factor, and optax's order (learning rate after the momentum trace), which rescales
  the buffer at a decay step: it would give u_1 = -0.05 (0.5 avg_0 + avg_1) = -([0.03, 0.04], 0.0625)."""
  config = make_config(learning_rate=0.1, momentum=0.5, lr_decay_epochs=lr_decay_epochs,
                       lr_decay_factor=lr_decay_factor)
  assert_updates_close(run_updates(config, steps=3), expected)


def test_learning_rate_decay_counts_updates_per_epoch():
  """Catches a schedule that ignores updates_per_epoch: epoch 0.5 at 4 updates per epoch is update 2."""
  config = make_config(learning_rate=0.1, momentum=0.5, lr_decay_epochs=(0.5,), lr_decay_factor=0.5)
  expected = [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.06, -0.08], "b": -0.125},
              {"w": [-0.05, -0.055], "b": -0.0725}]
  assert_updates_close(run_updates(config, steps=3, updates_per_epoch=4.0), expected)


# -------------------------------------------------------------- weight decay


@pytest.mark.parametrize("weight_decay", [0.1, 0.3])
@pytest.mark.parametrize("placement", ["modulated", "unmodulated"])
def test_weight_decay_placement(placement, weight_decay):
  """Catches weight decay that is ignored, taken at the initial instead of the current weights, or
  placed wrongly: under "modulated" it must be scaled by each contribution's staleness weight (inverse
  rule, sigma = [0, 2, 4] then [1, 3, 6]), under "unmodulated" added once after the average."""
  config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=weight_decay,
                       weight_decay_placement=placement, staleness_rule="inverse")
  expected = reference_updates(alphas=[0.1, 0.1], momentum=0.5, weights=[[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6]],
                               weight_decay=weight_decay, placement=placement)
  assert_updates_close(run_updates(config), expected)


def test_weight_decay_placements_differ_by_hand():
  """Literal pin of the first update, so that the two placements cannot silently swap.

  avg_0 of s g (s = 1, 1/2, 1/4): w [(0.3 + 0.3 + 0.225)/3, (0.6 + 0.45 + 0.375)/3] = [0.275, 0.475],
  b (0.2 + 0.2 + 0.225)/3 = 0.208333...; mean s = 7/12. Decay wd w_0 = 0.1 ([2, 1], 0.5).
  modulated:   avg + (7/12) wd w_0;  unmodulated: avg + wd w_0.  u_0 = -0.1 avg (mu irrelevant at t=0).
  """
  expected = {
      "modulated": {"w": [-(0.275 + 0.7 / 6), -(0.475 + 0.35 / 6)], "b": -(0.625 / 3 + 0.175 / 6)},
      "unmodulated": {"w": [-(0.275 + 0.2), -(0.475 + 0.1)], "b": -(0.625 / 3 + 0.05)},
  }
  for placement, want in expected.items():
    config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=0.1, weight_decay_placement=placement,
                         staleness_rule="inverse")
    (got,) = run_updates(config, steps=1)
    assert_updates_close([got], [{key: 0.1 * np.asarray(value) for key, value in want.items()}])


# ---------------------------------------------------------- model multipliers


@pytest.mark.parametrize("model_multipliers", [True, False])
def test_model_multipliers(model_multipliers):
  """Catches ignored lr_mult or decay_mult, multipliers swapped, lr_mult applied to the weight decay
  term only, or multipliers read although config.model_multipliers is False."""
  config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=0.1, staleness_rule="inverse",
                       model_multipliers=model_multipliers)
  model = FakeModel()
  expected = reference_updates(
      steps=3, alphas=[0.1] * 3, momentum=0.5, weights=[[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6], [1 / 2, 1 / 5, 1 / 8]],
      weight_decay=0.1, lr_mult=LR_MULT if model_multipliers else None,
      wd_mult=WD_MULT if model_multipliers else None)
  assert_updates_close(run_updates(config, steps=3, model=model), expected)
  if not model_multipliers:
    assert model.calls == []


def test_decay_multiplier_zero_removes_weight_decay_of_that_leaf():
  """Catches decay_mult applied to the gradient as well as the decay (b's update would vanish)."""
  config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=0.1, model_multipliers=True)
  model = FakeModel(lr_mult={"w": 1.0, "b": 1.0}, wd_mult={"w": 1.0, "b": 0.0})
  # b: no decay, lr_mult 1: the plain momentum pins of test_momentum_accumulates_the_buffer.
  # w: avg_0 + 0.1 w_0 = [0.6 + 0.2, 1.0 + 0.1]  ->  u_0 = -0.1 [0.8, 1.1].
  got = run_updates(config, steps=2, model=model)
  np.testing.assert_allclose([got[0]["b"], got[1]["b"]], [-0.05, -0.125], rtol=RTOL)
  np.testing.assert_allclose(got[0]["w"], [-0.08, -0.11], rtol=RTOL)


# ---------------------------------------------------------- staleness rules

# (config fields, s(sigma_k) per update for sigma = [0, 2, 4], [1, 3, 6], [2, 5, 8]), by hand.
E = math.exp
STALENESS_CASES = {
    "none": ({}, [[1, 1, 1], [1, 1, 1]]),
    "constant": ({"staleness_rule": "constant"}, [[1, 1, 1], [1, 1, 1]]),
    "inverse": ({"staleness_rule": "inverse"}, [[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6]]),
    "inverse_mean_given_2": ({"staleness_rule": "inverse_mean", "staleness_mean": 2.0}, [[1 / 2] * 3, [1 / 2] * 3]),
    "inverse_mean_given_4": ({"staleness_rule": "inverse_mean", "staleness_mean": 4.0}, [[1 / 4] * 3, [1 / 4] * 3]),
    # <sigma> < 1 is clamped to 1.
    "inverse_mean_given_half": ({"staleness_rule": "inverse_mean", "staleness_mean": 0.5}, [[1] * 3, [1] * 3]),
    # Tracked: <sigma> of the updates before: 0 (weight 1), then mean(0, 2, 4) = 2, then
    # mean(0, 2, 4, 1, 3, 6) = 16/6 = 8/3.
    "inverse_mean_tracked": ({"staleness_rule": "inverse_mean"}, [[1] * 3, [1 / 2] * 3, [3 / 8] * 3]),
    "polynomial_0.5": ({"staleness_rule": "polynomial", "staleness_exponent": 0.5},
                       [[1, 3 ** -0.5, 5 ** -0.5], [2 ** -0.5, 4 ** -0.5, 7 ** -0.5]]),
    "polynomial_1": ({"staleness_rule": "polynomial", "staleness_exponent": 1.0},
                     [[1, 1 / 3, 1 / 5], [1 / 2, 1 / 4, 1 / 7]]),
    "exponential_0.5": ({"staleness_rule": "exponential", "staleness_decay": 0.5},
                        [[1, E(-1), E(-2)], [E(-0.5), E(-1.5), E(-3)]]),
    "exponential_0.25": ({"staleness_rule": "exponential", "staleness_decay": 0.25},
                         [[1, E(-0.5), E(-1)], [E(-0.25), E(-0.75), E(-1.5)]]),
    "threshold_2": ({"staleness_rule": "threshold", "staleness_threshold": 2}, [[1, 1, 0], [1, 0, 0]]),
    "threshold_3": ({"staleness_rule": "threshold", "staleness_threshold": 3}, [[1, 1, 0], [1, 1, 0]]),
    # 1 / (sigma - threshold + 1) beyond the threshold.
    "hinge_2": ({"staleness_rule": "hinge", "staleness_threshold": 2}, [[1, 1, 1 / 3], [1, 1 / 2, 1 / 5]]),
    "hinge_3": ({"staleness_rule": "hinge", "staleness_threshold": 3}, [[1, 1, 1 / 2], [1, 1, 1 / 4]]),
    # Normalised by s(<sigma>): inverse at <sigma> = 2 is 1/2.
    "inverse_normalized": ({"staleness_rule": "inverse", "staleness_mean": 2.0, "staleness_normalize": True},
                           [[2, 1, 1 / 2], [2, 2 / 3, 1 / 3]]),
    # polynomial(0.5) at 2 is 3^-0.5.
    "polynomial_normalized": ({"staleness_rule": "polynomial", "staleness_mean": 2.0, "staleness_normalize": True},
                              [[3 ** 0.5, 1, (3 / 5) ** 0.5], [(3 / 2) ** 0.5, 3 ** 0.5 / 2, (3 / 7) ** 0.5]]),
    # exponential(0.5) at 2 is e^-1.
    "exponential_normalized": ({"staleness_rule": "exponential", "staleness_mean": 2.0,
                                "staleness_normalize": True}, [[E(1), 1, E(-1)], [E(0.5), E(-0.5), E(-2)]]),
    # hinge(2) at 4 is 1/3.
    "hinge_normalized": ({"staleness_rule": "hinge", "staleness_threshold": 2, "staleness_mean": 4.0,
                          "staleness_normalize": True}, [[3, 3, 1], [3, 3 / 2, 3 / 5]]),
    # inverse_mean normalised by itself is 1.
    "inverse_mean_normalized": ({"staleness_rule": "inverse_mean", "staleness_mean": 2.0,
                                 "staleness_normalize": True}, [[1] * 3, [1] * 3]),
    # threshold(2) at <sigma> = 3 is 0: left unnormalised.
    "threshold_normalized_at_zero": ({"staleness_rule": "threshold", "staleness_threshold": 2, "staleness_mean": 3.0,
                                      "staleness_normalize": True}, [[1, 1, 0], [1, 0, 0]]),
    # Normalised by the tracked mean (0, 2, then 8/3): inverse at those is 1, 1/2, 3/8;
    # sigma_2 = [2, 5, 8] -> [1/2, 1/5, 1/8] * 8/3.
    "inverse_normalized_tracked": ({"staleness_rule": "inverse", "staleness_normalize": True},
                                   [[1, 1 / 2, 1 / 4], [2, 2 / 3, 1 / 3], [4 / 3, 8 / 15, 1 / 3]]),
}


@pytest.mark.parametrize("case", sorted(STALENESS_CASES))
def test_staleness_rule_weights_each_contribution(case):
  """Catches a wrong staleness weight s(sigma) for any rule or option: an ignored exponent, decay,
  threshold (or < for <=), hinge slope, normalisation, a given mean ignored, a tracked mean that
  includes the current update or is not tracked, inverse computed as 1/max(sigma + 1, 1), or weights
  applied after the average."""
  fields, weights = STALENESS_CASES[case]
  config = make_config(learning_rate=0.1, momentum=0.5, **fields)
  steps = len(weights)
  expected = reference_updates(steps=steps, alphas=[0.1] * steps, momentum=0.5, weights=weights)
  assert_updates_close(run_updates(config, steps=steps), expected)


def test_inverse_rule_by_hand():
  """A literal pin of the inverse rule, independent of `reference_updates`.

  u_0 = -0.1 avg(s g), s = 1, 1/2, 1/4: w [0.275, 0.475], b 0.625/3 (see the placement test).
  """
  config = make_config(learning_rate=0.1, momentum=0.5, staleness_rule="inverse")
  (got,) = run_updates(config, steps=1)
  assert_updates_close([got], [{"w": [-0.0275, -0.0475], "b": -0.0625 / 3}])


def test_tracked_mean_in_async_stacks_of_one():
  """Catches a tracked <sigma> that is not the mean of every earlier staleness (the last one only, an
  EMA, or one including the current update): sigma = 4, 1, 3 gives weights 1, 1/4, 1/max(2.5, 1)."""
  config = make_config(c=1, learning_rate=0.1, momentum=0.0, staleness_rule="inverse_mean")
  grads = [{"w": [[1.0, 2.0]], "b": [1.0]}] * 3
  got = run_updates(config, grads, staleness=[[4], [1], [3]], steps=3)
  # Momentum 0: u_t = -0.1 s_t g.
  for t, s in enumerate([1.0, 0.25, 0.4]):
    assert_updates_close([got[t]], [{"w": [-0.1 * s, -0.2 * s], "b": -0.1 * s}])


# ------------------------------------------------------- delay compensation


def dc_constant(dc_lambda):
  """g~ = g + lambda0 g (.) g (.) (w_t - w_bak,k)."""
  def correct(t, g, w):
    del t
    return {key: g[key] + dc_lambda * g[key] ** 2 * (w[key] - STALE[key]) for key in g}
  return correct


def dc_adaptive(dc_lambda, decay, learners=None, num_learners=3, eps=1e-7, bias_correction=False):
  """DC-ASGD-a: MeanSquare <- m MS + (1-m) mean_k g_k^2 (first), lambda = lambda0 / sqrt(MS + eps).

  With ``learners`` (ids per update) one MeanSquare per learner, blended with the mean g^2 of that
  learner's contributions in the stack; absent learners keep theirs. With ``bias_correction`` a
  weight W <- m W + (1-m) (from 0, once per update, per learner only for the learners present)
  divides the MeanSquare: lambda = lambda0 / sqrt(MS / W + eps).
  """
  mean_square = {}
  weight = np.zeros(()) if learners is None else np.zeros(num_learners)

  def correct(t, g, w):
    nonlocal weight
    if learners is None:
      weight = decay * weight + (1 - decay)
      per_contribution_weight = weight
    else:
      ids = np.asarray(learners[t])
      weight = weight.copy()
      for learner in set(ids.tolist()):
        weight[learner] = decay * weight[learner] + (1 - decay)
      per_contribution_weight = weight[ids]
    out = {}
    for key in g:
      squares = g[key] ** 2
      if learners is None:
        ms = mean_square.get(key, np.zeros_like(squares[0]))
        ms = decay * ms + (1 - decay) * squares.mean(axis=0)
        mean_square[key] = ms
        per_contribution = np.stack([ms] * len(squares))
      else:
        ms = mean_square.get(key, np.zeros((num_learners,) + squares.shape[1:]))
        ms = ms.copy()
        for learner in set(ids.tolist()):
          ms[learner] = decay * ms[learner] + (1 - decay) * squares[ids == learner].mean(axis=0)
        mean_square[key] = ms
        per_contribution = ms[ids]
      if bias_correction:
        per_contribution = per_contribution / np.reshape(
            per_contribution_weight, np.shape(per_contribution_weight) + (1,) * (per_contribution.ndim - 1))
      out[key] = g[key] + dc_lambda / np.sqrt(per_contribution + eps) * squares * (w[key] - STALE[key])
    return out

  return correct


def dc_layerwise(dc_lambda):
  """Per contribution and leaf: lambda = lambda0 ||g|| / ||g (.) g (.) D||, so ||correction|| = lambda0 ||g||."""
  def correct(t, g, w):
    del t
    out = {}
    for key in g:
      rows = []
      for k in range(len(g[key])):
        correction = g[key][k] ** 2 * (w[key] - STALE[key][k])
        rows.append(g[key][k] + dc_lambda * np.linalg.norm(g[key][k]) / np.linalg.norm(correction) * correction)
      out[key] = np.stack(rows)
    return out
  return correct


STALE_STEPS = [STALE, STALE, STALE]


@pytest.mark.parametrize("dc_lambda", [0.5, 0.2])
def test_delay_compensation_constant(dc_lambda):
  """Catches a wrong dc_lambda (e.g. doubled), a displacement of the wrong sign (w_bak - w) or taken
  from the initial weights, or g instead of g (.) g in the correction."""
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="constant", dc_lambda=dc_lambda)
  expected = reference_updates(alphas=[0.1, 0.1], momentum=0.5, correct=dc_constant(dc_lambda))
  assert_updates_close(run_updates(config, stale=STALE_STEPS), expected)


def test_delay_compensation_constant_by_hand():
  """Literal pin of DC-ASGD-c's first update on b: g~ = g + 0.5 g^2 D, D = (0.25, -0.5, 1.0).

  g~ = 0.2 + 0.5*0.04*0.25 = 0.205, 0.4 - 0.5*0.16*0.5 = 0.36, 0.9 + 0.5*0.81 = 1.305;
  mean 1.87/3; u_0 = -0.1 * 1.87/3.
  """
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="constant", dc_lambda=0.5)
  (got,) = run_updates(config, steps=1, stale=STALE_STEPS)
  np.testing.assert_allclose(got["b"], -0.187 / 3, rtol=RTOL)


@pytest.mark.parametrize("dc_lambda, dc_decay", [(0.1, 0.9), (0.1, 0.75), (0.05, 0.9)])
@pytest.mark.parametrize("jit", [False, True])
def test_delay_compensation_adaptive(dc_lambda, dc_decay, jit):
  """Catches a wrong dc_lambda or dc_decay (m <-> 1-m), a MeanSquare updated after lambda_t is taken,
  blended once per contribution instead of once per stack, or not carried to the next update."""
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=dc_lambda,
                       dc_decay=dc_decay)
  expected = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(dc_lambda, dc_decay))
  assert_updates_close(run_updates(config, steps=3, stale=STALE_STEPS, jit=jit), expected)


def test_delay_compensation_adaptive_epsilon():
  """Catches a wrong epsilon (1e-7) inside the square root: gradients of 1e-3 give MeanSquare
  (1-m) g^2 = 1e-7 at m = 0.9, of the order of epsilon.

  c = 1, b only: g = 1e-3, D = w_0 - w_bak = 0.25, lambda = 0.1 / sqrt(1e-7 + 1e-7);
  g~ = g + lambda g^2 D; momentum 0: u_0 = -0.1 g~.
  """
  config = make_config(c=1, learning_rate=0.1, momentum=0.0, delay_compensation="adaptive", dc_lambda=0.1,
                       dc_decay=0.9)
  grads = [{"w": [[1e-3, 2e-3]], "b": [1e-3]}]
  stale = [{"w": [[1.75, 0.5]], "b": [0.25]}]
  (got,) = run_updates(config, grads, [[1]], steps=1, stale=stale)
  lam = 0.1 / math.sqrt(0.1 * 1e-6 + 1e-7)
  np.testing.assert_allclose(got["b"], -0.1 * (1e-3 + lam * 1e-6 * 0.25), rtol=RTOL)
  # w: MeanSquare (1e-7, 4e-7), D = (0.25, 0.5).
  lam_w = 0.1 / np.sqrt(np.array([1e-7, 4e-7]) + 1e-7)
  np.testing.assert_allclose(got["w"], -0.1 * (np.array([1e-3, 2e-3]) + lam_w * np.array([1e-6, 4e-6])
                                                * np.array([0.25, 0.5])), rtol=RTOL)


def test_delay_compensation_adaptive_first_update_by_hand():
  """Literal pin: at the first update MS = (1-m) mean g^2, so lambda = lambda0 / sqrt((1-m) mean g^2 + eps).

  b, m = 0.75: mean g^2 = (0.04 + 0.16 + 0.81)/3 = 1.01/3; MS = 0.25 * 1.01/3.
  """
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=0.1,
                       dc_decay=0.75)
  (got,) = run_updates(config, steps=1, stale=STALE_STEPS)
  lam = 0.1 / math.sqrt(0.25 * 1.01 / 3 + 1e-7)
  corrected = [0.2 + lam * 0.04 * 0.25, 0.4 - lam * 0.16 * 0.5, 0.9 + lam * 0.81 * 1.0]
  np.testing.assert_allclose(got["b"], -0.1 * sum(corrected) / 3, rtol=RTOL)


# Learner ids per update: learner 1 sends twice in the first stack, learner 2 first in the second;
# learner 0 is absent from the second stack and read again in the third.
LEARNER_IDS = [[0, 1, 1], [1, 1, 2], [2, 0, 0]]


@pytest.mark.parametrize("jit", [False, True])
def test_delay_compensation_adaptive_per_learner_mean_square(jit):
  """Catches dc_per_learner_mean_square ignored (one global MeanSquare), rows indexed by contribution
  instead of learner, or absent learners' MeanSquare decayed."""
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=0.1,
                       dc_decay=0.9, dc_per_learner_mean_square=True)
  expected = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5,
                               correct=dc_adaptive(0.1, 0.9, learners=LEARNER_IDS))
  got = run_updates(config, steps=3, stale=STALE_STEPS, learners=LEARNER_IDS, jit=jit)
  assert_updates_close(got, expected)
  # And it is not the global MeanSquare.
  global_ms = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(0.1, 0.9))
  assert not np.allclose(got[1]["w"], global_ms[1]["w"], rtol=1e-4)


@pytest.mark.parametrize("per_learner", [False, True])
@pytest.mark.parametrize("jit", [False, True])
def test_delay_compensation_adaptive_mean_square_bias_correction(per_learner, jit):
  """Catches dc_mean_square_bias_correction ignored, its weight W blended once per contribution instead of
  once per stack, not carried to the next update, or (per learner) advanced for absent learners."""
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=0.1,
                       dc_decay=0.9, dc_per_learner_mean_square=per_learner,
                       dc_mean_square_bias_correction=True)
  learners = LEARNER_IDS if per_learner else None
  expected = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5,
                               correct=dc_adaptive(0.1, 0.9, learners=learners, bias_correction=True))
  got = run_updates(config, steps=3, stale=STALE_STEPS, learners=LEARNER_IDS, jit=jit)
  assert_updates_close(got, expected)
  # And it is not the uncorrected MeanSquare.
  uncorrected = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5,
                                  correct=dc_adaptive(0.1, 0.9, learners=learners))
  assert not np.allclose(got[0]["w"], uncorrected[0]["w"], rtol=1e-4)


def test_delay_compensation_bias_correction_first_update_by_hand():
  """Literal pin: at the first update MS / W = (1-m) mean g^2 / (1-m) = mean g^2, whatever m.

  b, m = 0.75: mean g^2 = (0.04 + 0.16 + 0.81)/3 = 1.01/3, lambda = 0.1 / sqrt(1.01/3 + eps)
  (uncorrected: 0.1 / sqrt(0.25 * 1.01/3 + eps), twice as large).
  """
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=0.1,
                       dc_decay=0.75, dc_mean_square_bias_correction=True)
  (got,) = run_updates(config, steps=1, stale=STALE_STEPS)
  lam = 0.1 / math.sqrt(1.01 / 3 + 1e-7)
  corrected = [0.2 + lam * 0.04 * 0.25, 0.4 - lam * 0.16 * 0.5, 0.9 + lam * 0.81 * 1.0]
  np.testing.assert_allclose(got["b"], -0.1 * sum(corrected) / 3, rtol=RTOL)


def test_per_learner_mean_square_is_off_by_default():
  """Catches a MeanSquare kept per learner although dc_per_learner_mean_square is False."""
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=0.1, dc_decay=0.9)
  expected = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(0.1, 0.9))
  assert_updates_close(run_updates(config, steps=3, stale=STALE_STEPS, learners=LEARNER_IDS), expected)


@pytest.mark.parametrize("dc_lambda", [0.2, 0.6])
def test_delay_compensation_layerwise(dc_lambda):
  """Catches layerwise treated as constant, a norm over the whole stack or the whole model instead of
  per contribution and leaf, or a wrong dc_lambda."""
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="layerwise", dc_lambda=dc_lambda)
  expected = reference_updates(alphas=[0.1, 0.1], momentum=0.5, correct=dc_layerwise(dc_lambda))
  assert_updates_close(run_updates(config, stale=STALE_STEPS), expected)


@pytest.mark.parametrize("mode", ["constant", "adaptive", "layerwise"])
def test_weight_decay_does_not_enter_delay_compensation(mode):
  """Catches weight decay added before delay compensation (MXNet's order), so that g (.) g would hold
  g + wd w; with an inverse rule, also decay that skips the staleness weight."""
  correct = {"constant": dc_constant(0.5), "adaptive": dc_adaptive(0.1, 0.9), "layerwise": dc_layerwise(0.2)}[mode]
  dc_lambda = {"constant": 0.5, "adaptive": 0.1, "layerwise": 0.2}[mode]
  config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=0.2, staleness_rule="inverse",
                       delay_compensation=mode, dc_lambda=dc_lambda, dc_decay=0.9)
  expected = reference_updates(alphas=[0.1, 0.1], momentum=0.5, weights=[[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6]],
                               weight_decay=0.2, correct=correct)
  assert_updates_close(run_updates(config, stale=STALE_STEPS), expected)


def test_weight_decay_does_not_enter_delay_compensation_by_hand():
  """Literal pin on b, first update, DC constant 0.5, wd 0.2, rule none: the g^2 term uses g only.

  g~ = (0.205, 0.36, 1.305) (see the DC pin); decay 0.2 * 0.5 = 0.1 per contribution;
  u_0 = -0.1 (1.87/3 + 0.1). With decay inside DC: g' = (0.3, 0.5, 1.0) gives another value.
  """
  config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=0.2, delay_compensation="constant",
                       dc_lambda=0.5)
  (got,) = run_updates(config, steps=1, stale=STALE_STEPS)
  np.testing.assert_allclose(got["b"], -0.1 * (1.87 / 3 + 0.1), rtol=RTOL)


# ------------------------------------------------------------------- gap aware


def test_gap_aware_penalises_each_coordinate():
  """Catches Gap-Aware's penalty not applied, applied before the typical step exists (update 0), or
  not covering the modulated weight decay: q_k = 1 / (1 + |w_t - w_bak,k| / C), C = |w_1 - w_0|."""
  config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=0.1, gap_aware=True)

  def penalty(t, w):
    if t == 0:
      return {key: np.ones_like(STALE[key]) for key in w}
    w0 = {key: np.asarray(value, np.float64) for key, value in PARAMS.items()}
    return {key: 1 / (1 + np.abs(w[key] - STALE[key]) / np.abs(w[key] - w0[key])) for key in w}

  expected = reference_updates(alphas=[0.1, 0.1], momentum=0.5, weight_decay=0.1, penalty=penalty)
  assert_updates_close(run_updates(config, stale=STALE_STEPS), expected)


# --------------------------------------------------------- the combined case

COMBINED = {"learning_rate": 0.1, "momentum": 0.5, "lr_decay_epochs": (0.5,), "lr_decay_factor": 0.5,
            "weight_decay": 0.1, "model_multipliers": True, "staleness_rule": "inverse"}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("c", [1, 3])
def test_combined_momentum_decay_multipliers_inverse_rule(c, jit):
  """Catches any interaction error of the full chain, for a stack of one (async) and of three
  (softsync): order of weight decay, staleness weight, average, lr_mult, learning rate and momentum."""
  config = make_config(c=c, **COMBINED)
  if c == 3:
    grads, staleness, weights = GRADS, STALENESS, [[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6]]
  else:
    grads = [{key: np.asarray(value)[1:2] for key, value in g.items()} for g in GRADS]
    staleness, weights = [[2], [3]], [[1 / 2], [1 / 3]]
  expected = reference_updates(grads, alphas=[0.1, 0.05], momentum=0.5, weights=weights, weight_decay=0.1,
                               lr_mult=LR_MULT, wd_mult=WD_MULT)
  assert_updates_close(run_updates(config, grads, staleness, jit=jit), expected)


def test_unstacked_call_is_a_stack_of_one():
  """Catches an unstacked call (scalar staleness, no leading axis) treated differently from a stack of one."""
  config = make_config(c=1, delay_compensation="adaptive", dc_lambda=0.1, dc_decay=0.9, **COMBINED)
  stacked_grads = [{key: np.asarray(value)[1:2] for key, value in g.items()} for g in GRADS]
  stale = [{key: value[1:2] for key, value in STALE.items()}] * 3
  stacked = run_updates(config, stacked_grads, [[2], [3], [1]], steps=3, stale=stale, learners=[[1]] * 3)
  unstacked = run_updates(config, [{key: value[0] for key, value in g.items()} for g in stacked_grads],
                          [2, 3, 1], steps=3, stale=[{key: value[0] for key, value in s.items()} for s in stale],
                          learners=[1, 1, 1])
  assert_updates_equal(unstacked, stacked)


# --------------------------------------------------------- exact reductions


def test_inverse_rule_at_zero_staleness_is_no_rule():
  """Bit for bit: inverse at sigma = 0 weighs 1, so it must not perturb a single bit of the chain."""
  fields = dict(COMBINED, staleness_rule="none")
  zeros = [[0, 0, 0]] * 3
  plain = run_updates(make_config(**fields), staleness=zeros, steps=3)
  inverse = run_updates(make_config(**dict(fields, staleness_rule="inverse")), staleness=zeros, steps=3)
  assert_updates_equal(inverse, plain)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_constant_compensation_with_zero_lambda_is_no_compensation(weight_decay):
  """Bit for bit: dc_lambda = 0 must leave the loss gradient untouched."""
  fields = dict(COMBINED, weight_decay=weight_decay)
  plain = run_updates(make_config(**fields), steps=3, stale=STALE_STEPS)
  zero = run_updates(make_config(delay_compensation="constant", dc_lambda=0.0, **fields), steps=3, stale=STALE_STEPS)
  assert_updates_equal(zero, plain)


@pytest.mark.parametrize("mode", ["constant", "adaptive", "layerwise"])
def test_fresh_gradients_are_not_compensated(mode):
  """Bit for bit: with stale_params equal to the current weights (D = 0) every DC mode is the identity."""
  plain = run_updates(make_config(**COMBINED), steps=3)
  compensated = run_updates(make_config(delay_compensation=mode, dc_lambda=0.5, **COMBINED), steps=3)
  assert_updates_equal(compensated, plain)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("placement", ["modulated", "unmodulated"])
def test_weight_decay_placement_accepts_its_values(placement):
  """Catches a validator that rejects a documented placement."""
  validate_config(make_config(weight_decay_placement=placement), num_devices=8)


@pytest.mark.parametrize("placement", ["before", "Modulated", ""])
def test_weight_decay_placement_rejects_other_values(placement):
  """Catches a placement typo that build_optimizer would silently treat as "unmodulated"."""
  with pytest.raises(ValueError, match="weight_decay_placement"):
    validate_config(make_config(weight_decay_placement=placement), num_devices=8)
