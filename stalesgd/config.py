"""The configuration of one training run: every field, its default, and its checks.

`default_config()` is the one place where defaults live (big_vision's advice:
no ``config.get(key, default)`` scattered through the trainer); every file in
``experiments/configs/`` starts from it and overrides what its paper says.
`validate_config` runs before anything expensive (no data read, nothing
compiled) and names the offending field with the allowed values.

Durations are in epochs (one epoch = the training split's size in *applied*
samples: an update applies c contributions of mu samples each) and are converted
to server updates in one place, `updates_per_epoch`.
"""

from __future__ import annotations

import json
import math
import pathlib

import ml_collections
from ml_collections import config_dict

from stalesgd import decentral
from stalesgd import models
from stalesgd import schedule as schedule_lib
from stalesgd import transforms
from stalesgd.data import NORMALIZATIONS, SOURCES

PARAMETER_SERVER_PROTOCOLS = tuple(schedule_lib.PARAMETER_SERVER_PROTOCOLS)
DECENTRALIZED_PROTOCOLS = tuple(decentral.PROTOCOLS)
PROTOCOLS = PARAMETER_SERVER_PROTOCOLS + DECENTRALIZED_PROTOCOLS
STALENESS_RULES = ("none",) + tuple(transforms.STALENESS_RULES)
DELAY_COMPENSATIONS = ("none", "constant", "adaptive", "layerwise")
WEIGHT_DECAY_PLACEMENTS = ("modulated", "unmodulated")


def default_config() -> ml_collections.ConfigDict:
  """Every field of a run, with defaults that train the embedded data set quickly."""
  config = ml_collections.ConfigDict()
  config.seed = 0

  # Data (stalesgd.data.load_dataset).
  config.dataset = "digits"
  config.data_source = "embedded"  # tfds | npz | embedded
  config.data_dir = config_dict.placeholder(str)  # tfds data_dir, or the directory of <dataset>_{train,test}.npz
  config.normalization = "per_channel"  # per_pixel_mean (Caffe/Rudra) | per_channel | unit | raw
  config.augment = False  # random crop + flip (off in Rudra and DC-ASGD Table 1)
  config.image_size = 224  # ImageNet crop side

  # Model (stalesgd.models.get_model).
  config.model = "small_cnn"
  config.model_options = ml_collections.ConfigDict()
  config.model_multipliers = False  # Caffe-style per-layer learning-rate and weight-decay multipliers

  # Protocol (stalesgd.schedule.simulate / stalesgd.decentral).
  config.protocol = "hardsync"
  config.learners = 8  # lambda (parameter server) or M (decentralized workers)
  config.batch_per_learner = 16  # mu
  config.n = 1  # n of n-softsync and of drop_stale's underlying softsync
  config.ssp_bound = 1  # s of SSP
  config.backup_workers = 1  # b of backup
  config.max_staleness = 4  # drop_stale: gradients with sigma > this are discarded
  config.allreduce_staleness = 1  # S of s3gd / dcs3gd
  config.eager_updates = False  # dcs3gd / s3gd: Kale et al. eager updates
  config.num_epochs = 1.0

  # Timing model (stalesgd.schedule.TimingModel): simulated seconds.
  config.timing = ml_collections.ConfigDict()
  config.timing.compute_time_per_example = 1e-3  # base(mu) = this x mu
  config.timing.jitter = "lognormal"
  config.timing.jitter_sigma = 0.1
  config.timing.straggler_prob = 0.0
  config.timing.straggler_factor = 1.0
  config.timing.speed_factor_sigma = 0.0
  config.timing.latency = 0.0
  config.timing.bandwidth = 0.0  # bytes/s; 0 means infinite
  config.timing.model_bytes = 0  # bytes per push/pull/all-reduce; 0 means the model's float32 parameters
  config.timing.server_shards = 1
  config.timing.apply_time = 0.0

  # Optimizer: the server's for parameter-server protocols, each worker's for
  # decentralized ones.
  config.learning_rate = 0.05  # alpha_0
  config.lr_decay_epochs = ()  # multiply the learning rate by lr_decay_factor at these epochs
  config.lr_decay_factor = 0.1
  config.momentum = 0.9
  config.nesterov = False
  config.weight_decay = 0.0
  # "modulated" (the papers): decay joins each gradient before the staleness weight, so the modulated
  # rate covers it; "unmodulated" (ablation): decay added once after the weighted average, at alpha_t.
  config.weight_decay_placement = "modulated"

  # Staleness-dependent learning rate (stalesgd.scale_by_staleness), per contribution.
  config.staleness_rule = "none"  # none | inverse (Zhang et al.) | inverse_mean (Rudra) | polynomial | ...
  config.staleness_mean = config_dict.placeholder(float)  # <sigma> for inverse_mean / normalize; tracked if unset
  config.staleness_exponent = 0.5
  config.staleness_decay = 0.5
  config.staleness_threshold = config_dict.placeholder(int)  # threshold / hinge rules
  config.staleness_normalize = False

  # Delay compensation (stalesgd.scale_by_delay_compensation, or DC-S3GD's lambda).
  # none | constant (DC-ASGD-c) | adaptive (DC-ASGD-a) | layerwise. Protocol dcs3gd always corrects:
  # with "none" it uses DC-S3GD's own default (layer-wise, lambda_0 = 0.2); s3gd is the uncorrected one.
  config.delay_compensation = "none"
  config.dc_lambda = 0.04
  config.dc_decay = 0.95
  config.dc_per_learner_mean_square = False
  config.gap_aware = False

  # Evaluation, logging, checkpoints.
  config.eval_every_epochs = 1.0
  config.eval_batch_size = 512
  config.train_eval_examples = 2048  # train accuracy on a fixed subset of this size
  config.precise_bn_batches = 8
  config.log_every_updates = 100
  config.checkpoint_every_seconds = 300
  config.keep_checkpoints = 2
  return config


