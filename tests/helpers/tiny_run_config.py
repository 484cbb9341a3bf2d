r"""The smallest real training runs, for the tests of `stalesgd.training._loop` and ``stalesgd-train``.

A config file like those in ``stalesgd/configs/`` (one ``get_config(arg)``),
so the same runs can be started in-process (``get_config(arg)`` then
`stalesgd.training.train_and_evaluate`) and on the command line::

  stalesgd-train --config=tests/helpers/tiny_run_config.py:async_dc --workdir=/tmp/run

Every variant trains a one-hidden-layer MLP (32 units) on the embedded digits
(1,497 training images) with lambda = 8 learners and mu = 8 for one epoch,
evaluating every quarter epoch; ``arg`` picks the protocol:

* ``hardsync`` (default): synchronous SGD, 23 updates;
* ``async_dc``: async with DC-ASGD-a (lambda_0 = 2, m = 0.95), 187 updates in
  about 28 blocks, so the ring buffer, the MeanSquare and the momentum are all
  part of the state a resume must restore;
* ``dcs3gd``: DC-S3GD with S = 1 and the adaptive correction on the 8 devices
  (one learner each), 23 steps, so the in-flight update queue is part of it;
* ``async_local``: async with local runs of at most H = 3 steps of inner
  momentum SGD (rate 0.05, momentum 0.5) per contribution, each learner's inner
  state kept between its contributions, dynamic local updates (H_m = 3, 2 or 1
  by the learner's speed) on 4 data shards, so the learners' inner states and
  the shards' progress are part of the state a resume must restore;
* ``cifar10_full``: Rudra's CIFAR-10 network (``cifar10_full``, its default
  multipliers: lr 2 on every bias, weight decay 0.004 / 1.0 on the weights) on
  64 deterministic random 32x32 colour images (`random_cifar_like`), hardsync
  with lambda = 2 and mu = 8, 4 updates, so the per-layer multipliers and the
  decay placement are part of a digest.

Hardware and time: a CPU; 5-10 s per run, most of it compilation.
"""

from __future__ import annotations

import ml_collections
import numpy as np

from stalesgd.training import default_config

VARIANTS = ("hardsync", "async_dc", "dcs3gd", "async_local", "cifar10_full")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = arg or "hardsync"
  if variant not in VARIANTS:
    raise ValueError(f"tiny_run_config variant {variant!r}; allowed: one of {VARIANTS}")
  config = default_config()
  if variant == "cifar10_full":
    return _cifar10_full_config(config)
  config.model = "mlp"
  config.model_options.hidden_sizes = (32,)
  config.learners = 8
  config.batch_per_learner = 8
  config.num_epochs = 1.0
  config.learning_rate = 0.02
  config.eval_every_epochs = 0.25
  config.train_eval_examples = 64
  config.precise_bn_batches = 1
  config.log_every_updates = 10
  if variant == "hardsync":
    config.protocol = "hardsync"
  elif variant == "async_dc":
    config.protocol = "async"
    config.delay_compensation, config.dc_lambda, config.dc_decay = "adaptive", 2.0, 0.95
  elif variant == "async_local":
    config.protocol = "async"
    config.local_steps = 3
    config.inner.learning_rate, config.inner.momentum = 0.05, 0.5
    config.learning_rate, config.momentum = 0.7, 0.0
    # Dynamic local updates (H_m = 3, 2 or 1 by speed) on 4 data shards: each local run takes the least-visited
    # shard, so the shards' progress is part of what a resume must restore too.
    config.inner.dynamic_min_steps, config.inner.data_shards = 1, 4
    config.timing.speed_factors = (1.0, 1.0, 1.0, 1.0, 1.5, 1.5, 3.0, 3.0)
  else:
    config.protocol = "dcs3gd"
    config.allreduce_staleness = 1
    config.delay_compensation, config.dc_lambda = "adaptive", 0.2
  return config


def random_cifar_like():
  """64 training and 16 test images, 32x32x3 uint8, 10 classes, from a fixed seed (a python data source)."""
  generator = np.random.default_rng(1234)
  images = generator.integers(0, 256, size=(80, 32, 32, 3), dtype=np.uint8)
  labels = generator.integers(0, 10, size=(80,), dtype=np.int64)
  return (images[:64], labels[:64]), (images[64:], labels[64:])


def _cifar10_full_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  config.model = "cifar10_full"
  config.model_multipliers = True
  config.momentum = 0.9
  config.dataset, config.data_source = "tests.helpers.tiny_run_config:random_cifar_like", "python"
  config.protocol = "hardsync"
  config.learners = 2
  config.batch_per_learner = 8
  config.num_epochs = 0.5
  config.learning_rate = 0.001
  config.weight_decay = 0.004
  config.eval_every_epochs = 0.5
  config.train_eval_examples = 16
  config.precise_bn_batches = 1
  config.log_every_updates = 1
  return config
