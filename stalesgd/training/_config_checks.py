"""A run's config checked before anything expensive: no data read, nothing compiled.

`validate_config` checks every field of `stalesgd.training.default_config` for its type and range, then the
fields' combinations, and names the offending field with the allowed values (``config.<field>=<value>; allowed:
...``, nested fields as ``config.timing.<field>``), with the checks of `stalesgd._validation`. A field holds
Python's own int or float (``builtin_only``: the config is written as JSON), never a bool for a number.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections

from stalesgd import _validation as validation
from stalesgd import schedule as schedule_lib
from stalesgd.data._loading import SOURCES
from stalesgd.data._normalization import NORMALIZATIONS
from stalesgd.models._loss import check_loss_name
from stalesgd.training._component_checks import check_dataset, check_model, check_optimizer
from stalesgd.training._config_readers import is_decentralized, timing_model
from stalesgd.training._local_runs import check_local_runs
from stalesgd.training._run_config import (
  DC_LAMBDA_DEFAULTS,
  DELAY_COMPENSATIONS,
  MAX_DATA_WORKERS,
  PROTOCOLS,
  STALENESS_RULES,
  WEIGHT_DECAY_PLACEMENTS,
  default_config,
)

INT32_MAX = 2**31 - 1  # counts end up in int32 device arrays
INT64_MAX = 2**63 - 1  # seeds (numpy and JAX take up to int64) and byte counts


def _field(config, field: str) -> tuple[str, Any]:
  """``("config.a.b", config.a.b)`` for ``field = "a.b"``: a check's name and value."""
  value = config
  for name in field.split("."):
    value = value[name]
  return f"config.{field}", value


@functools.cache
def _default_fields() -> dict[str | None, tuple[str, ...]]:
  """The field names of `default_config` (None: top level) and of its ``timing``."""
  defaults = default_config()
  return {
    None: tuple(sorted(defaults.keys())),
    "timing": tuple(sorted(defaults.timing.keys())),
    "inner": tuple(sorted(defaults.inner.keys())),
    "outer": tuple(sorted(defaults.outer.keys())),
  }


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
      validation.reject(
        f"config.{parent}", given, f"an ml_collections.ConfigDict with the fields of default_config().{parent}"
      )
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
      validation.reject(f"config.{field}", options, f"a mapping of option names to values (e.g. {example})")


