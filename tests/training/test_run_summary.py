"""The sessions a run directory records, and the warning when a resume runs other code (`_run_summary`)."""

from __future__ import annotations

import io
import pathlib

import pytest

from stalesgd.reports._progress import ProgressReporter
from stalesgd.training._provenance import source_digest
from stalesgd.training._run_summary import (
  SOURCE_DIGEST_KEY,
  ran_on_other_cpu,
  ran_other_code,
  warn_if_code_changed,
  warn_if_cpu_changed,
)

COMMIT, OTHER = "a" * 40, "b" * 40


def _reporter() -> tuple[ProgressReporter, io.StringIO]:
  """The run's own reporter, writing into a string: what a user would see of the warning."""
  stream = io.StringIO()
  return ProgressReporter(1, stream=stream, enabled=True), stream


def _session(first_update: int, commit: str, digest: str | None = None) -> dict:
  session = {"first_update": first_update, "stalesgd_version": "0.2.0", "stalesgd_commit": commit}
  return session if digest is None else {**session, SOURCE_DIGEST_KEY: digest}


@pytest.mark.parametrize(
  "before, now, other",
  [
    (_session(0, COMMIT + "-dirty", "1" * 64), _session(9, COMMIT + "-dirty", "1" * 64), False),  # the same edits
    (_session(0, COMMIT + "-dirty", "1" * 64), _session(9, COMMIT + "-dirty", "2" * 64), True),  # other edits
    (_session(0, COMMIT, "1" * 64), _session(9, OTHER, "1" * 64), False),  # the same sources at two commits
    (_session(0, COMMIT), _session(9, COMMIT, "1" * 64), False),  # no digest before: version and commit decide
    (_session(0, COMMIT), _session(9, OTHER, "1" * 64), True),
    (_session(0, COMMIT + "-dirty"), _session(9, COMMIT + "-dirty", "1" * 64), True),  # a dirty tree, unknown edits
  ],
)
def test_other_code_is_told_by_the_source_digests_where_both_sessions_have_one(before, now, other):
  assert ran_other_code(before, now) is other
  reporter, printed = _reporter()
  warn_if_code_changed([before, now], reporter)
  assert len(printed.getvalue().splitlines()) == other


def test_the_warning_names_where_the_sessions_start_and_each_ones_code():
  reporter, printed = _reporter()
  warn_if_code_changed([_session(0, COMMIT), _session(5, COMMIT, "c" * 64), _session(13, OTHER, "d" * 64)], reporter)
  assert printed.getvalue().splitlines() == [
    f"warning: updates before 13 were computed by stalesgd 0.2.0 at {COMMIT} (source cccccccccccc), the rest by "
    f"stalesgd 0.2.0 at {OTHER} (source dddddddddddd): the bits need not equal an uninterrupted run of either "
    "(summary.json lists every session's code under sessions)"
  ]
  warn_if_code_changed([_session(0, OTHER)], reporter)  # one session: nothing to compare
  assert len(printed.getvalue().splitlines()) == 1


def test_the_source_digest_covers_each_python_files_path_and_bytes_only(tmp_path):
  def tree(name: str, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / name
    for relative, text in files.items():
      (root / relative).parent.mkdir(parents=True, exist_ok=True)
      (root / relative).write_text(text)
    return root

  base = {"__init__.py": "x = 1\n", "sub/_m.py": "y = 2\n"}
  digest = source_digest(tree("base", base))
  assert len(digest) == 64 and source_digest(tree("same", {**base, "notes.txt": "not code"})) == digest
  assert source_digest(tree("edited", {**base, "sub/_m.py": "y = 3\n"})) != digest
  assert source_digest(tree("moved", {"__init__.py": "x = 1\n", "sub/_n.py": "y = 2\n"})) != digest
  assert source_digest(tree("joined", {"__init__.py": "x = 1\nsub/_m.py\0y = 2\n"})) != digest


ZEN1 = {"cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD family 23 model 1", "cpu_isa": "avx avx2 fma"}
ZEN4 = {"cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD family 25 model 17", "cpu_isa": "avx avx2 avx512f fma"}


@pytest.mark.parametrize(
  "before, now, other",
  [
    (ZEN1, {**ZEN1, "cores": 4}, False),  # the same processor kind, another machine size
    (ZEN1, ZEN4, True),  # one name, two generations
    (ZEN1, {**ZEN1, "cpu_isa": "avx avx2 avx512f fma"}, True),  # a virtual machine showing other instructions
    ({"cpu_model": "AMD EPYC"}, ZEN4, False),  # recorded by name only: one name may be either, nothing is known
    ({"cpu_model": "Intel(R) Xeon(R) Processor"}, ZEN1, True),  # other names are other processors
    ({}, ZEN1, False),  # no host recorded
  ],
)
def test_another_processor_kind_is_told_by_any_cpu_field_both_sessions_record(before, now, other):
  sessions = [{"first_update": 0, "host": before}, {"first_update": 7, "host": now}]
  assert ran_on_other_cpu(*sessions) is other
  reporter, printed = _reporter()
  warn_if_cpu_changed(sessions, reporter)
  assert len(printed.getvalue().splitlines()) == other


def test_the_processor_warning_names_where_the_sessions_start_and_each_ones_processor():
  reporter, printed = _reporter()
  warn_if_cpu_changed([{"first_update": 0, "host": ZEN4}, {"first_update": 13, "host": ZEN1}], reporter)
  assert printed.getvalue().splitlines() == [
    "warning: updates before 13 were computed on AMD EPYC (AuthenticAMD family 25 model 17), the rest on AMD EPYC "
    "(AuthenticAMD family 23 model 1): another kind of processor rounds differently, so the bits need not equal an "
    "uninterrupted run on either (summary.json lists every session's host under sessions)"
  ]
  warn_if_cpu_changed([{"first_update": 0, "host": ZEN1}], reporter)  # one session: nothing to compare
  assert len(printed.getvalue().splitlines()) == 1
