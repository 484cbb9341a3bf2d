"""What the ``quick`` config variants share: the embedded digits, or a few ImageNet steps.

A paper's data set (CIFAR-10, ImageNet) needs a download or a prepared copy
and hours of compute on a CPU; the ``quick`` variants keep the paper's protocol
(learners, mini-batch per learner, n, staleness rule, delay compensation) and
swap the data and model for scikit-learn's 8x8 ``digits`` (shipped in its
wheel, 1,497 training and 300 test images) and a small network, with the
defaults of `stalesgd.training.default_config` (the one place defaults live).
Their numbers show the papers' qualitative findings at most; they are not
reproductions. The ImageNet configs' ``quick`` variants instead run a few
updates at a small crop size on the ImageNet pipeline itself, only to check
that the configuration builds and steps.
"""

from __future__ import annotations

import ml_collections

from stalesgd.training import default_config, examples_per_update

DATA_FIELDS = ("dataset", "data_source", "data_dir", "normalization", "augment", "image_size")
MODEL_FIELDS = ("model", "model_options", "model_multipliers", "multiplier_set")


def run_on_embedded_digits(
  config: ml_collections.ConfigDict, *, num_epochs: float, model: str | None = None
) -> ml_collections.ConfigDict:
  """Switches ``config`` (in place) to a short run on the embedded digits with a digits-sized model.

  The run lasts ``num_epochs``, evaluates every epoch and has no learning-rate
  decay steps (the paper's are placed for its own, much longer, runs).

  Args:
    config: a paper's config.
    num_epochs: the length of the run.
    model: the model to use on 8x8 images; None keeps the default model
      (``default_config().model``), e.g. ``"resnet20"`` keeps DC-ASGD's
      network, which accepts 8x8 inputs.

  Returns:
    ``config``, for chaining.
  """
  defaults = default_config()
  for field in DATA_FIELDS + MODEL_FIELDS:
    config[field] = defaults[field]
  if model is not None:
    config.model = model
  config.num_epochs = num_epochs
  config.lr_decay_epochs = ()
  config.eval_every_epochs = 1.0
  return config


IMAGENET_TRAIN_EXAMPLES = 1_281_167  # imagenet2012's train split


def run_a_few_imagenet_updates(
  config: ml_collections.ConfigDict, *, image_size: int, updates: int = 4
) -> ml_collections.ConfigDict:
  """Shrinks an ImageNet config (in place) to a smoke run: small crops and ``updates`` server updates.

  This only checks that the configuration builds and steps on the real data
  pipeline (a prepared ``imagenet2012``, or an npz copy of any size); it
  reproduces nothing.

  Args:
    config: an ImageNet config.
    image_size: the crop side, the smallest the model accepts or a little more.
    updates: server updates (decentralized: steps) to run on ImageNet's
      1,281,167 training images.

  Returns:
    ``config``, for chaining.
  """
  config.image_size = image_size
  config.num_epochs = updates * examples_per_update(config) / IMAGENET_TRAIN_EXAMPLES
  config.lr_decay_epochs = ()
  config.eval_every_epochs = config.num_epochs
  config.train_eval_examples = 256
  config.log_every_updates = 1
  return config
