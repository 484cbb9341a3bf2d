"""The numeric divergence rule: a finished run whose training loss fell back to chance for good diverged.

A run whose loss becomes non-finite stops and is recorded as diverged by `stalesgd.studies._outcomes.run_variant`.
A run can also diverge without a non-finite loss: it learns, then its loss climbs back to that of a uniform
prediction, ln K for K classes, and stays there (as DiLoCo's outer rate 0.7 did on the digits at M = 2). The
report marks such a run diverged by this rule (`stalesgd.studies._report.mark_collapse`), so its chance-level
error is never averaged into a variant's mean (docs/studies.md, *Diverged runs: a status, never an error rate*).
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from stalesgd.records import _run_directory as run_directory

COLLAPSE_LEARNED = 0.5  # the loss had been below this fraction of chance: the run learned
COLLAPSE_BAND = 0.05  # then came back within this fraction of chance ...
COLLAPSE_RECORDS = 3  # ... for the rest of the run, at least this many logged records


def chance_loss(workdir: pathlib.Path) -> float | None:
  """The cross-entropy of a uniform prediction, ln K for the K classes the run in ``workdir`` loaded; None if it
  wrote no ``dataset.json``."""
  path = pathlib.Path(workdir) / run_directory.DATASET
  return math.log(json.loads(path.read_text())["num_classes"]) if path.exists() else None


def collapse_update(records: Sequence[Mapping[str, Any]], chance: float) -> int | None:
  """Where a run that had learned fell back to chance for good, or None: the numeric divergence rule.

  A run diverged if its training loss, after it had been below ``COLLAPSE_LEARNED`` x chance (ln K), came back
  within ``COLLAPSE_BAND`` x chance of it and stayed there for the rest of the run, at least
  ``COLLAPSE_RECORDS`` logged records (a non-finite loss stops the run: the module docstring). Returns the update
  (``step``) of the first record of that last stretch.
  """
  losses = [(int(record["step"]), float(record["train_loss"])) for record in records if "train_loss" in record]
  learned = next((index for index, (_, loss) in enumerate(losses) if loss < COLLAPSE_LEARNED * chance), None)
  if learned is None:
    return None
  start = len(losses)
  while start > learned + 1 and abs(losses[start - 1][1] - chance) <= COLLAPSE_BAND * chance:
    start -= 1
  if len(losses) - start < COLLAPSE_RECORDS:
    return None
  return losses[start][0]
