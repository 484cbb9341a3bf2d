"""The configuration of one training run: every field, its default, and its checks.

`default_config()` is the one place where defaults live (big_vision's advice:
no ``config.get(key, default)`` scattered through the trainer); every config in
`stalesgd.configs` starts from it and overrides what its paper says.
`validate_config` runs before anything expensive (no data read, nothing
compiled) and names the offending field with the allowed values.

Durations are in epochs (one epoch = the training split's size in *applied*
samples: an update applies c contributions of mu samples each) and are converted
to server updates in one place, `updates_per_epoch`.

The config is read here and in `stalesgd.training.build_run`, nowhere below:
this module also turns it into the typed objects of the layers under the
training stack, the simulated cluster's schedule (`simulate_schedule`, with
`timing_model` and `protocol_options`) and DC-S3GD's settings
(`decentral_settings`), and names the run (`run_label`).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from stalesgd import decentral, models, transforms
from stalesgd import schedule as schedule_lib
from stalesgd.data import NORMALIZATIONS, SOURCES
from stalesgd.data._embedded import EMBEDDED_DATASETS
from stalesgd.models._loss import check_loss_name
from stalesgd.training._field_checks import (
  INT64_MAX,
  fail,
  is_number,
  require_bool,
  require_choice,
  require_int,
  require_number,
)
from stalesgd.training._solvers import CAFFE_SGD, solver_call
from stalesgd.utils._import_path import check_options, is_import_path, load_callable

# Every protocol's options, ranges and kind are its row of stalesgd.schedule.PROTOCOL_TABLE.
PARAMETER_SERVER_PROTOCOLS = schedule_lib.PARAMETER_SERVER_PROTOCOLS
DECENTRALIZED_PROTOCOLS = schedule_lib.DECENTRALIZED_PROTOCOLS
PROTOCOLS = schedule_lib.PROTOCOLS
STALENESS_RULES = ("none",) + tuple(transforms.STALENESS_RULES)
DELAY_COMPENSATIONS = ("none", "constant", "adaptive", "layerwise")
WEIGHT_DECAY_PLACEMENTS = ("modulated", "unmodulated")


STORED_DC_LAMBDA = 0.04  # config.dc_lambda's default: "the mode's own lambda_0" (`dc_lambda`)


def default_config() -> ml_collections.ConfigDict:
  """Every field of a run, with defaults that train the embedded data set quickly."""
  config = ml_collections.ConfigDict()
  config.seed = 0

  # Data (stalesgd.data.load_dataset).
  config.dataset = "digits"  # with data_source="python": "package.module:function" (docs/own_experiment.md)
  config.data_source = "embedded"  # tfds | npz | embedded | python
  config.data_dir = config_dict.placeholder(str)  # tfds data_dir, or the directory of <dataset>_{train,test}.npz
  # tfds: the splits to train and evaluate on (unset: the data set's usual ones) and the image and label features.
  config.train_split = config_dict.placeholder(str)
  config.test_split = config_dict.placeholder(str)
  config.image_key = "image"
  config.label_key = "label"
  config.normalization = "per_channel"  # per_pixel_mean (Caffe/Rudra) | per_channel | unit | raw
  # Training augmentation (off in Rudra and DC-ASGD Table 1), by the data set's kind: in memory (CIFAR-10,
  # MNIST, npz) a pad-4 random crop + flip; tfds imagenet2012 (decoded lazily) the Inception random-resized
  # crop of the original JPEG + flip (stalesgd.data._inception_crop). Either way a function of (seed, g, j).
  config.augment = False
  config.image_size = 224  # ImageNet crop side
  config.data_workers = default_data_workers()  # threads decoding ImageNet's JPEGs (the pixels do not depend on it)

  # Model (stalesgd.models.get_model).
  config.model = "small_cnn"  # a registered name, or "package.module:factory" (docs/own_experiment.md)
  config.model_options = ml_collections.ConfigDict()
  config.model_multipliers = False  # Caffe-style per-layer learning-rate and weight-decay multipliers
  # Whose multipliers, for a model published with several (ModelSpec.multiplier_sets): unset is the model's
  # default; cifar10_full: "rudra" (default, Rudra's release file) | "caffe" (Caffe's prototxt); alexnet: "caffe".
  config.multiplier_set = config_dict.placeholder(str)
  # "softmax_cross_entropy" (classification: test error, accuracy, loss), or "package.module:function"
  # returning per-example {"loss": ..., metric: ...} (stalesgd.models._loss; docs/own_experiment.md).
  config.loss = "softmax_cross_entropy"

  # Protocol (stalesgd.schedule.simulate / stalesgd.decentral).
  config.protocol = "hardsync"
  config.learners = 8  # lambda (parameter server) or M (decentralized)
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

  # Optimizer: the server's for parameter-server protocols, each learner's for
  # decentralized ones.
  config.learning_rate = 0.05  # alpha_0
  config.lr_decay_epochs = ()  # multiply the learning rate by lr_decay_factor at these epochs
  config.lr_decay_factor = 0.1
  # Gradual warm-up (Goyal et al. 2017, off at 0): the rate rises linearly per update from warmup_learning_rate
  # (the small-batch rate) to learning_rate over the first warmup_epochs, then follows the decay schedule.
  config.warmup_epochs = 0.0
  config.warmup_learning_rate = config_dict.placeholder(float)
  config.momentum = 0.9
  config.nesterov = False
  config.weight_decay = 0.0
  # "modulated" (the papers): decay joins each gradient before the staleness weight, so the modulated
  # rate covers it; "unmodulated" (ablation): decay added once after the weighted average, at alpha_t.
  config.weight_decay_placement = "modulated"
  # The solver: "sgd" (the papers' Caffe SGD), an optax optimizer by name ("adam", "adamw", "lamb", ...) or
  # "package.module:factory"; its keyword options (e.g. b1, b2, eps; AdamW's weight_decay). stalesgd.training._solvers.
  config.optimizer = "sgd"
  config.optimizer_options = ml_collections.ConfigDict()

  # Staleness-dependent learning rate (stalesgd.scale_by_staleness), per contribution.
  config.staleness_rule = "none"  # none | inverse (Zhang et al.) | inverse_mean (Rudra) | polynomial | ...
  config.staleness_mean = config_dict.placeholder(float)  # <sigma> for inverse_mean / normalize; tracked if unset
  config.staleness_exponent = 0.5
  config.staleness_decay = 0.5  # b of the exponential rule (the transforms call it rate; the field keeps its name)
  config.staleness_threshold = config_dict.placeholder(int)  # threshold / hinge rules
  config.staleness_normalize = False

  # Delay compensation (stalesgd.scale_by_delay_compensation, or DC-S3GD's lambda).
  # none | constant (DC-ASGD-c) | adaptive (DC-ASGD-a) | layerwise. Protocol dcs3gd always corrects:
  # with "none" it uses DC-S3GD's own default (layer-wise, lambda_0 = 0.2); s3gd is the uncorrected one.
  config.delay_compensation = "none"
  # lambda_0; left at this stored default it is the mode's own (stalesgd.decentral.DEFAULT_LAMBDA_0: constant
  # 0.04, adaptive 2.0, layerwise 0.2; `dc_lambda`). Kept at 0.04 so earlier run directories resume.
  config.dc_lambda = STORED_DC_LAMBDA
  config.dc_decay = 0.95
  config.dc_per_learner_mean_square = False
  # Ablation, not the paper's rule: DC-ASGD-a's MeanSquare divided by its blend weight (Adam-style bias
  # correction of its zero start); False is the authors' implementation.
  config.dc_mean_square_bias_correction = False
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


MAX_DATA_WORKERS = 256  # decoding threads: more only costs memory
DEFAULT_DATA_WORKERS_CAP = 8


def default_data_workers() -> int:
  """``config.data_workers``'s default: the cores this process may run on, at most `DEFAULT_DATA_WORKERS_CAP`.

  More threads than cores cost 6-18 % in the ImageNet pipeline's benchmark
  (docs/data.md); the decoded pixels do not depend on the count, and a resumed
  run may change it (`stalesgd.training._workdir`).
  """
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  return max(1, min(DEFAULT_DATA_WORKERS_CAP, cores))


def flatten_config(config: ml_collections.ConfigDict, *, first: Sequence[str] = ()) -> dict[str, Any]:
  """Every field as ``{"timing.jitter": value, ...}`` (nested fields joined by dots), those in ``first`` first."""
  flat: dict[str, Any] = {}

  def add(prefix: str, value: Any) -> None:
    if isinstance(value, dict):
      for key in sorted(value):
        add(f"{prefix}{key}.", value[key])
    else:
      flat[prefix[:-1]] = value

  add("", json.loads(config.to_json()))
  return {**{field: flat[field] for field in first if field in flat}, **flat}


@functools.cache
def _default_fields() -> dict[str | None, tuple[str, ...]]:
  """The field names of `default_config` (None: top level) and of its ``timing``."""
  defaults = default_config()
  return {None: tuple(sorted(defaults.keys())), "timing": tuple(sorted(defaults.timing.keys()))}


def _require_known_fields(config) -> None:
  """Every field of `default_config` present, no other (a misspelt field would be silently ignored)."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
      f"config has type {type(config).__name__}; allowed: an ml_collections.ConfigDict from "
      "stalesgd.training.default_config()"
    )
  for parent, expected in _default_fields().items():
    given = config if parent is None else config[parent]
    prefix = "" if parent is None else f"{parent}."
    if parent is not None and not isinstance(given, ml_collections.ConfigDict):
      fail(parent, given, "an ml_collections.ConfigDict with the fields of default_config().timing")
    missing = sorted(set(expected) - set(given.keys()))
    if missing:
      raise ValueError(
        f"config.{prefix}{missing[0]} is missing; allowed: a config built from "
        "stalesgd.training.default_config(), which has every field"
      )
    unknown = sorted(set(given.keys()) - set(expected))
    if unknown:
      raise ValueError(f"config.{prefix}{unknown[0]} is not a field; allowed: one of {expected}")
  for field, example in (
    ("model_options", "ml_collections.ConfigDict(hidden_sizes=(32,)) for model='mlp'"),
    ("optimizer_options", "ml_collections.ConfigDict(b1=0.9) for optimizer='adam'"),
  ):
    options = config[field]
    if not isinstance(options, (ml_collections.ConfigDict, Mapping)) or not all(isinstance(k, str) for k in options):
      fail(field, options, f"a mapping of option names to values (e.g. {example})")


