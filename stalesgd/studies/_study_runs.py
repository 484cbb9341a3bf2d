"""A study run's config and command, for the three ways a study runs (`stalesgd.cli.reproduce`).

* the paper's setting (default): the config as the file defines it;
* ``quick`` without a data source: the file's ``quick`` variant (embedded digits, minutes on a CPU);
* a data source (``data_source``/``data_dir``, e.g. the CIFAR-10 npz copy): the paper's model and data read from
  there; with ``quick`` as well, for the study's `Study.short_epochs` epochs.

A shortened run (``quick`` with a data source, or ``num_epochs`` given) is evaluated at least
`EVALUATIONS_PER_SHORT_RUN` times, so it has a curve; ``schedule_epochs`` compresses a whole schedule
(`compress_schedule`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from stalesgd.configs.arguments import QUICK
from stalesgd.studies._study import Study, Variant, load_config_module
from stalesgd.training._run_config import set_field

EVALUATIONS_PER_SHORT_RUN = 4


@dataclasses.dataclass(frozen=True)
class StudySettings:
  """How a study's runs are built, beyond the grid itself: the flags of ``stalesgd-reproduce``.

  Attributes:
    quick: the CPU-sized version.
    data_source: read the paper's data set from this source (``"tfds"`` or
      ``"npz"``) instead of the config's.
    data_dir: the source's directory.
    num_epochs: epochs per run, overriding everything else; the learning-rate
      decay epochs stay where the config puts them (so a short run may never
      reach them).
    schedule_epochs: the config's whole schedule compressed to this many
      epochs: ``num_epochs`` becomes it and every learning-rate decay epoch is
      moved to the same fraction of the run (`compress_schedule`).
    eval_every_epochs: the evaluation interval of every run (None: the
      config's, or `EVALUATIONS_PER_SHORT_RUN` evaluations of a shortened run).
  """

  quick: bool = False
  data_source: str | None = None
  data_dir: str | None = None
  num_epochs: float | None = None
  schedule_epochs: float | None = None
  eval_every_epochs: float | None = None

  def __post_init__(self):
    for name in ("num_epochs", "schedule_epochs", "eval_every_epochs"):
      value = getattr(self, name)
      if value is not None and not value > 0:
        raise ValueError(f"{name}={value!r}; allowed: a number of epochs > 0, or None")
    if self.num_epochs is not None and self.schedule_epochs is not None:
      raise ValueError(
        f"num_epochs={self.num_epochs} and schedule_epochs={self.schedule_epochs} given together; "
        "allowed: one of them (num_epochs shortens a run and keeps the decay epochs, "
        "schedule_epochs compresses the whole schedule)"
      )


def compress_schedule(config: ml_collections.ConfigDict, epochs: float) -> dict[str, Any]:
  """The fields that compress ``config``'s training schedule to ``epochs`` epochs.

  Every learning-rate decay epoch b of a ``config.num_epochs``-epoch schedule
  moves to b x epochs / num_epochs, so the decays happen at the same fractions
  of the run (Zhang et al.'s 140 epochs with x0.1 at 120 and 130 become, at
  20 epochs, x0.1 at 17.14 and 18.57).

  A warm-up (``warmup_epochs`` > 0) is compressed the same way.

  Returns:
    ``{"num_epochs": epochs, "lr_decay_epochs": (...)}`` (and ``warmup_epochs``
    with a warm-up), to set on the config.
  """
  original = float(config.num_epochs)
  fields = {
    "num_epochs": float(epochs),
    "lr_decay_epochs": tuple(float(boundary) * epochs / original for boundary in config.lr_decay_epochs),
  }
  if config.warmup_epochs > 0:
    fields["warmup_epochs"] = float(config.warmup_epochs) * epochs / original
  return fields


def run_directory_name(seed: int) -> str:
  """The sub-directory of a variant's directory that holds its run with ``seed``."""
  return f"seed_{seed}"


def study_run(
  study: Study, variant: Variant, settings: StudySettings = StudySettings(), *, seed: int | None = None
) -> tuple[ml_collections.ConfigDict, str]:
  """The config of one run of a study and the command that builds it (modes: the module docstring).

  Args:
    study: the study.
    variant: one of ``study.variants``.
    settings: the study-level flags (`StudySettings`).
    seed: the run's seed (``config.seed``: initialisation, data order,
      augmentation and the timing model's jitter all derive from it); None
      keeps the config's.

  Returns:
    (the run's config, the `Variant.command` whose config is the
    same: every field set here beyond the config file's is a flag of it).

  Raises:
    ValueError: if a data source is given to a study on embedded data only.
  """
  if variant not in study.variants:
    raise ValueError(f"variant {variant.label!r} is not part of study {study.name!r}")
  on_paper_data = settings.data_source is not None or settings.data_dir is not None
  if on_paper_data and not study.paper_data:
    raise ValueError(
      f"data_source={settings.data_source!r}/data_dir={settings.data_dir!r} given to study "
      f"{study.name!r}, which runs on the embedded data only; allowed: no data source for this study"
    )
  quick_variant = settings.quick and study.has_quick and not on_paper_data
  argument = f"{QUICK},{variant.config_variant}" if quick_variant else variant.config_variant
  config = load_config_module(variant.config_file).get_config(argument)
  for field, value in variant.overrides.items():
    set_field(config, field, value)
  extra: dict[str, Any] = {}
  if seed is not None and seed != config.seed:
    extra["seed"] = int(seed)
  if settings.data_source is not None:
    extra["data_source"] = settings.data_source
  if settings.data_dir is not None:
    extra["data_dir"] = settings.data_dir
  if settings.quick and on_paper_data:
    extra["num_epochs"] = study.short_epochs
  if settings.num_epochs is not None:
    extra["num_epochs"] = settings.num_epochs
  if settings.schedule_epochs is not None:
    extra.update(compress_schedule(config, settings.schedule_epochs))
  if settings.eval_every_epochs is not None:
    extra["eval_every_epochs"] = float(settings.eval_every_epochs)
  elif "num_epochs" in extra:
    # A shortened run still gets a learning curve, not just its final point.
    extra["eval_every_epochs"] = min(config.eval_every_epochs, extra["num_epochs"] / EVALUATIONS_PER_SHORT_RUN)
  for field, value in extra.items():
    set_field(config, field, value)
  return config, variant.command(quick=quick_variant, extra=extra)


def study_config(
  study: Study, variant: Variant, settings: StudySettings = StudySettings(), *, seed: int | None = None
) -> ml_collections.ConfigDict:
  """The config of one run of a study (`study_run`'s, without the command)."""
  return study_run(study, variant, settings, seed=seed)[0]
