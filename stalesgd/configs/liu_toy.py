r"""Liu et al.'s toy setting for asynchronous local SGD, as DeepMind's asyncdiloco notebook states it.

Data: 32 Gaussians (8 per class, 4 classes) on the unit sphere in 512 dimensions, noise 0.5, 128,000 points in 4
shards, each local run taking the least-visited one (`stalesgd.data._gaussian_mixture:liu_toy`: the notebook's
arrays and its 10,000 evaluation points, drawn from the training points). Model: MLP 512 -> `HIDDEN` -> 4 (the
notebook's is 65,000 wide; scaled down for 2 cores). 4 learners at 0.58, 0.75, 1.51 and 3.33 simulated s per step,
no jitter, free communication. A local run: H = 20 steps (batch 32) of a re-created AdamW (2e-4, decay 1e-3) whose
cosine (to 1e-6 over 20 x phases steps per shard) is keyed to the shard's step count, first step at the peak.
400 phases (``quick``: 100) of M x H steps: 32,000 inner steps. Variants (``get_config(arg)``):
``sync`` (default): DiLoCo, hardsync over the 4 learners, outer SGD 0.7 with heavy-ball momentum 0.9;
``async``: each run applied on arrival by SGD 0.07 x M^-1/2 (the notebook's constant weight folded into the rate),
heavy-ball momentum 0.9, grace window 0.5 s (the notebook's cells drop its default ``nesterov=True``);
``async_dn_dylu``: delayed Nesterov (N = 4, c = 0, rate 0.7: a buffer of 4 takes DiLoCo's step) and dynamic
local updates (H_m = 20, 15, 7, 5); ``sync_at_async_time``, ``sync_at_dn_dylu_time``: sync stopped at the last
round ending by the time that async variant takes.

Commands::

  stalesgd-train --config=liu_toy:async --workdir=runs/liu_async
  stalesgd-reproduce --study=liu_toy_async_local_sgd --seeds=3

Cost on 2 CPU cores, one run at a time: the 15 runs in 26 min (results/liu_toy_3seeds).

Result (3 seeds, test error on the 10,000 points): sync 16.6, async 45.6, async_dn_dylu 16.8, sync at their
times 45.9 and 45.7 (results/liu_toy_notebook_3seeds; with Nesterov, superseded: results/liu_toy_3seeds).
"""

from __future__ import annotations

import math

import ml_collections

from stalesgd.configs import ConfigResult
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.training import default_config, run_length, simulate_schedule

# The numbers the docstring's Result quotes, checked against results/ (tests/configs/test_config_results.py).
RESULTS = (
  ConfigResult("results/liu_toy_notebook_3seeds", "DiLoCo", value=16.6, decimals=1),
  ConfigResult("results/liu_toy_notebook_3seeds", "async local SGD", value=45.6, decimals=1),
  ConfigResult("results/liu_toy_notebook_3seeds", "async + delayed Nesterov + dynamic H", value=16.8, decimals=1),
  ConfigResult("results/liu_toy_notebook_3seeds", "DiLoCo at async's time", value=45.9, decimals=1),
  ConfigResult("results/liu_toy_notebook_3seeds", "DiLoCo at DN+DyLU's time", value=45.7, decimals=1),
)

VARIANTS = ("sync", "async", "async_dn_dylu", "sync_at_async_time", "sync_at_dn_dylu_time")
HIDDEN = 1024
LEARNERS = 4
LOCAL_STEPS = 20
BATCH = 32
NUM_TRAIN = 128_000
SECONDS_PER_STEP = (0.58, 0.75, 1.51, 3.33)
PHASES, QUICK_PHASES = 400, 100  # a phase: H steps of each of the M learners (the notebook's total_phases)
DYNAMIC_MIN_STEPS = 5
SYNC_RATE, ASYNC_RATE, MOMENTUM = 0.7, 0.07, 0.9


def _epochs(phases: int) -> float:
  """Epochs of ``phases`` x M x H inner steps of BATCH examples."""
  return phases * LEARNERS * LOCAL_STEPS * BATCH / NUM_TRAIN


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg`` (one of `VARIANTS`, optionally with ``quick``; the module docstring)."""
  arguments = parse_config_argument(arg, variants=VARIANTS, default="sync")
  phases = QUICK_PHASES if arguments.quick else PHASES
  variant = arguments.variant
  config = _base(phases)
  if variant.startswith("sync"):
    config.protocol = "hardsync"
    config.learning_rate = SYNC_RATE
    if variant != "sync":
      other = _base(phases)
      _make_async(other, dn_dylu=variant == "sync_at_dn_dylu_time")
      config.num_epochs = _rounds_by(_async_time(other)) * LEARNERS * LOCAL_STEPS * BATCH / NUM_TRAIN
  else:
    _make_async(config, dn_dylu=variant == "async_dn_dylu")
  return config


def _base(phases: int) -> ml_collections.ConfigDict:
  config = default_config()
  config.dataset, config.data_source = "stalesgd.data._gaussian_mixture:liu_toy", "python"
  config.normalization = "raw"
  config.model = "mlp"
  config.model_options = ml_collections.ConfigDict({"hidden_sizes": (HIDDEN,)})
  config.learners, config.batch_per_learner = LEARNERS, BATCH
  config.num_epochs = _epochs(phases)
  config.eval_every_epochs = _epochs(10)  # the notebook's eval_every: 10 phases
  config.log_every_updates = 10
  config.local_steps = LOCAL_STEPS
  config.momentum, config.nesterov = MOMENTUM, False  # heavy-ball, as every notebook cell with output ran it
  inner = config.inner
  inner.optimizer, inner.learning_rate = "adamw", 2e-4
  inner.options = ml_collections.ConfigDict({"weight_decay": 1e-3, "b1": 0.9, "b2": 0.999})
  inner.reset_state = True
  inner.data_shards = LEARNERS
  inner.cosine_steps, inner.cosine_final_rate, inner.restart_at_peak = LOCAL_STEPS * phases, 1e-6, True
  config.timing.compute_time_per_example = 1.0 / BATCH  # one simulated second per step before the factors
  config.timing.jitter = "deterministic"
  config.timing.speed_factors = SECONDS_PER_STEP
  return config


def _make_async(config: ml_collections.ConfigDict, *, dn_dylu: bool) -> None:
  config.protocol = "async"
  config.grace_window = 0.5
  if dn_dylu:
    config.optimizer, config.learning_rate, config.nesterov = "stalesgd:delayed_nesterov", SYNC_RATE, False
    config.optimizer_options = ml_collections.ConfigDict({"buffer_size": LEARNERS, "activation": 0.0})
    config.inner.dynamic_min_steps = DYNAMIC_MIN_STEPS
  else:
    config.learning_rate = ASYNC_RATE / math.sqrt(LEARNERS)


def _async_time(config: ml_collections.ConfigDict) -> float:
  """The simulated seconds an asynchronous variant takes for its inner steps (its schedule's last update)."""
  updates, inner_steps = run_length(config, NUM_TRAIN)
  return float(simulate_schedule(config, updates, parameter_bytes=0, inner_steps=inner_steps).total_time)


def _rounds_by(seconds: float) -> int:
  """Synchronous rounds that end by ``seconds``: each lasts H steps of the slowest learner."""
  return math.floor(seconds / (LOCAL_STEPS * max(SECONDS_PER_STEP)) + 1e-9)