def _check_timing(config) -> None:
  """The simulated cluster's fields, named as config fields (`TimingModel` checks their combination)."""
  require_number(config, "timing.compute_time_per_example", minimum=0, strict=True)
  if not math.isfinite(config.timing.compute_time_per_example * config.batch_per_learner):
    fail(
      "timing.compute_time_per_example",
      config.timing.compute_time_per_example,
      f"a number whose product with batch_per_learner={config.batch_per_learner} is finite",
    )
  require_number(config, "timing.jitter_sigma", minimum=0)
  if config.timing.jitter == "straggler":
    require_number(
      config,
      "timing.straggler_prob",
      minimum=0,
      strict=True,
      maximum=1,
      maximum_inclusive=True,
      because="with timing.jitter='straggler' (the share of steps that straggle)",
    )
    require_number(
      config,
      "timing.straggler_factor",
      minimum=1,
      because="with timing.jitter='straggler' (the slowdown of a straggling step)",
    )
  else:  # straggler settings without straggler jitter would silently measure nothing
    if not is_number(config.timing.straggler_prob) or config.timing.straggler_prob != 0:
      fail("timing.straggler_prob", config.timing.straggler_prob, "0.0 unless timing.jitter='straggler'")
    if not is_number(config.timing.straggler_factor) or config.timing.straggler_factor != 1:
      fail("timing.straggler_factor", config.timing.straggler_factor, "1.0 unless timing.jitter='straggler'")
  require_number(config, "timing.speed_factor_sigma", minimum=0)
  require_number(config, "timing.latency", minimum=0)
  require_number(config, "timing.bandwidth", minimum=0, allow_inf=True)  # 0 means infinite
  require_int(config, "timing.model_bytes", minimum=0, maximum=INT64_MAX)  # 0: the model's float32 weights
  require_int(config, "timing.server_shards", minimum=1)
  require_number(config, "timing.apply_time", minimum=0)


