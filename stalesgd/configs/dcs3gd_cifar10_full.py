r"""DC-S3GD on real CIFAR-10 at a CPU-sized cost: Rudra's cifar10_full at a large global batch.

Reproduces the claim of Rigazzi (arXiv 1911.02516, abstract), for our reconstruction: decentralized
stale-synchronous training whose all-reduce overlaps the next step, with a first-order correction of the stale
average, keeps synchronous accuracy in large-batch CNN training. `dcs3gd_cifar10` is the ResNet-20 version;
this file swaps in ``cifar10_full`` so that the study ``dcs3gd_cifar10`` fits on a CPU: M = 8 learners x 128
images, Rudra's solver with the rate scaled to the batch after a warm-up, 4 epochs (setting: `get_config`).

Commands (the study, then one run)::

  stalesgd-reproduce --study=dcs3gd_cifar10 --data_source=npz --data_dir=/tmp/cifar10_npz --parallel=2
  stalesgd-train --config=dcs3gd_cifar10_full:dcs3gd \
      --config.allreduce_staleness=4 --config.data_source=npz --config.data_dir=/tmp/cifar10_npz \
      --workdir=runs/dcs3gd_full_s4

Cost: 11-43 min per 10-epoch run (``--schedule_epochs=10``) on 2 CPU cores, 8 host devices (one learner each),
beside other work; 15 runs in 7.0 h (results/dcs3gd_cifar10_e10_3seeds).

Result (3 seeds, 10 epochs, CIFAR-10 JPEG copy): all-reduce SGD 36.56 ± 0.27 %, DC-S3GD at S = 1 37.13 ± 0.55 %
(keeps synchronous accuracy: holds), at S = 4 45.49 ± 0.78 % (does not hold); S3GD 37.73 ± 0.76 and 46.60 ± 0.37 %
(results/dcs3gd_cifar10_e10_3seeds).
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs import ConfigResult, rudra_cifar10
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.configs.quick import run_on_embedded_digits

# The numbers the docstring's Result quotes, checked against results/ (tests/configs/test_config_results.py).
RESULTS = (
  ConfigResult("results/dcs3gd_cifar10_e10_3seeds", "all-reduce SGD (S=0)", value=36.56, std=0.27),
  ConfigResult("results/dcs3gd_cifar10_e10_3seeds", "DC-S3GD layer-wise, S=1", value=37.13, std=0.55),
  ConfigResult("results/dcs3gd_cifar10_e10_3seeds", "DC-S3GD layer-wise, S=4", value=45.49, std=0.78),
  ConfigResult("results/dcs3gd_cifar10_e10_3seeds", "S3GD, S=1", value=37.73, std=0.76),
  ConfigResult("results/dcs3gd_cifar10_e10_3seeds", "S3GD, S=4", value=46.6, std=0.37),
)

VARIANTS = ("dcs3gd", "s3gd", "allreduce_sync")
LEARNERS, BATCH_PER_LEARNER = 8, 128
EPOCHS = 4.0
PAPER_EPOCHS = 140.0
WARMUP_FRACTION = 5.0 / 90.0  # Goyal et al. (arXiv 1706.02677): 5 warm-up epochs of a 90-epoch schedule


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg``, ``"[quick,]PROTOCOL"``.

  Setting (the choices of this file; the paper's hyperparameters are not available here, docs/algorithms.md
  §6): M = 8 learners x mu = 128 images = a global batch of 1,024; Rudra's network and solver
  (`stalesgd.configs.rudra_cifar10`: per-pixel mean, the multipliers of Rudra's release, momentum 0.9, weight
  decay 0.004) with the learning rate scaled linearly from Rudra's 0.001 at 128 images to 0.008 at 1,024
  (Goyal et al.'s rule), after Goyal et al.'s gradual warm-up: the rate rises linearly per step from 0.001 to
  0.008 over the first 5/90 of the run (Goyal et al.: 5 of 90 epochs), 0.22 epochs here, compressed with the
  rest of the schedule by ``--schedule_epochs``; Rudra's 140-epoch schedule (x0.1 at 120 and 130) compressed to
  4 epochs, decays at the same fractions (3.43 and 3.71), evaluated every half epoch; no augmentation
  (Rudra's).

  Protocols: ``dcs3gd`` (default; layer-wise lambda, lambda_0 = 0.2), ``s3gd`` (lambda = 0),
  ``allreduce_sync`` (S = 0); ``--config.allreduce_staleness=S`` and
  ``--config.delay_compensation=constant|adaptive`` (with ``dc_lambda``) select the study's other runs.
  ``quick``: the embedded digits, small CNN, 16 images per learner, learning rate 0.05, 6 epochs.
  """
  arguments = parse_config_argument(arg, variants=VARIANTS, default="dcs3gd")
  config = rudra_cifar10.paper_config()
  config.protocol = arguments.variant
  config.learners, config.batch_per_learner = LEARNERS, BATCH_PER_LEARNER
  config.allreduce_staleness = 1
  if arguments.variant == "dcs3gd":
    config.delay_compensation, config.dc_lambda = "layerwise", 0.2
  global_batch = LEARNERS * BATCH_PER_LEARNER
  config.warmup_learning_rate = config.learning_rate  # the small-batch rate, 0.001 at 128 images
  config.learning_rate = config.learning_rate * global_batch / rudra_cifar10.BASELINE_BATCH
  config.warmup_epochs = EPOCHS * WARMUP_FRACTION
  config.lr_decay_epochs = tuple(boundary * EPOCHS / PAPER_EPOCHS for boundary in config.lr_decay_epochs)
  config.num_epochs = EPOCHS
  config.eval_every_epochs = 0.5
  config.log_every_updates = 10
  if arguments.quick:
    run_on_embedded_digits(config, num_epochs=6.0)
    config.batch_per_learner = 16
    config.learning_rate = 0.05
    config.warmup_epochs, config.warmup_learning_rate = 0.0, None
    config.weight_decay = 0.0
    config.log_every_updates = 10
  return config
