"""A researcher's own model, data, optimizer and loss, defined here (outside the package), trained by stalesgd.

The four import paths below go into a config as they would from the command line
(``--config.model=tests.training.test_own_experiment:own_cnn``); nothing in stalesgd knows them. Each protocol
family runs: async with DC-ASGD-a and alpha_0/sigma (parameter server, the emulator) and DC-S3GD (real
collectives). A run preempted by SIGTERM at a block and resumed ends with the uninterrupted run's weights and
records; the async one is also started through ``stalesgd-train`` (``python -m stalesgd.cli.train``).
"""

from __future__ import annotations

import json
import signal
import sys

import flax.linen as nn
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

from stalesgd.training import _runners as runners
from stalesgd.training import train_and_evaluate
from tests.helpers.fault_helpers import without_wall_clock
from tests.helpers.train_helpers import event_hparams, read_metrics, run_main, tiny_config

HERE = "tests.training.test_own_experiment"
PREEMPT_AT_BLOCK = 6


class OwnCNN(nn.Module):
  width: int
  num_classes: int

  @nn.compact
  def __call__(self, images, *, train: bool):
    del train
    x = nn.relu(nn.Conv(self.width, (3, 3))(images))
    return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


def own_cnn(num_classes: int, width: int = 4) -> nn.Module:
  """The user's model factory: a flax module."""
  return OwnCNN(width=width, num_classes=num_classes)


def own_digits():
  """The user's data: scikit-learn's 8x8 digits as uint8 arrays, 1,200 to train on and the rest to test."""
  digits = load_digits()
  images = (digits.images * 15).astype(np.uint8)
  labels = digits.target.astype(np.int64)
  return (images[:1200], labels[:1200]), (images[1200:], labels[1200:])


def own_adam(learning_rate, b1: float = 0.9) -> optax.GradientTransformation:
  """The user's optimizer factory: takes the learning-rate schedule."""
  return optax.adam(learning_rate, b1=b1)


def own_cross_entropy(logits, labels):
  """The user's loss and metrics, per example: cross-entropy, and the error in percent (test_error)."""
  return {
    "loss": optax.losses.softmax_cross_entropy_with_integer_labels(logits, labels),
    "error": 100.0 * (logits.argmax(axis=-1) != labels),
  }


def own_config(variant: str):
  config = tiny_config(variant)
  config.model = f"{HERE}:own_cnn"
  config.model_options = {"width": 4}
  config.data_source, config.dataset = "python", f"{HERE}:own_digits"
  config.optimizer, config.optimizer_options = f"{HERE}:own_adam", {"b1": 0.8}
  config.momentum, config.learning_rate = 0.0, 0.01
  config.loss = f"{HERE}:own_cross_entropy"
  if variant == "async_dc":
    config.staleness_rule = "inverse"
  return config


@pytest.fixture
def preempted_once(monkeypatch):
  """Makes the runners send this process SIGTERM before block `PREEMPT_AT_BLOCK`, the first time they reach it."""
  sent = []
  for runner_class in (runners.ParameterServerRunner, runners.DecentralizedRunner):
    unsignalled_step = runner_class.step

    def step(self, state, block, _step=unsignalled_step):
      if block == PREEMPT_AT_BLOCK and not sent:
        sent.append(block)
        signal.raise_signal(signal.SIGTERM)  # the loop's PreemptionGuard turns it into a checkpoint and a stop
      return _step(self, state, block)

    monkeypatch.setattr(runner_class, "step", step)
  return sent


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["async_dc", "dcs3gd"])
def test_own_model_data_and_optimizer_train_and_resume_exactly(variant, tmp_path, preempted_once, compilation_cache):
  whole, resumed = tmp_path / "whole", tmp_path / "resumed"
  first = train_and_evaluate(own_config(variant), str(resumed))
  assert first["preempted"] and preempted_once == [PREEMPT_AT_BLOCK]
  finished = train_and_evaluate(own_config(variant), str(resumed))
  if variant == "async_dc":  # the uninterrupted run through the program, from a user's config file and flags
    config_file = tmp_path / "my_config.py"
    config_file.write_text(
      f"from {HERE} import own_config\n\n\ndef get_config(arg):\n  config = own_config(arg)\n"
      "  config.model_options = {}\n  return config\n"
    )
    result = run_main(
      [
        sys.executable,
        "-m",
        "stalesgd.cli.train",
        f"--config={config_file}:async_dc",
        "--config.model_options.width=4",  # a key the config file does not have
        f"--workdir={whole}",
      ],
      compilation_cache,
      timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = json.loads((whole / "summary.json").read_text())
  else:
    reference = train_and_evaluate(own_config(variant), str(whole))
  assert not finished["preempted"] and finished["updates"] == reference["updates"]
  assert finished["params_sha256"] == reference["params_sha256"]
  assert without_wall_clock(read_metrics(resumed)) == without_wall_clock(read_metrics(whole))
  # It learned (chance is about 88 % here, from the data), and says what the data is.
  facts = json.loads((whole / "dataset.json").read_text())
  assert (facts["num_classes"], facts["num_train"], facts["image_shape"]) == (10, 1200, [8, 8, 1])
  assert reference["test_error"] < facts["chance_test_error"] - 30
  hparams, names, metrics = event_hparams(whole)
  assert hparams["model"] == f"{HERE}:own_cnn" and hparams["optimizer_options.b1"] == pytest.approx(0.8)
  assert {"test_error", "test_loss"} <= set(metrics) and "protocol" in names  # the user's metrics, as test_*


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("model", "no_such_module:net", r"config.model='no_such_module:net': cannot import module"),
    (
      "model_options",
      {"depth": 2},
      r"config.model_options.depth: config.model='.*:own_cnn' does not take option\(s\) \['depth'\]",
    ),
    ("dataset", f"{HERE}:missing", r"config.dataset='.*:missing': .* has no attribute 'missing'"),
    ("optimizer", "adamz", r"config.optimizer='adamz'; allowed: 'sgd' .*adam, adamax, adamaxw, adamw, .*lamb"),
    (
      "optimizer_options",
      {"beta": 1},
      r"config.optimizer_options.beta: config.optimizer='.*:own_adam' does not take option\(s\) \['beta'\]",
    ),
    ("momentum", 0.9, r"config.momentum=0.9, but config.optimizer='.*:own_adam' takes no momentum argument"),
  ],
)
def test_a_bad_own_experiment_is_refused_before_anything_is_read(field, value, match, tmp_path):
  config = own_config("async_dc")
  config[field] = value
  with pytest.raises(ValueError, match=match):
    train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "config.json").exists()


