"""The configuration of one training run: every field declared once, in one table per section.

`default_config()` is the one place where defaults live (big_vision's advice: no ``config.get(key, default)``
scattered through the trainer); every config in `stalesgd.configs` starts from it and overrides what its paper
says. Each field of the tables below (`RUN_SECTIONS`, with ``inner`` and ``outer`` from
`stalesgd.training._local_runs`) carries its default, kind, bounds or choices and a one-line doc
(`stalesgd.training._config_fields`); `default_config`, the fields' own checks
(`stalesgd.training._config_checks.validate_config`, which adds the checks relating several fields) and the field
list of ``stalesgd-train --config_help`` are generated from them. The sections group the flat fields for reading:
on the command line a flat field is ``--config.<field>``, a nested section's ``--config.<section>.<field>``.
Adding a field is one entry here (docs/contributing.md).

The quantities and objects derived from a config (updates per epoch, the simulated schedule, DC-S3GD's settings,
the run's name) are `stalesgd.training._config_readers`. Durations are in epochs (one epoch = the training split's
size in *applied* samples: an update applies c contributions of mu samples each), converted to server updates in
one place, `stalesgd.training._config_readers.updates_per_epoch`.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from stalesgd import schedule as schedule_lib
from stalesgd import transforms
from stalesgd.data._loading import SOURCES
from stalesgd.data._normalization import NORMALIZATIONS
from stalesgd.training._config_fields import (
  INT64_MAX,
  Choice,
  Described,
  Field,
  Flag,
  Integer,
  Numbers,
  Options,
  Real,
  Section,
  Text,
  describe_sections,
  field_paths,
  section_defaults,
)
from stalesgd.training._local_runs import INNER, OUTER

# Every protocol's options, ranges and kind are its row of stalesgd.schedule.PROTOCOL_TABLE.
PARAMETER_SERVER_PROTOCOLS = schedule_lib.PARAMETER_SERVER_PROTOCOLS
DECENTRALIZED_PROTOCOLS = schedule_lib.DECENTRALIZED_PROTOCOLS
PROTOCOLS = schedule_lib.PROTOCOLS
STALENESS_RULES = ("none",) + tuple(transforms.STALENESS_RULES)
DELAY_COMPENSATIONS = ("none", "constant", "adaptive", "layerwise")
WEIGHT_DECAY_PLACEMENTS = ("modulated", "unmodulated")

STORED_DC_LAMBDA = 0.04  # config.dc_lambda's default: "the mode's own lambda_0" (`dc_lambda`)
DC_LAMBDA_DEFAULTS = ("per_mode", "dc_asgd")  # what dc_lambda left at STORED_DC_LAMBDA means (`dc_lambda`)

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


RUN = Section(
  "run",
  "the run's seed",
  (Field("seed", 0, Integer(0, INT64_MAX), "seeds the weights, the data order and the simulated cluster"),),
)

DATA = Section(
  "data",
  "the data set and its pipeline (stalesgd.data.load_dataset)",
  (
    Field(
      "dataset",
      "digits",
      Described("a data set's name for the source, or 'package.module:function' with data_source='python'"),
      "the data set (docs/own_experiment.md for a function of your own)",
    ),
    Field("data_source", "embedded", Choice(SOURCES), "where the data comes from"),
    Field(
      "data_dir",
      None,
      Text("None or the path of a directory (a str)", optional=True),
      "tfds data_dir, or the directory of <dataset>_{train,test}.npz",
    ),
    Field(
      "train_split",
      None,
      Text("None (the data set's usual split) or a split's name", optional=True, nonempty=True),
      "tfds: the split to train on (None: the data set's usual one)",
    ),
    Field(
      "test_split",
      None,
      Text("None (the data set's usual split) or a split's name", optional=True, nonempty=True),
      "tfds: the split to evaluate on (None: the data set's usual one)",
    ),
    Field(
      "image_key", "image", Text("the name of a feature of the tfds data set", nonempty=True), "tfds: the image feature"
    ),
    Field(
      "label_key", "label", Text("the name of a feature of the tfds data set", nonempty=True), "tfds: the label feature"
    ),
    Field(
      "validation_fraction",
      0.0,
      Real(
        0,
        1,
        high_open=True,
        note="(0: evaluate on the test split; in (0, 1): on that share of the training split, held out)",
      ),
      "0: evaluate on the test split; in (0, 1): hold out that share of the training split (the same examples for "
      "every seed), train on the rest and evaluate on it, never reading the test split (a study's pilot)",
    ),
    Field(
      "normalization",
      "per_channel",
      Choice(NORMALIZATIONS),
      "pixel normalization: per_pixel_mean is Caffe's and Rudra's",
    ),
    Field(
      "augment",
      False,
      Flag(),
      "training augmentation (off in Rudra and DC-ASGD Table 1): in memory a pad-4 random crop and flip; tfds "
      "imagenet2012 the Inception random-resized crop and flip; a function of (seed, learner, step)",
    ),
    Field("image_size", 224, Integer(1), "ImageNet's crop side"),
    Field(
      "data_workers",
      default_data_workers,
      Integer(1, MAX_DATA_WORKERS),
      "threads decoding ImageNet's JPEGs (default: this process's cores, at most 8; the pixels do not depend on it)",
      resumable=True,
    ),
  ),
)

MODEL = Section(
  "model",
  "the network and its loss (stalesgd.models.get_model)",
  (
    Field(
      "model",
      "small_cnn",
      Described("a registered model's name, or 'package.module:factory'"),
      "the network (docs/own_experiment.md for a factory of your own)",
    ),
    Field(
      "model_options",
      ml_collections.ConfigDict,
      Options("ml_collections.ConfigDict(hidden_sizes=(32,)) for model='mlp'"),
      "keyword options of the model's factory",
    ),
    Field("model_multipliers", False, Flag(), "Caffe-style per-layer learning-rate and weight-decay multipliers"),
    Field(
      "multiplier_set",
      None,
      Text("None (the model's default) or a source's name, e.g. 'caffe'", optional=True),
      "whose multipliers, for a model published with several (cifar10_full: 'rudra', Rudra's release file, "
      "default, or 'caffe'; alexnet: 'caffe'); None: the model's default",
    ),
    Field(
      "loss",
      "softmax_cross_entropy",
      Text("'softmax_cross_entropy' or an import path 'package.module:function'"),
      "classification's softmax cross-entropy (test error, accuracy, loss), or a function returning per-example "
      "{'loss': ..., metric: ...}",
    ),
  ),
)

PROTOCOL = Section(
  "protocol",
  "the protocol and its cluster of learners (stalesgd.schedule.simulate, stalesgd.decentral)",
  (
    Field("protocol", "hardsync", Choice(PROTOCOLS), "the update protocol (docs/algorithms.md)"),
    Field("learners", 8, Integer(1), "lambda (parameter server) or M (decentralized)"),
    Field("batch_per_learner", 16, Integer(1), "mu: each learner's mini-batch"),
    Field("n", 1, Integer(1), "n of n-softsync and of drop_stale's underlying softsync"),
    Field("ssp_bound", 1, Integer(0), "s of SSP"),
    Field("backup_workers", 1, Integer(0), "b of backup"),
    Field("max_staleness", 4, Integer(0), "drop_stale: gradients staler than this are discarded"),
    Field("allreduce_staleness", 1, Integer(1), "S of s3gd and dcs3gd"),
    Field("eager_updates", False, Flag(), "Kale et al.'s eager updates (s3gd, dcs3gd, streaming_diloco)"),
    Field("num_epochs", 1.0, Real(0, low_open=True), "the run's length in epochs of applied samples"),
    Field(
      "local_steps",
      1,
      Integer(1),
      "H: a contribution is a local run of H inner steps (config.inner for the parameter server, the run's "
      "optimizer for diloco; docs/algorithms.md)",
    ),
    Field(
      "grace_window",
      0.0,
      Real(0),
      "async only: contributions arriving within this many simulated seconds of the first are answered together "
      "(the asynchronous DiLoCo notebook's grace window); 0: none",
    ),
  ),
)

TIMING = Section(
  "timing",
  "the simulated cluster's timing model, in simulated seconds (stalesgd.schedule.TimingModel)",
  (
    Field("compute_time_per_example", 1e-3, Real(0, low_open=True), "a step's base time is this x mu"),
    Field("jitter", "lognormal", Choice(schedule_lib.JITTERS), "the distribution of a step's time around its base"),
    Field("jitter_sigma", 0.1, Real(0), "the jitter's spread"),
    Field(
      "straggler_prob",
      0.0,
      Real(0, 1),
      "with jitter='straggler': the share of steps that straggle (> 0); otherwise 0",
    ),
    Field(
      "straggler_factor",
      1.0,
      Real(1),
      "with jitter='straggler': the slowdown of a straggling step; otherwise 1",
    ),
    Field("speed_factor_sigma", 0.0, Real(0), "spread of the learners' random fixed speed factors; 0: none"),
    Field(
      "speed_factors",
      (),
      Numbers("a tuple of positive numbers, one per learner, or ()", finite=False),
      "fixed per-learner speed factors, one per learner; (): none",
    ),
    Field("latency", 0.0, Real(0), "seconds per message"),
    Field("bandwidth", 0.0, Real(0, allow_inf=True), "bytes/s; 0: infinite"),
    Field(
      "model_bytes", 0, Integer(0, INT64_MAX), "bytes per push, pull or all-reduce; 0: the model's float32 weights"
    ),
    Field("server_shards", 1, Integer(1), "parameter-server shards sharing the traffic"),
    Field("apply_time", 0.0, Real(0), "seconds the server takes to apply an update"),
  ),
  nested=True,
)

OPTIMIZER = Section(
  "optimizer",
  "the optimizer: the server's for parameter-server protocols, each learner's for decentralized ones",
  (
    Field("learning_rate", 0.05, Real(0, low_open=True), "alpha_0"),
    Field(
      "lr_decay_epochs",
      (),
      Numbers("a tuple of positive finite epoch numbers, e.g. (30, 60)"),
      "multiply the learning rate by lr_decay_factor at these epochs",
    ),
    Field("lr_decay_factor", 0.1, Real(0, low_open=True), "the decay's factor"),
    Field(
      "warmup_epochs",
      0.0,
      Real(0),
      "gradual warm-up (Goyal et al. 2017; 0: off): the rate rises linearly per update from warmup_learning_rate "
      "to learning_rate over these epochs",
    ),
    Field("warmup_learning_rate", None, Real(0, optional=True), "the warm-up's start rate (the small-batch rate)"),
    Field("momentum", 0.9, Real(0, 1, high_open=True), "the solver's momentum"),
    Field("nesterov", False, Flag(), "Nesterov momentum"),
    Field("weight_decay", 0.0, Real(0), "L2 weight decay"),
    Field(
      "weight_decay_placement",
      "modulated",
      Choice(WEIGHT_DECAY_PLACEMENTS),
      "modulated (the papers): decay joins each gradient before the staleness weight; unmodulated (ablation): "
      "added once after the weighted average, at alpha_t",
    ),
    Field(
      "optimizer",
      "sgd",
      Text("'sgd', an optax optimizer's name, or 'package.module:factory'"),
      "the solver: 'sgd' (the papers' Caffe SGD), an optax optimizer by name ('adam', 'lamb', ...) or a factory",
    ),
    Field(
      "optimizer_options",
      ml_collections.ConfigDict,
      Options("ml_collections.ConfigDict(b1=0.9) for optimizer='adam'"),
      "the solver's keyword options (e.g. b1, b2, eps; AdamW's weight_decay)",
    ),
  ),
)

STALENESS = Section(
  "staleness",
  "the staleness-dependent learning rate, per contribution (stalesgd.scale_by_staleness)",
  (
    Field(
      "staleness_rule",
      "none",
      Choice(STALENESS_RULES),
      "inverse: Zhang et al.'s alpha_0/sigma; inverse_mean: Rudra's alpha_0/<sigma>; ...",
    ),
    Field("staleness_mean", None, Real(0, optional=True), "<sigma> for inverse_mean and normalize; None: tracked"),
    Field("staleness_exponent", 0.5, Real(0), "the polynomial rule's exponent"),
    Field("staleness_decay", 0.5, Real(0), "b of the exponential rule (the transforms call it rate)"),
    Field("staleness_threshold", None, Integer(0, optional=True), "the threshold and hinge rules' threshold"),
    Field("staleness_normalize", False, Flag(), "divide the weights by their mean"),
  ),
)

DELAY_COMPENSATION = Section(
  "delay compensation",
  "DC-ASGD's first-order correction (stalesgd.scale_by_delay_compensation) or DC-S3GD's lambda",
  (
    Field(
      "delay_compensation",
      "none",
      Choice(DELAY_COMPENSATIONS),
      "constant: DC-ASGD-c; adaptive: DC-ASGD-a; layerwise: DC-S3GD's (dcs3gd corrects even with none, with its "
      "own default)",
    ),
    Field(
      "dc_lambda",
      STORED_DC_LAMBDA,
      Real(0),
      "lambda_0; left at 0.04 it is the mode's own (constant 0.04, adaptive 2.0, layerwise 0.2)",
    ),
    Field(
      "dc_lambda_default",
      "per_mode",
      Choice(DC_LAMBDA_DEFAULTS),
      "what dc_lambda left at 0.04 means: per_mode (above) or dc_asgd (0.04 in every mode, as runs started before "
      "the per-mode defaults ran)",
    ),
    Field("dc_decay", 0.95, Real(0, 1, high_open=True), "m of DC-ASGD-a's MeanSquare"),
    Field(
      "dc_per_learner_mean_square",
      False,
      Flag(),
      "DC-ASGD-a on the parameter server: one MeanSquare per learner instead of one",
    ),
    Field(
      "dc_mean_square_bias_correction",
      False,
      Flag(),
      "ablation, not the paper's rule: DC-ASGD-a's MeanSquare divided by its blend weight (Adam-style)",
    ),
    Field("gap_aware", False, Flag(), "Gap-Aware's per-parameter damping of stale gradients"),
  ),
)

EVALUATION = Section(
  "evaluation",
  "evaluation and logging",
  (
    Field(
      "eval_every_epochs", 1.0, Real(0, low_open=True), "evaluate every this many epochs (and after the last update)"
    ),
    Field("eval_batch_size", 512, Integer(1), "examples per evaluation batch", resumable=True),
    Field("train_eval_examples", 2048, Integer(0), "train accuracy on a fixed subset of this size"),
    Field("precise_bn_batches", 8, Integer(1), "batches that re-estimate batch-norm statistics before evaluating"),
    Field("log_every_updates", 100, Integer(1), "log training metrics every this many updates", resumable=True),
  ),
)

CHECKPOINTING = Section(
  "checkpointing",
  "checkpoints (stalesgd.training.checkpoint)",
  (
    Field(
      "checkpoint_every_seconds", 300, Integer(1), "save a checkpoint every this many wall seconds", resumable=True
    ),
    Field("keep_checkpoints", 2, Integer(1), "checkpoints kept", resumable=True),
  ),
)

RUN_SECTIONS = (
  RUN,
  DATA,
  MODEL,
  PROTOCOL,
  INNER,
  OUTER,
  TIMING,
  OPTIMIZER,
  STALENESS,
  DELAY_COMPENSATION,
  EVALUATION,
  CHECKPOINTING,
)
"""Every section, in the order of `default_config` and of ``--config_help``."""

RESUMABLE_FIELDS = field_paths(RUN_SECTIONS, where=lambda field: field.resumable)
"""Fields a resumed run may change: when to log or save, how to batch evaluation or how many threads decode."""


def default_config() -> ml_collections.ConfigDict:
  """Every field of a run at its default (`RUN_SECTIONS`): a run that trains the embedded digits quickly."""
  return section_defaults(RUN_SECTIONS)


def describe_config(config: ml_collections.ConfigDict | None = None) -> str:
  """Every config field by section: its name on the command line, its value in ``config`` (default: its
  default), the values it takes and what it does (``stalesgd-train --config_help``)."""
  return describe_sections(RUN_SECTIONS, defaults=default_config() if config is None else config)


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


def set_field(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
  """Sets ``config.<field>``, where ``field`` may name a nested section's field with dots (``"timing.jitter"``).

  The config's shape (docs/api.md, *The config's shape*): the run's fields are flat, and a group of options
  added later is a nested section; overrides, study variants and error messages name a nested field
  ``section.field``, as ``--config.section.field=VALUE`` does on the command line.

  Raises:
    ValueError: for a field the config does not have, naming the nearest field.
  """
  *sections, name = field.split(".")
  target = config
  for depth, section in enumerate(sections):
    if section not in target or not isinstance(target[section], ml_collections.ConfigDict):
      raise ValueError(_unknown_field(config, ".".join(sections[: depth + 1])))
    target = target[section]
  if name not in target:
    raise ValueError(_unknown_field(config, field))
  target[name] = value


def _unknown_field(config: ml_collections.ConfigDict, field: str) -> str:
  known = list(flatten_config(config)) + [key for key in config if isinstance(config[key], ml_collections.ConfigDict)]
  nearest = difflib.get_close_matches(field, known, n=1)
  hint = f"; did you mean config.{nearest[0]}?" if nearest else ""
  return (
    f"config.{field}: no such config field{hint} (allowed: a field of default_config(), nested ones as section.field)"
  )
