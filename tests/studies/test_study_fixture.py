"""A study directory written by an earlier commit's code resumes, and ``--gather`` reads it, with today's code.

The fixture (``tests/fixtures/study_643a36b``, written by ``tests/fixtures/make_study_fixture.py`` with the code
the long grids ran from) holds the demo at 2 epochs: ``8_softsync_a0_sigma`` finished, ``hardsync`` preempted
by SIGTERM at update 13. A copy of it must be refused by ``--gather`` naming the unfinished run (one line, no
traceback), then run to the end (the finished run read back, the preempted one resumed from its checkpoint to
the records the old code reached uninterrupted: bit for bit on the host the fixture records, elsewhere to the
tolerance of `tests.helpers.cross_host`), and then gathered into the same report.
"""

from __future__ import annotations

import csv
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from tests.helpers import cross_host, train_helpers
from tests.helpers.fault_helpers import without_wall_clock

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPOSITORY / "tests" / "fixtures" / "study_643a36b"
REPORT_TABLES = ("runs.csv", "results.csv")  # one row per run; per variant over seeds


def _facts() -> dict:
  return json.loads((FIXTURE / "fixture.json").read_text())


def _reproduce(workdir: pathlib.Path, compilation_cache: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
  command = [sys.executable, "-m", "stalesgd.cli.reproduce", *_facts()["study_flags"], f"--workdir={workdir}", *flags]
  env = {**train_helpers.main_environment(compilation_cache), "JAX_PLATFORMS": "cpu"}
  return subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=600, env=env)


def _table(path: pathlib.Path) -> list[dict[str, str]]:
  with open(path, newline="", encoding="utf-8") as file:
    return list(csv.DictReader(file))


@pytest.mark.slow
def test_an_earlier_commits_study_directory_resumes_and_gathers(tmp_path, compilation_cache):
  facts = _facts()
  workdir = tmp_path / "study"
  shutil.copytree(FIXTURE, workdir)
  finished, preempted = workdir / facts["finished"], workdir / facts["preempted"]
  finished_records = train_helpers.read_metrics(finished)
  assert train_helpers.read_summary(preempted)["preempted"] is True

  refused = _reproduce(workdir, tmp_path / "cache", "--gather")
  assert refused.returncode == 1, refused.stderr[-3000:]
  lines = refused.stderr.strip().splitlines()
  assert "Traceback" not in refused.stderr and len(lines) == 2, lines
  assert lines[0].startswith("FATAL --gather: 1 of 2 runs has not finished: --task=0 (hardsync, seed 0, ")
  assert str(preempted) in lines[0]

  ran = _reproduce(workdir, compilation_cache, "--parallel=1")
  assert ran.returncode == 0, ran.stderr[-3000:] + ran.stdout[-3000:]
  assert f"resumed from the checkpoint at update {facts['preempted_at_update']} in {preempted}" in ran.stdout
  assert f"reused the finished run in {finished}" in ran.stdout
  summary = train_helpers.read_summary(preempted)
  assert summary["preempted"] is False and summary["updates"] == facts["expected_updates"]
  old_session, new_session = summary["sessions"]  # the old code's, then today's, which records its source digest
  assert old_session["stalesgd_commit"] == facts["commit"] and "stalesgd_source_sha256" not in old_session
  assert new_session["first_update"] == facts["preempted_at_update"] and new_session["stalesgd_source_sha256"]
  at, commit = facts["preempted_at_update"], facts["commit"]
  assert f"warning: updates before {at} were computed by stalesgd 0.2.0 at {commit}, the rest by " in ran.stdout
  # The fixture's sessions recorded their processor by name; another name is another processor, and a resume
  # there says so (one name may hide two generations: then nothing is known, and nothing is said).
  other_cpu = facts["host"]["cpu_model"] != cross_host.this_host()["cpu_model"]
  cpu_warning = f"warning: updates before {at} were computed on {facts['host']['cpu_model']}, the rest on "
  assert (cpu_warning in ran.stdout) is other_cpu
  expected = [json.loads(line) for line in (FIXTURE / "expected_hardsync_metrics.jsonl").read_text().splitlines()]
  num_test = json.loads((preempted / "dataset.json").read_text())["num_test"]
  # Written on the fixture's host: exactly there, elsewhere to the stated tolerance (tests/helpers/cross_host.py).
  cross_host.assert_records_agree(
    without_wall_clock(train_helpers.read_metrics(preempted)),
    without_wall_clock(expected),
    facts["host"],
    num_test=num_test,
  )
  assert train_helpers.read_metrics(finished) == finished_records  # read back, not trained again
  report = {name: _table(workdir / name) for name in REPORT_TABLES}

  for name in REPORT_TABLES:
    (workdir / name).unlink()
  gathered = _reproduce(workdir, compilation_cache, "--gather")
  assert gathered.returncode == 0, gathered.stderr[-3000:]
  assert {name: _table(workdir / name) for name in REPORT_TABLES} == report
  errors = {row["variant"]: float(row["test_error"]) for row in report["runs.csv"]}  # each run's last evaluation
  assert errors["8-softsync, a0/sigma"] == train_helpers.evaluation_records(finished_records)[-1]["test_error"]
  cross_host.assert_records_agree(
    [{"test_error": errors["hardsync"]}],
    [{"test_error": train_helpers.evaluation_records(expected)[-1]["test_error"]}],
    facts["host"],
    num_test=num_test,
  )
