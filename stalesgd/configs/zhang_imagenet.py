r"""Zhang et al.'s ImageNet runs: AlexNet-style network, lambda = 18, mu = 16 (arXiv 1511.05950).

Zhang et al. train "an AlexNet-style model, 5 conv + 3 fc layers, about 72M
parameters" on ImageNet (ILSVRC-2012) with lambda = 18 learners and mu = 16
images each, comparing n-softsync with the fixed alpha_0 and with alpha_0 /
sigma. Published: the fixed rate fails for 9- and 18-softsync; alpha_0 /
sigma is nearly identical for every n; the single-learner baseline (mu = 256,
35 epochs): its top-1 error is in docs/algorithms.md §6 (no study runs this
config).

The exact layer widths of their variant are not available here, so the model
is Caffe's ``bvlc_alexnet`` (60,965,224 parameters, `stalesgd.models._alexnet`),
with Krizhevsky et al.'s dropout 0.5 after fc6 and fc7; the solver is
``bvlc_alexnet``'s (learning rate 0.01, momentum 0.9, weight decay 5e-4, x0.1
every 100,000 iterations of 256 images, i.e. about every 20 epochs), which
the paper's setting is styled on: reconstructed, not the paper's own numbers.
Inputs: 227x227 centre crops with flips and pad-4 crops (`stalesgd.data`'s
augmentation, not Caffe's 227-from-256 random crop), per-channel normalisation
(the per-pixel mean image of Caffe is not computed for lazily read ImageNet).

Variants:

* ``baseline`` (default): one learner, mu = 256, 35 epochs;
* ``hardsync``: lambda = 18, mu = 16;
* ``softsync_fixed`` / ``softsync_inverse``: 18-softsync (``--config.n=9`` and
  others) with the fixed alpha_0 or alpha_0 / sigma.

Commands::

  stalesgd-train --config=zhang_imagenet:softsync_inverse \
      --config.data_dir=$TFDS_DATA_DIR --workdir=runs/zhang_imagenet_18softsync_inverse

Data: tfds ``imagenet2012`` prepared with ``file_format='array_record'`` in
``--config.data_dir`` (tfds cannot download ImageNet: the archives must be
obtained from image-net.org first); the ``validation`` split is the test split.

Hardware and time: GPUs; 35 epochs are 45M images through a 61M-parameter
network (the paper's own runs used a GPU cluster). Not run here.

``quick``: NOT a reproduction. It keeps the protocol (lambda, mu, n, rates)
and the data pipeline, shrinks the crops to 67x67 (which the 11x11 stride-4
stem tiles exactly: 15 -> 7 -> 3 -> 1 after the three poolings; 55 is the
smallest size AlexNet accepts) and the run to 4 server updates,
only to check on a machine with the data that the configuration builds and
steps; its final evaluation still reads the whole validation split.
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs.arguments import parse_config_argument
from stalesgd.configs.imagenet import use_imagenet
from stalesgd.configs.quick import run_a_few_imagenet_updates
from stalesgd.training._run_config import default_config

VARIANTS = ("baseline", "hardsync", "softsync_fixed", "softsync_inverse")
LEARNERS, BATCH_PER_LEARNER, SOFTSYNC_N = 18, 16, 18
BASELINE_BATCH = 256
QUICK_IMAGE_SIZE = 67


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg`` (``"[quick,]VARIANT"``; see the module docstring)."""
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
