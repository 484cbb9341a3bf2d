"""The papers' reproduction studies (`definitions`) and the sweep that runs them (`sweep`).

``stalesgd-reproduce --study=NAME`` (`stalesgd.cli.reproduce`; from a clone also
``python -m experiments.reproduce --study=NAME``) is the command line;
`STUDIES` maps each name to its `Study`.
"""

from __future__ import annotations

from stalesgd.studies.definitions import STUDIES, Study, Variant, study_config, study_run
from stalesgd.studies.sweep import RunOutcome, SweepResult, run_study, run_variant, write_report

__all__ = ["RunOutcome", "STUDIES", "Study", "SweepResult", "Variant", "run_study", "run_variant",
           "study_config", "study_run", "write_report"]
