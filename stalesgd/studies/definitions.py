"""The reproduction studies: each a grid of config variants and the numbers the papers report.

A `Study` is a list of `Variant` rows; each row is one run, named by a config
config of `stalesgd.configs` (``stalesgd/configs/``), the variant of that file, and field overrides
(so every row is one training command, see `Variant.command`). `study_run` builds the run's config, and the command that
rebuilds it, for the three ways a study runs (`stalesgd.cli.reproduce`):

* the paper's setting (default): the config as the file defines it;
* ``quick`` without a data source: the file's ``quick`` variant (embedded
  digits, minutes on a CPU);
* a data source (``data_source``/``data_dir``, e.g. the CIFAR-10 npz copy):
  the paper's model and data read from there; with ``quick`` as well, for the
  study's `Study.short_epochs` epochs.

A shortened run (``quick`` with a data source, or ``num_epochs`` given) is
evaluated at least `EVALUATIONS_PER_SHORT_RUN` times, so it has a curve.

Published numbers (docs/algorithms.md §6) sit in ``published`` and end up in
``published_<name>`` columns beside ours (`stalesgd.plots.table_columns`);
this module is their one place in the code (the config docstrings name the
study instead of repeating them).
"""

from __future__ import annotations

import dataclasses
import importlib
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from stalesgd.configs.arguments import QUICK

CONFIG_PACKAGE = "stalesgd.configs"
TRAIN_MODULE = "stalesgd.cli.train"  # the program of `Variant.command`
EVALUATIONS_PER_SHORT_RUN = 4
ZHANG_N = (1, 2, 4, 10, 15, 30)
ZHANG_DIVERGED_ERROR = 90.0  # Zhang et al.: n = 15 and 30 with the fixed rate "do not converge (90% error)".
RUDRA_TEST_ERROR = 18.0
DCASGD_LEARNERS = (4, 8)
# Zheng et al. (arXiv 1609.08326) Table 1: CIFAR-10 ResNet-20 test error (%), by method and M.
DCASGD_TABLE1 = {
    ("sgd", 1): 8.65,
    ("asgd", 4): 9.27, ("ssgd", 4): 9.17, ("dcasgd_c", 4): 8.67, ("dcasgd_a", 4): 8.19,
    ("asgd", 8): 10.26, ("ssgd", 8): 10.10, ("dcasgd_c", 8): 9.27, ("dcasgd_a", 8): 8.57,
}
DCASGD_METHOD_NAMES = {"sgd": "SGD", "asgd": "ASGD", "ssgd": "SSGD", "dcasgd_c": "DC-ASGD-c",
                       "dcasgd_a": "DC-ASGD-a", "dcasgd_a_bc": "DC-ASGD-a bias-corrected"}


@dataclasses.dataclass(frozen=True)
class Variant:
  """One run of a study.

  Attributes:
    label: the row's name in tables and plot legends (unique in its study).
    config_file: a config's name in `stalesgd.configs` (e.g. ``"rudra_cifar10"``).
    config_variant: the variant of that file (its ``get_config`` argument).
    overrides: config fields set after ``get_config`` (e.g. ``{"n": 15}``).
    published: the paper's numbers for this run, by result field
      (``{"test_error": 18.0}``).
  """

  label: str
  config_file: str
  config_variant: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  published: Mapping[str, float] = dataclasses.field(default_factory=dict)

  @property
  def slug(self) -> str:
    """A directory name for the run: the label with anything but [a-z0-9.] turned into ``_``."""
    cleaned = "".join(character if character.isalnum() or character == "." else "_"
                      for character in self.label.lower())
    return "_".join(part for part in cleaned.split("_") if part)

  def command(self, *, quick: bool, extra: Mapping[str, Any] | None = None) -> str:
    """The command line that runs this variant alone (without ``--workdir``), from any directory.

    ``python -m stalesgd.cli.train`` (the program ``stalesgd-train`` and, in a
    clone, ``python -m experiments.main`` run) with the config by name, so the
    command recorded in a study's ``results.csv`` needs neither a clone nor
    the console script on ``PATH``; from a clone's root,
    ``--config=experiments/configs/<name>.py:...`` is the same config.
    """
    argument = f"{QUICK},{self.config_variant}" if quick else self.config_variant
    overrides = {**self.overrides, **(extra or {})}
    flags = "".join(f" --config.{field}={_flag_value(value)}" for field, value in overrides.items())
    return f"python -m {TRAIN_MODULE} --config={self.config_file}:{argument}{flags}"


def _flag_value(value: Any) -> str:
  """A config override value as one shell word (tuples in the ``(a,b)`` form config_flags parses)."""
  if isinstance(value, (tuple, list)):
    value = "(" + ",".join(str(item) for item in value) + ("," if len(value) == 1 else "") + ")"
  return shlex.quote(str(value))


