r"""DC-S3GD on CIFAR-10: large-batch decentralized training of a ResNet (Rigazzi, arXiv 1911.02516).

One learner per device (M = ``learners`` = the number of devices in the job,
default 8: set ``--config.learners=<devices>``), each with its own mini-batch
and optimizer state; the weight update of step t is all-reduced while step t+1
computes and is applied S = 1 step later, with DC-S3GD's first-order
correction towards the consensus (docs/algorithms.md §3; the per-learner step is
*reconstructed*, the paper's text was not available).

Variants:

* ``dcs3gd`` (default): staleness S = 1, layer-wise lambda with lambda_0 = 0.2
  (the mode a secondary source attributes to the paper; flagged in
  `stalesgd.decentral`); ``--config.delay_compensation=constant|adaptive``
  selects the other modes;
* ``s3gd``: the same without correction (lambda = 0);
* ``allreduce_sync``: synchronous all-reduce SGD (S = 0), the baseline.

Setting, "as far as known": the paper reports large-batch CNN training on
CIFAR-10 and ImageNet but its hyperparameters and numbers are not available
here (docs/algorithms.md §6). This file uses ResNet-20 (He et al.) with the
usual CIFAR recipe (pad-4 crops and flips, per-channel normalisation, momentum
0.9, weight decay 1e-4, 160 epochs, x0.1 at 80 and 120) at a large global
batch, 8 x 128 = 1,024, with Goyal et al.'s linear learning-rate scaling
(0.1 x 1024 / 256 = 0.4; no warm-up: the step schedule has none). No published
number to compare with; allreduce_sync is the reference.

Commands::

  stalesgd-train --config=dcs3gd_cifar10:dcs3gd \
      --config.learners=8 --workdir=runs/dcs3gd_cifar10
  launch/local.sh 2 --config=dcs3gd_cifar10:quick,dcs3gd --workdir=runs/dcs3gd_2proc

Data: tfds ``cifar10`` from a prepared ``--config.data_dir``, or the npz copy
(``--config.data_source=npz --config.data_dir=/tmp/cifar10_npz``; see
rudra_cifar10.py).

Hardware and time: one host with 8 GPUs (or several hosts, launch/README.md);
160 epochs are 8M images. On a CPU the 8 "devices" are forced host devices
sharing the cores: useful for checking, not for speed.

``quick``: the embedded digits (no download), the small CNN, 16 images per
learner, learning rate 0.05, no decay steps, 10 epochs, M = 8 (the forced host
devices of stalesgd-train on a CPU): too easy a problem to separate the variants
(results/dcs3gd_cifar10_e4_3seeds/README.md, Notes).
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs.arguments import parse_config_argument
from stalesgd.configs.quick import run_on_embedded_digits
from stalesgd.training._run_config import default_config

VARIANTS = ("dcs3gd", "s3gd", "allreduce_sync")
DEFAULT_LEARNERS = 8


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg`` (``"[quick,]PROTOCOL"``; see the module docstring)."""
  arguments = parse_config_argument(arg, variants=VARIANTS, default="dcs3gd")
  config = default_config()
  config.dataset, config.data_source = "cifar10", "tfds"
  config.normalization = "per_channel"
  config.augment = True
  config.model = "resnet20"
  config.protocol = arguments.variant
  config.learners = DEFAULT_LEARNERS
  config.batch_per_learner = 128
  config.allreduce_staleness = 1
  if arguments.variant == "dcs3gd":
    config.delay_compensation, config.dc_lambda = "layerwise", 0.2
  config.learning_rate = 0.4
  config.momentum = 0.9
  config.weight_decay = 1e-4
  config.lr_decay_epochs = (80.0, 120.0)
  config.num_epochs = 160.0
  config.eval_every_epochs = 4.0
  config.log_every_updates = 100
  if arguments.quick:
    run_on_embedded_digits(config, num_epochs=10.0)
    config.batch_per_learner = 16
    config.learning_rate = 0.05
    config.log_every_updates = 20
  return config
