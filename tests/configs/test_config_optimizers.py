"""The optimizer each paper's config builds, against the paper's update written out by hand.

`tests/training/test_optimizer_solver.py` and `test_optimizer_delay_compensation.py` pin every optimizer field on small
configs; here the configs themselves are pinned: the solver a user gets from
``rudra_cifar10.py`` (Caffe's SGD on cifar10_full with its per-layer multipliers
and a staleness-modulated rate, Zhang et al. eq. 2-3) and from
``dcasgd_cifar10_resnet20.py`` (Zheng et al.'s DC-ASGD update). Expected values
are computed with numpy from the equations, with the multipliers typed in from
Rudra's release file (``Rudra-org/rudra`` ``examples/cifar10.cnn``, the default) and
Caffe's ``cifar10_full_train_test.prototxt`` (``multiplier_set="caffe"``); nothing
here calls the code under test to build an expectation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd import models
from stalesgd.configs import dcasgd_cifar10_resnet20, rudra_cifar10
from stalesgd.training._config_readers import updates_per_epoch
from stalesgd.training._optimizer import build_optimizer, learning_rate_schedule

CIFAR10_TRAIN = 50_000
# Rudra's examples/cifar10.cnn: alphaW = 0.001 and alphaB = 0.002 in every layer (lr_mult 1 / 2 of the rate 0.001);
# lambdaW = 0.004 on conv1-3 and 1.0 on fc1 (decay_mult 1 and 250 of weight_decay 0.004); no lambdaB anywhere.
LR_MULT = {layer: {"kernel": 1.0, "bias": 2.0} for layer in ("conv1", "conv2", "conv3", "ip1")}
DECAY_MULT = {
  "conv1": {"kernel": 1.0, "bias": 0.0},
  "conv2": {"kernel": 1.0, "bias": 0.0},
  "conv3": {"kernel": 1.0, "bias": 0.0},
  "ip1": {"kernel": 250.0, "bias": 0.0},
}
# cifar10_full_train_test.prototxt: lr_mult 1 (weights) / 2 (biases) but on conv3; decay_mult 250 / 0 on ip1,
# Caffe's default 1 on the conv blobs.
CAFFE_LR_MULT = {
  "conv1": {"kernel": 1.0, "bias": 2.0},
  "conv2": {"kernel": 1.0, "bias": 2.0},
  "conv3": {"kernel": 1.0, "bias": 1.0},  # conv3 has no param block: Caffe's default lr_mult 1
  "ip1": {"kernel": 1.0, "bias": 2.0},
}
CAFFE_DECAY_MULT = {
  "conv1": {"kernel": 1.0, "bias": 1.0},
  "conv2": {"kernel": 1.0, "bias": 1.0},
  "conv3": {"kernel": 1.0, "bias": 1.0},
  "ip1": {"kernel": 250.0, "bias": 0.0},
}


def _cifar10_full_params(seed: int):
  model = models.get_model("cifar10_full", num_classes=10)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), (32, 32, 3)))["params"]
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda s: rng.normal(0, 0.05, s.shape).astype(np.float32), shapes)
  return model, params


def _numpy(tree):
  return jax.tree.map(np.asarray, tree)


def _rudra_steps(
  variant: str, stalenesses: list[list[int]], *, n: int | None = None, multiplier_set: str | None = None
):
  """Runs the config's optimizer over len(stalenesses) updates; returns (params, gradient stacks, updates)."""
  config = rudra_cifar10.get_config(variant)
  if n is not None:
    config.n = n
  model, params = _cifar10_full_params(seed=0)
  if multiplier_set is not None:
    model = model.with_multiplier_set(multiplier_set)
  optimizer = build_optimizer(
    config, model=model, params=params, updates_per_epoch=updates_per_epoch(config, CIFAR10_TRAIN)
  )
  state = optimizer.init(params)
  rng = np.random.default_rng(1)
  weights, grads_per_step, updates_per_step = [params], [], []
  update = jax.jit(lambda g, s, p, sigma: optimizer.update(g, s, p, staleness=sigma))
  for sigma in stalenesses:
    grads = jax.tree.map(lambda p: rng.normal(0, 1.0, (len(sigma),) + p.shape).astype(np.float32), params)
    updates, state = update(grads, state, weights[-1], jnp.asarray(sigma, jnp.int32))
    grads_per_step.append(grads)
    updates_per_step.append(_numpy(updates))
    weights.append(jax.tree.map(lambda w, u: w + u, weights[-1], updates_per_step[-1]))
  return weights, grads_per_step, updates_per_step