@dataclasses.dataclass(frozen=True)
class Study:
  """A grid of runs and what it should show.

  Attributes:
    name: the ``--study`` name.
    title: one line for plot titles.
    finding: the published qualitative finding the grid tests.
    variants: the runs, in table order.
    paper_data: whether the study runs on a paper's data set (so a data
      source can be given); False for studies on the embedded data only.
    has_quick: whether the config files have a ``quick`` variant (the demo is
      quick already).
    short_epochs: epochs per run with ``quick`` and a data source (the paper's
      model and data, fewer epochs).
  """

  name: str
  title: str
  finding: str
  variants: tuple[Variant, ...]
  paper_data: bool = True
  has_quick: bool = True
  short_epochs: float = 1.0

  def __post_init__(self):
    labels = [variant.label for variant in self.variants]
    slugs = [variant.slug for variant in self.variants]
    if not labels or len(set(labels)) != len(labels) or len(set(slugs)) != len(slugs):
      raise ValueError(f"study {self.name!r}: variant labels {labels} must be non-empty and unique "
                       "(also as directory names)")


  def select(self, slugs: Sequence[str] | None) -> tuple[Variant, ...]:
    """The variants named by ``slugs`` (directory names), in study order; all of them for None.

    Raises:
      ValueError: naming an unknown slug and the allowed ones.
    """
    if slugs is None:
      return self.variants
    known = [variant.slug for variant in self.variants]
    unknown = [slug for slug in slugs if slug not in known]
    if unknown or not slugs:
      raise ValueError(f"variants={list(slugs)!r}: {unknown or 'none given'} not in study {self.name!r}; "
                       f"allowed: a non-empty subset of {known}")
    return tuple(variant for variant in self.variants if variant.slug in slugs)


def load_config_module(config_file: str):
  """The module `stalesgd.configs`.<config_file>."""
  return importlib.import_module(f"{CONFIG_PACKAGE}.{config_file}")


def study_run(study: Study, variant: Variant, *, quick: bool = False, data_source: str | None = None,
              data_dir: str | None = None, num_epochs: float | None = None) -> tuple[ml_collections.ConfigDict, str]:
  """The config of one run of a study and the command that builds it (modes: the module docstring).

  Args:
    study: the study.
    variant: one of ``study.variants``.
    quick: the CPU-sized version.
    data_source: read the paper's data set from this source (``"tfds"`` or
      ``"npz"``) instead of the config's.
    data_dir: the source's directory.
    num_epochs: epochs per run, overriding everything else.

  Returns:
    (the run's config, the `Variant.command` whose config is the
    same: every field set here beyond the config file's is a flag of it).

  Raises:
    ValueError: if a data source is given to a study on embedded data only.
  """
  if variant not in study.variants:
    raise ValueError(f"variant {variant.label!r} is not part of study {study.name!r}")
  on_paper_data = data_source is not None or data_dir is not None
  if on_paper_data and not study.paper_data:
    raise ValueError(f"data_source={data_source!r}/data_dir={data_dir!r} given to study {study.name!r}, which "
                     "runs on the embedded data only; allowed: no data source for this study")
  quick_variant = quick and study.has_quick and not on_paper_data
  argument = f"{QUICK},{variant.config_variant}" if quick_variant else variant.config_variant
  config = load_config_module(variant.config_file).get_config(argument)
  for field, value in variant.overrides.items():
    config[field] = value
  extra: dict[str, Any] = {}
  if data_source is not None:
    extra["data_source"] = data_source
  if data_dir is not None:
    extra["data_dir"] = data_dir
  if quick and on_paper_data:
    extra["num_epochs"] = study.short_epochs
  if num_epochs is not None:
    extra["num_epochs"] = num_epochs
  if "num_epochs" in extra:
    # A shortened run still gets a learning curve, not just its final point.
    extra["eval_every_epochs"] = min(config.eval_every_epochs, extra["num_epochs"] / EVALUATIONS_PER_SHORT_RUN)
  for field, value in extra.items():
    config[field] = value
  return config, variant.command(quick=quick_variant, extra=extra)


def study_config(study: Study, variant: Variant, *, quick: bool = False, data_source: str | None = None,
                 data_dir: str | None = None, num_epochs: float | None = None) -> ml_collections.ConfigDict:
  """The config of one run of a study (`study_run`'s, without the command)."""
  return study_run(study, variant, quick=quick, data_source=data_source, data_dir=data_dir,
                   num_epochs=num_epochs)[0]


