"""`build_run(config, mesh)`: the one place that turns a run's config into objects.

The data, model, initial weights, optimizer, the simulated cluster's schedule, DC-S3GD's settings, the run's name
and the runner (`RunInputs`); with the config layer (`stalesgd.training._config_readers`) for the quantities
derived from the config, nothing below the training stack reads a config. The training loop
(`stalesgd.training._loop`) and the benchmarks build their runs here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from stalesgd import data as data_lib
from stalesgd import models
from stalesgd import schedule as schedule_lib
from stalesgd.decentral._fragments import assign_fragments, fragment_layers, fragment_sizes, model_leaf_order
from stalesgd.decentral._streaming import check_settings
from stalesgd.models._loss import is_default_loss, user_loss
from stalesgd.training._config_readers import (
  applied_examples,
  decentral_settings,
  evaluation_updates,
  examples_per_update,
  run_label,
  run_length,
  simulate_schedule,
  timing_model,
  updates_per_epoch,
)
from stalesgd.training._diloco_runner import DiLoCoRunner
from stalesgd.training._local_runs import build_outer_optimizer, local_runs_of, streaming_settings
from stalesgd.training._optimizer import build_optimizer
from stalesgd.training._runners import DCS3GDSettings, Runner, Schedule, make_runner


def _num_parameters(params: Any) -> int:
  return sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree_util.tree_leaves(params))


def _label_dtype(dataset: data_lib.Dataset) -> np.dtype:
  """The labels' dtype: float32 targets or int32 classes (a lazily read split holds class labels)."""
  labels = getattr(dataset.train, "labels", None)
  return np.dtype(np.int32) if labels is None else labels.dtype


class Fragments(NamedTuple):
  """An outer-loop run's fragments (``config.outer.fragments`` and ``fragment_pattern``,
  `stalesgd.decentral._fragments`): the pattern, each leaf's fragment in ``jax.tree`` leaf order, and each
  fragment's parameters and layers (in the model's order)."""

  pattern: str
  of_leaf: tuple[int, ...]
  sizes: tuple[int, ...]
  layers: tuple[tuple[str, ...], ...]

  def describe(self) -> str:
    """One log line, e.g. ``2 fragments (strided layers): 16,512 parameters [conv1, hidden], ...``."""
    kind = "arrays strided" if self.pattern == "array_strided" else f"{self.pattern} layers"
    parts = ", ".join(f"{size:,} [{', '.join(names)}]" for size, names in zip(self.sizes, self.layers))
    return f"{len(self.sizes)} fragments ({kind}), parameters [layers]: {parts}"


def run_fragments(
  config: ml_collections.ConfigDict, model: models.ModelSpec, params: Any, image_shape: tuple[int, int, int]
) -> Fragments:
  """The fragments an outer-loop run syncs (P = 1: one, the whole model).

  Raises:
    ValueError: naming ``config.outer.fragments`` and the model's number of layers (arrays for
      ``array_strided``), if P exceeds it.
  """
  outer = config.outer
  order = None if outer.fragment_pattern == "array_strided" else model_leaf_order(model, image_shape)
  owner = assign_fragments(params, outer.fragments, outer.fragment_pattern, order, field="config.outer.fragments")
  return Fragments(outer.fragment_pattern, owner, fragment_sizes(params, owner), fragment_layers(params, owner, order))


class RunInputs(NamedTuple):
  """What a run trains, built from its config alone (`build_run`).

  Attributes:
    dataset: the data set, normalised as the config says.
    model: the network.
    batches: every learner's k-th mini-batch (`stalesgd.data.LearnerBatches`).
    params: the initial weights.
    optimizer: the server optimizer (`stalesgd.training.build_optimizer`).
    schedule: the simulated cluster's schedule of updates.
    updates_per_epoch: server updates per pass over the training split.
    label: the run's name in logs, plots and the summary (`stalesgd.training.run_label`).
    decentral_settings: a decentralized protocol's DC-S3GD settings; None for a parameter-server protocol.
    runner: the protocol's runner on the mesh given to `build_run` (None without one).
    metric_names: what a user's loss (``config.loss``) returns per example, ``"loss"`` first; () for the
      built-in classification.
    evaluation_updates: int64 [K], the updates after which the run evaluates (besides its last,
      `stalesgd.training._config_readers.evaluation_updates`); a parameter-server runner's blocks start there.
    fragments: an outer-loop run's `Fragments` (each timed in the schedule for its own bytes); None otherwise.
  """

  dataset: data_lib.Dataset
  model: models.ModelSpec
  batches: data_lib.LearnerBatches
  params: Any
  optimizer: Any
  schedule: Schedule
  updates_per_epoch: float
  label: str
  decentral_settings: DCS3GDSettings | None
  runner: Runner | None
  metric_names: tuple[str, ...]
  evaluation_updates: np.ndarray
  fragments: Fragments | None = None


