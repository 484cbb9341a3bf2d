"""The papers' reproduction studies (`definitions`), the sweep that runs them (`sweep`) and its report (`report`).

``stalesgd-reproduce --study=NAME`` (`stalesgd.cli.reproduce`; from a clone also
``python -m experiments.reproduce --study=NAME``) is the command line;
`STUDIES` maps each name to its `Study`.
"""

from __future__ import annotations

from stalesgd.studies._definitions import (
  STUDIES,
  Claim,
  RunSettings,
  Study,
  Variant,
  compress_schedule,
  study_config,
  study_run,
)
from stalesgd.studies._report import write_report
from stalesgd.studies._sweep import RunOutcome, SweepResult, Task, plan_tasks, run_study, run_variant

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
