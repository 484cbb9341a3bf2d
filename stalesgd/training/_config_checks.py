"""A run's config checked before anything expensive: no data read, nothing compiled.

`validate_config` checks that the config has exactly the fields of `stalesgd.training.default_config`, then each
field's own type and range, as its declaration says (`stalesgd.training._run_config.RUN_SECTIONS`), then the checks
that relate several fields, written here section by section. Every message names the offending field with the
allowed values (``config.<field>=<value>; allowed: ...``, nested fields as ``config.timing.<field>``), with the
checks of `stalesgd._validation`.
"""

from __future__ import annotations

import functools
import math

import jax
import ml_collections

from stalesgd import _validation as validation
from stalesgd import schedule as schedule_lib
from stalesgd.models._loss import check_loss_name
from stalesgd.training._component_checks import check_dataset, check_model, check_optimizer
from stalesgd.training._config_readers import is_decentralized, timing_model
from stalesgd.training._local_runs import check_local_runs
from stalesgd.training._run_config import RUN_SECTIONS, default_config


@functools.cache
def _default_fields() -> dict[str | None, tuple[str, ...]]:
  """The field names of `default_config` (None: top level) and of each nested section."""
  defaults = default_config()
  fields = {None: tuple(sorted(defaults.keys()))}
  for section in RUN_SECTIONS:
    if section.nested:
      fields[section.name] = tuple(sorted(defaults[section.name].keys()))
  return fields


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


# ------------------------------------------------------------------ the checks that relate several fields, by section
def _check_model(config) -> None:
  """The model's name or factory, its multiplier set (with the multipliers on) and the loss's name."""
  check_model(config)
  if config.multiplier_set is not None and not config.model_multipliers:
    validation.reject(
      "config.multiplier_set",
      config.multiplier_set,
      "None unless model_multipliers=True (a multiplier set chooses among the multipliers that flag turns on)",
    )
  check_loss_name(config.loss)


def _check_protocol(config, num_devices: int | None) -> None:
  """The protocol's options and combinations, as its row of `stalesgd.schedule.PROTOCOL_TABLE` says."""
  protocol = config.protocol
  row = schedule_lib.protocol_row(protocol)
  for option in row.options.values():
    bound = option.upper_bound(config.learners)
    if option.config_field is not None and bound is not None:
      name = f"config.{option.config_field}"
      validation.check_integer(name, config[option.config_field], low=option.low, high=bound, builtin_only=True)
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


def _check_timing(config) -> None:
  """The simulated cluster's fields together (`TimingModel` checks the rest of their combination)."""
  timing = config.timing
  if not math.isfinite(timing.compute_time_per_example * config.batch_per_learner):
    validation.reject(
      "config.timing.compute_time_per_example",
      timing.compute_time_per_example,
      f"a number whose product with batch_per_learner={config.batch_per_learner} is finite",
    )
  if timing.jitter == "straggler":
    validation.check_real(
      "config.timing.straggler_prob",
      timing.straggler_prob,
      low=0,
      low_open=True,
      high=1,
      builtin_only=True,
      note="with timing.jitter='straggler' (the share of steps that straggle)",
    )
  else:  # straggler settings without straggler jitter would silently measure nothing
    if timing.straggler_prob != 0:
      validation.reject("config.timing.straggler_prob", timing.straggler_prob, "0.0 unless timing.jitter='straggler'")
    if timing.straggler_factor != 1:
      validation.reject(
        "config.timing.straggler_factor", timing.straggler_factor, "1.0 unless timing.jitter='straggler'"
      )
  factors = timing.speed_factors
  if factors and len(factors) != config.learners:
    validation.reject(
      "config.timing.speed_factors", factors, f"one factor per learner (config.learners={config.learners})"
    )
  if factors and timing.speed_factor_sigma:
    validation.reject(
      "config.timing.speed_factors", factors, "() with timing.speed_factor_sigma > 0 (one source of speeds)"
    )


def _check_optimizer(config) -> None:
  """The solver and its options; a warm-up has a start rate and ends before the first decay."""
  check_optimizer(config)
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


def _check_staleness(config) -> None:
  if config.staleness_rule in ("threshold", "hinge") and config.staleness_threshold is None:
    validation.reject(
      "config.staleness_threshold", None, f"an integer >= 0 for staleness_rule={config.staleness_rule!r}"
    )


def _check_delay_compensation(config) -> None:
  """The MeanSquare options belong to the parameter server's DC-ASGD-a."""
  for field in ("dc_per_learner_mean_square", "dc_mean_square_bias_correction"):
    if config[field] and config.delay_compensation != "adaptive":
      validation.reject(
        f"config.{field}",
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


def validate_config(config: ml_collections.ConfigDict, *, num_devices: int | None) -> None:
  """Checks a run's config before anything expensive happens.

  First its fields (every field of `default_config`, no other), then each field's own type and range in the
  order of `RUN_SECTIONS` (an int field takes a Python int, not a float or a bool; a number field an int or a
  finite float), then the checks that relate several fields, section by section.

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
  for section in RUN_SECTIONS:
    section.check_fields(config)
  check_dataset(config)
  _check_model(config)
  _check_protocol(config, num_devices)
  check_local_runs(config)  # inner and outer
  _check_timing(config)
  _check_optimizer(config)
  _check_staleness(config)
  _check_delay_compensation(config)
  timing_model(config)  # TimingModel checks the combination of its fields
