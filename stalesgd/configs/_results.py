"""The numbers a config's docstring *Result* quotes, as data a test checks against ``results/``: `ConfigResult`.

Every packaged config module has ``RESULTS``, a tuple of `ConfigResult`: one per number its *Result* paragraph
quotes from a results directory's ``results.csv`` (empty where the paragraph says "not measured"). The test
``tests/configs/test_config_results.py`` reads each directory's ``results.csv`` and checks the value to the
printed precision, and that the docstring's *Result* prints the same number, so neither can go stale alone.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

__all__ = ["ConfigResult", "FINAL", "LAST", "STATISTIC_COLUMNS"]

# A study's value per variant: each run's mean of its last 3 test evaluations, then mean ± std over the seeds
# (results.csv's final_test_error and final_test_error_std; `stalesgd.studies._report`).
FINAL = "test error (%), mean of the last 3 evaluations, mean ± std over seeds"
# The runs of a report older than the studies' (one seed): a run's last test evaluation (results.csv's test_error).
LAST = "test error (%) at the last evaluation, one seed"
# The results.csv columns of each statistic: (the value's, the std's or None).
STATISTIC_COLUMNS = {FINAL: ("final_test_error", "final_test_error_std"), LAST: ("test_error", None)}


@dataclasses.dataclass(frozen=True)
class ConfigResult:
  """One number of a config's *Result*, and where in ``results/`` it comes from.

  Attributes:
    directory: the results directory, from the repository root (``"results/demo_3seeds"``); its ``results.csv``
      holds the number.
    variant: the row of that ``results.csv`` (its ``variant`` column).
    statistic: what the number is: a key of `STATISTIC_COLUMNS` (`FINAL` or `LAST`).
    value: the number as the docstring prints it (percent).
    std: the std over seeds as the docstring prints it beside the value (``value ± std``), or None where it
      prints none.
    decimals: the decimals printed, for value and std alike.
  """

  FINAL: ClassVar[str] = FINAL
  LAST: ClassVar[str] = LAST

  directory: str
  variant: str
  statistic: str = FINAL
  value: float = 0.0
  std: float | None = None
  decimals: int = 2

  def __post_init__(self):
    if self.statistic not in STATISTIC_COLUMNS:
      raise ValueError(f"statistic={self.statistic!r}; allowed: one of {list(STATISTIC_COLUMNS)}")
    if not self.directory.startswith("results/"):
      raise ValueError(f"directory={self.directory!r}; allowed: a path from the repository root, results/NAME")
    if self.std is not None and STATISTIC_COLUMNS[self.statistic][1] is None:
      raise ValueError(f"std={self.std} for {self.statistic!r}, which has none; allowed: None")

  def printed(self) -> str:
    """The number as the docstring prints it: ``"1.81 ± 0.47"``, or ``"51.9"`` without a std."""
    text = f"{self.value:.{self.decimals}f}"
    return text if self.std is None else f"{text} ± {self.std:.{self.decimals}f}"
