"""Every field of `default_config()` given wrong types and out-of-range values: a ValueError naming it, or nothing.

For each field (``timing.*`` included), a table below says which values are
valid in a given context (the default config, or one with the fields the
value depends on set, e.g. ``protocol='softsync'`` for ``n <= learners``).
Each field is then tried with a fixed list of bad and borderline values
(str for a number, float for an int, bool, None, 0, negative, huge, NaN,
infinities, containers, numpy scalars) and with values drawn from a seeded
`random.Random`. `validate_config(config, num_devices=8)` must

* raise ValueError whose message names the field (``config.<field>=...``, or
  ``config.timing: <field>`` for what `TimingModel` checks) when the table says
  the value is invalid: never another exception type, never silence;
* accept the value when the table says it is valid (so the table is not
  simply "everything is invalid").

Configs are built with ``type_safe=False`` so that any value reaches
`validate_config` (a config file can build such a config; the command line's
typed flags cannot). A table entry is required for every field: a new field
without one fails `test_the_table_covers_every_field`.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import ml_collections
import numpy as np
import pytest

from stalesgd import models
from stalesgd.data._normalization import NORMALIZATIONS
from stalesgd.data._tfds_source import TFDS_SPLITS
from stalesgd.schedule import JITTERS
from stalesgd.training._config_checks import validate_config
from stalesgd.training._run_config import (
  DC_LAMBDA_DEFAULTS,
  DELAY_COMPENSATIONS,
  PROTOCOLS,
  STALENESS_RULES,
  WEIGHT_DECAY_PLACEMENTS,
  default_config,
)
from stalesgd.training._solvers import optax_optimizers

NUM_DEVICES = 8
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SEED = 20240612
RANDOM_VALUES_PER_FIELD = 30


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def ints(low: int, high: int = INT32_MAX, *, optional: bool = False) -> Callable[[Any], bool]:
  return lambda value: (optional and value is None) or (_is_int(value) and low <= value <= high)


def numbers(
  low: float,
  *,
  strict: bool = False,
  high: float | None = None,
  high_inclusive: bool = False,
  optional: bool = False,
  allow_inf: bool = False,
) -> Callable[[Any], bool]:
  def valid(value: Any) -> bool:
    if optional and value is None:
      return True
    if not _is_number(value) or math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
      return False
    above = value > low if strict else value >= low
    below = high is None or (value <= high if high_inclusive else value < high)
    return above and below

  return valid


def _kind(value: Any) -> Any:
  return "bool" if isinstance(value, bool) else "number" if _is_number(value) else type(value)


def exactly(*allowed: Any) -> Callable[[Any], bool]:
  """Equal to one of ``allowed`` and of its kind (0 and 0.0 alike; False, 0 and np.int64(0) not)."""
  return lambda value: any(_kind(value) == _kind(option) and value == option for option in allowed)


def choice(options) -> Callable[[Any], bool]:
  return lambda value: isinstance(value, str) and value in tuple(options)


def flags(value: Any) -> bool:
  return isinstance(value, bool)


def optional_str(value: Any) -> bool:
  return value is None or isinstance(value, str)


def non_empty_str(value: Any) -> bool:
  return isinstance(value, str) and bool(value)


def optional_non_empty_str(value: Any) -> bool:
  return value is None or non_empty_str(value)


def tfds_name(value: Any) -> bool:
  return non_empty_str(value) and ":" not in value


def empty_mapping(value: Any) -> bool:
  return isinstance(value, (ml_collections.ConfigDict, dict)) and not value


def adam_options(value: Any) -> bool:
  # optax.adam's own options; its learning_rate and nesterov are config fields
  return isinstance(value, (ml_collections.ConfigDict, dict)) and set(value) <= {
    "b1",
    "b2",
    "eps",
    "eps_root",
    "mu_dtype",
  }


def file_prefix(value: Any) -> bool:
  return non_empty_str(value) and "/" not in value


def epochs(value: Any) -> bool:
  return isinstance(value, (tuple, list)) and all(
    _is_number(epoch) and math.isfinite(epoch) and epoch > 0 for epoch in value
  )


def mapping(value: Any) -> bool:
  return isinstance(value, (ml_collections.ConfigDict, dict))


def timing_fields(value: Any) -> bool:
  return isinstance(value, ml_collections.ConfigDict) and set(value.keys()) == set(default_config().timing.keys())


def inner_fields(value: Any) -> bool:
  return isinstance(value, ml_collections.ConfigDict) and set(value.keys()) == set(default_config().inner.keys())


def outer_fields(value: Any) -> bool:
  return isinstance(value, ml_collections.ConfigDict) and set(value.keys()) == set(default_config().outer.keys())


_DILOCO_SGD = {"protocol": "diloco", "outer.momentum": 0.0, "outer.nesterov": False}  # any optimizer may follow


class Case(NamedTuple):
  """Values of ``field`` that are valid in the default config updated with ``context``."""

  field: str
  valid: Callable[[Any], bool]
  context: dict[str, Any] = {}
  extra: tuple = ()  # field-specific values to try besides the common ones


_SERVER_RULES = tuple(rule for rule in STALENESS_RULES if rule not in ("threshold", "hinge"))
CASES = [
  Case("seed", ints(0, INT64_MAX), extra=(INT64_MAX, INT64_MAX + 1)),
  Case("dataset", exactly("digits"), extra=("cifar10", "mnist")),
  Case("dataset", file_prefix, {"data_source": "npz", "data_dir": "/data"}, extra=("cifar10", "a/b")),
  Case("dataset", tfds_name, {"data_source": "tfds"}, extra=tuple(TFDS_SPLITS) + ("svhn", "", "pkg.data:load")),
  Case("data_source", exactly("embedded", "tfds"), extra=("tfds", "npz", "embedded", "python")),
  Case(
    "data_source",
    exactly("npz", "tfds"),
    {"dataset": "cifar10", "data_dir": "/data"},
    extra=("tfds", "npz", "embedded"),
  ),
  Case("train_split", optional_non_empty_str, extra=("train", "train[:80%]", "")),
  Case("test_split", optional_non_empty_str, extra=("test", "validation", "")),
  Case("image_key", non_empty_str, extra=("image", "")),
  Case("label_key", non_empty_str, extra=("coarse_label", "")),
  Case("data_dir", optional_str, extra=("/data", "")),
  Case("data_dir", non_empty_str, {"data_source": "npz"}, extra=("data", "")),
  Case("normalization", choice(NORMALIZATIONS), extra=NORMALIZATIONS + ("zca", "Per_channel")),
  Case("augment", flags),
  Case("image_size", ints(1)),
  Case("data_workers", ints(1, 256), extra=(256, 257)),
  Case("model", choice(models.available_models()), extra=models.available_models() + ("resnet7",)),
  Case("model_options", mapping, extra=({}, {"hidden_sizes": (8,)}, "hidden_sizes=8", ("hidden_sizes", 8))),
  Case("model_multipliers", flags),
  Case("multiplier_set", exactly(None), extra=("caffe", "rudra")),
  Case("multiplier_set", optional_str, {"model_multipliers": True}, extra=("caffe", "rudra", "")),
  Case("loss", exactly("softmax_cross_entropy"), extra=("softmax_cross_entropy", "mse", "a:b", "")),
  Case("optimizer", exactly("sgd"), extra=("sgd", "adam", "sgd:x", "SGD")),
  Case("optimizer", choice(("sgd",) + optax_optimizers()), {"momentum": 0.0}, extra=("adam", "lamb", "adamz", "a:b")),
  Case("optimizer_options", empty_mapping, extra=({}, {"b1": 0.9}, "b1=0.9", ("b1", 0.9))),
  Case(
    "optimizer_options",
    adam_options,
    {"optimizer": "adam", "momentum": 0.0},
    extra=({"b1": 0.8}, {"beta": 1}, {"nesterov": True}, {"learning_rate": 0.1}),
  ),
  Case("protocol", choice(PROTOCOLS), extra=PROTOCOLS + ("gossip", "ASYNC")),
  Case("learners", ints(1)),
  Case("learners", ints(1, NUM_DEVICES), {"protocol": "dcs3gd"}, extra=(4, 8, 16)),  # one process: M <= devices
  Case("batch_per_learner", ints(1)),
  Case("n", ints(1)),
  Case("n", ints(1, 8), {"protocol": "softsync"}, extra=(7, 8, 9)),
  Case("n", ints(1, 8), {"protocol": "drop_stale"}, extra=(8, 9)),
  Case("ssp_bound", ints(0)),
  Case("ssp_bound", ints(0), {"protocol": "ssp"}),
  Case("backup_workers", ints(0)),
  Case("backup_workers", ints(0, 7), {"protocol": "backup"}, extra=(6, 7, 8)),
  Case("max_staleness", ints(0)),
  Case("max_staleness", ints(0), {"protocol": "drop_stale"}),
  Case("allreduce_staleness", ints(1)),
  Case("allreduce_staleness", ints(1), {"protocol": "dcs3gd"}),
  Case("eager_updates", exactly(False)),
  Case("eager_updates", flags, {"protocol": "s3gd"}),
  Case("num_epochs", numbers(0, strict=True)),
  Case("validation_fraction", numbers(0, high=1)),
  Case("local_steps", ints(1)),
  Case("local_steps", ints(1, 1), {"protocol": "s3gd"}, extra=(2,)),
  Case("inner", inner_fields, extra=("sgd", default_config().inner.to_dict())),
  Case("inner.optimizer", choice(("sgd",) + optax_optimizers()), extra=("adam", "adamz", "a:b", "SGD")),
  Case("inner.learning_rate", numbers(0, strict=True)),
  Case("inner.momentum", numbers(0, high=1), extra=(0.999, 1.0)),
  Case("inner.momentum", exactly(0, 0.0), {"protocol": "s3gd"}, extra=(0.5,)),
  Case("inner.nesterov", flags),
  Case("inner.options", empty_mapping, extra=({}, {"b1": 0.9}, "b1=0.9", {"momentum": 0.9})),
  Case("inner.reset_state", flags),
  Case("inner.dynamic_min_steps", ints(0, 1), extra=(1, 2)),
  Case("inner.dynamic_min_steps", ints(0, 4), {"local_steps": 4}, extra=(4, 5)),
  Case("inner.data_shards", ints(0), extra=(4, 2**31)),
  Case("inner.cosine_steps", ints(0, 2**62), extra=(8000, 2**62 + 1)),
  Case("inner.cosine_final_rate", numbers(0), extra=(1e-6,)),
  Case("inner.restart_at_peak", exactly(False), extra=(True,)),
  Case("inner.restart_at_peak", flags, {"inner.cosine_steps": 8}),
  Case("local_steps", ints(1), {"protocol": "diloco"}),
  Case("grace_window", exactly(0.0), extra=(0.5,)),
  Case("grace_window", numbers(0), {"protocol": "async"}, extra=(0.5, 1e9)),
  Case("outer", outer_fields, extra=("sgd", default_config().outer.to_dict())),
  # A parameter-server protocol has no outer step: config.outer keeps its defaults.
  Case("outer.optimizer", exactly("sgd"), extra=("adam",)),
  Case("outer.optimizer", choice(("sgd",) + optax_optimizers()), _DILOCO_SGD, extra=("adam", "adamz", "a:b", "SGD")),
  Case("outer.learning_rate", exactly(0.7), extra=(0.5,)),
  Case("outer.learning_rate", numbers(0, strict=True), {"protocol": "diloco"}),
  Case("outer.momentum", exactly(0.9), extra=(0.0,)),
  Case("outer.momentum", numbers(0, high=1), {"protocol": "diloco"}, extra=(0.999, 1.0)),
  Case("outer.nesterov", exactly(True), extra=(False,)),
  Case("outer.nesterov", flags, {"protocol": "diloco"}),
  Case("outer.options", empty_mapping, extra=({}, {"b1": 0.9})),
  Case("outer.options", empty_mapping, {"protocol": "diloco"}, extra=({}, {"b1": 0.9}, "b1=0.9", {"momentum": 0.9})),
  Case("outer.reset_inner_state", exactly(False), extra=(True,)),
  Case("outer.reset_inner_state", flags, {"protocol": "diloco"}),
  Case("outer.fragments", ints(1, 1), extra=(2,)),  # a count: 1.0 is refused whatever the protocol
  Case(
    "outer.fragments",
    lambda value: _is_int(value) and value in (1, 2, 4),  # the divisors of H = 4
    {"protocol": "streaming_diloco", "local_steps": 4},
    extra=(2, 3, 4, 8),
  ),
  Case("outer.delay", ints(0, 0), {"protocol": "diloco"}, extra=(1,)),
  Case("outer.delay", ints(0, 4), {"protocol": "streaming_diloco", "local_steps": 4}, extra=(4, 5)),
  Case("outer.mix", exactly(0.0), extra=(0.5,)),
  Case("outer.mix", numbers(0, high=1, high_inclusive=True), {"protocol": "streaming_diloco"}, extra=(1.0, 1.5)),
  Case("outer.fragment_pattern", exactly("strided"), extra=("sequential",)),
  Case(
    "outer.fragment_pattern",
    choice(("strided", "sequential", "array_strided")),
    {"protocol": "streaming_diloco"},
    extra=("sequential", "array_strided", "Strided", "layers"),
  ),
  Case("timing", timing_fields, extra=("lognormal", default_config().timing.to_dict())),
  Case(
    "timing.compute_time_per_example",  # times batch_per_learner (16) it is the simulated compute time
    lambda value: numbers(0, strict=True)(value) and math.isfinite(value * 16),
    extra=(1e307, 1e306),
  ),
  Case(
    "timing.jitter", choice(tuple(jitter for jitter in JITTERS if jitter != "straggler")), extra=JITTERS + ("cauchy",)
  ),
  Case("timing.jitter", choice(("straggler",)), {"timing.straggler_prob": 0.1}, extra=JITTERS),
  Case("timing.jitter_sigma", numbers(0)),
  Case("timing.straggler_prob", exactly(0.0), extra=(0.0, 0, 0.1)),
  Case(
    "timing.straggler_prob",
    numbers(0, strict=True, high=1, high_inclusive=True),
    {"timing.jitter": "straggler", "timing.straggler_factor": 2.0},
    extra=(1.0, 1.0 + 1e-9),
  ),
  Case("timing.straggler_factor", exactly(1.0), extra=(1.0, 1, 2.0)),
  Case(
    "timing.straggler_factor",
    numbers(1),
    {"timing.jitter": "straggler", "timing.straggler_prob": 0.1},
    extra=(1.0, 0.999),
  ),
  Case("timing.speed_factor_sigma", numbers(0)),
  Case(
    "timing.speed_factors",  # () or one positive finite number per learner
    lambda value: (
      isinstance(value, (tuple, list))
      and (
        not value
        or (
          len(value) == default_config().learners
          and all(_is_number(factor) and math.isfinite(factor) and factor > 0 for factor in value)
        )
      )
    ),
    extra=((), (1.0,) * default_config().learners, (2,) * default_config().learners, (1.0, 2.0), (0.0,) * 4),
  ),
  Case("timing.latency", numbers(0)),
  Case("timing.bandwidth", numbers(0, allow_inf=True), extra=(1.25e9,)),
  Case("timing.model_bytes", ints(0, INT64_MAX), extra=(4 * 10**9, INT64_MAX)),
  Case("timing.server_shards", ints(1)),
  Case("timing.apply_time", numbers(0)),
  Case("learning_rate", numbers(0, strict=True)),
  Case("lr_decay_epochs", epochs, extra=((30, 60), [30.5], (0,), (-1,), (math.nan,), (True,), ("30",), 30, "30")),
  Case("lr_decay_factor", numbers(0, strict=True)),
  Case("warmup_epochs", exactly(0), extra=(0.5,)),
  Case("warmup_epochs", numbers(0), {"warmup_learning_rate": 0.001}, extra=(0.5,)),
  Case("warmup_learning_rate", numbers(0, optional=True), extra=(0.001,)),
  Case("warmup_learning_rate", numbers(0), {"warmup_epochs": 0.5}, extra=(0.001,)),
  Case("momentum", numbers(0, high=1), extra=(0.999, 1.0)),
  Case("nesterov", flags),
  Case("weight_decay", numbers(0)),
  Case("weight_decay_placement", choice(WEIGHT_DECAY_PLACEMENTS), extra=WEIGHT_DECAY_PLACEMENTS + ("before_dc",)),
  Case("staleness_rule", choice(_SERVER_RULES), extra=STALENESS_RULES + ("sqrt",)),
  Case(
    "staleness_rule", choice(STALENESS_RULES), {"protocol": "async", "staleness_threshold": 3}, extra=STALENESS_RULES
  ),
  Case("staleness_rule", exactly("none"), {"protocol": "dcs3gd"}, extra=STALENESS_RULES),
  Case("staleness_mean", numbers(0, optional=True)),
  Case("staleness_exponent", numbers(0)),
  Case("staleness_decay", numbers(0)),
  Case("staleness_threshold", ints(0, optional=True)),
  Case("staleness_threshold", ints(0), {"staleness_rule": "threshold"}),
  Case("staleness_normalize", flags),
  Case("delay_compensation", choice(DELAY_COMPENSATIONS), extra=DELAY_COMPENSATIONS + ("taylor",)),
  Case("delay_compensation", exactly("none"), {"protocol": "s3gd"}, extra=DELAY_COMPENSATIONS),
  Case("dc_lambda", numbers(0)),
  Case("dc_lambda_default", choice(DC_LAMBDA_DEFAULTS), extra=DC_LAMBDA_DEFAULTS + ("constant",)),
  Case("dc_decay", numbers(0, high=1), extra=(0.999, 1.0)),
  Case("dc_per_learner_mean_square", exactly(False)),
  Case("dc_per_learner_mean_square", flags, {"protocol": "async", "delay_compensation": "adaptive"}),
  Case("dc_mean_square_bias_correction", exactly(False)),
  Case("dc_mean_square_bias_correction", flags, {"protocol": "async", "delay_compensation": "adaptive"}),
  Case("dc_mean_square_bias_correction", exactly(False), {"protocol": "dcs3gd", "delay_compensation": "adaptive"}),
  Case("gap_aware", flags),
  Case("gap_aware", exactly(False), {"protocol": "dcs3gd"}),
  Case("eval_every_epochs", numbers(0, strict=True)),
  Case("eval_batch_size", ints(1)),
  Case("train_eval_examples", ints(0)),
  Case("precise_bn_batches", ints(1)),
  Case("log_every_updates", ints(1)),
  Case("checkpoint_every_seconds", ints(1)),
  Case("keep_checkpoints", ints(1)),
]

# Tried on every field: wrong types, zero, negative, huge, non-finite, borderline.
COMMON_VALUES = (
  None,
  True,
  False,
  0,
  1,
  2,
  -1,
  0.0,
  0.5,
  1.0,
  1.5,
  -0.5,
  1e-300,
  1e308,
  10**30,
  -(10**30),
  2**31 - 1,
  2**31,
  2**63,
  2**64,
  math.nan,
  math.inf,
  -math.inf,
  "",
  "1",
  "0.5",
  "True",
  "none",
  "abc",
  b"1",
  [],
  [1],
  (),
  (1,),
  {"a": 1},
  1j,
  np.int64(3),
  np.float32(0.5),
  np.bool_(True),
)


def random_values(generator: random.Random) -> list[Any]:
  """Values of every kind, from the seeded generator."""
  values = []
  for _ in range(RANDOM_VALUES_PER_FIELD):
    kind = generator.randrange(6)
    if kind == 0:
      values.append(generator.randint(-(10**6), 10**6))
    elif kind == 1:
      values.append(generator.randint(-(2**70), 2**70))
    elif kind == 2:
      values.append(generator.uniform(-10.0, 10.0))
    elif kind == 3:
      values.append(10.0 ** generator.uniform(-30, 30) * generator.choice((1, -1)))
    elif kind == 4:
      values.append("".join(generator.choice("abcxyz019._-") for _ in range(generator.randint(0, 8))))
    else:
      values.append(tuple(generator.uniform(-5, 100) for _ in range(generator.randint(0, 3))))
  return values


def config_with(context: dict[str, Any], field: str, value: Any) -> ml_collections.ConfigDict:
  """The default config with ``context`` and ``field = value`` set, whatever their types."""
  config = ml_collections.ConfigDict(default_config().to_dict(), type_safe=False)
  for name, setting in {**context, field: value}.items():
    _set(config, name, setting)
  return config


def _set(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
  *parents, leaf = field.split(".")
  for parent in parents:
    config = config[parent]
  config[leaf] = value


def names_the_field(message: str, field: str) -> bool:
  """``config.<field>=`` / ``config.<field>.`` (a nested field of it), ``config.timing: <leaf>`` (`TimingModel`'s
  own checks), or ``<field>=`` in what is allowed (a combination: "... unless timing.jitter='straggler'")."""
  parent, _, leaf = field.rpartition(".")
  return bool(re.search(rf"(config\.|(?<![\w.])){re.escape(field)}[=.]", message)) or (
    bool(parent) and bool(re.search(rf"config\.{re.escape(parent)}: {re.escape(leaf)}[ =]", message))
  )


def field_paths(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Every field's dotted name; ``timing`` and ``model_options`` themselves too (they can be given wrongly)."""
  paths = []
  for name in config.keys():
    paths.append(prefix + name)
    if isinstance(config[name], ml_collections.ConfigDict):
      paths.extend(field_paths(config[name], f"{prefix}{name}."))
  return paths