def _fail(field: str, value, allowed: str) -> None:
  raise ValueError(f"config.{field}={value!r} is not allowed: {allowed}")


def _require_int(config, field: str, *, minimum: int, maximum: int | None = None) -> None:
  value = config[field]
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
      maximum is not None and value > maximum):
    upper = "" if maximum is None else f" and <= {maximum}"
    _fail(field, value, f"an integer >= {minimum}{upper}")


def _require_number(config, field: str, *, minimum: float, strict: bool = False, maximum: float | None = None):
  value = config[field]
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  ok = ok and (value > minimum if strict else value >= minimum) and (maximum is None or value < maximum)
  if not ok:
    bounds = f"{'>' if strict else '>='} {minimum}" + ("" if maximum is None else f" and < {maximum}")
    _fail(field, value, f"a finite number {bounds}")


def _require_choice(config, field: str, choices) -> None:
  if config[field] not in choices:
    _fail(field, config[field], f"one of {tuple(choices)}")


def validate_config(config: ml_collections.ConfigDict, *, num_devices: int) -> None:
  """Checks a run's config before anything expensive happens.

  Args:
    config: the run's config (see `default_config`).
    num_devices: devices in the mesh (all processes); decentralized protocols
      run one worker per device.

  Raises:
    ValueError: naming the first bad field, its value and what is allowed.
  """
  _require_choice(config, "protocol", PROTOCOLS)
  _require_choice(config, "data_source", SOURCES)
  _require_choice(config, "normalization", NORMALIZATIONS)
  _require_choice(config, "model", models.available_models())
  _require_choice(config, "staleness_rule", STALENESS_RULES)
  _require_choice(config, "delay_compensation", DELAY_COMPENSATIONS)
  _require_choice(config, "weight_decay_placement", WEIGHT_DECAY_PLACEMENTS)
  _require_int(config, "seed", minimum=0)
  _require_int(config, "learners", minimum=1)
  _require_int(config, "batch_per_learner", minimum=1)
  _require_number(config, "num_epochs", minimum=0, strict=True)
  _require_number(config, "learning_rate", minimum=0, strict=True)
  _require_number(config, "momentum", minimum=0, maximum=1)
  _require_number(config, "weight_decay", minimum=0)
  _require_number(config, "lr_decay_factor", minimum=0, strict=True)
  _require_number(config, "dc_lambda", minimum=0)
  _require_number(config, "dc_decay", minimum=0, maximum=1)
  _require_number(config, "eval_every_epochs", minimum=0, strict=True)
  _require_int(config, "eval_batch_size", minimum=1)
  _require_int(config, "train_eval_examples", minimum=0)
  _require_int(config, "precise_bn_batches", minimum=1)
  _require_int(config, "log_every_updates", minimum=1)
  _require_int(config, "checkpoint_every_seconds", minimum=1)
  _require_int(config, "keep_checkpoints", minimum=1)
  if any(not isinstance(epoch, (int, float)) or epoch <= 0 for epoch in config.lr_decay_epochs):
    _fail("lr_decay_epochs", config.lr_decay_epochs, "a tuple of positive epoch numbers")

  learners = config.learners
  protocol = config.protocol
  if protocol in ("softsync", "drop_stale"):
    _require_int(config, "n", minimum=1, maximum=learners)
  if protocol == "ssp":
    _require_int(config, "ssp_bound", minimum=0)
  if protocol == "backup":
    _require_int(config, "backup_workers", minimum=0, maximum=learners - 1)
  if protocol == "drop_stale":
    _require_int(config, "max_staleness", minimum=0)
  if protocol in DECENTRALIZED_PROTOCOLS:
    if learners != num_devices:
      _fail("learners", learners, f"protocol {protocol!r} runs one worker per device: set it to the number of "
                                  f"devices, {num_devices}")
    if protocol != "allreduce_sync":
      _require_int(config, "allreduce_staleness", minimum=1)
    if config.staleness_rule != "none" or config.gap_aware:
      _fail("staleness_rule" if config.staleness_rule != "none" else "gap_aware",
            config.staleness_rule if config.staleness_rule != "none" else config.gap_aware,
            f"'none'/False: protocol {protocol!r} has no per-gradient staleness (every step is S stale)")
    if protocol != "dcs3gd" and config.delay_compensation != "none":
      _fail("delay_compensation", config.delay_compensation,
            f"'none' for protocol {protocol!r}; use protocol='dcs3gd' for the corrected variant")
  elif config.eager_updates:
    _fail("eager_updates", True, "False for parameter-server protocols (only s3gd / dcs3gd have eager updates)")
  if config.dc_per_learner_mean_square and config.delay_compensation != "adaptive":
    _fail("dc_per_learner_mean_square", True,
          f"False unless delay_compensation='adaptive' (only DC-ASGD-a keeps a MeanSquare; got "
          f"delay_compensation={config.delay_compensation!r})")
  if config.staleness_rule in ("threshold", "hinge") and config.staleness_threshold is None:
    _fail("staleness_threshold", None, f"an integer >= 0 for staleness_rule={config.staleness_rule!r}")
  if config.data_source == "npz" and not config.data_dir:
    _fail("data_dir", config.data_dir, "the directory holding <dataset>_train.npz and <dataset>_test.npz")
  timing_model(config)  # TimingModel validates its own fields


