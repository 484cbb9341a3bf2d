r"""Hand-computed pins of the server optimizer a config builds: the solver, weight decay, Caffe multipliers,
staleness rules, and the config's validation of them.

The equation and the fixture are in `tests.helpers.optimizer_equations`.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from stalesgd.training._config_checks import validate_config
from stalesgd.training._optimizer import learning_rate_schedule
from tests.helpers.optimizer_equations import (
  LR_MULT,
  RTOL,
  WD_MULT,
  FakeModel,
  assert_updates_close,
  assert_updates_equal,
  make_config,
  reference_updates,
  run_updates,
)

# ------------------------------------------------------------------ the solver


@pytest.mark.parametrize(
  "learning_rate, expected",
  [
    # Momentum 0: u_t = -alpha * avg_t.
    (0.1, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.03, -0.03], "b": -0.1}]),
    (0.05, [{"w": [-0.03, -0.05], "b": -0.025}, {"w": [-0.015, -0.015], "b": -0.05}]),
  ],
)
def test_learning_rate_scales_the_step(learning_rate, expected):
  """Catches a learning rate that is ignored, applied twice, or not negated (u = +alpha g)."""
  config = make_config(learning_rate=learning_rate, momentum=0.0)
  assert_updates_close(run_updates(config), expected)


@pytest.mark.parametrize(
  "momentum, expected",
  [
    # v_0 = 0.1 avg_0 = ([0.06, 0.1], 0.05); v_1 = mu v_0 + 0.1 avg_1; v_2 = mu v_1 + 0.1 avg_2.
    # mu 0.5:  v_1 = ([0.03+0.03, 0.05+0.03], 0.025+0.1), v_2 = ([0.03+0.04, 0.04+0.03], 0.0625+0.02)
    (0.5, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.06, -0.08], "b": -0.125}, {"w": [-0.07, -0.07], "b": -0.0825}]),
    # mu 0.25: v_1 = ([0.015+0.03, 0.025+0.03], 0.0125+0.1), v_2 = ([0.01125+0.04, 0.01375+0.03], 0.028125+0.02)
    (
      0.25,
      [
        {"w": [-0.06, -0.1], "b": -0.05},
        {"w": [-0.045, -0.055], "b": -0.1125},
        {"w": [-0.05125, -0.04375], "b": -0.048125},
      ],
    ),
  ],
)
def test_momentum_accumulates_the_buffer(momentum, expected):
  """Catches a momentum that is ignored, scaled (e.g. 0.9 mu), or a buffer that is reset each update."""
  config = make_config(learning_rate=0.1, momentum=momentum)
  assert_updates_close(run_updates(config, steps=3), expected)


@pytest.mark.parametrize(
  "nesterov, expected",
  [
    (False, [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.06, -0.08], "b": -0.125}]),
    # u_t = -(alpha avg_t + mu v_t), mu 0.5: u_0 = -([0.06, 0.1] + 0.5 [0.06, 0.1], 0.05 + 0.025);
    # u_1 = -([0.03 + 0.03, 0.03 + 0.04], 0.1 + 0.0625).
    (True, [{"w": [-0.09, -0.15], "b": -0.075}, {"w": [-0.06, -0.07], "b": -0.1625}]),
  ],
)
def test_nesterov_looks_ahead_through_the_buffer(nesterov, expected):
  """Catches an ignored nesterov flag, or Nesterov's look-ahead taken on the old buffer v_{t-1}."""
  config = make_config(learning_rate=0.1, momentum=0.5, nesterov=nesterov)
  assert_updates_close(run_updates(config), expected)