def _check_timing(config) -> None:
  """The simulated cluster's fields, named as config fields (`TimingModel` checks their combination)."""
  validation.check_choice(*_field(config, "timing.jitter"), schedule_lib.JITTERS)
  validation.check_real(*_field(config, "timing.compute_time_per_example"), low=0, low_open=True, builtin_only=True)
  if not math.isfinite(config.timing.compute_time_per_example * config.batch_per_learner):
    validation.reject(
      "config.timing.compute_time_per_example",
      config.timing.compute_time_per_example,
      f"a number whose product with batch_per_learner={config.batch_per_learner} is finite",
    )
  validation.check_real(*_field(config, "timing.jitter_sigma"), low=0, builtin_only=True)
  if config.timing.jitter == "straggler":
    validation.check_real(
      *_field(config, "timing.straggler_prob"),
      low=0,
      low_open=True,
      high=1,
      builtin_only=True,
      note="with timing.jitter='straggler' (the share of steps that straggle)",
    )
    validation.check_real(
      *_field(config, "timing.straggler_factor"),
      low=1,
      builtin_only=True,
      note="with timing.jitter='straggler' (the slowdown of a straggling step)",
    )
  else:  # straggler settings without straggler jitter would silently measure nothing
    if not validation.is_real(config.timing.straggler_prob, builtin_only=True) or config.timing.straggler_prob != 0:
      validation.reject(
        "config.timing.straggler_prob", config.timing.straggler_prob, "0.0 unless timing.jitter='straggler'"
      )
    if not validation.is_real(config.timing.straggler_factor, builtin_only=True) or config.timing.straggler_factor != 1:
      validation.reject(
        "config.timing.straggler_factor", config.timing.straggler_factor, "1.0 unless timing.jitter='straggler'"
      )
  validation.check_real(*_field(config, "timing.speed_factor_sigma"), low=0, builtin_only=True)
  factors = config.timing.speed_factors
  if not isinstance(factors, (tuple, list)) or not all(
    validation.is_real(factor, builtin_only=True) and factor > 0 for factor in factors
  ):
    validation.reject("config.timing.speed_factors", factors, "a tuple of positive numbers, one per learner, or ()")
  if factors and len(factors) != config.learners:
    validation.reject(
      "config.timing.speed_factors", factors, f"one factor per learner (config.learners={config.learners})"
    )
  if factors and config.timing.speed_factor_sigma:
    validation.reject(
      "config.timing.speed_factors", factors, "() with timing.speed_factor_sigma > 0 (one source of speeds)"
    )
  validation.check_real(*_field(config, "timing.latency"), low=0, builtin_only=True)
  # 0 means infinite
  validation.check_real(*_field(config, "timing.bandwidth"), low=0, allow_inf=True, builtin_only=True)
  # 0: the model's float32 weights
  validation.check_integer(*_field(config, "timing.model_bytes"), low=0, high=INT64_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "timing.server_shards"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_real(*_field(config, "timing.apply_time"), low=0, builtin_only=True)


def validate_config(config: ml_collections.ConfigDict, *, num_devices: int | None) -> None:
  """Checks a run's config before anything expensive happens.

  Every field of `default_config` is checked for its type and range (an int
  field takes a Python int, not a float or a bool; a number field an int or a
  finite float), then the fields' combinations.

  Args:
    config: the run's config (see `default_config`).
    num_devices: devices in the mesh (all processes); decentralized protocols
      run one learner per device. None before JAX has started (a program's
      check of its flags): every check but the learner count against the
      devices, which the run repeats once the devices are known.

  Raises:
    ValueError: naming the first bad field (``config.<field>=<value>``, or
      ``config.timing: <field>`` for the timing model's own checks) and what
      is allowed.
  """
  _require_known_fields(config)
  validation.check_choice(*_field(config, "protocol"), PROTOCOLS)
  validation.check_choice(*_field(config, "data_source"), SOURCES)
  validation.check_choice(*_field(config, "normalization"), NORMALIZATIONS)
  check_model(config)
  _check_multiplier_set(config)
  if not isinstance(config.loss, str):
    validation.reject("config.loss", config.loss, "'softmax_cross_entropy' or an import path 'package.module:function'")
  check_loss_name(config.loss)
  validation.check_choice(*_field(config, "staleness_rule"), STALENESS_RULES)
  validation.check_choice(*_field(config, "delay_compensation"), DELAY_COMPENSATIONS)
  validation.check_choice(*_field(config, "dc_lambda_default"), DC_LAMBDA_DEFAULTS)
  validation.check_choice(*_field(config, "weight_decay_placement"), WEIGHT_DECAY_PLACEMENTS)
  check_dataset(config)
  validation.check_integer(*_field(config, "seed"), low=0, high=INT64_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "image_size"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "data_workers"), low=1, high=MAX_DATA_WORKERS, builtin_only=True)
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
    validation.check_bool(*_field(config, flag))
  validation.check_integer(*_field(config, "learners"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "batch_per_learner"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "n"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "ssp_bound"), low=0, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "backup_workers"), low=0, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "max_staleness"), low=0, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "allreduce_staleness"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_real(*_field(config, "num_epochs"), low=0, low_open=True, builtin_only=True)
  validation.check_real(
    *_field(config, "validation_fraction"),
    low=0,
    high=1,
    high_open=True,
    builtin_only=True,
    note="(0: evaluate on the test split; in (0, 1): on that share of the training split, held out)",
  )
  validation.check_real(*_field(config, "learning_rate"), low=0, low_open=True, builtin_only=True)
  validation.check_real(*_field(config, "momentum"), low=0, high=1, high_open=True, builtin_only=True)
  validation.check_real(*_field(config, "weight_decay"), low=0, builtin_only=True)
  validation.check_real(*_field(config, "lr_decay_factor"), low=0, low_open=True, builtin_only=True)
  validation.check_real(*_field(config, "warmup_epochs"), low=0, builtin_only=True)
  validation.check_real(*_field(config, "warmup_learning_rate"), low=0, optional=True, builtin_only=True)
  validation.check_real(*_field(config, "staleness_mean"), low=0, optional=True, builtin_only=True)
  validation.check_real(*_field(config, "staleness_exponent"), low=0, builtin_only=True)
  validation.check_real(*_field(config, "staleness_decay"), low=0, builtin_only=True)
  validation.check_integer(
    *_field(config, "staleness_threshold"), low=0, high=INT32_MAX, optional=True, builtin_only=True
  )
  validation.check_real(*_field(config, "dc_lambda"), low=0, builtin_only=True)
  validation.check_real(*_field(config, "dc_decay"), low=0, high=1, high_open=True, builtin_only=True)
  validation.check_real(*_field(config, "eval_every_epochs"), low=0, low_open=True, builtin_only=True)
  validation.check_integer(*_field(config, "eval_batch_size"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "train_eval_examples"), low=0, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "precise_bn_batches"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "log_every_updates"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "checkpoint_every_seconds"), low=1, high=INT32_MAX, builtin_only=True)
  validation.check_integer(*_field(config, "keep_checkpoints"), low=1, high=INT32_MAX, builtin_only=True)
  epochs = config.lr_decay_epochs
  if not isinstance(epochs, (tuple, list)) or any(
    not validation.is_real(epoch, builtin_only=True) or not math.isfinite(epoch) or epoch <= 0 for epoch in epochs
  ):
    validation.reject("config.lr_decay_epochs", epochs, "a tuple of positive finite epoch numbers, e.g. (30, 60)")
  _check_warmup(config)
  _check_timing(config)
  check_optimizer(config)

  _check_protocol(config, num_devices)
  check_local_runs(config)
  if config.dc_per_learner_mean_square and config.delay_compensation != "adaptive":
    validation.reject(
      "config.dc_per_learner_mean_square",
      True,
      f"False unless delay_compensation='adaptive' (only DC-ASGD-a keeps a MeanSquare; got "
      f"delay_compensation={config.delay_compensation!r})",
    )
  if config.dc_mean_square_bias_correction and config.delay_compensation != "adaptive":
    validation.reject(
      "config.dc_mean_square_bias_correction",
      True,
      f"False unless delay_compensation='adaptive' (only DC-ASGD-a keeps a MeanSquare; got "
      f"delay_compensation={config.delay_compensation!r})",
    )
  if config.dc_per_learner_mean_square and is_decentralized(config):
    validation.reject(
      "config.dc_per_learner_mean_square",
      True,
      f"False for protocol {config.protocol!r} (DC-S3GD keeps one MeanSquare per learner anyway; the field "
      "chooses between the parameter server's two DC-ASGD-a conventions)",
    )
  if config.dc_mean_square_bias_correction and is_decentralized(config):
    validation.reject(
      "config.dc_mean_square_bias_correction",
      True,
      f"False for protocol {config.protocol!r} (DC-S3GD's own adaptive lambda has no bias correction; it is "
      "the parameter server's DC-ASGD-a option)",
    )
  if config.staleness_rule in ("threshold", "hinge") and config.staleness_threshold is None:
    validation.reject(
      "config.staleness_threshold", None, f"an integer >= 0 for staleness_rule={config.staleness_rule!r}"
    )
  timing_model(config)  # TimingModel checks the combination of its fields