def test_the_table_covers_every_field():
  assert set(field_paths(default_config())) == {case.field for case in CASES}


def test_the_default_config_is_valid():
  validate_config(default_config(), num_devices=NUM_DEVICES)


def _value_of(config, field):
  for name in field.split("."):
    config = config[name]
  return config


@pytest.mark.parametrize(
  "case",
  CASES,
  ids=lambda case: f"{case.field}{'|' if case.context else ''}{','.join(f'{k}={v}' for k, v in case.context.items())}",
)
def test_every_bad_value_is_refused_naming_the_field_and_every_good_one_accepted(case):
  generator = random.Random(f"{SEED}:{case.field}:{sorted(case.context.items())}")
  values = [_value_of(default_config(), case.field), *COMMON_VALUES, *case.extra, *random_values(generator)]
  problems, judged = [], set()
  config = config_with(case.context, case.field, values[0])
  for value in values:
    _set(config, case.field, value)
    try:
      validate_config(config, num_devices=NUM_DEVICES)
      error = None
    except ValueError as caught:
      error = caught
    except Exception as caught:  # any other type is the failure reported
      problems.append(f"{value!r}: {type(caught).__name__} instead of ValueError: {caught}")
      continue
    # A dict given for a mapping field arrives as a ConfigDict; judge what validate_config saw.
    seen = _value_of(config, case.field)
    judged.add(case.valid(seen))
    if case.valid(seen):
      if error is not None:
        problems.append(f"{value!r} is valid but was refused: {error}")
    elif error is None:
      problems.append(f"{value!r} is invalid but was accepted")
    elif not names_the_field(str(error), case.field):
      problems.append(f"{value!r} was refused without naming config.{case.field}: {error}")
  assert not problems, f"config.{case.field} (context {case.context}):\n" + "\n".join(problems)
  assert judged == {True, False}, "the values tried must include valid and invalid ones"


@pytest.mark.parametrize("field", ["learners", "timing.jitter_sigma", "keep_checkpoints"])
def test_a_missing_field_is_named(field):
  config = ml_collections.ConfigDict(default_config().to_dict(), type_safe=False)
  *parents, leaf = field.split(".")
  node = config
  for parent in parents:
    node = node[parent]
  del node[leaf]
  with pytest.raises(ValueError, match=rf"config\.{field} is missing"):
    validate_config(config, num_devices=NUM_DEVICES)


@pytest.mark.parametrize("field", ["learnig_rate", "timing.jiter"])
def test_a_misspelt_field_is_named_instead_of_ignored(field):
  config = config_with({}, field, 0.1)
  with pytest.raises(ValueError, match=rf"config\.{field} is not a field; allowed: one of \("):
    validate_config(config, num_devices=NUM_DEVICES)
