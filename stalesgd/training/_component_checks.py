"""The parts of a run's config that name code or data: its model, its optimizer, its data set.

Each names a registered choice or an import path (``package.module:function``) and the options it is called with;
these checks resolve the path and compare the options with the callable's signature, and for a data set check the
fields its source reads, with nothing built or read. `stalesgd.training._config_checks.validate_config` calls
each at its place among the field checks: of several bad fields, the same one is reported first.
"""

from __future__ import annotations

import os

import ml_collections

from stalesgd import _validation as validation
from stalesgd import models
from stalesgd.data._embedded import EMBEDDED_DATASETS
from stalesgd.training._solvers import CAFFE_SGD, solver_call
from stalesgd.utils._import_path import check_options, is_import_path, load_callable


def check_model(config: ml_collections.ConfigDict) -> None:
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
  validation.check_choice("config.model", config.model, models.available_models() + ("package.module:factory",))


def check_optimizer(config: ml_collections.ConfigDict) -> None:
  """The solver's name, its options, and what the config's SGD fields mean for it (`_solvers`)."""
  if config.optimizer == CAFFE_SGD:  # a str: its field's own check came first (`validate_config`)
    if config.optimizer_options.keys():
      validation.reject(
        "config.optimizer_options",
        dict(config.optimizer_options.items()),
        "empty for optimizer='sgd' (the Caffe solver)",
      )
    return
  solver_call(
    config.optimizer, dict(config.optimizer_options.items()), momentum=config.momentum, nesterov=config.nesterov
  )
  if config.weight_decay_placement == "unmodulated" and config.weight_decay > 0:
    validation.reject(
      "config.weight_decay_placement",
      "unmodulated",
      f"'modulated' with optimizer={config.optimizer!r}: the ablation is defined for the SGD solver only",
    )


def check_dataset(config: ml_collections.ConfigDict) -> None:
  """The data set's name and directory, for the config's source (nothing is read)."""
  name, data_dir, source = config.dataset, config.data_dir, config.data_source
  if data_dir is not None and not isinstance(data_dir, str):
    validation.reject("config.data_dir", data_dir, "None or the path of a directory (a str)")
  if source == "embedded" and (not isinstance(name, str) or name not in EMBEDDED_DATASETS):
    validation.reject("config.dataset", name, f"one of {EMBEDDED_DATASETS} for data_source='embedded'")
  if source == "tfds" and (not isinstance(name, str) or not name or is_import_path(name)):
    validation.reject(
      "config.dataset", name, "a tfds data set's name for data_source='tfds' (any prepared in data_dir)"
    )
  if source == "python":
    if not is_import_path(name):
      validation.reject("config.dataset", name, "an import path 'package.module:function' for data_source='python'")
    load_callable(name, field="config.dataset")
  for field in ("train_split", "test_split"):
    if config[field] is not None and (not isinstance(config[field], str) or not config[field]):
      validation.reject(f"config.{field}", config[field], "None (the data set's usual split) or a split's name")
  for field in ("image_key", "label_key"):
    if not isinstance(config[field], str) or not config[field]:
      validation.reject(f"config.{field}", config[field], "the name of a feature of the tfds data set")
  if source == "npz":
    if not isinstance(name, str) or not name or os.sep in name:
      validation.reject(
        "config.dataset", name, "a file-name prefix for data_source='npz' (<data_dir>/<dataset>_train.npz)"
      )
    if not data_dir:
      validation.reject(
        "config.data_dir",
        data_dir,
        "the directory holding <dataset>_train.npz and <dataset>_test.npz, for data_source='npz'",
      )