@pytest.mark.parametrize(
  "lr_decay_epochs, lr_decay_factor, expected",
  [
    # Boundary round(0.5 * 2) = 1: alpha = 0.1, 0.05, 0.05 (mu 0.5). The buffer keeps alpha_0's part:
    # v_1 = 0.5 v_0 + 0.05 avg_1 = ([0.03+0.015, 0.05+0.015], 0.025+0.05),
    # v_2 = 0.5 v_1 + 0.05 avg_2 = ([0.0225+0.02, 0.0325+0.015], 0.0375+0.01).
    (
      (0.5,),
      0.5,
      [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.045, -0.065], "b": -0.075}, {"w": [-0.0425, -0.0475], "b": -0.0475}],
    ),
    # Boundary round(0.3 * 2) = round(0.6) = 1: the same as epoch 0.5.
    (
      (0.3,),
      0.5,
      [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.045, -0.065], "b": -0.075}, {"w": [-0.0425, -0.0475], "b": -0.0475}],
    ),
    # Boundary 1 with factor 0.2: alpha = 0.1, 0.02, 0.02.
    # v_1 = ([0.03+0.006, 0.05+0.006], 0.025+0.02), v_2 = ([0.018+0.008, 0.028+0.006], 0.0225+0.004).
    (
      (0.5,),
      0.2,
      [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.036, -0.056], "b": -0.045}, {"w": [-0.026, -0.034], "b": -0.0265}],
    ),
    # Boundary 2: alpha = 0.1, 0.1, 0.05; v_2 = 0.5 v_1 + 0.05 avg_2 = ([0.03+0.02, 0.04+0.015], 0.0625+0.01).
    (
      (1.0,),
      0.5,
      [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.06, -0.08], "b": -0.125}, {"w": [-0.05, -0.055], "b": -0.0725}],
    ),
    # Boundaries 1 and 2 (given unsorted): alpha = 0.1, 0.05, 0.025;
    # v_2 = 0.5 v_1 + 0.025 avg_2 = ([0.0225+0.01, 0.0325+0.0075], 0.0375+0.005).
    (
      (1.0, 0.5),
      0.5,
      [{"w": [-0.06, -0.1], "b": -0.05}, {"w": [-0.045, -0.065], "b": -0.075}, {"w": [-0.0325, -0.04], "b": -0.0425}],
    ),
  ],
)
def test_learning_rate_decay_at_boundaries_inside_the_buffer(lr_decay_epochs, lr_decay_factor, expected):
  """Catches wrong boundaries (epochs not converted with updates_per_epoch, off by one: t > b), an
  ignored lr_decay_factor, and optax's order (learning rate after the momentum trace), which rescales
  the buffer at a decay step: it would give u_1 = -0.05 (0.5 avg_0 + avg_1) = -([0.03, 0.04], 0.0625)."""
  config = make_config(
    learning_rate=0.1, momentum=0.5, lr_decay_epochs=lr_decay_epochs, lr_decay_factor=lr_decay_factor
  )
  assert_updates_close(run_updates(config, steps=3), expected)


def test_learning_rate_decay_counts_updates_per_epoch():
  """Catches a schedule that ignores updates_per_epoch: epoch 0.5 at 4 updates per epoch is update 2."""
  config = make_config(learning_rate=0.1, momentum=0.5, lr_decay_epochs=(0.5,), lr_decay_factor=0.5)
  expected = [
    {"w": [-0.06, -0.1], "b": -0.05},
    {"w": [-0.06, -0.08], "b": -0.125},
    {"w": [-0.05, -0.055], "b": -0.0725},
  ]
  assert_updates_close(run_updates(config, steps=3, updates_per_epoch=4.0), expected)


def test_hundreds_of_decay_boundaries_each_decay_once():
  """300 boundaries at distinct updates are accepted (their count compared by value), the rate x 0.99 at each."""
  config = make_config(learning_rate=1.0, lr_decay_epochs=tuple(range(1, 301)), lr_decay_factor=0.99)
  schedule = learning_rate_schedule(config, updates_per_epoch=1.0)
  assert float(schedule(0)) == 1.0
  for update in (3, 150, 300):
    assert float(schedule(update)) == pytest.approx(0.99**update, rel=1e-4)