def validate_config(config: ml_collections.ConfigDict, *, num_devices: int) -> None:
  """Checks a run's config before anything expensive happens.

  Every field of `default_config` is checked for its type and range (an int
  field takes a Python int, not a float or a bool; a number field an int or a
  finite float), then the fields' combinations.

  Args:
    config: the run's config (see `default_config`).
    num_devices: devices in the mesh (all processes); decentralized protocols
      run one learner per device.

  Raises:
    ValueError: naming the first bad field (``config.<field>=<value>``, or
      ``config.timing: <field>`` for the timing model's own checks) and what
      is allowed.
  """
  _require_known_fields(config)
  require_choice(config, "protocol", PROTOCOLS)
  require_choice(config, "data_source", SOURCES)
  require_choice(config, "normalization", NORMALIZATIONS)
  _check_model(config)
  _check_multiplier_set(config)
  if not isinstance(config.loss, str):
    fail("loss", config.loss, "'softmax_cross_entropy' or an import path 'package.module:function'")
  check_loss_name(config.loss)
  require_choice(config, "staleness_rule", STALENESS_RULES)
  require_choice(config, "delay_compensation", DELAY_COMPENSATIONS)
  require_choice(config, "weight_decay_placement", WEIGHT_DECAY_PLACEMENTS)
  _check_dataset(config)
  require_int(config, "seed", minimum=0, maximum=INT64_MAX)
  require_int(config, "image_size", minimum=1)
  require_int(config, "data_workers", minimum=1, maximum=MAX_DATA_WORKERS)
  for flag in (
    "augment",
    "model_multipliers",
    "eager_updates",
    "nesterov",
    "staleness_normalize",
    "dc_per_learner_mean_square",
    "dc_mean_square_bias_correction",
    "gap_aware",
  ):
    require_bool(config, flag)
  require_int(config, "learners", minimum=1)
  require_int(config, "batch_per_learner", minimum=1)
  require_int(config, "n", minimum=1)
  require_int(config, "ssp_bound", minimum=0)
  require_int(config, "backup_workers", minimum=0)
  require_int(config, "max_staleness", minimum=0)
  require_int(config, "allreduce_staleness", minimum=1)
  require_number(config, "num_epochs", minimum=0, strict=True)
  require_number(config, "learning_rate", minimum=0, strict=True)
  require_number(config, "momentum", minimum=0, maximum=1)
  require_number(config, "weight_decay", minimum=0)
  require_number(config, "lr_decay_factor", minimum=0, strict=True)
  require_number(config, "warmup_epochs", minimum=0)
  require_number(config, "warmup_learning_rate", minimum=0, optional=True)
  require_number(config, "staleness_mean", minimum=0, optional=True)
  require_number(config, "staleness_exponent", minimum=0)
  require_number(config, "staleness_decay", minimum=0)
  require_int(config, "staleness_threshold", minimum=0, optional=True)
  require_number(config, "dc_lambda", minimum=0)
  require_number(config, "dc_decay", minimum=0, maximum=1)
  require_number(config, "eval_every_epochs", minimum=0, strict=True)
  require_int(config, "eval_batch_size", minimum=1)
  require_int(config, "train_eval_examples", minimum=0)
  require_int(config, "precise_bn_batches", minimum=1)
  require_int(config, "log_every_updates", minimum=1)
  require_int(config, "checkpoint_every_seconds", minimum=1)
  require_int(config, "keep_checkpoints", minimum=1)
  epochs = config.lr_decay_epochs
  if not isinstance(epochs, (tuple, list)) or any(
    not is_number(epoch) or not math.isfinite(epoch) or epoch <= 0 for epoch in epochs
  ):
    fail("lr_decay_epochs", epochs, "a tuple of positive finite epoch numbers, e.g. (30, 60)")
  _check_warmup(config)
  _check_timing(config)  # timing.jitter is checked by TimingModel, with the other fields' combination
  _check_optimizer(config)

  _check_protocol(config, num_devices)
  if config.dc_per_learner_mean_square and config.delay_compensation != "adaptive":
    fail(
      "dc_per_learner_mean_square",
      True,
      f"False unless delay_compensation='adaptive' (only DC-ASGD-a keeps a MeanSquare; got "
      f"delay_compensation={config.delay_compensation!r})",
    )
  if config.dc_mean_square_bias_correction and config.delay_compensation != "adaptive":
    fail(
      "dc_mean_square_bias_correction",
      True,
      f"False unless delay_compensation='adaptive' (only DC-ASGD-a keeps a MeanSquare; got "
      f"delay_compensation={config.delay_compensation!r})",
    )
  if config.dc_per_learner_mean_square and is_decentralized(config):
    fail(
      "dc_per_learner_mean_square",
      True,
      f"False for protocol {config.protocol!r} (DC-S3GD keeps one MeanSquare per learner anyway; the field "
      "chooses between the parameter server's two DC-ASGD-a conventions)",
    )
  if config.dc_mean_square_bias_correction and is_decentralized(config):
    fail(
      "dc_mean_square_bias_correction",
      True,
      f"False for protocol {config.protocol!r} (DC-S3GD's own adaptive lambda has no bias correction; it is "
      "the parameter server's DC-ASGD-a option)",
    )
  if config.staleness_rule in ("threshold", "hinge") and config.staleness_threshold is None:
    fail("staleness_threshold", None, f"an integer >= 0 for staleness_rule={config.staleness_rule!r}")
  timing_model(config)  # TimingModel checks the combination of its fields


