"""What a study concludes from several seeds: per-evaluation spread, a smoothed final value, paired intervals.

Asynchronous runs swing by several points between evaluations, so a study
never reads one evaluation of one seed:

* a run's **final value** is the mean of its last k evaluations (`final_value`);
* a variant's value is the mean +- standard deviation of its seeds' final
  values (`Spread`, the sample standard deviation, ddof = 1);
* a claim compares a variant with a reference **seed by seed** (the same seed
  gives both runs the same initial weights and data order): the gaps
  d_s = value(variant, s) - value(reference, s) have the 95 % Student-t interval
  d_bar +- t_{0.975, n-1} s_d / sqrt(n) (`paired_interval`), which a claim's rule
  reads (`stalesgd.studies.Claim`). One seed gives no interval.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Spread:
  """Mean, sample standard deviation (None for one value), min and max of n values."""

  mean: float
  std: float | None
  low: float
  high: float
  count: int

  def format(self, digits: int = 2) -> str:
    """``"mean ± std"`` (or the single value, with ``(1 seed)``)."""
    if self.std is None:
      return f"{self.mean:.{digits}f} (1 seed)"
    return f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"


def spread(values: Sequence[float]) -> Spread:
  """The `Spread` of ``values`` (at least one finite number).

  Raises:
    ValueError: if ``values`` is empty or holds a non-finite number.
  """
  array = np.asarray(values, dtype=np.float64)
  if array.size == 0 or not np.all(np.isfinite(array)):
    raise ValueError(f"values={list(values)!r}; allowed: one or more finite numbers")
  std = float(np.std(array, ddof=1)) if array.size > 1 else None
  return Spread(float(np.mean(array)), std, float(np.min(array)), float(np.max(array)), int(array.size))


def final_value(values: Sequence[float], last: int) -> float:
  """The mean of the last ``last`` values of a learning curve (all of them if it is shorter).

  Raises:
    ValueError: for an empty curve or ``last`` < 1.
  """
  if last < 1:
    raise ValueError(f"last={last}; allowed: an integer >= 1")
  if not len(values):
    raise ValueError("the curve has no evaluation; allowed: a run evaluated at least once")
  return float(np.mean(np.asarray(values[-last:], dtype=np.float64)))


@dataclasses.dataclass(frozen=True)
class Interval:
  """A paired mean difference and its two-sided confidence interval."""

  mean: float
  low: float
  high: float
  count: int
  confidence: float = CONFIDENCE

  def format(self, digits: int = 2, *, compact: bool = False) -> str:
    """``"+mean [+low, +high] (95% interval, n seeds)"``; with ``compact``, ``"+mean [+low, +high] (n)"`` for a
    table cell whose header names the confidence."""
    bounds = f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"
    if compact:
      return f"{bounds} ({self.count})"
    return f"{bounds} ({self.confidence:.0%} interval, {self.count} seeds)"


def t_quantile(probability: float, degrees_of_freedom: int) -> float:
  """Student's t quantile (scipy's, imported here only: the core never needs scipy)."""
  from scipy import stats

  return float(stats.t.ppf(probability, degrees_of_freedom))


def paired_interval(differences: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
  """The Student-t interval of the mean of per-seed differences; None for fewer than 2 of them (none included).

  d_bar +- t_{(1 + confidence) / 2, n - 1} x s_d / sqrt(n), s_d the sample
  standard deviation of the n differences.

  Raises:
    ValueError: if a difference is not finite.
  """
  if not len(differences):
    return None
  values = spread(differences)
  if values.count < 2:
    return None
  half_width = t_quantile((1.0 + confidence) / 2.0, values.count - 1) * values.std / math.sqrt(values.count)
  return Interval(values.mean, values.mean - half_width, values.mean + half_width, values.count, confidence)