def test_caffe_sgd_keeps_a_momentum_buffer_only_with_momentum():
  """Momentum 0 keeps no buffer (no state leaf at all, at a constant rate); momentum 0.9 one buffer per weight."""
  import jax.numpy as jnp

  from stalesgd.training._optimizer import caffe_sgd

  params = {"w": jnp.ones(3)}
  assert [leaf.shape for leaf in jax.tree.leaves(caffe_sgd(0.1).init(params))] == []  # the default: momentum 0
  assert [leaf.shape for leaf in jax.tree.leaves(caffe_sgd(0.1, momentum=0.0).init(params))] == []
  assert [leaf.shape for leaf in jax.tree.leaves(caffe_sgd(0.1, momentum=0.9).init(params))] == [(3,)]
  # Heavy ball, not Nesterov, by default: g = 1 twice at rate 1 and momentum 0.5 gives u = -1, then -(0.5 + 1).
  solver = caffe_sgd(1.0, momentum=0.5)
  state = solver.init(params)
  first, state = solver.update({"w": jnp.ones(3)}, state)
  second, state = solver.update({"w": jnp.ones(3)}, state)
  assert first["w"].tolist() == [-1.0] * 3 and second["w"].tolist() == [-1.5] * 3


# An optax solver by name (config.optimizer) that has its own momentum / nesterov arguments gets config.momentum
# and config.nesterov. optax.rmsprop with decay 0.5 and eps 0, on the averages avg_0 = (w [0.6, 1.0], b 0.5) and
# avg_1 = ([0.3, 0.3], 1.0) (no staleness rule: the modulated step's scale is 1):
#   nu_0 = 0.5 avg_0^2, s_0 = avg_0 / sqrt(nu_0) = sqrt(2) for every leaf;
#   nu_1 = 0.25 avg_0^2 + 0.5 avg_1^2, s_1 = avg_1 / sqrt(nu_1) = (w [0.3 / sqrt(0.135), 0.3 / sqrt(0.295)],
#   b 1 / sqrt(0.5625)) = ([sqrt(2/3), 0.55234...], 4/3);
# then optax's trace of the rate-scaled step: v_t = alpha s_t + mu v_{t-1}, u_t = -v_t, or with nesterov
# u_t = -(alpha s_t + mu v_t); alpha = 0.1.
_S0 = {"w": [math.sqrt(2.0)] * 2, "b": math.sqrt(2.0)}
_S1 = {"w": [0.3 / math.sqrt(0.135), 0.3 / math.sqrt(0.295)], "b": 1.0 / math.sqrt(0.5625)}


def _rmsprop_steps(mu, nesterov, alpha=0.1):
  """The two updates above, leaf by leaf, in float64."""
  steps = []
  for key in ("w", "b"):
    s0, s1 = np.asarray(_S0[key]), np.asarray(_S1[key])
    v0 = alpha * s0
    v1 = alpha * s1 + mu * v0
    steps.append((-(alpha * s0 + mu * v0), -(alpha * s1 + mu * v1)) if nesterov else (-v0, -v1))
  (w0, w1), (b0, b1) = steps
  return [{"w": w0, "b": b0}, {"w": w1, "b": b1}]


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.5, False), (0.5, True), (0.25, True)])
def test_an_optax_solver_receives_the_configs_momentum_and_nesterov(momentum, nesterov):
  """Catches config.momentum / config.nesterov not reaching a named optax solver that takes them (e.g. switched
  off): with mu 0.5 the second step is -(0.1 s_1 + 0.05 sqrt 2), not -0.1 s_1."""
  config = make_config(
    learning_rate=0.1,
    momentum=momentum,
    nesterov=nesterov,
    optimizer="rmsprop",
    optimizer_options={"decay": 0.5, "eps": 0.0},
  )
  expected = _rmsprop_steps(momentum, nesterov)
  if momentum == 0.5 and not nesterov:  # by hand: u_1 = -(0.1 s_1 + 0.5 * 0.1 sqrt 2)
    np.testing.assert_allclose(expected[1]["w"], [-0.1523603362, -0.1259451551], rtol=1e-9)
    np.testing.assert_allclose(expected[1]["b"], -0.2040440114, rtol=1e-9)
  assert_updates_close(run_updates(config), expected)


