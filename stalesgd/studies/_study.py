"""A study's data model: its runs (`Variant`), the claims it decides (`Claim`) and the grid (`Study`).

A `Study` is a list of `Variant` rows; each row is one run, named by a config of `stalesgd.configs`
(``stalesgd/configs/``), the variant of that file, and field overrides, so every row is one training command
(`Variant.command`). The papers' studies are in `stalesgd.studies._catalogue`; building a run's config for the
ways a study runs is `stalesgd.studies._study_runs`.
"""

from __future__ import annotations

import dataclasses
import importlib
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from stalesgd.configs.arguments import QUICK

CONFIG_PACKAGE = "stalesgd.configs"
TRAIN_MODULE = "stalesgd.cli.train"  # the program of `Variant.command`


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
    family: in a study with a `Pilot`, the group of variants that share the value the pilot chooses (e.g.
      ``"synchronous M=4"``); None elsewhere.
  """

  label: str
  config_file: str
  config_variant: str
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  published: Mapping[str, float] = dataclasses.field(default_factory=dict)
  family: str | None = None

  @property
  def slug(self) -> str:
    """A directory name for the run: the label with anything but [a-z0-9.] turned into ``_``."""
    return slug_of(self.label)

  def command(self, *, quick: bool, extra: Mapping[str, Any] | None = None) -> str:
    """The command line that runs this variant alone (without ``--workdir``), from any directory.

    ``python -m stalesgd.cli.train`` (the program ``stalesgd-train`` runs)
    with the config by name, so the command recorded in a study's
    ``results.csv`` needs neither a clone nor the console script on ``PATH``.
    """
    argument = f"{QUICK},{self.config_variant}" if quick else self.config_variant
    overrides = {**self.overrides, **(extra or {})}
    flags = "".join(f" --config.{field}={_flag_value(value)}" for field, value in overrides.items())
    return f"python -m {TRAIN_MODULE} --config={self.config_file}:{argument}{flags}"


def slug_of(label: str) -> str:
  cleaned = "".join(character if character.isalnum() or character == "." else "_" for character in label.lower())
  return "_".join(part for part in cleaned.split("_") if part)


def _flag_value(value: Any) -> str:
  """A config override value as one shell word (tuples in the ``(a,b)`` form config_flags parses)."""
  if isinstance(value, (tuple, list)):
    value = "(" + ",".join(str(item) for item in value) + ("," if len(value) == 1 else "") + ")"
  return shlex.quote(str(value))


@dataclasses.dataclass(frozen=True)
class Pilot:
  """A setting a study chooses before its decision runs, on seeds and data the decision never uses.

  Every variant of the study runs once per value of ``values`` and per pilot seed, with ``validation_fraction``
  of the training data held out and evaluated on (`stalesgd.data._validation_split`; the test split is never
  read). Per `Variant.family`, the value chosen is the one with the lowest mean validation error over the
  family's runs (each run's value: the mean of its last `Study.last_evaluations` evaluations), among the values
  none of whose runs diverged (`stalesgd.studies._report.is_diverged`); equal means go to the smaller value. The
  decision grid then runs every variant of a family at its chosen value (`stalesgd.studies._pilot`).

  Attributes:
    field: the config field chosen (dotted for a section, e.g. ``"outer.learning_rate"``).
    values: the grid, fixed before the pilot runs.
    first_seed: the first pilot seed; the pilot runs ``first_seed`` .. ``first_seed + seeds - 1``, seeds the
      decision grid (seeds 0, 1, 2, ...; a confirmatory grid 3, 4, 5) never uses.
    seeds: pilot seeds per value.
    validation_fraction: the share of the training split held out (`config.validation_fraction`).
  """

  field: str
  values: tuple[float, ...]
  first_seed: int = 100
  seeds: int = 2
  validation_fraction: float = 0.2

  def __post_init__(self):
    if not self.values or len(set(self.values)) != len(self.values):
      raise ValueError(f"pilot values={self.values!r}; allowed: a non-empty tuple of distinct values")
    if self.first_seed < 10 or self.seeds < 1:
      raise ValueError(
        f"pilot first_seed={self.first_seed!r}, seeds={self.seeds!r}; allowed: first_seed >= 10 (the decision "
        "grids' seeds start at 0) and seeds >= 1"
      )
    if not 0.0 < self.validation_fraction < 1.0:
      raise ValueError(f"pilot validation_fraction={self.validation_fraction!r}; allowed: a number in (0, 1)")

  def record(self) -> dict[str, Any]:
    """The pilot's definition as JSON values (part of the study's registration, and of its choice file)."""
    return {
      "field": self.field,
      "values": [float(value) for value in self.values],
      "seeds": list(range(self.first_seed, self.first_seed + self.seeds)),
      "validation_fraction": float(self.validation_fraction),
    }


CLAIM_KINDS = ("matches", "worse")
NOT_DECIDED_ONE_SEED = "not decided (1 seed: no interval)"


@dataclasses.dataclass(frozen=True)
class Claim:
  """A published claim as a rule fixed before the runs: a variant against a reference, seed by seed.

  The gap of seed s is d_s = value(variant, s) - value(reference, s), a run's
  value being the mean of its last evaluations' test error (points; the
  study's `Study.last_evaluations`). Its 95 % interval
  (`stalesgd.studies._seed_statistics.paired_interval`) decides:

  * ``matches``: holds if the interval lies inside (-margin, +margin); does not
    hold if it lies wholly outside; otherwise not decided;
  * ``worse``: the variant is worse by more than ``margin``: holds if the
    interval lies above +margin; does not hold if it lies below; otherwise not
    decided.

  With one seed there is no interval and the claim is not decided.

  Attributes:
    statement: the published claim, in the paper's terms.
    variant: the slug of the variant it is about.
    reference: the slug of the variant it is compared with.
    kind: one of `CLAIM_KINDS`.
    margin: test-error points.
  """

  statement: str
  variant: str
  reference: str
  kind: str
  margin: float

  def __post_init__(self):
    if self.kind not in CLAIM_KINDS:
      raise ValueError(f"kind={self.kind!r}; allowed: one of {CLAIM_KINDS}")
    if not self.margin > 0:
      raise ValueError(f"margin={self.margin!r}; allowed: a number of test-error points > 0")

  def rule(self, last_evaluations: int) -> str:
    """The decision rule in words."""
    gap = (
      f"the 95 % interval of the paired per-seed gap in test error ({self.variant} - {self.reference}, "
      f"mean of the last {last_evaluations} evaluations)"
    )
    if self.kind == "matches":
      return f"{gap} lies inside ±{self.margin:g} points"
    return f"{gap} lies above +{self.margin:g} points"

  def decide(self, low: float | None, high: float | None) -> str:
    """``holds``, ``does not hold``, or why it is not decided, from the interval [low, high] (None: 1 seed)."""
    if low is None or high is None:
      return NOT_DECIDED_ONE_SEED
    margin = self.margin
    if self.kind == "matches":
      if -margin < low and high < margin:
        return "holds"
      if low >= margin or high <= -margin:
        return "does not hold"
    else:
      if low > margin:
        return "holds"
      if high < margin:
        return "does not hold"
    return "not decided (the interval crosses the margin)"


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
    claims: the published claims the grid decides (`Claim`), fixed before it
      runs.
    last_evaluations: a run's value is the mean of this many last evaluations.
    report_last_evaluation: the decisions also give each claim's paired
      interval of the last evaluation alone, as a second statistic that
      decides nothing.
    bands: ``(low, high, label)`` ranges of test error (points): when given,
      the printed table shows, per variant, the band every seed's value falls
      in instead of the numbers, so that it reads the same on any machine whose
      floating-point results move the numbers within their bands (the demo;
      a value outside every band, or seeds in different bands, is printed as
      such).
    pilot: a setting chosen per variant family before the decision runs (`Pilot`); every variant then names
      its ``family``.
  """

  name: str
  title: str
  finding: str
  variants: tuple[Variant, ...]
  paper_data: bool = True
  has_quick: bool = True
  short_epochs: float = 1.0
  claims: tuple[Claim, ...] = ()
  last_evaluations: int = 3
  report_last_evaluation: bool = False
  bands: tuple[tuple[float, float, str], ...] = ()
  pilot: Pilot | None = None

  def __post_init__(self):
    labels = [variant.label for variant in self.variants]
    slugs = [variant.slug for variant in self.variants]
    if not labels or len(set(labels)) != len(labels) or len(set(slugs)) != len(slugs):
      raise ValueError(
        f"study {self.name!r}: variant labels {labels} must be non-empty and unique (also as directory names)"
      )
    families = [variant.family for variant in self.variants]
    if (self.pilot is None) != all(family is None for family in families) or (
      self.pilot is not None and None in families
    ):
      raise ValueError(
        f"study {self.name!r}: variant families {families}; allowed: a family for every variant with a pilot, "
        "none without one"
      )
    for claim in self.claims:
      for slug in (claim.variant, claim.reference):
        if slug not in slugs:
          raise ValueError(f"study {self.name!r}: claim {claim.statement!r} names {slug!r}; allowed: one of {slugs}")

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
      raise ValueError(
        f"variants={list(slugs)!r}: {unknown or 'none given'} not in study {self.name!r}; "
        f"allowed: a non-empty subset of {known}"
      )
    return tuple(variant for variant in self.variants if variant.slug in slugs)


def load_config_module(config_file: str):
  """The module `stalesgd.configs`.<config_file>."""
  return importlib.import_module(f"{CONFIG_PACKAGE}.{config_file}")
