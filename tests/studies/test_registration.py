"""Pre-registration computed from what runs recorded (`stalesgd.studies._registration`).

The rule: pre-registered only if every run registered the grid's claims, seeds and settings as they stand now,
from a clean commit; an older run without a registration counts only if its clean first commit's own code held
the same claims. Each case below changes one of those facts.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import subprocess

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


# ---- the record and its digest ----------------------------------------------------------------------------------


def test_the_digest_is_of_the_record_not_of_the_order_its_keys_were_written_in():
  grid = _grid()
  assert registration.digest(dict(reversed(list(grid.items())))) == registration.digest(grid)
  assert registration.digest({"a": 1, "b": 2}) == registration.digest({"b": 2, "a": 1})
  assert registration.digest({"a": 1, "b": 2}) != registration.digest({"a": 2, "b": 1})


def test_the_grid_and_the_verdicts_inputs_are_named_never_positional():
  with pytest.raises(TypeError):
    registration.registration_record(DEMO, [0, 1], {})  # which is the seeds, which the settings?
  with pytest.raises(TypeError):
    registration.judge(DEMO, [], None, lambda commit: None)


def test_a_registration_is_written_into_a_run_directory_that_already_exists(tmp_path):
  (tmp_path / "seed_0").mkdir()  # planned, not begun: the directory exists before its first update
  assert registration.write_registration(tmp_path / "seed_0", _grid(), CLEAN)
  assert json.loads((tmp_path / "seed_0" / "registration.json").read_text())["stalesgd_commit"] == CLEAN


def test_evidence_and_verdicts_cannot_be_altered_once_made():
  evidence = registration.RunEvidence("r", None, CLEAN)
  verdict = registration.Registration(registration.EXPLORATORY, ("r recorded no commit",))
  with pytest.raises(dataclasses.FrozenInstanceError):
    evidence.first_commit = DIRTY
  with pytest.raises(dataclasses.FrozenInstanceError):
    verdict.status = registration.PRE_REGISTERED


# ---- the first commit a run recorded ---------------------------------------------------------------------------


def test_a_runs_first_commit_is_its_first_sessions():
  resumed = {
    "sessions": [{"stalesgd_commit": CLEAN}, {"stalesgd_commit": DIRTY}],
    "provenance": {"stalesgd_commit": "c"},
  }
  assert registration.first_session_commit(resumed) == CLEAN
  assert registration.first_session_commit({"provenance": {"stalesgd_commit": "c" * 40}}) == "c" * 40  # no sessions
  assert registration.first_session_commit({"sessions": [], "provenance": None}) is None
  assert registration.first_session_commit({}) is None


def test_a_runs_evidence_takes_the_commit_it_registered_before_its_summarys(tmp_path):
  registered, old = tmp_path / "registered", tmp_path / "old"
  registration.write_registration(registered, _grid(), CLEAN)
  for directory in (registered, old):
    directory.mkdir(exist_ok=True)
    (directory / "summary.json").write_text(json.dumps({"sessions": [{"stalesgd_commit": DIRTY}]}))
  assert registration.evidence_of("r", registered).first_commit == CLEAN
  assert registration.evidence_of("o", old) == registration.RunEvidence("o", None, DIRTY)  # no registration
  assert registration.evidence_of("n", tmp_path / "never") == registration.RunEvidence("n", None, None)


# ---- the verdict --------------------------------------------------------------------------------------------------


def test_every_run_that_cannot_show_it_is_named_not_only_the_first():
  runs = [
    registration.RunEvidence("a", None, None),
    _registered("b", _grid(), DIRTY),
    _registered("c", _grid(seeds=1)),
    registration.RunEvidence("d", None, CLEAN),
    _registered("e", _grid()),
  ]
  assert _judge(runs).reasons == (
    "a recorded no commit",
    "b began from a dirty tree (bbbbbbb-dirty)",
    "c registered other claims, seeds or settings than the grid's now",
    "d: the claims at its commit aaaaaaa could not be read",
  )


@pytest.mark.parametrize("recorded", ["0" * 64, "f" * 64, None])
def test_any_other_digest_is_another_registration(recorded):
  run = registration.RunEvidence("r", {"digest": recorded, "record": _grid()}, CLEAN)
  assert _judge([run]).reasons == ("r registered other claims, seeds or settings than the grid's now",)


def test_without_the_grids_settings_only_the_registered_claims_are_compared():
  now = registration.claims_record(DEMO)
  moved = {**now, "claims": [{**now["claims"][0], "margin": 5.0}, *now["claims"][1:]]}
  same = registration.RunEvidence("same", {"digest": "0" * 64, "record": {**now, "seeds": [7]}}, CLEAN)
  other = registration.RunEvidence("other", {"digest": "0" * 64, "record": moved}, CLEAN)
  bare = registration.RunEvidence("bare", {"digest": "0" * 64}, CLEAN)
  assert registration.judge(DEMO, [same], registration=None, claims_at=lambda commit: None).pre_registered
  assert registration.judge(DEMO, [same, other, bare], registration=None, claims_at=lambda commit: None).reasons == (
    "other registered other claims",
    "bare registered other claims",
  )


def test_a_study_without_claims_is_exploratory_whatever_its_runs_recorded():
  unclaimed = dataclasses.replace(DEMO, claims=())
  verdict = registration.judge(unclaimed, [_registered("r", _grid())], registration=None, claims_at=lambda c: None)
  assert verdict.reasons == ("the study states no claim",)


@pytest.mark.parametrize(
  "count, shown",
  [
    (2, "r0; r1"),
    (3, "r0; r1; r2"),
    (4, "r0; r1; r2; and 1 more"),
    (6, "r0; r1; r2; and 3 more"),
  ],
)
def test_a_verdict_names_three_reasons_and_counts_the_rest(count, shown):
  verdict = registration.Registration(registration.EXPLORATORY, tuple(f"r{k}" for k in range(count)))
  assert verdict.describe() == f"{registration.EXPLORATORY} ({shown})"
  assert verdict.describe(most=count) == f"{registration.EXPLORATORY} ({'; '.join(f'r{k}' for k in range(count))})"


def test_a_verdict_read_back_from_its_record_is_the_same_verdict():
  status = json.loads(json.dumps({"status": registration.PRE_REGISTERED}))["status"]  # preregistration.json's
  assert status is not registration.PRE_REGISTERED  # an equal string, not the module's constant
  assert registration.Registration(status).pre_registered
  assert not registration.Registration(registration.EXPLORATORY).pre_registered


# ---- the claims a commit's own code held ------------------------------------------------------------------------

# A stand-in for a past commit's stalesgd: a package whose STUDIES holds one study, which prints two lines when
# imported (as a commit's code may: a warning, a banner) before the record.
_PAST_STUDIES = """
import types
print("a line a past commit printed when imported")
print("and another")
_claim = types.SimpleNamespace(variant="soft", reference="hard", kind="matches", margin={margin})
def _variant(slug):
  return types.SimpleNamespace(slug=slug, config_file="past.py", config_variant=None, overrides={{"lr": 0.5, "a": 1}})