# ------------------------------------------------------------------- warm-up


def test_warmup_first_middle_and_last_steps_by_hand():
  """W = round(1.5 epochs x 2) = 3 updates from 0.02 to 0.08, momentum 0: alpha = 0.02, 0.04, 0.06, then 0.08;
  u_t = -alpha_t avg_t: u_0 = -0.02 ([0.6, 1.0], 0.5), u_1 = -0.04 ([0.3, 0.3], 1.0), u_2 = -0.06 ([0.4, 0.3], 0.2).
  Catches a ramp over W - 1 or W + 1 updates, one that starts at 0, and the warm-up left off."""
  config = make_config(learning_rate=0.08, momentum=0.0, warmup_epochs=1.5, warmup_learning_rate=0.02)
  expected = [
    {"w": [-0.012, -0.02], "b": -0.01},
    {"w": [-0.012, -0.012], "b": -0.04},
    {"w": [-0.024, -0.018], "b": -0.012},
  ]
  assert_updates_close(run_updates(config, steps=3), expected)


def test_warmup_from_the_small_batch_rate_to_the_scaled_one():
  """Goyal et al.'s ramp at DC-S3GD's rates, 0.001 to 0.008 over W = 8 updates (1 epoch of 8 updates): the first
  step 0.001, the middle (u = 4) 0.001 + 0.007 x 4/8 = 0.0045, the last (u = 7) 0.001 + 0.007 x 7/8 = 0.007125,
  then 0.008 until the first decay (epoch 2, update 16: 0.0008)."""
  config = make_config(
    learning_rate=0.008, warmup_epochs=1.0, warmup_learning_rate=0.001, lr_decay_epochs=(2.0,), lr_decay_factor=0.1
  )
  schedule = learning_rate_schedule(config, updates_per_epoch=8.0)
  rates = [float(schedule(u)) for u in (0, 4, 7, 8, 15, 16)]
  np.testing.assert_allclose(rates, [0.001, 0.0045, 0.007125, 0.008, 0.008, 0.0008], rtol=1e-6)


def test_a_decay_at_the_end_of_the_warmup_applies_from_its_first_update():
  """W = 8 updates and the first decay at the same epoch (allowed: the warm-up ends by then): update 8 takes the
  decayed rate 0.0008, not the ramp's end 0.008; update 7 is the ramp's last step."""
  config = make_config(
    learning_rate=0.008, warmup_epochs=1.0, warmup_learning_rate=0.001, lr_decay_epochs=(1.0,), lr_decay_factor=0.1
  )
  schedule = learning_rate_schedule(config, updates_per_epoch=8.0)
  np.testing.assert_allclose([float(schedule(7)), float(schedule(8))], [0.007125, 0.0008], rtol=1e-6)


def test_an_optax_solver_named_after_sgd_in_order_is_built():
  """ "yogi" sorts after "sgd": it is an optax solver, not Caffe's SGD (the name compared for equality)."""
  yogi = run_updates(make_config(learning_rate=0.1, momentum=0.0, optimizer="yogi"), steps=1)[0]
  sgd = run_updates(make_config(learning_rate=0.1, momentum=0.0), steps=1)[0]
  assert not np.allclose(yogi["w"], sgd["w"])


def test_warmup_off_is_the_step_schedule():
  config = make_config(learning_rate=0.08, lr_decay_epochs=(1.0,), lr_decay_factor=0.5)
  schedule = learning_rate_schedule(config, updates_per_epoch=2.0)
  np.testing.assert_allclose([float(schedule(u)) for u in (0, 1, 2)], [0.08, 0.08, 0.04], rtol=1e-7)


