"""The configuration of one training run: every field and its default.

`default_config()` is the one place where defaults live (big_vision's advice: no ``config.get(key, default)``
scattered through the trainer); every config in `stalesgd.configs` starts from it and overrides what its paper
says. Its checks are `stalesgd.training._config_checks.validate_config`; the quantities and objects derived from
it (updates per epoch, the simulated schedule, DC-S3GD's settings, the run's name) are
`stalesgd.training._config_readers`.

Durations are in epochs (one epoch = the training split's size in *applied* samples: an update applies c
contributions of mu samples each), converted to server updates in one place,
`stalesgd.training._config_readers.updates_per_epoch`.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from stalesgd import schedule as schedule_lib
from stalesgd import transforms
from stalesgd.training._local_runs import default_inner, default_outer

# Every protocol's options, ranges and kind are its row of stalesgd.schedule.PROTOCOL_TABLE.
PARAMETER_SERVER_PROTOCOLS = schedule_lib.PARAMETER_SERVER_PROTOCOLS
DECENTRALIZED_PROTOCOLS = schedule_lib.DECENTRALIZED_PROTOCOLS
PROTOCOLS = schedule_lib.PROTOCOLS
STALENESS_RULES = ("none",) + tuple(transforms.STALENESS_RULES)
DELAY_COMPENSATIONS = ("none", "constant", "adaptive", "layerwise")
WEIGHT_DECAY_PLACEMENTS = ("modulated", "unmodulated")


STORED_DC_LAMBDA = 0.04  # config.dc_lambda's default: "the mode's own lambda_0" (`dc_lambda`)
DC_LAMBDA_DEFAULTS = ("per_mode", "dc_asgd")  # what dc_lambda left at STORED_DC_LAMBDA means (`dc_lambda`)


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
  # 0: evaluate on the test split. In (0, 1): hold out that share of the training split (the same examples for
  # every seed, stalesgd.data._validation_split), train on the rest and evaluate on it; the test split is never
  # read (a study's pilot, docs/studies.md). The run's test_* metrics are then the validation split's.
  config.validation_fraction = 0.0
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
  # Local runs (stalesgd.training._local_runs, docs/algorithms.md §7): a contribution is local_steps = H steps.
  # Parameter-server protocols: config.inner is each learner's inner optimizer (optimizer, learning_rate, momentum,
  # nesterov, options, reset_state) and the server applies minus their summed updates as a gradient; the defaults,
  # H = 1 and inner SGD at rate 1, make a contribution one gradient, as before these fields. diloco: the run's
  # optimizer fields are each learner's inner optimizer and config.outer the outer step (DiLoCo's Nesterov SGD).
  config.local_steps = 1
  config.inner = default_inner()
  config.outer = default_outer()
  # async only: contributions arriving within this many simulated seconds of the first are answered together, so
  # their learners restart from the same version (the asynchronous DiLoCo notebook's grace window); 0: none.
  config.grace_window = 0.0

  # Timing model (stalesgd.schedule.TimingModel): simulated seconds.
  config.timing = ml_collections.ConfigDict()
  config.timing.compute_time_per_example = 1e-3  # base(mu) = this x mu
  config.timing.jitter = "lognormal"
  config.timing.jitter_sigma = 0.1
  config.timing.straggler_prob = 0.0
  config.timing.straggler_factor = 1.0
  config.timing.speed_factor_sigma = 0.0
  config.timing.speed_factors = ()  # fixed per-learner factors (one per learner); () for none
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
  # What dc_lambda left at 0.04 means: "per_mode" (the mode's own lambda_0, as above) | "dc_asgd" (0.04 in every
  # mode, as runs started before the per-mode defaults ran; a run directory saved then resumes only with it).
  config.dc_lambda_default = "per_mode"
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