STUDIES = {{"past": types.SimpleNamespace(
  name="past", last_evaluations=2, claims=[_claim], variants=[_variant("hard"), _variant("other"), _variant("soft")]
)}}
"""


def _past_variant(slug: str) -> dict:
  return {"slug": slug, "config_file": "past.py", "config_variant": None, "overrides": {"a": "1", "lr": "0.5"}}


def _commit_past_studies(repository: pathlib.Path, margin: float) -> str:
  package = repository / "stalesgd" / "studies"
  package.mkdir(parents=True, exist_ok=True)
  (repository / "stalesgd" / "__init__.py").write_text("")
  (package / "__init__.py").write_text(_PAST_STUDIES.format(margin=margin))
  git = ["git", "-C", str(repository), "-c", "user.name=t", "-c", "user.email=t@example.com"]
  subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
  subprocess.run([*git, "commit", "-q", "-m", f"margin {margin}"], check=True, capture_output=True)
  return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_the_claims_at_a_commit_are_that_commits_not_the_working_trees(tmp_path):
  subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, capture_output=True)
  first = _commit_past_studies(tmp_path, 2)
  second = _commit_past_studies(tmp_path, 5)
  (tmp_path / "stalesgd" / "studies" / "__init__.py").write_text("raise SystemExit('never read')")  # uncommitted
  expected = {
    "study": "past",
    "last_evaluations": 2,
    "claims": [{"variant": "soft", "reference": "hard", "kind": "matches", "margin": 2.0}],
    "variants": [_past_variant("hard"), _past_variant("soft")],  # only those a claim names
  }
  assert registration.claims_at_commit(tmp_path, first, "past") == expected
  assert registration.claims_at_commit(tmp_path, second, "past")["claims"][0]["margin"] == 5.0
  assert registration.claims_at_commit(tmp_path, first, "absent") is None  # no such study then
  assert registration.claims_at_commit(tmp_path, "0" * 40, "past") is None  # no such commit
  assert registration.claims_at_commit(tmp_path / "stalesgd", first, "past") is None  # not a repository's root
  # Read once per commit: the answer stays when the repository is gone.
  shutil.rmtree(tmp_path / ".git")
  assert registration.claims_at_commit(tmp_path, first, "past") == expected


def test_without_git_the_claims_at_a_commit_cannot_be_read(tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))  # no git, no tar
  assert registration.claims_at_commit(tmp_path, "1" * 40, "past") is None