def _caffe_expected(
  weights,
  grads_per_step,
  weights_of_staleness,
  *,
  rate=0.001,
  momentum=0.9,
  decay=0.004,
  lr_mult=LR_MULT,
  decay_mult=DECAY_MULT,
):
  """Caffe with a modulated rate: v <- m v + rate lr_mult (1/c) sum_k s_k (g_k + decay decay_mult w); w <- w - v."""
  expected = []
  for layer in weights[0]:
    for blob in weights[0][layer]:
      velocity = np.zeros_like(weights[0][layer][blob], dtype=np.float64)
      steps = []
      for step, (grads, scales) in enumerate(zip(grads_per_step, weights_of_staleness)):
        w = np.asarray(weights[step][layer][blob], np.float64)
        stack = np.asarray(grads[layer][blob], np.float64)
        contributions = [scale * (stack[k] + decay * decay_mult[layer][blob] * w) for k, scale in enumerate(scales)]
        velocity = momentum * velocity + rate * lr_mult[layer][blob] * np.mean(contributions, axis=0)
        steps.append(-velocity)
      expected.append(((layer, blob), steps))
  return expected


def _assert_updates(updates_per_step, expected):
  for (layer, blob), steps in expected:
    for step, want in enumerate(steps):
      np.testing.assert_allclose(
        updates_per_step[step][layer][blob], want, rtol=2e-5, atol=1e-9, err_msg=f"{layer}/{blob}, update {step}"
      )


@pytest.mark.slow
def test_rudra_async_inverse_is_caffe_momentum_with_alpha0_over_sigma_covering_weight_decay():
  """async (c = 1), sigma = 29: the whole Caffe step, decay included, at alpha_0/29 (the papers' semantics)."""
  weights, grads, updates = _rudra_steps("async_inverse", [[29], [29]])
  _assert_updates(updates, _caffe_expected(weights, grads, [[1 / 29], [1 / 29]]))


def test_rudra_async_inverse_with_caffes_prototxt_multipliers():
  """multiplier_set="caffe": conv3's bias at lr_mult 1 and decay on the conv biases, as the prototxt has them."""
  weights, grads, updates = _rudra_steps("async_inverse", [[29], [29]], multiplier_set="caffe")
  expected = _caffe_expected(weights, grads, [[1 / 29], [1 / 29]], lr_mult=CAFFE_LR_MULT, decay_mult=CAFFE_DECAY_MULT)
  _assert_updates(updates, expected)


@pytest.mark.slow
def test_rudra_15_softsync_inverse_averages_two_modulated_contributions():
  """15-softsync (c = 2): w <- w - (alpha_0/c) sum_k (g_k + wd w) / sigma_k, with momentum across updates."""
  weights, grads, updates = _rudra_steps("softsync_inverse", [[14, 15], [13, 16]], n=15)
  _assert_updates(updates, _caffe_expected(weights, grads, [[1 / 14, 1 / 15], [1 / 13, 1 / 16]]))


def test_rudra_inverse_mean_tracks_the_mean_staleness_of_earlier_updates():
  """alpha_0/<sigma> with <sigma> tracked: weight 1 at the first update (nothing seen), then 1/mean of what was."""
  weights, grads, updates = _rudra_steps("async_inverse_mean", [[29], [27], [5]])
  _assert_updates(updates, _caffe_expected(weights, grads, [[1.0], [1 / 29], [1 / 28]]))


def test_rudra_fixed_rate_and_hardsync_leave_the_solver_unmodulated():
  """softsync_fixed: the plain Caffe step whatever sigma is."""
  weights, grads, updates = _rudra_steps("softsync_fixed", [[14, 15], [13, 16]], n=15)
  _assert_updates(updates, _caffe_expected(weights, grads, [[1.0, 1.0], [1.0, 1.0]]))


@pytest.mark.parametrize(
  "variant, applied_per_update", [("baseline", 128), ("async_fixed", 4), ("softsync_fixed", 8), ("hardsync", 120)]
)
def test_rudra_learning_rate_decays_at_epochs_120_and_130_counted_in_samples(variant, applied_per_update):
  """x0.1 at epochs 120 and 130 of applied samples: update round(epoch * 50000 / (c mu))."""
  config = rudra_cifar10.get_config(variant)
  schedule = learning_rate_schedule(config, updates_per_epoch(config, CIFAR10_TRAIN))
  first, second = (round(epoch * CIFAR10_TRAIN / applied_per_update) for epoch in (120, 130))
  rates = [float(schedule(count)) for count in (0, first - 1, first, second - 1, second, 10 * second)]
  np.testing.assert_allclose(rates, [1e-3, 1e-3, 1e-4, 1e-4, 1e-5, 1e-5], rtol=1e-6)


