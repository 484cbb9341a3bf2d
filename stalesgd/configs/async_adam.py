r"""Does alpha_0/sigma help an asynchronous Adam? Adam as the parameter server's solver, on the embedded digits.

Reproduces no paper: our question. FedBuff-style servers apply stale updates with Adam; Zhang et al.'s
alpha_0/sigma was derived for SGD, and with an adaptive solver it must scale the solver's *step*
(`stalesgd.modulated_step`), since Adam normalises a scale on its input away. lambda = 16 learners, mu = 8,
``small_cnn``, Adam at 0.003, 10 epochs, lognormal timing jitter (sigma 0.3). Variants (``get_config(arg)``):
``hardsync`` (synchronous Adam, the reference); ``async`` (default; every gradient applied as it arrives, sigma
about lambda - 1 = 15); ``async_inverse`` (the same with alpha_0/sigma on Adam's step). No ``quick`` variant.

Commands (one run; the study)::

  stalesgd-train --config=async_adam:async_inverse --workdir=runs/adam1
  stalesgd-reproduce --study=async_adam --seeds=10 --parallel=2

Cost: 7-28 s per run on 2 CPU cores; the study's 30 runs (10 seeds), 8 min of runs in all, took 6 min as 2
processes (results/async_adam_digits_10seeds).

Result (10 seeds, 10 epochs, test error): 3.21 ± 1.47 % with alpha_0/sigma, 67.11 ± 25.23 % without,
1.81 ± 0.47 % synchronous (results/async_adam_digits_10seeds).
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs import ConfigResult
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.training import default_config

# The numbers the docstring's Result quotes, checked against results/ (tests/configs/test_config_results.py).
RESULTS = (
  ConfigResult("results/async_adam_digits_10seeds", "async, a0/sigma", value=3.21, std=1.47),
  ConfigResult("results/async_adam_digits_10seeds", "async", value=67.11, std=25.23),
  ConfigResult("results/async_adam_digits_10seeds", "hardsync", value=1.81, std=0.47),
)

VARIANTS = ("hardsync", "async", "async_inverse")
ADAM_LEARNING_RATE = 0.003


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg`` (one of `VARIANTS`; see the module docstring)."""
  arguments = parse_config_argument(arg, variants=VARIANTS, default="async", has_quick=False)
  config = default_config()
  config.dataset, config.data_source = "digits", "embedded"
  config.model = "small_cnn"
  config.learners = 16
  config.batch_per_learner = 8
  config.num_epochs = 10.0
  config.optimizer = "adam"
  config.learning_rate = ADAM_LEARNING_RATE
  config.momentum = 0.0  # Adam's averaging is its b1 (optimizer_options), left at optax's 0.9
  config.timing.jitter_sigma = 0.3
  config.eval_every_epochs = 1.0
  config.log_every_updates = 50
  if arguments.variant == "hardsync":
    config.protocol = "hardsync"
  else:
    config.protocol = "async"
    config.staleness_rule = "inverse" if arguments.variant == "async_inverse" else "none"
  return config