def _check_protocol(config, num_devices: int) -> None:
  """The protocol's options and combinations, as its row of `stalesgd.schedule.PROTOCOL_TABLE` says."""
  protocol = config.protocol
  row = schedule_lib.protocol_row(protocol)
  for option in row.options.values():
    bound = option.upper_bound(config.learners)
    if option.config_field is not None and bound is not None:
      require_int(config, option.config_field, minimum=option.low, maximum=bound)
  if config.eager_updates and not row.eager:
    fail(
      "eager_updates",
      True,
      f"False for protocol {protocol!r} (only {' / '.join(schedule_lib.EAGER_PROTOCOLS)} have eager updates)",
    )
  if not row.decentralized:
    return
  if config.learners != num_devices:
    fail(
      "learners",
      config.learners,
      f"protocol {protocol!r} runs one learner per device: set it to the number of devices, {num_devices}",
    )
  if config.staleness_rule != "none" or config.gap_aware:
    fail(
      "staleness_rule" if config.staleness_rule != "none" else "gap_aware",
      config.staleness_rule if config.staleness_rule != "none" else config.gap_aware,
      f"'none'/False: protocol {protocol!r} has no per-gradient staleness (every step is S stale)",
    )
  if not row.corrects and config.delay_compensation != "none":
    fail(
      "delay_compensation",
      config.delay_compensation,
      f"'none' for protocol {protocol!r}; use protocol="
      f"{schedule_lib.CORRECTED_DECENTRALIZED_PROTOCOLS[0]!r} for the corrected variant",
    )


