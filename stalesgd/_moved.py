"""Module paths of stalesgd 0.1 that moved in 0.2, kept importable for one release with a DeprecationWarning.

Version 0.2 put the implementation in private modules (optax's convention:
the API is what a package's ``__init__`` exports, docs/api.md), the run code
in `stalesgd.training` and the leaf utilities in `stalesgd.utils`. Importing
an old path, e.g. ``from stalesgd.train import train_and_evaluate`` or
``import stalesgd.transforms.staleness``, still works: it warns, naming the
new place, and gives the new module's names. The old paths are removed in
stalesgd `REMOVED_IN`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

REMOVED_IN = "0.3.0"

MOVED_MODULES: dict[str, str] = {
  "stalesgd.checkpoint": "stalesgd.training.checkpoint",
  "stalesgd.checkpoint.agreement": "stalesgd.training.checkpoint._agreement",
  "stalesgd.checkpoint.checkpointer": "stalesgd.training.checkpoint._checkpointer",
  "stalesgd.checkpoint.errors": "stalesgd.training.checkpoint._errors",
  "stalesgd.checkpoint.integrity": "stalesgd.training.checkpoint._integrity",
  "stalesgd.checkpoint.preemption": "stalesgd.training.checkpoint._preemption",
  "stalesgd.compilation_cache": "stalesgd.utils._compilation_cache",
  "stalesgd.config": "stalesgd.training",
  "stalesgd.data.augmentation": "stalesgd.data._augmentation",
  "stalesgd.data.center_crop": "stalesgd.data._center_crop",
  "stalesgd.data.counter_hash": "stalesgd.data._counter_hash",
  "stalesgd.data.dataset": "stalesgd.data._dataset",
  "stalesgd.data.embedded": "stalesgd.data._embedded",
  "stalesgd.data.evaluation": "stalesgd.data._evaluation_batches",
  "stalesgd.data.inception_crop": "stalesgd.data._inception_crop",
  "stalesgd.data.learner_batches": "stalesgd.data._learner_batches",
  "stalesgd.data.loading": "stalesgd.data._loading",
  "stalesgd.data.normalization": "stalesgd.data._normalization",
  "stalesgd.data.npz_source": "stalesgd.data._npz_source",
  "stalesgd.data.preparation.cifar10": "stalesgd.data.preparation._cifar10",
  "stalesgd.data.preparation.imagenet": "stalesgd.data.preparation._imagenet",
  "stalesgd.data.preparation.layouts": "stalesgd.data.preparation._layouts",
  "stalesgd.data.preparation.mnist": "stalesgd.data.preparation._mnist",
  "stalesgd.data.preparation.tfds_writer": "stalesgd.data.preparation._tfds_writer",
  "stalesgd.data.sources": "stalesgd.data._sources",
  "stalesgd.data.tfds_source": "stalesgd.data._tfds_source",
  "stalesgd.decentral.config": "stalesgd.decentral._settings",
  "stalesgd.decentral.dcs3gd": "stalesgd.decentral._dcs3gd",
  "stalesgd.decentral.hlo": "stalesgd.decentral._hlo",
  "stalesgd.device_layout": "stalesgd.training._device_layout",
  "stalesgd.dispatch": "stalesgd.parallel._dispatch",
  "stalesgd.distributed": "stalesgd.utils._distributed",
  "stalesgd.engine.blocks": "stalesgd.engine._blocks",
  "stalesgd.engine.engine": "stalesgd.engine._emulator",
  "stalesgd.engine.ring_buffer": "stalesgd.engine._ring_buffer",
  "stalesgd.evaluation": "stalesgd.training._evaluator",
  "stalesgd.field_checks": "stalesgd.training._field_checks",
  "stalesgd.metrics": "stalesgd.utils._metrics",
  "stalesgd.models.alexnet": "stalesgd.models._alexnet",
  "stalesgd.models.batch_norm": "stalesgd.models._batch_norm",
  "stalesgd.models.caffe_pooling": "stalesgd.models._caffe_pooling",
  "stalesgd.models.cifar10_full": "stalesgd.models._cifar10_full",
  "stalesgd.models.local_response_norm": "stalesgd.models._local_response_norm",
  "stalesgd.models.mlp": "stalesgd.models._mlp",
  "stalesgd.models.registry": "stalesgd.models._registry",
  "stalesgd.models.resnet_cifar": "stalesgd.models._resnet_cifar",
  "stalesgd.models.resnet_imagenet": "stalesgd.models._resnet_imagenet",
  "stalesgd.models.small_cnn": "stalesgd.models._small_cnn",
  "stalesgd.models.spec": "stalesgd.models._spec",
  "stalesgd.optimizer": "stalesgd.training._optimizer",
  "stalesgd.pending_metrics": "stalesgd.training._pending_metrics",
  "stalesgd.plots": "stalesgd.utils._plots",
  "stalesgd.progress": "stalesgd.utils._progress",
  "stalesgd.provenance": "stalesgd.training._provenance",
  "stalesgd.runners": "stalesgd.training._runners",
  "stalesgd.schedule.backup": "stalesgd.schedule._backup",
  "stalesgd.schedule.decentralized": "stalesgd.schedule._decentralized",
  "stalesgd.schedule.durations": "stalesgd.schedule._durations",
  "stalesgd.schedule.events": "stalesgd.schedule._events",
  "stalesgd.schedule.parameter_server": "stalesgd.schedule._parameter_server",
  "stalesgd.schedule.plots": "stalesgd.utils._schedule_plots",
  "stalesgd.schedule.protocols": "stalesgd.schedule._protocols",
  "stalesgd.schedule.schedule": "stalesgd.schedule._schedule_arrays",
  "stalesgd.schedule.softsync": "stalesgd.schedule._softsync",
  "stalesgd.schedule.ssp": "stalesgd.schedule._ssp",
  "stalesgd.schedule.statistics": "stalesgd.schedule._summary",
  "stalesgd.schedule.timing": "stalesgd.schedule._timing",
  "stalesgd.schedule.validation": "stalesgd.schedule._validation",
  "stalesgd.sharding": "stalesgd.parallel._sharding",
  "stalesgd.studies.definitions": "stalesgd.studies",
  "stalesgd.studies.processes": "stalesgd.studies._processes",
  "stalesgd.studies.report": "stalesgd.studies._report",
  "stalesgd.studies.statistics": "stalesgd.studies._seed_statistics",
  "stalesgd.studies.sweep": "stalesgd.studies._sweep",
  "stalesgd.train": "stalesgd.training._loop",
  "stalesgd.transforms.aliases": "stalesgd.transforms._aliases",
  "stalesgd.transforms.contributions": "stalesgd.transforms._contributions",
  "stalesgd.transforms.delay_compensation": "stalesgd.transforms._delay_compensation",
  "stalesgd.transforms.delayed": "stalesgd.transforms._delayed",
  "stalesgd.transforms.gap_aware": "stalesgd.transforms._gap_aware",
  "stalesgd.transforms.hyperparameters": "stalesgd.transforms._hyperparameters",
  "stalesgd.transforms.mean_square": "stalesgd.transforms._mean_square",
  "stalesgd.transforms.moving_average": "stalesgd.transforms._moving_average",
  "stalesgd.transforms.staleness": "stalesgd.transforms._staleness",
  "stalesgd.workdir": "stalesgd.training._workdir",
}
"""Old module path -> the module that holds its code now."""

MOVED_NAMES: dict[str, dict[str, str]] = {
  "stalesgd.runners": {
    "decentral_settings": "stalesgd.training._config_readers",
    "run_label": "stalesgd.training._config_readers",
    "simulate_schedule": "stalesgd.training._config_readers",
  },
}
"""Old module path -> {name: the module that holds it now}, for names that left the module `MOVED_MODULES` maps to."""


def public_home(module: str) -> str:
  """The public package of a new module path: its parent when the leaf is private (``a.b._c`` -> ``a.b``)."""
  parent, _, leaf = module.rpartition(".")
  return parent if leaf.startswith("_") else module


class _MovedModuleLoader(importlib.abc.Loader):
  """Fills the old module with the new module's names, after a DeprecationWarning."""

  def __init__(self, new_name: str):
    self._new_name = new_name

  def exec_module(self, module: types.ModuleType) -> None:
    warnings.warn(
      f"{module.__name__} moved to {public_home(self._new_name)} in stalesgd 0.2 (its code is in "
      f"{self._new_name}); the old path is removed in stalesgd {REMOVED_IN}",
      DeprecationWarning,
      stacklevel=2,
    )  # warnings skips importlib's frames: the importer's line
    target = importlib.import_module(self._new_name)
    module.__dict__.update({name: value for name, value in vars(target).items() if not name.startswith("__")})
    for name, home in MOVED_NAMES.get(module.__name__, {}).items():
      module.__dict__[name] = getattr(importlib.import_module(home), name)
    module.__getattr__ = lambda name: getattr(target, name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
  """Finds the old paths of `MOVED_MODULES` (and nothing else)."""

  def find_spec(self, fullname, path=None, target=None):  # the finder protocol
    new_name = MOVED_MODULES.get(fullname)
    if new_name is None:
      return None
    # A package spec, so that old submodule paths (stalesgd.checkpoint.checkpointer) resolve below it.
    return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(new_name), is_package=True)


def install() -> None:
  """Puts the finder first on ``sys.meta_path``, once (``import stalesgd`` calls it).

  First, so that no other finder (an editable install's maps ``stalesgd`` to
  a source tree) answers an old path with a file of another checkout. It
  answers only the old paths, which no longer exist as files.
  """
  if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())
