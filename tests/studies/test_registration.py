"""Pre-registration computed from what runs recorded (`stalesgd.studies._registration`).

The rule: pre-registered only if every run registered the grid's claims, seeds and settings as they stand now,
from a clean commit; an older run without a registration counts only if its clean first commit's own code held
the same claims. Each case below changes one of those facts.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from stalesgd.studies import STUDIES, StudySettings
from stalesgd.studies import _registration as registration
from stalesgd.studies._tasks import plan_tasks

DEMO = STUDIES["demo"]
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
CLEAN, DIRTY = "a" * 40, "b" * 40 + "-dirty"
# The commit that introduced zhang_cifar10_e140 and its claims, before its first run.
E140_COMMIT = "6759f66b62c324a0f0c5aab5923fa5351a099631"


def _grid(seeds: int = 3, first_seed: int = 0, **settings) -> dict:
  seed_values = range(first_seed, first_seed + seeds)
  return registration.registration_record(
    DEMO, seeds=seed_values, settings=dataclasses.asdict(StudySettings(**settings))
  )


def _registered(label: str, grid: dict, commit: str | None = CLEAN) -> registration.RunEvidence:
  return registration.RunEvidence(label, {"digest": registration.digest(grid), "record": grid}, commit)


def _judge(runs, grid=None, claims_at=lambda commit: None):
  return registration.judge(DEMO, runs, registration=_grid() if grid is None else grid, claims_at=claims_at)


def test_every_run_registered_now_from_a_clean_commit_is_pre_registered():
  verdict = _judge([_registered("hardsync, seed 0", _grid()), _registered("hardsync, seed 1", _grid())])
  assert verdict.pre_registered and verdict.describe() == "pre-registered"


@pytest.mark.parametrize(
  "run, reason",
  [
    (_registered("r", _grid(), DIRTY), "r began from a dirty tree (bbbbbbb-dirty)"),
    (_registered("r", _grid(), None), "r recorded no commit"),
    (_registered("r", _grid(seeds=1)), "r registered other claims, seeds or settings than the grid's now"),
    (_registered("r", _grid(first_seed=3)), "r registered other claims, seeds or settings than the grid's now"),
    (_registered("r", _grid(eval_every_epochs=0.5)), "r registered other claims, seeds or settings than the grid's"),
    (registration.RunEvidence("r", None, None), "r recorded no commit"),  # e.g. a diverged run of old code
  ],
)
def test_one_run_that_cannot_show_it_makes_the_grid_exploratory(run, reason):
  verdict = _judge([_registered("fine", _grid()), run])
  assert not verdict.pre_registered
  assert verdict.reasons == (reason,) or verdict.reasons[0].startswith(reason)
  assert verdict.describe().startswith("exploratory: the rule was fixed after runs began (")


def test_the_data_directory_is_not_part_of_what_is_registered():
  assert registration.digest(_grid(data_dir="/tmp/a")) == registration.digest(_grid(data_dir="/work/b"))
  assert registration.digest(_grid(quick=True)) != registration.digest(_grid())


def test_an_older_run_is_judged_by_the_claims_its_clean_commit_held():
  now = registration.claims_record(DEMO)
  moved = {**now, "claims": [{**now["claims"][1], "margin": 5.0}, now["claims"][0]]}
  old = registration.RunEvidence("old, seed 0", None, CLEAN)
  assert _judge([old], claims_at=lambda commit: now).pre_registered
  assert _judge([old], claims_at=lambda commit: moved).reasons == (
    "old, seed 0 began at aaaaaaa, whose claims differ from these",
  )
  assert _judge([old], claims_at=lambda commit: None).reasons == (
    "old, seed 0: the claims at its commit aaaaaaa could not be read",
  )
  dirty = registration.RunEvidence("old, seed 1", None, DIRTY)
  assert _judge([dirty], claims_at=lambda commit: now).reasons == (
    "old, seed 1 began from a dirty tree (bbbbbbb-dirty)",
  )


def test_a_registration_is_written_only_before_the_run_begins(tmp_path):
  grid = _grid()
  assert registration.write_registration(tmp_path / "new", grid, CLEAN)
  written = json.loads((tmp_path / "new" / "registration.json").read_text())
  assert written == {"digest": registration.digest(grid), "record": grid, "stalesgd_commit": CLEAN}
  assert not registration.write_registration(tmp_path / "new", _grid(seeds=5), DIRTY)  # never rewritten
  (tmp_path / "begun").mkdir()
  (tmp_path / "begun" / "metrics.jsonl").write_text("{}\n")
  assert not registration.write_registration(tmp_path / "begun", grid, CLEAN)
  assert registration.evidence_of("x", tmp_path / "new") == registration.RunEvidence("x", written, CLEAN)


def test_every_task_of_a_grid_carries_the_grids_registration(tmp_path):
  tasks = plan_tasks(DEMO, tmp_path, StudySettings(eval_every_epochs=2.0), seeds=2, first_seed=3)
  assert [(task.variant.slug, task.seed, task.directory.name) for task in tasks[:2]] == [
    ("hardsync", 3, "seed_3"),
    ("hardsync", 4, "seed_4"),
  ]
  assert tasks[0].config.seed == 3
  expected = registration.digest(_grid(seeds=2, first_seed=3, eval_every_epochs=2.0))
  assert {registration.digest(task.registration) for task in tasks} == {expected}


@pytest.mark.slow
def test_the_claims_at_a_commit_are_read_from_that_commits_own_code():
  study = STUDIES["zhang_cifar10_e140"]
  assert registration.claims_at_commit(REPOSITORY, E140_COMMIT, study.name) == registration.claims_record(study)
  assert registration.claims_at_commit(REPOSITORY, "0" * 40, study.name) is None  # no such commit


def test_a_committed_result_directory_is_judged_from_the_records_it_keeps(tmp_path):
  from experiments import preregistration

  (tmp_path / "README.md").write_text("stalesgd-reproduce --study=demo --seeds=2\n")
  (tmp_path / "runs.csv").write_text("variant,slug,seed\nhardsync,hardsync,0\nhardsync,hardsync,1\n")
  registration.write_registration(tmp_path / "runs" / "hardsync" / "seed_0", _grid(seeds=2), CLEAN)
  (tmp_path / "summaries").mkdir()
  (tmp_path / "summaries" / "hardsync_seed_1.json").write_text(json.dumps({"sessions": [{"stalesgd_commit": DIRTY}]}))
  verdict = preregistration.judge_directory(tmp_path)
  assert verdict.reasons == ("hardsync, seed 1 began from a dirty tree (bbbbbbb-dirty)",)
  assert preregistration.main([f"{tmp_path}:demo"]) == 0
  assert json.loads((tmp_path / "preregistration.json").read_text())["status"] == registration.EXPLORATORY


def test_the_command_names_a_grids_first_seed(tmp_path):
  import os
  import subprocess
  import sys

  command = [sys.executable, "-m", "stalesgd.cli.reproduce", "--study=demo", "--variants=hardsync", "--seeds=2"]
  listed = subprocess.run(
    [*command, "--first_seed=3", f"--workdir={tmp_path}", "--list_tasks"],
    capture_output=True,
    text=True,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    timeout=300,
  )
  assert listed.returncode == 0, listed.stderr[-2000:]
  assert listed.stdout.splitlines() == [
    f"--task=0: hardsync, seed 3 ({tmp_path / 'hardsync' / 'seed_3'})",
    f"--task=1: hardsync, seed 4 ({tmp_path / 'hardsync' / 'seed_4'})",
  ]