def _check_model(config) -> None:
  """A registered model name, or an importable factory that takes the model options (built in `build_run`)."""
  if is_import_path(config.model):
    factory = load_callable(config.model, field="config.model")
    check_options(
      factory,
      config.model_options.keys(),
      field="config.model",
      path=config.model,
      options_field="config.model_options",
    )
    return
  require_choice(config, "model", models.available_models() + ("package.module:factory",))


def _check_warmup(config) -> None:
  """A warm-up has a start rate and ends before the first decay (a start rate without one is unused)."""
  if config.warmup_epochs > 0:
    if config.warmup_learning_rate is None:
      fail(
        "warmup_learning_rate",
        None,
        f"a number >= 0 with warmup_epochs={config.warmup_epochs} (the rate at the first update, Goyal et al.'s "
        "small-batch rate)",
      )
    if config.lr_decay_epochs and min(config.lr_decay_epochs) < config.warmup_epochs:
      fail(
        "warmup_epochs",
        config.warmup_epochs,
        f"at most the first decay epoch, {min(config.lr_decay_epochs)} (lr_decay_epochs): the warm-up ends "
        "before the first decay",
      )


def _check_multiplier_set(config) -> None:
  """A source's name, with the multipliers on (the model's own sets are checked in `build_run`)."""
  if config.multiplier_set is None:
    return
  if not isinstance(config.multiplier_set, str):
    fail("multiplier_set", config.multiplier_set, "None (the model's default) or a source's name, e.g. 'caffe'")
  if not config.model_multipliers:
    fail(
      "multiplier_set",
      config.multiplier_set,
      "None unless model_multipliers=True (a multiplier set chooses among the multipliers that flag turns on)",
    )


