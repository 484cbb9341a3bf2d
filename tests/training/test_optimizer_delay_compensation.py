r"""Hand-computed pins of the server optimizer a config builds: delay compensation (constant, adaptive,
layer-wise), Gap-Aware, the combined case and the exact reductions.

The equation and the fixture are in `tests.helpers.optimizer_equations`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stalesgd.training._config_readers import dc_lambda, decentral_settings
from stalesgd.training._run_config import default_config
from tests.helpers.optimizer_equations import (
  GRADS,
  LR_MULT,
  PARAMS,
  RTOL,
  STALE,
  STALENESS,
  WD_MULT,
  assert_updates_close,
  assert_updates_equal,
  make_config,
  reference_updates,
  run_updates,
)

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
          per_contribution_weight, np.shape(per_contribution_weight) + (1,) * (per_contribution.ndim - 1)
        )
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
  config = make_config(
    learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=dc_lambda, dc_decay=dc_decay
  )
  expected = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(dc_lambda, dc_decay))
  assert_updates_close(run_updates(config, steps=3, stale=STALE_STEPS, jit=jit), expected)


def test_delay_compensation_adaptive_epsilon():
  """Catches a wrong epsilon (1e-7) inside the square root: gradients of 1e-3 give MeanSquare
  (1-m) g^2 = 1e-7 at m = 0.9, of the order of epsilon.

  c = 1, b only: g = 1e-3, D = w_0 - w_bak = 0.25, lambda = 0.1 / sqrt(1e-7 + 1e-7);
  g~ = g + lambda g^2 D; momentum 0: u_0 = -0.1 g~.
  """
  config = make_config(c=1, learning_rate=0.1, momentum=0.0, delay_compensation="adaptive", dc_lambda=0.1, dc_decay=0.9)
  grads = [{"w": [[1e-3, 2e-3]], "b": [1e-3]}]
  stale = [{"w": [[1.75, 0.5]], "b": [0.25]}]
  (got,) = run_updates(config, grads, [[1]], steps=1, stale=stale)
  lam = 0.1 / math.sqrt(0.1 * 1e-6 + 1e-7)
  np.testing.assert_allclose(got["b"], -0.1 * (1e-3 + lam * 1e-6 * 0.25), rtol=RTOL)
  # w: MeanSquare (1e-7, 4e-7), D = (0.25, 0.5).
  lam_w = 0.1 / np.sqrt(np.array([1e-7, 4e-7]) + 1e-7)
  np.testing.assert_allclose(
    got["w"], -0.1 * (np.array([1e-3, 2e-3]) + lam_w * np.array([1e-6, 4e-6]) * np.array([0.25, 0.5])), rtol=RTOL
  )


def test_delay_compensation_adaptive_first_update_by_hand():
  """Literal pin: at the first update MS = (1-m) mean g^2, so lambda = lambda0 / sqrt((1-m) mean g^2 + eps).

  b, m = 0.75: mean g^2 = (0.04 + 0.16 + 0.81)/3 = 1.01/3; MS = 0.25 * 1.01/3.
  """
  config = make_config(learning_rate=0.1, momentum=0.5, delay_compensation="adaptive", dc_lambda=0.1, dc_decay=0.75)
  (got,) = run_updates(config, steps=1, stale=STALE_STEPS)
  lam = 0.1 / math.sqrt(0.25 * 1.01 / 3 + 1e-7)
  corrected = [0.2 + lam * 0.04 * 0.25, 0.4 - lam * 0.16 * 0.5, 0.9 + lam * 0.81 * 1.0]
  np.testing.assert_allclose(got["b"], -0.1 * sum(corrected) / 3, rtol=RTOL)


# Learner ids per update: learner 1 sends twice in the first stack, learner 2 first in the second;
# learner 0 is absent from the second stack and read again in the third.
LEARNER_IDS = [[0, 1, 1], [1, 1, 2], [2, 0, 0]]


@pytest.mark.slow
@pytest.mark.parametrize("jit", [False, True])
def test_delay_compensation_adaptive_per_learner_mean_square(jit):
  """Catches dc_per_learner_mean_square ignored (one global MeanSquare), rows indexed by contribution
  instead of learner, or absent learners' MeanSquare decayed."""
  config = make_config(
    learning_rate=0.1,
    momentum=0.5,
    delay_compensation="adaptive",
    dc_lambda=0.1,
    dc_decay=0.9,
    dc_per_learner_mean_square=True,
  )
  expected = reference_updates(
    steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(0.1, 0.9, learners=LEARNER_IDS)
  )
  got = run_updates(config, steps=3, stale=STALE_STEPS, learners=LEARNER_IDS, jit=jit)
  assert_updates_close(got, expected)
  # And it is not the global MeanSquare.
  global_ms = reference_updates(steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(0.1, 0.9))
  assert not np.allclose(got[1]["w"], global_ms[1]["w"], rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("per_learner", [False, True])
@pytest.mark.parametrize("jit", [False, True])
def test_delay_compensation_adaptive_mean_square_bias_correction(per_learner, jit):
  """Catches dc_mean_square_bias_correction ignored, its weight W blended once per contribution instead of
  once per stack, not carried to the next update, or (per learner) advanced for absent learners."""
  config = make_config(
    learning_rate=0.1,
    momentum=0.5,
    delay_compensation="adaptive",
    dc_lambda=0.1,
    dc_decay=0.9,
    dc_per_learner_mean_square=per_learner,
    dc_mean_square_bias_correction=True,
  )
  learners = LEARNER_IDS if per_learner else None
  expected = reference_updates(
    steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(0.1, 0.9, learners=learners, bias_correction=True)
  )
  got = run_updates(config, steps=3, stale=STALE_STEPS, learners=LEARNER_IDS, jit=jit)
  assert_updates_close(got, expected)
  # And it is not the uncorrected MeanSquare.
  uncorrected = reference_updates(
    steps=3, alphas=[0.1] * 3, momentum=0.5, correct=dc_adaptive(0.1, 0.9, learners=learners)
  )
  assert not np.allclose(got[0]["w"], uncorrected[0]["w"], rtol=1e-4)


def test_delay_compensation_bias_correction_first_update_by_hand():
  """Literal pin: at the first update MS / W = (1-m) mean g^2 / (1-m) = mean g^2, whatever m.

  b, m = 0.75: mean g^2 = (0.04 + 0.16 + 0.81)/3 = 1.01/3, lambda = 0.1 / sqrt(1.01/3 + eps)
  (uncorrected: 0.1 / sqrt(0.25 * 1.01/3 + eps), twice as large).
  """
  config = make_config(
    learning_rate=0.1,
    momentum=0.5,
    delay_compensation="adaptive",
    dc_lambda=0.1,
    dc_decay=0.75,
    dc_mean_square_bias_correction=True,
  )
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
  config = make_config(
    learning_rate=0.1,
    momentum=0.5,
    weight_decay=0.2,
    staleness_rule="inverse",
    delay_compensation=mode,
    dc_lambda=dc_lambda,
    dc_decay=0.9,
  )
  expected = reference_updates(
    alphas=[0.1, 0.1], momentum=0.5, weights=[[1, 1 / 2, 1 / 4], [1, 1 / 3, 1 / 6]], weight_decay=0.2, correct=correct
  )
  assert_updates_close(run_updates(config, stale=STALE_STEPS), expected)


def test_weight_decay_does_not_enter_delay_compensation_by_hand():
  """Literal pin on b, first update, DC constant 0.5, wd 0.2, rule none: the g^2 term uses g only.

  g~ = (0.205, 0.36, 1.305) (see the DC pin); decay 0.2 * 0.5 = 0.1 per contribution;
  u_0 = -0.1 (1.87/3 + 0.1). With decay inside DC: g' = (0.3, 0.5, 1.0) gives another value.
  """
  config = make_config(learning_rate=0.1, momentum=0.5, weight_decay=0.2, delay_compensation="constant", dc_lambda=0.5)
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

COMBINED = {
  "learning_rate": 0.1,
  "momentum": 0.5,
  "lr_decay_epochs": (0.5,),
  "lr_decay_factor": 0.5,
  "weight_decay": 0.1,
  "model_multipliers": True,
  "staleness_rule": "inverse",
}


@pytest.mark.slow
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
  expected = reference_updates(
    grads, alphas=[0.1, 0.05], momentum=0.5, weights=weights, weight_decay=0.1, lr_mult=LR_MULT, wd_mult=WD_MULT
  )
  assert_updates_close(run_updates(config, grads, staleness, jit=jit), expected)


def test_unstacked_call_is_a_stack_of_one():
  """Catches an unstacked call (scalar staleness, no leading axis) treated differently from a stack of one."""
  config = make_config(c=1, delay_compensation="adaptive", dc_lambda=0.1, dc_decay=0.9, **COMBINED)
  stacked_grads = [{key: np.asarray(value)[1:2] for key, value in g.items()} for g in GRADS]
  stale = [{key: value[1:2] for key, value in STALE.items()}] * 3
  stacked = run_updates(config, stacked_grads, [[2], [3], [1]], steps=3, stale=stale, learners=[[1]] * 3)
  unstacked = run_updates(
    config,
    [{key: value[0] for key, value in g.items()} for g in stacked_grads],
    [2, 3, 1],
    steps=3,
    stale=[{key: value[0] for key, value in s.items()} for s in stale],
    learners=[1, 1, 1],
  )
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


@pytest.mark.parametrize(
  "protocol, mode, given, expected",
  [
    # lambda_0 left at the stored 0.04: each mode's own (DC-ASGD-c 0.04, DC-ASGD-a 2.0, DC-S3GD's layer-wise 0.2).
    ("dcs3gd", "constant", 0.04, 0.04),
    ("dcs3gd", "adaptive", 0.04, 2.0),
    ("dcs3gd", "layerwise", 0.04, 0.2),
    ("async", "constant", 0.04, 0.04),
    ("async", "adaptive", 0.04, 2.0),
    ("async", "layerwise", 0.04, 0.2),
    # Any other value is taken as given.
    ("dcs3gd", "layerwise", 0.5, 0.5),
    ("async", "adaptive", 0.0, 0.0),
  ],
)
def test_lambda_0_defaults_per_mode(protocol, mode, given, expected):
  config = make_config(c=1, delay_compensation=mode, dc_lambda=given)
  config.protocol = protocol
  assert default_config().dc_lambda == 0.04  # stored default unchanged: earlier run directories resume
  assert dc_lambda(config) == expected
  if protocol == "dcs3gd":
    assert decentral_settings(config).dc_lambda == expected


@pytest.mark.parametrize("protocol", ["dcs3gd", "async"])
@pytest.mark.parametrize("mode", ["constant", "adaptive", "layerwise"])
def test_dc_lambda_default_dc_asgd_keeps_0_04_in_every_mode(protocol, mode):
  """dc_lambda_default='dc_asgd': dc_lambda left at 0.04 means 0.04, as runs started before the per-mode defaults
  ran (their run directories resume only with it); a value given otherwise is still taken as given."""
  config = make_config(c=1, delay_compensation=mode, dc_lambda_default="dc_asgd")
  config.protocol = protocol
  assert dc_lambda(config) == 0.04
  if protocol == "dcs3gd":
    assert decentral_settings(config).dc_lambda == 0.04
  config.dc_lambda = 0.5
  assert dc_lambda(config) == 0.5


def test_an_unknown_mode_is_refused_where_the_optimizer_is_built():
  """build_optimizer is public and does not require a validated config: a mode it does not know is an error naming
  the field and the modes, not a silent constant correction."""
  config = make_config(learning_rate=0.1, delay_compensation="Adaptive")
  with pytest.raises(
    ValueError,
    match=r"config.delay_compensation='Adaptive'; allowed: one of \('none', 'constant', 'adaptive', 'layerwise'\)",
  ):
    run_updates(config, steps=1)


@pytest.mark.parametrize("mode", ["adaptive", "layerwise"])
def test_a_mode_named_at_run_time_corrects_as_the_literal_does(mode):
  """A config's mode parsed from a command line is not the interned literal: compared by value, it gives the
  literal's correction (at stale weights, where the modes differ)."""
  options = dict(learning_rate=0.1, momentum=0.5, dc_lambda=0.2, dc_decay=0.9)
  built = make_config(delay_compensation="".join(list(mode)), **options)
  literal = make_config(delay_compensation=mode, **options)
  assert_updates_equal(run_updates(built, stale=STALE_STEPS), run_updates(literal, stale=STALE_STEPS))