def timing_model(config: ml_collections.ConfigDict, *, parameter_bytes: int = 0) -> schedule_lib.TimingModel:
  """The run's `TimingModel`; its compute time scales with the mini-batch size.

  Args:
    config: the run's config.
    parameter_bytes: the model's size, used for messages when
      ``config.timing.model_bytes`` is 0 (only matters with a finite bandwidth).
  """
  timing = config.timing
  try:
    return schedule_lib.TimingModel(
        compute_time=timing.compute_time_per_example * config.batch_per_learner,
        jitter=timing.jitter, jitter_sigma=timing.jitter_sigma, straggler_prob=timing.straggler_prob,
        straggler_factor=timing.straggler_factor, speed_factor_sigma=timing.speed_factor_sigma,
        latency=timing.latency, bandwidth=timing.bandwidth if timing.bandwidth > 0 else math.inf,
        model_bytes=timing.model_bytes or parameter_bytes, server_shards=timing.server_shards,
        apply_time=timing.apply_time)
  except ValueError as error:
    raise ValueError(f"config.timing: {error}") from error


def protocol_options(config: ml_collections.ConfigDict) -> dict:
  """The keyword options `stalesgd.schedule.simulate` takes for the run's protocol."""
  protocol = config.protocol
  if protocol == "softsync":
    return {"n": config.n}
  if protocol == "ssp":
    return {"s": config.ssp_bound}
  if protocol == "backup":
    return {"backup": config.backup_workers}
  if protocol == "drop_stale":
    return {"max_staleness": config.max_staleness, "n": config.n}
  if protocol in ("s3gd", "dcs3gd"):
    return {"staleness": config.allreduce_staleness}
  return {}


def contributions_per_update(config: ml_collections.ConfigDict) -> int:
  """c: gradients applied by one server update (M for decentralized protocols)."""
  return schedule_lib.contributions_per_update(config.protocol, learners=config.learners,
                                               **protocol_options(config))


def updates_per_epoch(config: ml_collections.ConfigDict, num_train: int) -> float:
  """Server updates (decentralized: steps) per epoch of applied samples."""
  return num_train / (contributions_per_update(config) * config.batch_per_learner)


# Fields a resumed run may change: they decide when to log, save or how to batch
# evaluation, never the weights or the metrics' values.
RESUMABLE_CHANGES = ("log_every_updates", "checkpoint_every_seconds", "keep_checkpoints", "eval_batch_size")
CONFIG_FILENAME = "config.json"


def config_changes(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """``field: old -> new`` for every top-level field that differs, except `RESUMABLE_CHANGES`."""
  current = json.loads(config.to_json())
  return [f"{field}: {saved.get(field)!r} -> {current.get(field)!r}"
          for field in sorted(saved.keys() | current.keys())
          if field not in RESUMABLE_CHANGES and saved.get(field) != current.get(field)]


def check_same_run(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> None:
  """Refuses a workdir that holds a run of another config, before anything is resumed or reused.

  A checkpoint of one config restored into another would silently mix two runs.

  Raises:
    ValueError: naming the workdir and the fields that differ.
  """
  path = pathlib.Path(workdir) / CONFIG_FILENAME
  if not path.exists():
    return
  changes = config_changes(json.loads(path.read_text()), config)
  if changes:
    raise ValueError(f"{workdir} holds a run of another config ({', '.join(changes)}); allowed: the same config "
                     f"(only {', '.join(RESUMABLE_CHANGES)} may change on resume), or another workdir")
