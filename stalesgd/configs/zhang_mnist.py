r"""Zhang et al.'s protocol grid on MNIST with a small CNN: several seeds and a converged end of schedule.

Reproduces the qualitative claims of Zhang et al. (arXiv 1511.05950, CIFAR-10 figures: n-softsync at lambda = 30,
mu = 4 fails with the fixed alpha_0 at n = 15 and 30 and matches hardsync with alpha_0/sigma) and Rudra's
mu x lambda rule (Gupta et al., arXiv 1509.04210), not their numbers: the protocols of `rudra_cifar10` on MNIST
and ``small_cnn``, 3 epochs of the 140-epoch schedule compressed (setting and variants: `get_config`).

Commands (the two studies, then one run)::

  stalesgd-reproduce --study=zhang_mnist --seeds=3 --parallel=2 --data_source=npz --data_dir=/tmp/mnist_npz
  stalesgd-reproduce --study=rudra_mu_lambda_mnist --seeds=3 --data_source=npz --data_dir=/tmp/mnist_npz
  stalesgd-train --config=zhang_mnist:softsync_inverse --config.n=30 \
      --config.data_source=npz --config.data_dir=/tmp/mnist_npz --workdir=runs/zhang_mnist_30

Cost: 2 CPU cores, 8 host devices: 3.6-5.9 min per run at lambda = 30, beside other work
(results/zhang_mnist_3seeds); 2-3.5 min per run of the mu x lambda grid, the single learner included, on 2 AMD
EPYC cores (results/rudra_mu_lambda_mnist_3seeds).

Result (3 seeds, 3 epochs, test error): hardsync 1.32 ± 0.10 %; 15- and 30-softsync with alpha_0/sigma
1.25 ± 0.06 and 1.35 ± 0.09 %, with the fixed alpha_0 88.97 and 89.16 % (chance) (results/zhang_mnist_3seeds);
mu lambda = 120 1.33 ± 0.14 % against the single learner's 1.37 ± 0.09 %, mu lambda = 3840 35.74 ± 3.71 %
(results/rudra_mu_lambda_mnist_3seeds).
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs import ConfigResult, rudra_cifar10
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.configs.quick import run_on_embedded_digits
from stalesgd.training import default_config

# The numbers the docstring's Result quotes, checked against results/ (tests/configs/test_config_results.py).
RESULTS = (
  ConfigResult("results/zhang_mnist_3seeds", "hardsync", value=1.32, std=0.1),
  ConfigResult("results/zhang_mnist_3seeds", "15-softsync, a0/sigma", value=1.25, std=0.06),
  ConfigResult("results/zhang_mnist_3seeds", "30-softsync, a0/sigma", value=1.35, std=0.09),
  ConfigResult("results/zhang_mnist_3seeds", "15-softsync, a0", value=88.97),
  ConfigResult("results/zhang_mnist_3seeds", "30-softsync, a0", value=89.16),
  ConfigResult("results/rudra_mu_lambda_mnist_3seeds", "1-softsync, mu*lambda=120 (mu=4)", value=1.33, std=0.14),
  ConfigResult("results/rudra_mu_lambda_mnist_3seeds", "baseline (lambda=1, mu=128)", value=1.37, std=0.09),
  ConfigResult("results/rudra_mu_lambda_mnist_3seeds", "1-softsync, mu*lambda=3840 (mu=128)", value=35.74, std=3.71),
)

VARIANTS = ("baseline", "hardsync", "softsync_fixed", "softsync_inverse", "softsync_inverse_mean") + tuple(
  f"mu_lambda_{rudra_cifar10.LEARNERS * batch}" for batch in rudra_cifar10.MU_LAMBDA_BATCHES
)
EPOCHS = 3.0
PAPER_EPOCHS, PAPER_DECAY_EPOCHS = 140.0, (120.0, 130.0)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg``, ``"[quick,]VARIANT"``.

  Setting (the choices of this file, not the paper's): MNIST (tfds ``mnist``; ``--config.data_source=npz`` for
  local arrays, docs/data.md), per-channel normalisation, no augmentation; ``small_cnn`` with 16 and 32
  channels and a 64-unit hidden layer; alpha_0 = 0.01, momentum 0.9, no weight decay (the ``quick`` variants'
  solver, with which the fixed alpha_0 fails at n = 15 and 30 on the digits); 3 epochs with x0.1 at 120/140
  and 130/140 of the run (Zhang et al.'s schedule compressed, as ``stalesgd-reproduce --schedule_epochs``
  does), evaluated every quarter epoch. Zhang et al.'s CIFAR-10 runs (`rudra_cifar10`) are hours each here.

  Variants: ``baseline``, ``hardsync`` (default), ``softsync_fixed``, ``softsync_inverse``,
  ``softsync_inverse_mean`` (n = 15; ``--config.n=N``) and Rudra's ``mu_lambda_120`` ... ``mu_lambda_3840``
  (1-softsync, lambda = 30, the fixed alpha_0), as in `stalesgd.configs.rudra_cifar10`. ``quick``: the
  embedded digits for 4 epochs, no decay steps.
  """
  arguments = parse_config_argument(arg, variants=VARIANTS, default="hardsync")
  config = default_config()
  config.dataset, config.data_source = "mnist", "tfds"
  config.normalization = "per_channel"
  config.augment = False
  config.model = "small_cnn"
  config.model_options = ml_collections.ConfigDict({"conv_features": (16, 32), "dense_features": 64})
  config.learning_rate = 0.01
  config.momentum = 0.9
  config.weight_decay = 0.0
  config.num_epochs = EPOCHS
  config.lr_decay_epochs = tuple(boundary * EPOCHS / PAPER_EPOCHS for boundary in PAPER_DECAY_EPOCHS)
  config.lr_decay_factor = 0.1
  config.eval_every_epochs = 0.25
  config.log_every_updates = 250
  rudra_cifar10.set_protocol(config, arguments.variant)
  if arguments.quick:
    run_on_embedded_digits(config, num_epochs=4.0)
    config.log_every_updates = 50
  return config