def _check_optimizer(config) -> None:
  """The solver's name, its options, and what the config's SGD fields mean for it (`_solvers`)."""
  if not isinstance(config.optimizer, str):
    fail("optimizer", config.optimizer, "'sgd', an optax optimizer's name, or 'package.module:factory'")
  if config.optimizer == CAFFE_SGD:
    if config.optimizer_options.keys():
      fail("optimizer_options", dict(config.optimizer_options.items()), "empty for optimizer='sgd' (the Caffe solver)")
    return
  solver_call(
    config.optimizer, dict(config.optimizer_options.items()), momentum=config.momentum, nesterov=config.nesterov
  )
  if config.weight_decay_placement == "unmodulated" and config.weight_decay > 0:
    fail(
      "weight_decay_placement",
      "unmodulated",
      f"'modulated' with optimizer={config.optimizer!r}: the ablation is defined for the SGD solver only",
    )


def _check_dataset(config) -> None:
  """The data set's name and directory, for the config's source (nothing is read)."""
  name, data_dir, source = config.dataset, config.data_dir, config.data_source
  if data_dir is not None and not isinstance(data_dir, str):
    fail("data_dir", data_dir, "None or the path of a directory (a str)")
  if source == "embedded" and (not isinstance(name, str) or name not in EMBEDDED_DATASETS):
    fail("dataset", name, f"one of {EMBEDDED_DATASETS} for data_source='embedded'")
  if source == "tfds" and (not isinstance(name, str) or not name or is_import_path(name)):
    fail("dataset", name, "a tfds data set's name for data_source='tfds' (any prepared in data_dir)")
  if source == "python":
    if not is_import_path(name):
      fail("dataset", name, "an import path 'package.module:function' for data_source='python'")
    load_callable(name, field="config.dataset")
  for field in ("train_split", "test_split"):
    if config[field] is not None and (not isinstance(config[field], str) or not config[field]):
      fail(field, config[field], "None (the data set's usual split) or a split's name")
  for field in ("image_key", "label_key"):
    if not isinstance(config[field], str) or not config[field]:
      fail(field, config[field], "the name of a feature of the tfds data set")
  if source == "npz":
    if not isinstance(name, str) or not name or os.sep in name:
      fail("dataset", name, "a file-name prefix for data_source='npz' (<data_dir>/<dataset>_train.npz)")
    if not data_dir:
      fail(
        "data_dir", data_dir, "the directory holding <dataset>_train.npz and <dataset>_test.npz, for data_source='npz'"
      )


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
      jitter=timing.jitter,
      jitter_sigma=timing.jitter_sigma,
      straggler_prob=timing.straggler_prob,
      straggler_factor=timing.straggler_factor,
      speed_factor_sigma=timing.speed_factor_sigma,
      latency=timing.latency,
      bandwidth=timing.bandwidth if timing.bandwidth > 0 else math.inf,
      model_bytes=timing.model_bytes or parameter_bytes,
      server_shards=timing.server_shards,
      apply_time=timing.apply_time,
    )
  except ValueError as error:
    raise ValueError(f"config.timing: {error}") from error


def protocol_options(config: ml_collections.ConfigDict) -> dict:
  """The keyword options `stalesgd.schedule.simulate` takes for the run's protocol (its table row maps fields)."""
  return schedule_lib.protocol_row(config.protocol).config_options(config)


