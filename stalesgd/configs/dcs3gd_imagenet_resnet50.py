r"""DC-S3GD on ImageNet with ResNet-50: large-batch decentralized training (Rigazzi, arXiv 1911.02516).

Reproduces the paper's ImageNet setting as far as known (its hyperparameters and numbers are not available
here): one learner per device, staleness S = 1 (the all-reduce of step t overlaps step t+1), the reconstructed
DC-S3GD step of docs/algorithms.md §3, with Goyal et al.'s large-batch recipe (arXiv 1706.02677) at 128 images
per learner, 90 epochs. ``allreduce_sync`` is the reference (Goyal et al.: about 23.7 % top-1 error at batch 8k).
Variants: ``dcs3gd`` (default; layer-wise lambda, lambda_0 = 0.2), ``s3gd`` (no correction), ``allreduce_sync``
(synchronous all-reduce SGD, S = 0); the recipe and ``quick``: `get_config`.

Command::

  stalesgd-train --config=dcs3gd_imagenet_resnet50:dcs3gd \
      --config.learners=8 --config.data_dir=$TFDS_DATA_DIR --workdir=runs/dcs3gd_imagenet

Data: tfds ``imagenet2012`` prepared with ``file_format='array_record'`` in ``--config.data_dir``.

Cost: not measured (multi-GPU hosts, launch/README.md: SLURM, Kubernetes; 90 epochs are 115M images through
ResNet-50). What S buys in step time at this scale, simulated rather than run: results/dcs3gd_wallclock.json.

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

VARIANTS = ("dcs3gd", "s3gd", "allreduce_sync")
DEFAULT_LEARNERS, BATCH_PER_LEARNER = 8, 128
QUICK_IMAGE_SIZE = 64


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg``, ``"[quick,]PROTOCOL"``.

  M = ``learners`` = the number of devices in the job (default 8, one 8-GPU host: set
  ``--config.learners=<devices>``). Goyal et al.'s recipe: learning rate 0.1 x (global batch / 256) (0.4 at
  M = 8; scale ``--config.learning_rate`` with M), momentum 0.9, weight decay 1e-4, 90 epochs, x0.1 at 30, 60 and
  80; without Goyal's 5-epoch warm-up. 224x224 crops with flips and pad-4 crops, per-channel normalisation.

  ``quick``: NOT a reproduction: 64x64 crops and 4 steps on the same pipeline, only to check on a machine with
  the data that the configuration builds and steps; its final evaluation still reads the whole validation split.
  """
  arguments = parse_config_argument(arg, variants=VARIANTS, default="dcs3gd")
  config = use_imagenet(default_config(), model="resnet50", image_size=224)
  config.protocol = arguments.variant
  config.learners, config.batch_per_learner = DEFAULT_LEARNERS, BATCH_PER_LEARNER
  config.allreduce_staleness = 1
  if arguments.variant == "dcs3gd":
    config.delay_compensation, config.dc_lambda = "layerwise", 0.2
  config.learning_rate = 0.1 * DEFAULT_LEARNERS * BATCH_PER_LEARNER / 256
  config.momentum = 0.9
  config.weight_decay = 1e-4
  config.lr_decay_epochs = (30.0, 60.0, 80.0)
  config.num_epochs = 90.0
  config.eval_every_epochs = 1.0
  config.log_every_updates = 500
  if arguments.quick:
    run_a_few_imagenet_updates(config, image_size=QUICK_IMAGE_SIZE)
  return config