def zhang_cifar10() -> Study:
  """Zhang et al. (arXiv 1511.05950) Fig. 3-4: n-softsync at lambda = 30, mu = 4, fixed alpha_0 vs alpha_0/sigma."""
  variants = [Variant("baseline (lambda=1, mu=128)", "rudra_cifar10", "baseline",
                      published={"test_error": RUDRA_TEST_ERROR}),
              Variant("hardsync", "rudra_cifar10", "hardsync", published={"test_error": RUDRA_TEST_ERROR})]
  for rule, rule_label in (("fixed", "a0"), ("inverse", "a0/sigma")):
    for n in ZHANG_N:
      published = {"test_error": RUDRA_TEST_ERROR} if rule == "inverse" else (
          {"test_error": ZHANG_DIVERGED_ERROR} if n >= 15 else {})
      variants.append(Variant(f"{n}-softsync, {rule_label}", "rudra_cifar10", f"softsync_{rule}",
                              overrides={"n": n}, published=published))
  # Rudra's protocol-level rate at the largest n (the reconstructed alpha_0/<sigma>, <sigma> tracked).
  variants.append(Variant(f"{ZHANG_N[-1]}-softsync, a0/mean(sigma)", "rudra_cifar10", "softsync_inverse_mean",
                          overrides={"n": ZHANG_N[-1]}, published={"test_error": RUDRA_TEST_ERROR}))
  return Study(
      name="zhang_cifar10", title="Zhang et al.: n-softsync, lambda=30, mu=4",
      finding="fixed alpha_0 degrades as n grows and fails at n = 15, 30; alpha_0/sigma tracks hardsync",
      variants=tuple(variants), short_epochs=1.0)


def rudra_mu_lambda() -> Study:
  """Rudra (arXiv 1509.04210): at a fixed alpha_0 and fixed epochs, larger mu * lambda is worse."""
  variants = [Variant("baseline (lambda=1, mu=128)", "rudra_cifar10", "baseline",
                      published={"test_error": RUDRA_TEST_ERROR})]
  module = load_config_module("rudra_cifar10")
  for batch in module.MU_LAMBDA_BATCHES:
    product = module.LEARNERS * batch
    variants.append(Variant(f"1-softsync, mu*lambda={product} (mu={batch})", "rudra_cifar10",
                            f"mu_lambda_{product}"))
  return Study(name="rudra_mu_lambda", title="Rudra: 1-softsync, lambda=30, fixed alpha_0, varying mu",
               finding="test error grows with mu * lambda at a fixed alpha_0; mu * lambda ~ 128 matches the baseline",
               variants=tuple(variants), short_epochs=1.0)


def dcasgd_table1() -> Study:
  """Zheng et al. (arXiv 1609.08326) Table 1: ResNet-20 on CIFAR-10, M in {1, 4, 8}.

  After the paper's 9 runs, one ablation per M that the paper does not have (so no published
  number): DC-ASGD-a with its MeanSquare bias-corrected (``dcasgd_a_bc``). Appended last, so the
  paper's runs keep their slugs and commands.
  """
  variants = [Variant("SGD, M=1", "dcasgd_cifar10_resnet20", "sgd", overrides={"learners": 1},
                      published={"test_error": DCASGD_TABLE1["sgd", 1]})]
  for learners in DCASGD_LEARNERS:
    for method in ("asgd", "ssgd", "dcasgd_c", "dcasgd_a"):
      variants.append(Variant(f"{DCASGD_METHOD_NAMES[method]}, M={learners}", "dcasgd_cifar10_resnet20", method,
                              overrides={"learners": learners},
                              published={"test_error": DCASGD_TABLE1[method, learners]}))
  for learners in DCASGD_LEARNERS:
    variants.append(Variant(f"{DCASGD_METHOD_NAMES['dcasgd_a_bc']}, M={learners}", "dcasgd_cifar10_resnet20",
                            "dcasgd_a_bc", overrides={"learners": learners}))
  return Study(name="dcasgd_table1", title="Zheng et al. Table 1: ResNet-20, CIFAR-10",
               finding="DC-ASGD-a <= DC-ASGD-c <= ASGD in test error at M = 4 and 8",
               variants=tuple(variants), short_epochs=1.0)


def demo() -> Study:
  """The `make demo` comparison at lambda = 8 on the embedded digits."""
  labels = {"hardsync": "hardsync", "softsync_fixed": "8-softsync, a0", "softsync_inverse": "8-softsync, a0/sigma",
            "async_dc": "async, DC-ASGD-a"}
  variants = tuple(Variant(labels[name], "demo", name) for name in load_config_module("demo").VARIANTS)
  return Study(name="demo", title="demo: lambda=8 learners on the embedded digits",
               finding="8-softsync with a fixed alpha_0 is clearly worse than hardsync; alpha_0/sigma and "
                       "DC-ASGD-a recover most of the gap",
               variants=variants, paper_data=False, has_quick=False)


STUDIES = {study.name: study for study in (zhang_cifar10(), rudra_mu_lambda(), dcasgd_table1(), demo())}