class OwnRegressor(nn.Module):
  @nn.compact
  def __call__(self, images, *, train: bool):
    del train
    return nn.Dense(1)(nn.relu(nn.Dense(16)(images.reshape(images.shape[0], -1))))


def own_regressor() -> nn.Module:
  """A model for a task that is not classification: one number per image."""
  return OwnRegressor()


def own_brightness():
  """A regression: each digit image's mean pixel value, standardised with the training split's mean and std."""
  (train_images, _), (test_images, _) = own_digits()
  brightness = lambda images: images.reshape(len(images), -1).mean(axis=1)
  mean, std = brightness(train_images).mean(), brightness(train_images).std()
  target = lambda images: ((brightness(images) - mean) / std).astype(np.float32)
  return (train_images, target(train_images)), (test_images, target(test_images))


def squared_error(outputs, targets):
  """The user's loss and metrics, per example."""
  error = outputs[:, 0] - targets
  return {"loss": error**2, "abs_error": abs(error)}


def no_loss_key(outputs, targets):
  return {"error": outputs[:, 0] - targets}


def regression_config():
  """Synchronous Adam (lambda = 8, mu = 2), 8 epochs: 600 updates, a few seconds."""
  config = tiny_config("hardsync")
  config.model, config.model_options = f"{HERE}:own_regressor", {}
  config.data_source, config.dataset = "python", f"{HERE}:own_brightness"
  config.loss = f"{HERE}:squared_error"
  config.normalization = "unit"
  config.batch_per_learner, config.num_epochs, config.eval_every_epochs = 2, 8.0, 2.0
  config.optimizer, config.learning_rate, config.momentum = "adam", 0.03, 0.0
  return config


@pytest.mark.slow
def test_a_regression_with_its_own_loss_trains_and_reports_its_metrics(tmp_path):
  summary = train_and_evaluate(regression_config(), str(tmp_path))
  evaluations = [record for record in read_metrics(tmp_path) if "test_loss" in record]
  assert evaluations and all("test_abs_error" in record and "test_error" not in record for record in evaluations)
  assert summary["test_error"] is None and json.loads((tmp_path / "dataset.json").read_text())["num_classes"] is None
  (_, train_targets), (_, test_targets) = own_brightness()
  always_the_mean = float(np.abs(test_targets - train_targets.mean()).mean())
  assert evaluations[-1]["test_abs_error"] < 0.25 * always_the_mean  # it learned the brightness
  assert evaluations[-1]["test_loss"] < evaluations[0]["test_loss"]
  _, _, metrics = event_hparams(tmp_path)
  assert {"test_loss", "test_abs_error"} <= set(metrics)


@pytest.mark.parametrize(
  "changes, match",
  [
    ({"loss": "softmax_cross_entropy"}, r"config.loss='softmax_cross_entropy' needs class labels, and config.dataset"),
    ({"loss": f"{HERE}:no_loss_key"}, r"config.loss='.*:no_loss_key' returned .*allowed: a dict of per-example values"),
    ({"loss": "mse"}, r"config.loss='mse'; allowed: 'softmax_cross_entropy' or an import path"),
    ({"model": "mlp", "model_options": {"hidden_sizes": (8,)}}, r"data without classes needs a model of your own"),
  ],
)
def test_a_bad_own_loss_is_refused_naming_the_field(changes, match, tmp_path):
  config = regression_config()
  config.update(changes)
  with pytest.raises(ValueError, match=match):
    train_and_evaluate(config, str(tmp_path / "run"))