@pytest.mark.parametrize("weight_decay", [0.1, 0.3])
@pytest.mark.parametrize("placement", ["modulated", "unmodulated"])
def test_weight_decay_placement(placement, weight_decay):
  """Catches weight decay that is ignored, taken at the initial instead of the current weights, or
  placed wrongly: under "modulated" it must be scaled by each contribution's staleness weight (inverse
  rule, sigma = [0, 2, 4] then [1, 3, 6]), under "unmodulated" added once after the average."""
  config = make_config(
    learning_rate=0.1,
    momentum=0.5,
    weight_decay=weight_decay,
    weight_decay_placement=placement,
    staleness_rule="inverse",
  )
  expected = reference_updates(
    alphas=[0.1, 0.1],
    momentum=0.5,
    weights=[[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6]],
    weight_decay=weight_decay,
    placement=placement,
  )
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
    config = make_config(
      learning_rate=0.1, momentum=0.5, weight_decay=0.1, weight_decay_placement=placement, staleness_rule="inverse"
    )
    (got,) = run_updates(config, steps=1)
    assert_updates_close([got], [{key: 0.1 * np.asarray(value) for key, value in want.items()}])


# ---------------------------------------------------------- model multipliers


@pytest.mark.parametrize("model_multipliers", [True, False])
def test_model_multipliers(model_multipliers):
  """Catches ignored lr_mult or decay_mult, multipliers swapped, lr_mult applied to the weight decay
  term only, or multipliers read although config.model_multipliers is False."""
  config = make_config(
    learning_rate=0.1, momentum=0.5, weight_decay=0.1, staleness_rule="inverse", model_multipliers=model_multipliers
  )
  model = FakeModel()
  expected = reference_updates(
    steps=3,
    alphas=[0.1] * 3,
    momentum=0.5,
    weights=[[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6], [1 / 2, 1 / 5, 1 / 8]],
    weight_decay=0.1,
    lr_mult=LR_MULT if model_multipliers else None,
    wd_mult=WD_MULT if model_multipliers else None,
  )
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
  "polynomial_0.5": (
    {"staleness_rule": "polynomial", "staleness_exponent": 0.5},
    [[1, 3**-0.5, 5**-0.5], [2**-0.5, 4**-0.5, 7**-0.5]],
  ),
  "polynomial_1": (
    {"staleness_rule": "polynomial", "staleness_exponent": 1.0},
    [[1, 1 / 3, 1 / 5], [1 / 2, 1 / 4, 1 / 7]],
  ),
  "exponential_0.5": (
    {"staleness_rule": "exponential", "staleness_decay": 0.5},
    [[1, E(-1), E(-2)], [E(-0.5), E(-1.5), E(-3)]],
  ),
  "exponential_0.25": (
    {"staleness_rule": "exponential", "staleness_decay": 0.25},
    [[1, E(-0.5), E(-1)], [E(-0.25), E(-0.75), E(-1.5)]],
  ),
  "threshold_2": ({"staleness_rule": "threshold", "staleness_threshold": 2}, [[1, 1, 0], [1, 0, 0]]),
  "threshold_3": ({"staleness_rule": "threshold", "staleness_threshold": 3}, [[1, 1, 0], [1, 1, 0]]),
  # 1 / (sigma - threshold + 1) beyond the threshold.
  "hinge_2": ({"staleness_rule": "hinge", "staleness_threshold": 2}, [[1, 1, 1 / 3], [1, 1 / 2, 1 / 5]]),
  "hinge_3": ({"staleness_rule": "hinge", "staleness_threshold": 3}, [[1, 1, 1 / 2], [1, 1, 1 / 4]]),
  # Normalised by s(<sigma>): inverse at <sigma> = 2 is 1/2.
  "inverse_normalized": (
    {"staleness_rule": "inverse", "staleness_mean": 2.0, "staleness_normalize": True},
    [[2, 1, 1 / 2], [2, 2 / 3, 1 / 3]],
  ),
  # polynomial(0.5) at 2 is 3^-0.5.
  "polynomial_normalized": (
    {"staleness_rule": "polynomial", "staleness_mean": 2.0, "staleness_normalize": True},
    [[3**0.5, 1, (3 / 5) ** 0.5], [(3 / 2) ** 0.5, 3**0.5 / 2, (3 / 7) ** 0.5]],
  ),
  # exponential(0.5) at 2 is e^-1.
  "exponential_normalized": (
    {"staleness_rule": "exponential", "staleness_mean": 2.0, "staleness_normalize": True},
    [[E(1), 1, E(-1)], [E(0.5), E(-0.5), E(-2)]],
  ),
  # hinge(2) at 4 is 1/3.
  "hinge_normalized": (
    {"staleness_rule": "hinge", "staleness_threshold": 2, "staleness_mean": 4.0, "staleness_normalize": True},
    [[3, 3, 1], [3, 3 / 2, 3 / 5]],
  ),
  # inverse_mean normalised by itself is 1.
  "inverse_mean_normalized": (
    {"staleness_rule": "inverse_mean", "staleness_mean": 2.0, "staleness_normalize": True},
    [[1] * 3, [1] * 3],
  ),
  # threshold(2) at <sigma> = 3 is 0: left unnormalised.
  "threshold_normalized_at_zero": (
    {"staleness_rule": "threshold", "staleness_threshold": 2, "staleness_mean": 3.0, "staleness_normalize": True},
    [[1, 1, 0], [1, 0, 0]],
  ),
  # Normalised by the tracked mean (0, 2, then 8/3): inverse at those is 1, 1/2, 3/8;
  # sigma_2 = [2, 5, 8] -> [1/2, 1/5, 1/8] * 8/3.
  "inverse_normalized_tracked": (
    {"staleness_rule": "inverse", "staleness_normalize": True},
    [[1, 1 / 2, 1 / 4], [2, 2 / 3, 1 / 3], [4 / 3, 8 / 15, 1 / 3]],
  ),
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


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("placement", ["modulated", "unmodulated"])
def test_weight_decay_placement_accepts_its_values(placement):
  """Catches a validator that rejects a documented placement."""
  validate_config(make_config(weight_decay_placement=placement), num_devices=8)


