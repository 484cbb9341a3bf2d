"""The papers' reproduction studies (`_catalogue`, on the data model of `_study`), how a study run's config is built
(`_study_runs`), the grid's runs (`_tasks`), how each ended (`_outcomes`), the sweep that runs them (`_sweep`)
and its report (`_report`).

``stalesgd-reproduce --study=NAME`` (`stalesgd.cli.reproduce`) is the command line;
`STUDIES` maps each name to its `Study`.
"""

from __future__ import annotations

from stalesgd.studies._catalogue import STUDIES
from stalesgd.studies._outcomes import RunOutcome, run_variant
from stalesgd.studies._report import write_report
from stalesgd.studies._study import Claim, Study, Variant
from stalesgd.studies._study_runs import RunSettings, compress_schedule, study_config, study_run
from stalesgd.studies._sweep import SweepResult, run_study
from stalesgd.studies._tasks import Task, plan_tasks

__all__ = [
  "Claim",
  "RunOutcome",
  "RunSettings",
  "STUDIES",
  "Study",
  "SweepResult",
  "Task",
  "Variant",
  "compress_schedule",
  "plan_tasks",
  "run_study",
  "run_variant",
  "study_config",
  "study_run",
  "write_report",
]