def contributions_per_update(config: ml_collections.ConfigDict) -> int:
  """c: gradients applied by one server update (M for decentralized protocols)."""
  return schedule_lib.contributions_per_update(config.protocol, learners=config.learners, **protocol_options(config))


def examples_per_update(config: ml_collections.ConfigDict) -> int:
  """c * mu: the examples one server update (decentralized: one step of all M learners) applies."""
  return contributions_per_update(config) * config.batch_per_learner


def updates_per_epoch(config: ml_collections.ConfigDict, num_train: int) -> float:
  """Server updates (decentralized: steps) per epoch of applied samples."""
  return num_train / examples_per_update(config)


def dc_lambda(config: ml_collections.ConfigDict) -> float:
  """lambda_0 of the run's correction: ``config.dc_lambda``, or the mode's default where it is left at 0.04.

  ``config.dc_lambda``'s stored default (`STORED_DC_LAMBDA`, DC-ASGD-c's 0.04)
  stands for "the mode's own lambda_0" (`stalesgd.decentral.DEFAULT_LAMBDA_0`):
  constant 0.04, adaptive 2.0 (DC-ASGD-a), layer-wise 0.2 (DC-S3GD). Any other
  value is taken as given. The one cost: lambda_0 = 0.04 exactly cannot be asked
  for with the adaptive or layer-wise mode (0.0400001 can).
  """
  if config.dc_lambda == STORED_DC_LAMBDA and config.delay_compensation in decentral.DEFAULT_LAMBDA_0:
    return decentral.DEFAULT_LAMBDA_0[config.delay_compensation]
  return config.dc_lambda


def is_decentralized(config: ml_collections.ConfigDict) -> bool:
  """Whether the config's protocol is a decentralized all-reduce protocol (its row of the protocol table)."""
  return schedule_lib.protocol_row(config.protocol).decentralized


def decentral_settings(config: ml_collections.ConfigDict) -> decentral.DCS3GDConfig | None:
  """The `stalesgd.decentral.DCS3GDConfig` of a decentralized run (None for a parameter-server protocol).

  The protocol's row fixes some fields; the config sets the staleness S, eager
  updates and (where the row allows one) the correction.
  """
  row = schedule_lib.protocol_row(config.protocol)
  if not row.decentralized:
    return None
  overrides = {}
  if "staleness" not in row.fixed_settings:
    overrides.update(staleness=config.allreduce_staleness)
  if row.eager:
    overrides.update(eager=config.eager_updates)
  if row.corrects and config.delay_compensation != "none":
    overrides.update(
      dc_lambda=dc_lambda(config), lambda_mode=config.delay_compensation, mean_square_decay=config.dc_decay
    )
  return decentral.config_for_protocol(config.protocol, **overrides)


def simulate_schedule(
  config: ml_collections.ConfigDict, num_updates: int, *, parameter_bytes: int
) -> schedule_lib.Schedule:
  """The simulated cluster's schedule of a run: its protocol, options and timing model, seeded by the config."""
  return schedule_lib.simulate(
    config.protocol,
    learners=config.learners,
    num_updates=num_updates,
    seed=config.seed,
    **protocol_options(config),
    timing=timing_model(config, parameter_bytes=parameter_bytes),
  )


def run_label(config: ml_collections.ConfigDict) -> str:
  """A run's name in logs, plots and summaries, e.g. ``"4-softsync (lambda=30, mu=4, inverse)"``."""
  row = schedule_lib.protocol_row(config.protocol)
  protocol = (row.label or row.name).format(**config)
  rule = "" if config.staleness_rule == "none" else f", {config.staleness_rule}"
  correction = config.delay_compensation
  settings = decentral_settings(config)
  if settings is not None:  # DC-S3GD corrects even with delay_compensation="none" (its own default lambda)
    correction = settings.lambda_mode if settings.corrects else "none"
  dc = "" if correction == "none" else f", DC-{correction}"
  if config.dc_mean_square_bias_correction:
    dc += " bias-corrected"
  return f"{protocol} (lambda={config.learners}, mu={config.batch_per_learner}{rule}{dc})"