@pytest.mark.parametrize("placement", ["before", "Modulated", "", "zz"])
def test_weight_decay_placement_rejects_other_values(placement):
  """Catches a placement typo that build_optimizer would silently treat as "unmodulated", in the config's checks
  and where the optimizer is built (it is public: a config may reach it unchecked)."""
  with pytest.raises(ValueError, match="weight_decay_placement"):
    validate_config(make_config(weight_decay_placement=placement), num_devices=8)
  with pytest.raises(ValueError, match=f"config.weight_decay_placement={placement!r}; allowed: one of"):
    run_updates(make_config(weight_decay_placement=placement), steps=1)


def test_the_optax_optimizers_by_name_leave_out_sgd_and_building_blocks():
  from stalesgd.training._solvers import optax_optimizers

  names = optax_optimizers()
  assert {"adam", "adamw", "rmsprop", "yogi", "sm3"} <= set(names)  # names after "sgd" included
  assert "sgd" not in names and not any(name.startswith(("_", "scale_by")) for name in names)


def test_an_unknown_solver_names_its_field_and_what_sgd_means_there():
  from stalesgd.training._solvers import solver_factory

  with pytest.raises(ValueError, match=r"config.optimizer='nope'; allowed: 'sgd' \(the papers' Caffe solver\)"):
    solver_factory("nope")
  for field in ("config.inner.optimizer", "config.outer.optimizer"):
    with pytest.raises(ValueError, match=rf"{field}='nope'; allowed: 'sgd' \(optax.sgd\)"):
      solver_factory("nope", field=field)
  # The field compared by value (a name built at run time: equal, another object).
  with pytest.raises(ValueError, match=r"allowed: 'sgd' \(the papers' Caffe solver\)"):
    solver_factory("nope", field="".join(["config.", "optimizer"]))
  with pytest.raises(TypeError):
    solver_factory("nope", "config.inner.optimizer")  # the field is keyword-only