def _check_protocol(config, num_devices: int | None) -> None:
  """The protocol's options and combinations, as its row of `stalesgd.schedule.PROTOCOL_TABLE` says."""
  protocol = config.protocol
  row = schedule_lib.protocol_row(protocol)
  for option in row.options.values():
    bound = option.upper_bound(config.learners)
    if option.config_field is not None and bound is not None:
      validation.check_integer(*_field(config, option.config_field), low=option.low, high=bound, builtin_only=True)
  if config.eager_updates and not row.eager:
    validation.reject(
      "config.eager_updates",
      True,
      f"False for protocol {protocol!r} (only {' / '.join(schedule_lib.EAGER_PROTOCOLS)} have eager updates)",
    )
  if not row.decentralized:
    return
  # One learner per device; a one-process run with more devices uses the first M (`_device_layout.runner_mesh`).
  # Before JAX starts (num_devices None) the count is unknown: `train_and_evaluate` checks it.
  if num_devices is not None and (
    config.learners > num_devices or (config.learners < num_devices and jax.process_count() > 1)
  ):
    validation.reject(
      "config.learners",
      config.learners,
      f"protocol {protocol!r} runs one learner per device: set it to the number of devices, {num_devices} (or "
      "fewer in a one-process run, which then uses the first ones)",
    )
  if config.staleness_rule != "none" or config.gap_aware:
    validation.reject(
      "config.staleness_rule" if config.staleness_rule != "none" else "config.gap_aware",
      config.staleness_rule if config.staleness_rule != "none" else config.gap_aware,
      f"'none'/False: protocol {protocol!r} has no per-gradient staleness (every step is S stale)",
    )
  if not row.corrects and config.delay_compensation != "none":
    validation.reject(
      "config.delay_compensation",
      config.delay_compensation,
      f"'none' for protocol {protocol!r}; use protocol="
      f"{schedule_lib.CORRECTED_DECENTRALIZED_PROTOCOLS[0]!r} for the corrected variant",
    )


def _check_warmup(config) -> None:
  """A warm-up has a start rate and ends before the first decay (a start rate without one is unused)."""
  if config.warmup_epochs > 0:
    if config.warmup_learning_rate is None:
      validation.reject(
        "config.warmup_learning_rate",
        None,
        f"a number >= 0 with warmup_epochs={config.warmup_epochs} (the rate at the first update, Goyal et al.'s "
        "small-batch rate)",
      )
    if config.lr_decay_epochs and min(config.lr_decay_epochs) < config.warmup_epochs:
      validation.reject(
        "config.warmup_epochs",
        config.warmup_epochs,
        f"at most the first decay epoch, {min(config.lr_decay_epochs)} (lr_decay_epochs): the warm-up ends "
        "before the first decay",
      )


def _check_multiplier_set(config) -> None:
  """A source's name, with the multipliers on (the model's own sets are checked in `build_run`)."""
  if config.multiplier_set is None:
    return
  if not isinstance(config.multiplier_set, str):
    validation.reject(
      "config.multiplier_set", config.multiplier_set, "None (the model's default) or a source's name, e.g. 'caffe'"
    )
  if not config.model_multipliers:
    validation.reject(
      "config.multiplier_set",
      config.multiplier_set,
      "None unless model_multipliers=True (a multiplier set chooses among the multipliers that flag turns on)",
    )
