r"""Zhang et al.'s ImageNet runs: AlexNet-style network, lambda = 18, mu = 16 (arXiv 1511.05950).

Reproduces Zhang et al.'s ImageNet comparison (no study runs this config): "an AlexNet-style model, 5 conv + 3 fc
layers, about 72M parameters" on ILSVRC-2012 with lambda = 18 learners and mu = 16 images each; published: the
fixed alpha_0 fails for 9- and 18-softsync, alpha_0/sigma is nearly identical for every n; the single learner's
top-1 error (mu = 256, 35 epochs) is in docs/algorithms.md §6. Their layer widths are not available, so the
model is Caffe's ``bvlc_alexnet`` with its solver: reconstructed, not the paper's own numbers (`get_config`).

Command::

  stalesgd-train --config=zhang_imagenet:softsync_inverse \
      --config.data_dir=$TFDS_DATA_DIR --workdir=runs/zhang_imagenet_18softsync_inverse

Data: tfds ``imagenet2012`` prepared with ``file_format='array_record'`` in ``--config.data_dir`` (tfds cannot
download ImageNet: the archives must be obtained from image-net.org first); ``validation`` is the test split.

Cost: not measured (GPUs: 35 epochs are 45M images through a 61M-parameter network; the paper's own runs used a
GPU cluster).

Result: not measured.
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs import ConfigResult
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.configs.imagenet import use_imagenet
from stalesgd.configs.quick import run_a_few_imagenet_updates
from stalesgd.training import default_config

# The numbers the docstring's Result quotes, checked against results/ (tests/configs/test_config_results.py): none,
# its Result is not measured.
RESULTS: tuple[ConfigResult, ...] = ()

VARIANTS = ("baseline", "hardsync", "softsync_fixed", "softsync_inverse")
LEARNERS, BATCH_PER_LEARNER, SOFTSYNC_N = 18, 16, 18
BASELINE_BATCH = 256
QUICK_IMAGE_SIZE = 67


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg``, ``"[quick,]VARIANT"``.

  The model is Caffe's ``bvlc_alexnet`` (60,965,224 parameters, `stalesgd.models._alexnet`), with Krizhevsky et
  al.'s dropout 0.5 after fc6 and fc7; the solver is ``bvlc_alexnet``'s (learning rate 0.01, momentum 0.9,
  weight decay 5e-4, x0.1 every 100,000 iterations of 256 images, i.e. about every 20 epochs), which the
  paper's setting is styled on. Inputs: 227x227 centre crops with flips and pad-4 crops (`stalesgd.data`'s
  augmentation, not Caffe's 227-from-256 random crop), per-channel normalisation (the per-pixel mean image of
  Caffe is not computed for lazily read ImageNet).

  * ``baseline`` (default): one learner, mu = 256, 35 epochs;
  * ``hardsync``: lambda = 18, mu = 16;
  * ``softsync_fixed`` / ``softsync_inverse``: 18-softsync (``--config.n=9`` and others) with the fixed
    alpha_0 or alpha_0 / sigma.

  ``quick``: NOT a reproduction. It keeps the protocol (lambda, mu, n, rates) and the data pipeline, shrinks the
  crops to 67x67 (which the 11x11 stride-4 stem tiles exactly: 15 -> 7 -> 3 -> 1 after the three poolings; 55
  is the smallest size AlexNet accepts) and the run to 4 server updates, only to check on a machine with the
  data that the configuration builds and steps; its final evaluation still reads the whole validation split.
  """
  arguments = parse_config_argument(arg, variants=VARIANTS, default="baseline")
  config = use_imagenet(default_config(), model="alexnet", image_size=227)
  config.model_options = ml_collections.ConfigDict({"dropout_rate": 0.5})
  config.model_multipliers = True
  config.learning_rate = 0.01
  config.momentum = 0.9
  config.weight_decay = 5e-4
  config.lr_decay_epochs = (20.0,)
  config.num_epochs = 35.0
  config.eval_every_epochs = 1.0
  config.log_every_updates = 1000
  config.learners, config.batch_per_learner = LEARNERS, BATCH_PER_LEARNER
  if arguments.variant == "baseline":
    config.protocol, config.learners, config.batch_per_learner = "hardsync", 1, BASELINE_BATCH
  elif arguments.variant == "hardsync":
    config.protocol = "hardsync"
  else:
    config.protocol, config.n = "softsync", SOFTSYNC_N
    config.staleness_rule = "inverse" if arguments.variant == "softsync_inverse" else "none"
  if arguments.quick:
    run_a_few_imagenet_updates(config, image_size=QUICK_IMAGE_SIZE)
  return config
