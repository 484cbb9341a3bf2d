"""The papers' reproduction studies (`_catalogue`, on the data model of `_study`), how a study run's config is built
(`_study_runs`), the grid's runs (`_tasks`), how each ended (`_outcomes`; a run that fell back to chance:
`_divergence`), the sweep that runs them (`_sweep`) and its report (`_report`).

``stalesgd-reproduce --study=NAME`` (`stalesgd.cli.reproduce`) is the command line;
`STUDIES` maps each name to its `Study`.
"""

from __future__ import annotations

from stalesgd.studies._catalogue import STUDIES
from stalesgd.studies._study import Claim, Study, Variant
from stalesgd.studies._study_runs import StudySettings, study_config
from stalesgd.studies._sweep import run_study

__all__ = [
  "Claim",
  "STUDIES",
  "Study",
  "StudySettings",
  "Variant",
  "run_study",
  "study_config",
]
