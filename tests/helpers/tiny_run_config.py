r"""The smallest real training runs, for the tests of `stalesgd.training._loop` and ``experiments.main``.

A config file like those in ``stalesgd/configs/`` (one ``get_config(arg)``),
so the same runs can be started in-process (``get_config(arg)`` then
`stalesgd.training.train_and_evaluate`) and on the command line::

  python -m experiments.main --config=tests/helpers/tiny_run_config.py:async_dc --workdir=/tmp/run

Every variant trains a one-hidden-layer MLP (32 units) on the embedded digits
(1,497 training images) with lambda = 8 learners and mu = 8 for one epoch,
evaluating every quarter epoch; ``arg`` picks the protocol:

* ``hardsync`` (default): synchronous SGD, 23 updates;
* ``async_dc``: async with DC-ASGD-a (lambda_0 = 2, m = 0.95), 187 updates in
  about 28 blocks, so the ring buffer, the MeanSquare and the momentum are all
  part of the state a resume must restore;
* ``dcs3gd``: DC-S3GD with S = 1 and the adaptive correction on the 8 devices
  (one learner each), 23 steps, so the in-flight update queue is part of it.

Hardware and time: a CPU; 5-10 s per run, most of it compilation.
"""

from __future__ import annotations

import ml_collections

from stalesgd.training._run_config import default_config

VARIANTS = ("hardsync", "async_dc", "dcs3gd")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variant = arg or "hardsync"
  if variant not in VARIANTS:
    raise ValueError(f"tiny_run_config variant {variant!r}; allowed: one of {VARIANTS}")
  config = default_config()
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
  else:
    config.protocol = "dcs3gd"
    config.allreduce_staleness = 1
    config.delay_compensation, config.dc_lambda = "adaptive", 0.2
  return config
