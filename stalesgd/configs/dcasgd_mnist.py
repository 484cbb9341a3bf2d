r"""Zheng et al.'s DC-ASGD ordering on MNIST with a small CNN: several seeds and a converged end of schedule.

Zheng et al. (arXiv 1609.08326) Table 1 orders the test error DC-ASGD-a <= DC-ASGD-c <= ASGD at M = 4 and 8
learners (ResNet-20, CIFAR-10, 160 epochs: `dcasgd_cifar10_resnet20`, 6-9 minutes per epoch on 2 CPU cores).
This file asks the same question where several seeds reach the end of a schedule in minutes: the network, data
and compressed schedule of `stalesgd.configs.zhang_mnist`, with Table 1's methods and solver form. It tests the
qualitative ordering, not the paper's numbers.

Setting (the choices of this file, fixed before its first run, not the paper's):

* MNIST, per-channel normalisation, ``small_cnn`` (16 and 32 channels, 64 hidden units), no augmentation;
* mu = 32 images per learner; async (ASGD, c = 1) at M learners (``--config.learners``, default 4);
* Zheng et al.'s solver form: SGD without momentum, no weight decay on this network, at alpha_0 = 0.1 (the
  effective step of `zhang_mnist`'s alpha_0 = 0.01 with momentum 0.9, 0.01 / (1 - 0.9); not tuned here);
* DC-ASGD-c lambda_0 = 0.04, DC-ASGD-a lambda_0 = 2, MeanSquare decay 0.95 (the paper's);
* 3 epochs with x0.1 at 120/140 and 130/140 of the run, evaluated every quarter epoch.

Variants (``get_config("[quick,]METHOD")``): ``sgd`` (one learner), ``asgd``, ``dcasgd_c``, ``dcasgd_a``.
``quick``: the embedded digits for 4 epochs, no decay steps. The study ``dcasgd_mnist``
(`stalesgd.studies._catalogue`) runs the grid at M = 4 and 8 with its claims.

Commands (the study, then one run)::

  stalesgd-reproduce --study=dcasgd_mnist --seeds=3 --parallel=2 \
      --data_source=npz --data_dir=/tmp/mnist_npz
  stalesgd-train --config=dcasgd_mnist:dcasgd_a --config.learners=8 \
      --config.data_source=npz --config.data_dir=/tmp/mnist_npz --workdir=runs/dcasgd_mnist_a8
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs import dcasgd_cifar10_resnet20, zhang_mnist
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.configs.quick import run_on_embedded_digits

VARIANTS = ("sgd", "asgd", "dcasgd_c", "dcasgd_a")
BATCH_PER_LEARNER = 32
LEARNING_RATE = 0.1  # zhang_mnist's 0.01 at momentum 0.9, as a momentum-free step: 0.01 / (1 - 0.9)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg`` (``"[quick,]METHOD"``; see the module docstring)."""
  arguments = parse_config_argument(arg, variants=VARIANTS, default="dcasgd_a")
  config = zhang_mnist.get_config("hardsync")
  config.learners = dcasgd_cifar10_resnet20.DEFAULT_LEARNERS
  config.batch_per_learner = BATCH_PER_LEARNER
  config.learning_rate = LEARNING_RATE
  config.momentum = 0.0
  config.weight_decay = 0.0
  dcasgd_cifar10_resnet20.set_method(config, arguments.variant)
  if arguments.quick:
    run_on_embedded_digits(config, num_epochs=4.0)
    config.log_every_updates = 50
  return config