def _dcasgd_steps(variant: str, learners: int | None = None):
  config = dcasgd_cifar10_resnet20.get_config(variant)
  if learners is not None:
    config.learners = learners
  params = {"w": np.array([0.5, -1.0, 2.0], np.float32), "b": np.array([0.25], np.float32)}
  optimizer = build_optimizer(
    config, model=None, params=params, updates_per_epoch=updates_per_epoch(config, CIFAR10_TRAIN)
  )
  state = optimizer.init(params)
  grads = [
    {"w": np.array([[0.3, -0.2, 0.1]], np.float32), "b": np.array([[0.5]], np.float32)},
    {"w": np.array([[-0.1, 0.4, 0.2]], np.float32), "b": np.array([[-0.3]], np.float32)},
  ]
  stale = [
    {"w": np.array([[0.4, -0.5, 2.5]], np.float32), "b": np.array([[0.0]], np.float32)},
    {"w": np.array([[0.5, -1.0, 2.0]], np.float32), "b": np.array([[0.25]], np.float32)},
  ]
  weights, updates_per_step = [params], []
  for step in range(2):
    updates, state = optimizer.update(
      grads[step], state, weights[-1], staleness=jnp.array([3]), stale_params=stale[step], learner=jnp.array([step])
    )
    updates_per_step.append(_numpy(updates))
    weights.append(jax.tree.map(lambda w, u: w + u, weights[-1], updates_per_step[-1]))
  return weights, grads, stale, updates_per_step


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dcasgd_c", "dcasgd_a", "dcasgd_a_bc", "asgd"])
def test_dcasgd_table1_update_is_the_papers_with_weight_decay_outside_the_correction(variant):
  """w <- w - 0.5 (g + lambda_t g g (w - w_bak) + 1e-4 w), no momentum; DC-a: MS <- .95 MS + .05 g^2 first
  (the dcasgd_a_bc ablation: W <- .95 W + .05 from 0, lambda_t = 2 / sqrt(MS / W + eps))."""
  weights, grads, stale, updates = _dcasgd_steps(variant)
  for name in ("w", "b"):
    mean_square, weight = np.zeros_like(weights[0][name], np.float64), 0.0
    for step in range(2):
      w = np.asarray(weights[step][name], np.float64)
      g = np.asarray(grads[step][name][0], np.float64)
      backup = np.asarray(stale[step][name][0], np.float64)
      if variant in ("dcasgd_a", "dcasgd_a_bc"):
        mean_square = 0.95 * mean_square + 0.05 * g * g
        weight = 0.95 * weight + 0.05 if variant == "dcasgd_a_bc" else 1.0
        dc_lambda = 2.0 / np.sqrt(mean_square / weight + 1e-7)
      else:
        dc_lambda = 0.04 if variant == "dcasgd_c" else 0.0
      want = -0.5 * (g + dc_lambda * g * g * (w - backup) + 1e-4 * w)
      # atol: in dcasgd_a_bc's first step on w[2], g + lambda g g D = 0.1 - 2/sqrt(0.01 + eps) * 0.01 * 0.5
      # cancels to about 5e-7 in float32, leaving the decay term 1e-4 w with a few 1e-9 of rounding.
      np.testing.assert_allclose(
        updates[step][name], want, rtol=2e-5, atol=1e-8, err_msg=f"{variant} {name} step {step}"
      )


def test_dcasgd_ssgd_is_sgd_on_the_mean_of_m_gradients_plus_decay():
  """SSGD (hardsync, c = M = 4): w <- w - 0.5 (mean_k g_k + 1e-4 w)."""
  config = dcasgd_cifar10_resnet20.get_config("ssgd")
  params = {"w": np.array([1.0, -2.0], np.float32)}
  optimizer = build_optimizer(
    config, model=None, params=params, updates_per_epoch=updates_per_epoch(config, CIFAR10_TRAIN)
  )
  grads = {"w": np.array([[0.1, 0.2], [0.3, -0.4], [0.5, 0.6], [-0.7, 0.8]], np.float32)}
  updates, _ = optimizer.update(grads, optimizer.init(params), params, staleness=jnp.zeros([4], jnp.int32))
  want = -0.5 * (np.array([0.05, 0.3]) + 1e-4 * np.array([1.0, -2.0]))
  np.testing.assert_allclose(updates["w"], want, rtol=1e-6)
  schedule = learning_rate_schedule(config, updates_per_epoch(config, CIFAR10_TRAIN))
  per_epoch = CIFAR10_TRAIN / (4 * 128)  # 97.65625 updates
  boundaries = [round(80 * per_epoch), round(120 * per_epoch)]
  assert boundaries == [7812, 11719]
  np.testing.assert_allclose(
    [float(schedule(c)) for c in (7811, 7812, 11718, 11719)], [0.5, 0.05, 0.05, 0.005], rtol=1e-6
  )


def test_decay_epochs_on_the_same_update_are_refused():
  """Two decay epochs rounding to one update would decay once, silently; refused naming the field."""
  config = dcasgd_cifar10_resnet20.get_config("ssgd")
  config.lr_decay_epochs = (80.0, 79.999)
  with pytest.raises(
    ValueError,
    match=r"config.lr_decay_epochs=\(80.0, 79.999\) falls on server updates "
    r"\[7812, 7812\]",
  ):
    learning_rate_schedule(config, updates_per_epoch(config, CIFAR10_TRAIN))