def build_run(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None) -> RunInputs:
  """Loads the data and builds the model, optimizer, schedule, DC-S3GD settings and runner of a (validated) config.

  The one place that turns a config into objects (with the config layer,
  `stalesgd.training._config_readers`, for the quantities derived from it): the
  runners and the layers below take those objects, never the config.
  Deterministic in the config: every process of a run, and every tool that
  re-executes a run outside the training loop (the benchmarks), gets the same
  weights, mini-batches and schedule.

  Args:
    config: the run's config, validated (`stalesgd.training.validate_config`).
    mesh: the devices to run on; without one (the benchmarks, which drive the
      engine themselves) no runner is built.
  """
  dataset = data_lib.load_dataset(
    config.dataset,
    source=config.data_source,
    data_dir=config.data_dir,
    normalization=config.normalization,
    image_size=config.image_size,
    data_workers=config.data_workers,
    train_split=config.train_split,
    test_split=config.test_split,
    image_key=config.image_key,
    label_key=config.label_key,
    validation_fraction=config.validation_fraction,
  )
  if dataset.num_classes is None and is_default_loss(config.loss):
    raise ValueError(
      f"config.loss={config.loss!r} needs class labels, and config.dataset={config.dataset!r} has float targets; "
      "allowed: a loss of your own, 'package.module:function' (docs/own_experiment.md)"
    )
  model = models.get_model(
    config.model, num_classes=dataset.num_classes, data_shape=dataset.image_shape, **config.model_options
  )
  if config.multiplier_set is not None:
    try:
      model = model.with_multiplier_set(config.multiplier_set)
    except ValueError as error:
      raise ValueError(f"config.multiplier_set={config.multiplier_set!r}: {error}") from error
  metric_names: tuple[str, ...] = ()
  if not is_default_loss(config.loss):
    loss, metric_names = user_loss(
      config.loss, model, image_shape=dataset.image_shape, label_dtype=_label_dtype(dataset)
    )
    model = dataclasses.replace(model, loss=loss)
  batches = data_lib.LearnerBatches(
    dataset,
    batch_per_learner=config.batch_per_learner,
    learners=config.inner.data_shards or config.learners,  # the data's streams: shards, or one per learner
    seed=config.seed,
    augment=config.augment,
    dropout_seeds=model.uses_dropout,
  )
  params = model.init(jax.random.key(config.seed), dataset.image_shape)["params"]
  per_epoch = updates_per_epoch(config, dataset.num_train)
  total_updates, inner_steps = run_length(config, dataset.num_train)
  outer_loop = schedule_lib.protocol_row(config.protocol).outer_loop
  fragments = run_fragments(config, model, params, dataset.image_shape) if outer_loop else None
  schedule = simulate_schedule(
    config,
    total_updates,
    parameter_bytes=4 * _num_parameters(params),
    inner_steps=inner_steps,
    fragment_bytes=None if fragments is None else tuple(4 * size for size in fragments.sizes),
  )
  evaluations = evaluation_updates(
    schedule.num_updates,
    config.eval_every_epochs,
    per_epoch,
    applied_examples(schedule, config.batch_per_learner),
    examples_per_update(config),
  )
  settings, label = decentral_settings(config), run_label(config)
  # The optimizer's step count: server updates, or (diloco, where it is the learners' inner optimizer) inner steps.
  optimizer_steps_per_epoch = per_epoch * (config.local_steps if outer_loop else 1)
  optimizer = build_optimizer(config, model=model, params=params, updates_per_epoch=optimizer_steps_per_epoch)
  runner = None
  if outer_loop:
    settings_of_rounds = streaming_settings(config)
    try:
      check_settings(settings_of_rounds, len(jax.tree_util.tree_leaves(params)))
    except ValueError as error:
      raise ValueError(
        f"config.outer: {error} (a fragment is a set of whole layers, or of arrays with array_strided)"
      ) from error
  if mesh is not None and outer_loop:
    runner = DiLoCoRunner(
      model,
      optimizer,
      build_outer_optimizer(config.outer),
      schedule.num_updates,
      batches,
      mesh,
      settings=settings_of_rounds,
      reset_inner_state=config.outer.reset_inner_state,
      fragment_of_leaf=fragments.of_leaf,
    )
  elif mesh is not None:
    local_runs = None if settings is not None else local_runs_of(config, timing_model(config))
    runner = make_runner(
      model,
      optimizer,
      schedule,
      batches,
      mesh,
      decentral_settings=settings,
      local_runs=local_runs,
      boundaries=evaluations,
    )
  return RunInputs(
    dataset,
    model,
    batches,
    params,
    optimizer,
    schedule,
    per_epoch,
    label,
    settings,
    runner,
    metric_names,
    evaluations,
    fragments,
  )
