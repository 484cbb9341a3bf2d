"""A study's README (`stalesgd.studies._results_readme`): the provenance its runs give, the Notes it keeps."""

from __future__ import annotations

import json

import pytest

from stalesgd.studies import Study, Variant
from stalesgd.studies import _results_readme as results_readme


@pytest.mark.parametrize(
  "seconds, shown",
  [(None, "-"), (3.2, "3 s"), (59.4, "59 s"), (59.6, "1 min"), (125.0, "2 min"), (3700.0, "1 h 02 min")],
)
def test_durations_read_in_seconds_under_a_minute_then_minutes_and_hours(seconds, shown):
  assert results_readme._duration(seconds) == shown


def test_the_wall_time_line_counts_the_runs_that_recorded_none(tmp_path):
  rows = [
    {"workdir": str(tmp_path / "a"), "wall_time": 30.0, "host_devices": 8},
    {"workdir": str(tmp_path / "b"), "wall_time": 170.0, "host_devices": 8},
    {"workdir": str(tmp_path / "c"), "wall_time": None, "host_devices": 8},  # diverged: no summary
  ]
  lines = results_readme.provenance_lines(rows)
  assert lines[-1] == (
    "- wall time: 3 min in all, 2 runs of 30 s to 3 min (per run below and in runs.csv); "
    "1 run(s) recorded none (e.g. diverged)"
  )
  assert results_readme.provenance_lines(rows[:2])[-1].endswith("(per run below and in runs.csv)")


def test_a_new_report_keeps_the_hand_written_notes_word_for_word(tmp_path):
  study = Study("notes", "a study", "demo: none", (Variant("hardsync", "demo", "hardsync"),), paper_data=False)

  def write(table: str) -> None:
    results_readme.write_readme(study, [], tmp_path, table=table, decisions="none", command="stalesgd-reproduce")

  write("| first |")
  first = (tmp_path / "README.md").read_text()
  assert first.endswith(f"## Notes\n\n{results_readme.NO_NOTES}\n") and "| first |" in first
  edited = "Superseded by X.\n\n- a caveat, with ## inside\n"
  (tmp_path / "README.md").write_text(first.replace(results_readme.NO_NOTES + "\n", edited))
  write("| second |")
  second = (tmp_path / "README.md").read_text()
  assert second.endswith("## Notes\n\n" + edited) and "| second |" in second and "| first |" not in second
  (tmp_path / "README.md").write_text(second.replace("## Notes\n", "## Remarks\n"))  # no Notes heading: none kept
  write("| third |")
  assert (tmp_path / "README.md").read_text().endswith(f"## Notes\n\n{results_readme.NO_NOTES}\n")


def test_the_hosts_line_names_each_cpus_generation_where_a_session_recorded_it(tmp_path):
  for name, host in (
    ("old", {"cpu_model": "AMD EPYC", "cores": 2}),  # recorded before the family was
    ("zen", {"cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD family 23 model 1", "cores": 2}),
  ):
    (tmp_path / name).mkdir()
    summary = {"sessions": [{"stalesgd_commit": "a" * 40, "stalesgd_version": "0.2.0", "host": host}]}
    (tmp_path / name / "summary.json").write_text(json.dumps(summary))
  rows = [{"workdir": str(tmp_path / name), "wall_time": 1.0, "host_devices": 8} for name in ("old", "zen")]
  (hosts,) = [line for line in results_readme.provenance_lines(rows) if line.startswith("- host: ")]
  assert "AMD EPYC, 2 cores" in hosts and "AMD EPYC (AuthenticAMD family 23 model 1), 2 cores" in hosts