def test_a_momentum_or_nesterov_a_solver_cannot_take_is_refused_and_the_off_values_pass():
  from stalesgd.training._solvers import solver_call

  assert solver_call("adagrad", {}, momentum=0, nesterov=False).arguments == {}
  assert solver_call("adagrad", {}, momentum=0.0, nesterov=False).arguments == {}
  with pytest.raises(ValueError, match=r"config.momentum=0.9, but config.optimizer='adagrad' takes no momentum"):
    solver_call("adagrad", {}, momentum=0.9, nesterov=False)
  with pytest.raises(ValueError, match=r"config.nesterov=True, but config.optimizer='adagrad' takes no nesterov"):
    solver_call("adagrad", {}, momentum=0, nesterov=True)


def rate_first_sgd(step_size, momentum=0.0, nesterov=False):
  """A solver factory that takes its rate as its first argument, not by the name learning_rate."""
  import optax

  return optax.sgd(step_size, momentum=momentum, nesterov=nesterov)


def test_a_solver_takes_the_rate_by_name_or_as_its_first_argument():
  """optax's factories get ``learning_rate=``; a factory of another parameter name gets the rate first: SGD at
  0.5 on gradient 2 moves a weight by -1 either way."""
  import jax.numpy as jnp

  from stalesgd.training._solvers import build_solver, solver_call

  for name in ("tests.training.test_optimizer_solver:rate_first_sgd", "rmsprop"):
    solver = build_solver(name, lambda step: 0.5, {}, momentum=0.0, nesterov=False)
    if name == "rmsprop":
      assert solver_call(name, {}, momentum=0.0, nesterov=False).rate_by_name
      continue
    assert not solver_call(name, {}, momentum=0.0, nesterov=False).rate_by_name
    updates, _ = solver.update(jnp.array([2.0]), solver.init(jnp.zeros(1)))
    assert updates.tolist() == [-1.0]
  with pytest.raises(TypeError):
    solver_call("adagrad", {}, 0.0, False)  # momentum and nesterov are keyword-only
  with pytest.raises(TypeError):
    build_solver("adagrad", lambda step: 0.5, {}, 0.0, False)


def test_a_short_warmup_takes_at_least_one_update():
  """W = round(warmup_epochs x updates per epoch), at least 1 when on: 0.1 epoch of 4 updates is 1 update, 0 is off."""
  from stalesgd.training._optimizer import warmup_updates

  assert warmup_updates(make_config(warmup_epochs=0.1), updates_per_epoch=4.0) == 1
  assert warmup_updates(make_config(warmup_epochs=1.5), updates_per_epoch=4.0) == 6
  assert warmup_updates(make_config(warmup_epochs=0.0), updates_per_epoch=4.0) == 0


def test_build_optimizer_takes_its_model_params_and_rate_by_keyword():
  from stalesgd.training._optimizer import build_optimizer

  with pytest.raises(TypeError):
    build_optimizer(make_config(), FakeModel(), {"w": np.zeros(2)}, 4.0)


def test_names_in_the_config_are_compared_by_value():
  """A config's strings parsed from a command line are not the interned literals: ``"none"``, ``"sgd"`` and the
  weight-decay placements built at run time give the literals' optimizer (no staleness weight; Caffe's SGD)."""
  built = make_config(
    learning_rate=0.1, momentum=0.5, staleness_rule="".join(["no", "ne"]), optimizer="".join(["s", "gd"])
  )
  literal = make_config(learning_rate=0.1, momentum=0.5, staleness_rule="none", optimizer="sgd")
  assert_updates_equal(run_updates(built, steps=2), run_updates(literal, steps=2))
  for placement in ("modulated", "unmodulated"):
    options = dict(learning_rate=0.1, momentum=0.5, weight_decay=0.2, staleness_rule="inverse")
    built_placement = make_config(weight_decay_placement="".join(list(placement)), **options)
    literal_placement = make_config(weight_decay_placement=placement, **options)
    assert_updates_equal(run_updates(built_placement, steps=2), run_updates(literal_placement, steps=2))
  from stalesgd.training._optimizer import delay_compensation_transforms

  assert delay_compensation_transforms(make_config(delay_compensation="".join(["no", "ne"]))) == []
