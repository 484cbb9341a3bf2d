r"""DC-S3GD on CIFAR-10: large-batch decentralized training of a ResNet (Rigazzi, arXiv 1911.02516).

Reproduces the paper's claim, for our reconstruction (docs/algorithms.md §3; its text was not available):
stale-synchronous all-reduce (the update of step t all-reduced while step t+1 computes, applied S = 1 step
later) with a first-order correction towards the consensus keeps synchronous accuracy in large-batch CNN
training. No published number to compare with; ``allreduce_sync`` is the reference. ResNet-20 at 8 learners x
128 = 1,024 images per step (setting and variants: `get_config`; the CPU-sized study is `dcs3gd_cifar10_full`).

Commands (one run on 8 devices; two processes on one machine)::

  stalesgd-train --config=dcs3gd_cifar10:dcs3gd \
      --config.learners=8 --workdir=runs/dcs3gd_cifar10
  launch/local.sh 2 --config=dcs3gd_cifar10:quick,dcs3gd --workdir=runs/dcs3gd_2proc

Cost: not measured (one host with 8 GPUs or several, launch/README.md; 160 epochs are 8M images). ResNet-20
alone takes 6-9 min per CIFAR-10 epoch on 2 CPU cores (results/dcasgd_table1_jpeg_1epoch).

Result: not measured. ``quick`` (digits, 10 epochs): dcs3gd, s3gd and allreduce_sync all reach 1.3 % test error
in about 10 s each, too easy a problem to separate them (results/dcs3gd_cifar10_e4_3seeds, Notes).
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs import ConfigResult
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.configs.quick import run_on_embedded_digits
from stalesgd.training import default_config

# The numbers the docstring's Result quotes, checked against results/ (tests/configs/test_config_results.py): none,
# its Result is not measured.
RESULTS: tuple[ConfigResult, ...] = ()

VARIANTS = ("dcs3gd", "s3gd", "allreduce_sync")
DEFAULT_LEARNERS = 8


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg``, ``"[quick,]PROTOCOL"``.

  One learner per device (M = ``learners`` = the number of devices in the job, default 8: set
  ``--config.learners=<devices>``), each with its own mini-batch and optimizer state. Protocols:

  * ``dcs3gd`` (default): staleness S = 1, layer-wise lambda with lambda_0 = 0.2 (the mode a secondary source
    attributes to the paper; flagged in `stalesgd.decentral`); ``--config.delay_compensation=constant|adaptive``
    selects the other modes;
  * ``s3gd``: the same without correction (lambda = 0);
  * ``allreduce_sync``: synchronous all-reduce SGD (S = 0), the baseline.

  Setting, "as far as known": the paper reports large-batch CNN training on CIFAR-10 and ImageNet but its
  hyperparameters and numbers are not available here (docs/algorithms.md §6). ResNet-20 (He et al.) with the
  usual CIFAR recipe (pad-4 crops and flips, per-channel normalisation, momentum 0.9, weight decay 1e-4, 160
  epochs, x0.1 at 80 and 120) at a global batch of 8 x 128 = 1,024, with Goyal et al.'s linear learning-rate
  scaling (0.1 x 1024 / 256 = 0.4; no warm-up: the step schedule has none). Data: tfds ``cifar10`` from a
  prepared ``--config.data_dir``, or the npz copy (``--config.data_source=npz --config.data_dir=/tmp/cifar10_npz``;
  see `rudra_cifar10`). On a CPU the 8 "devices" are forced host devices sharing the cores: useful for
  checking, not for speed.

  ``quick``: the embedded digits (no download), the small CNN, 16 images per learner, learning rate 0.05, no
  decay steps, 10 epochs, M = 8 (the forced host devices of stalesgd-train on a CPU).
  """
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
