"""experiments/mutation.py's pure parts: the summary built from a session's records, the control-patch applier,
the killing test read from pytest's output, and the module table against the controls. Needs no mutation tool
(the records are written here in `cosmic-ray dump`'s form) and runs no test command."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sqlite3

import pytest

from experiments import mutation

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def _record(job, operator, occurrence, line, result):
  mutation_spec = {
    "module_path": "stalesgd/transforms/_x.py",
    "operator_name": f"core/{operator}",
    "occurrence": occurrence,
    "start_pos": [line, 4],
    "end_pos": [line, 5],
    "operator_args": {},
    "definition_name": "rule",
  }
  return [{"job_id": job, "mutations": [mutation_spec]}, result]


def _result(test_outcome, output="", worker="normal"):
  return {"worker_outcome": worker, "output": output, "test_outcome": test_outcome, "diff": "--- a\n+++ b\n-x\n+y"}


FAILED = "....F\n=== short test summary info ===\nFAILED tests/transforms/test_x.py::test_rule[0.5] - assert 1 == 2\n"


def test_the_summary_counts_each_outcome_and_never_a_timeout_as_killed():
  records = [
    _record("a", "ReplaceBinaryOperator_Add_Sub", 0, 10, _result("killed", FAILED)),
    _record("b", "ReplaceBinaryOperator_Add_Mul", 0, 10, _result("survived", "5 passed")),
    _record("c", "NumberReplacer", 1, 12, _result("killed", "timeout")),
    _record("d", "NumberReplacer", 0, 12, _result("incompetent", "Traceback", worker="exception")),
    _record("e", "NumberReplacer", 2, 12, _result(None, None, worker="no-test")),
    _record("f", "ReplaceComparisonOperator_Lt_LtE", 0, 14, None),
    _record("g", "ReplaceComparisonOperator_Lt_Gt", 0, 14, _result("killed", "ERROR collecting tests/x.py\n")),
  ]
  summary = mutation.module_summary("stalesgd/transforms/_x.py", records)
  assert (summary["mutants"], summary["killed"], summary["survived"]) == (6, 2, 1)
  assert (summary["timed_out"], summary["incompetent"], summary["pending"], summary["equivalent"]) == (1, 1, 1, 0)
  assert summary["killed_percent_of_non_equivalent"] == 50.0  # 2 killed of 4 decided: the timeout is not a kill
  rows = {row["job_id"]: row for row in summary["mutant_list"]}
  assert rows["a"]["killed_by"] == "tests/transforms/test_x.py::test_rule[0.5]"
  assert rows["a"]["diff"] == ["-x", "+y"] and rows["a"]["line"] == 10
  assert rows["c"]["outcome"] == "timed out" and rows["c"]["killed_by"] is None
  assert rows["g"]["killed_by"] is None and rows["g"]["output_tail"] == "ERROR collecting tests/x.py"
  assert [row["job_id"] for row in summary["survivors"]] == ["b"]


def test_an_equivalent_survivor_leaves_the_denominator():
  records = [
    _record("a", "ReplaceBinaryOperator_Add_Sub", 0, 10, _result("killed", FAILED)),
    _record("b", "ReplaceBinaryOperator_Add_Mul", 0, 10, _result("survived", "5 passed")),
  ]
  equivalents = [
    {"module": "stalesgd/transforms/_x.py", "operator": "core/ReplaceBinaryOperator_Add_Mul", "occurrence": 0}
  ]
  summary = mutation.module_summary("stalesgd/transforms/_x.py", records, equivalents)
  assert summary["equivalent"] == 1 and summary["survivors"] == []
  assert summary["killed_percent_of_non_equivalent"] == 100.0


def test_an_equivalent_listed_for_another_source_counts_for_nothing():
  """Occurrence numbers are per source: once the module changed, the listed mutant may be another one."""
  source = "def rule(x):\n  return x + 1\n"
  records = [_record("b", "ReplaceBinaryOperator_Add_Mul", 0, 2, _result("survived", "5 passed"))]
  listed = {"module": "stalesgd/transforms/_x.py", "operator": "core/ReplaceBinaryOperator_Add_Mul", "occurrence": 0}
  today = hashlib.sha256(source.encode()).hexdigest()
  for digest, equivalent in ((today, 1), ("0" * 64, 0)):
    summary = mutation.module_summary(
      "stalesgd/transforms/_x.py", records, [{**listed, "source_sha256": digest}], source
    )
    assert summary["equivalent"] == equivalent and len(summary["survivors"]) == 1 - equivalent


def test_the_control_applier_refuses_an_absent_or_ambiguous_old_text():
  assert mutation.apply_control("a = b + c\n", "b + c", "b - c") == "a = b - c\n"
  with pytest.raises(ValueError, match="occurs 0 times"):
    mutation.apply_control("a = b + c\n", "b * c", "b - c")
  with pytest.raises(ValueError, match="occurs 2 times"):
    mutation.apply_control("a = b + c\nd = b + c\n", "b + c", "b - c")


def test_every_listed_module_has_a_control_that_applies_and_tests_that_exist():
  controls = json.loads((REPOSITORY / "experiments" / "mutation_controls.json").read_text())["controls"]
  for control in controls:  # each applies to today's source, exactly once
    mutation.apply_control((REPOSITORY / control["file"]).read_text(), control["old"], control["new"])
  listed = {module.path for module in mutation.MODULES}
  assert len(listed) == len(mutation.MODULES)
  assert listed == {control["file"] for control in controls}
  for module in mutation.MODULES:
    assert (REPOSITORY / module.path).is_file(), module.path
    for test in module.tests:
      assert (REPOSITORY / test).is_file(), test


def test_the_test_command_runs_the_modules_tests_stopping_at_the_first_failure():
  module = mutation.Module("stalesgd/x.py", ("tests/a.py", "tests/b.py"), "x", not_slow=True)
  command = mutation.test_command(module, python="/p/python")
  assert command == "/p/python -m pytest -x -q -p no:cacheprovider -m 'not slow' tests/a.py tests/b.py"


def test_a_session_is_kept_for_a_wider_test_list_and_set_aside_for_anything_else():
  """Adding a test file keeps the kills (the failing test still runs); a changed source, a removed test file or
  other pytest options make the session stale."""
  narrow = mutation.Module("stalesgd/x.py", ("tests/a.py",), "x")
  meta = {"source_sha256": "s", "tests": ["tests/a.py"], "test_command": mutation.test_command(narrow, python="/p")}
  assert mutation.session_change(meta, narrow, "s", python="/p") == "same"
  wider = narrow._replace(tests=("tests/a.py", "tests/b.py"))
  assert mutation.session_change(meta, wider, "s", python="/p") == "widened"
  assert mutation.session_change(meta, wider, "t", python="/p") == "stale"
  assert mutation.session_change(meta, narrow._replace(tests=("tests/b.py",)), "s", python="/p") == "stale"
  assert mutation.session_change(meta, wider._replace(not_slow=True), "s", python="/p") == "stale"
  assert mutation.session_change(meta, narrow, "s", python="/q") == "stale"


def test_each_module_has_its_own_session_files():
  files = [mutation._module_files(module) for module in mutation.MODULES]
  paths = [path for entry in files for path in entry.values()]
  assert len(set(paths)) == len(paths)
  assert files[0]["session"].name == "stalesgd.transforms._staleness.sqlite"


def test_a_controls_outcome_is_kept_only_while_its_tests_are_unchanged(tmp_path):
  """A control that survived must run again once a test is added: its record is keyed on the tests' digest too."""
  module = mutation.Module("stalesgd/x.py", ("tests/a.py", "tests/b.py"), "x")
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "a.py").write_text("def test_a(): pass\n")
  (tmp_path / "tests" / "b.py").write_text("")
  before = mutation.tests_digest(module, tmp_path)
  assert mutation.tests_digest(module, tmp_path) == before
  (tmp_path / "tests" / "b.py").write_text("def test_b(): pass\n")
  assert mutation.tests_digest(module, tmp_path) != before


def test_forgetting_survivors_leaves_the_other_results(tmp_path):
  session = tmp_path / "session.sqlite"
  with sqlite3.connect(session) as database:
    database.execute("CREATE TABLE work_results (worker_outcome, output, test_outcome, diff, job_id PRIMARY KEY)")
    for job, outcome in (("a", "KILLED"), ("b", "SURVIVED"), ("c", "SURVIVED")):  # as cosmic-ray stores them
      database.execute("INSERT INTO work_results VALUES ('NORMAL', '', ?, '', ?)", (outcome, job))
  assert sorted(mutation.forget_survivors(session)) == ["b", "c"]
  with sqlite3.connect(session) as database:
    assert list(database.execute("SELECT job_id, test_outcome FROM work_results")) == [("a", "KILLED")]


def test_an_incompetent_result_is_forgotten_and_a_skipped_mutant_kept(tmp_path):
  """A pass stopped mid-mutant leaves an INCOMPETENT row (its worker raised): it is run again at the next pass.
  Annotation-only mutants are skipped rows with no test outcome: they stay."""
  session = tmp_path / "session.sqlite"
  with sqlite3.connect(session) as database:
    database.execute("CREATE TABLE work_results (worker_outcome, output, test_outcome, diff, job_id PRIMARY KEY)")
    rows = [
      ("NORMAL", "", "KILLED", "a"),
      ("EXCEPTION", "Traceback", "INCOMPETENT", "b"),
      ("SKIPPED", mutation.ANNOTATION_ONLY, None, "c"),
      ("NORMAL", "", "SURVIVED", "d"),
    ]
    database.executemany("INSERT INTO work_results VALUES (?, ?, ?, '', ?)", rows)
  assert mutation.forget_incompetent(session) == ["b"]
  with sqlite3.connect(session) as database:
    assert sorted(row[0] for row in database.execute("SELECT job_id FROM work_results")) == ["a", "c", "d"]


ANNOTATED = """\
from __future__ import annotations


def rule(a: int | None, *rest: str, b: float = 1.0, **options: dict) -> list[int] | None:
  total: int | None = a
  return [total]


class Row:
  field: int | None = None
"""


def test_annotation_spans_are_the_unevaluated_function_annotations_only():
  spans = sorted(mutation.annotation_spans(ANNOTATED))
  lines = ANNOTATED.splitlines()
  assert all(start[0] == end[0] for start, end in spans)
  # The parameters', the return's and the local variable's annotations; Row.field's (line 10) is kept in
  # __annotations__, so it is not among them.
  assert [(start[0], lines[start[0] - 1][start[1] : end[1]]) for start, end in spans] == [
    (4, "int | None"),
    (4, "str"),
    (4, "float"),
    (4, "dict"),
    (4, "list[int] | None"),
    (5, "int | None"),
  ]
  assert spans[0] == ((4, 12), (4, 22))
  assert mutation.in_annotation(spans, [4, 16], [4, 17])  # the `|` of `int | None`
  assert not mutation.in_annotation(spans, [4, 47], [4, 50])  # the default 1.0
  assert not mutation.in_annotation(spans, [10, 13], [10, 14])  # the class field's `|`
  # Without the __future__ import a function's annotations are evaluated when it is defined: none is skipped.
  assert mutation.annotation_spans(ANNOTATED.replace("from __future__ import annotations\n", "")) == []


def test_an_annotation_only_mutant_is_equivalent_whether_it_ran_or_was_skipped():
  def at(job, line, column, result):
    record = _record(job, "ReplaceBinaryOperator_BitOr_BitAnd", 0, line, result)
    record[0]["mutations"][0]["start_pos"], record[0]["mutations"][0]["end_pos"] = [line, column], [line, column + 1]
    return record

  records = [
    at("ran", 4, 16, _result("survived", "5 passed")),
    at("skipped", 4, 84, _result(None, mutation.ANNOTATION_ONLY, worker="skipped")),
    at("local", 5, 13, None),
    at("code", 6, 2, _result("killed", FAILED)),
  ]
  summary = mutation.module_summary("stalesgd/transforms/_x.py", records, source=ANNOTATED)
  rows = {row["job_id"]: row for row in summary["mutant_list"]}
  assert [rows[job]["outcome"] for job in ("ran", "skipped", "local", "code")] == [
    "survived",
    "skipped",
    "pending",
    "killed",
  ]
  assert all(rows[job]["equivalent"] for job in ("ran", "skipped", "local")) and not rows["code"]["equivalent"]
  assert rows["skipped"]["equivalent_reason"] == mutation.ANNOTATION_ONLY
  assert summary["survivors"] == [] and summary["skipped_annotation_only"] == 1 and summary["equivalent"] == 3
  assert summary["killed_percent_of_non_equivalent"] == 100.0  # 1 killed of 1 decided: the rest never counted
  # Without the source, the same records are what they were: a survivor and an unlisted skip.
  plain = mutation.module_summary("stalesgd/transforms/_x.py", records)
  assert [row["job_id"] for row in plain["survivors"]] == ["ran"] and plain["killed_percent_of_non_equivalent"] == 50.0


def test_skipping_marks_only_pending_annotation_mutants(tmp_path):
  session = tmp_path / "session.sqlite"
  with sqlite3.connect(session) as database:
    database.execute(
      "CREATE TABLE mutation_specs (module_path VARCHAR, operator_name VARCHAR, operator_args JSON, occurrence "
      "INTEGER, start_pos_row INTEGER, start_pos_col INTEGER, end_pos_row INTEGER, end_pos_col INTEGER, "
      "definition_name VARCHAR, job_id VARCHAR NOT NULL)"
    )
    database.execute(
      "CREATE TABLE work_results (worker_outcome VARCHAR(9), output TEXT, test_outcome VARCHAR(11), diff TEXT, "
      "job_id VARCHAR NOT NULL)"
    )
    for job, line, column in (("annotation", 4, 16), ("done", 4, 20), ("code", 6, 2)):
      database.execute(
        "INSERT INTO mutation_specs VALUES ('m', 'op', '{}', 0, ?, ?, ?, ?, 'rule', ?)",
        (line, column, line, column + 1, job),
      )
    database.execute("INSERT INTO work_results VALUES ('NORMAL', '', 'SURVIVED', '', 'done')")
  assert mutation.skip_annotation_mutants(session, ANNOTATED) == 1
  with sqlite3.connect(session) as database:
    results = dict(database.execute("SELECT job_id, worker_outcome FROM work_results"))
  assert results == {"done": "NORMAL", "annotation": "SKIPPED"}


def test_a_finished_module_keeps_its_summary_entry_only_for_the_source_it_was_made_for():
  """Sessions live under runs/ (not committed): a fresh clone keeps a done module's figures while its source and
  test command are those of the entry, and says where they come from; anything else is not kept."""
  module = mutation.MODULES[0]
  entry = {
    "module": module.path,
    "status": "done",
    "source_sha256": mutation._sha256(REPOSITORY / module.path),
    "test_command": mutation.summary_test_command(module),
    "killed": 3,
  }
  kept = mutation.kept_from_summary(entry, module, "2026-12-04T00:00:00Z")
  assert kept["killed"] == 3 and "2026-12-04T00:00:00Z" in kept["session"]
  assert mutation.kept_from_summary({**entry, "status": "in progress"}, module, None) is None
  assert mutation.kept_from_summary({**entry, "source_sha256": "0" * 64}, module, None) is None
  assert mutation.kept_from_summary({**entry, "test_command": "other"}, module, None) is None
  assert mutation.kept_from_summary(None, module, None) is None


def test_every_equivalents_evidence_names_a_test_that_exists():
  """An equivalent mutant's evidence cites tests as path::name: each must be a test function of that file."""
  entries = json.loads((REPOSITORY / "experiments" / "mutation_equivalents.json").read_text())["equivalents"]
  missing = []
  for entry in entries:
    for evidence in entry["evidence"]:
      cited = evidence.split(" ", 1)[0]
      if "::" not in cited:
        continue
      path, name = cited.split("::", 1)
      name = name.split("[", 1)[0]
      source = (REPOSITORY / path).read_text() if (REPOSITORY / path).exists() else ""
      if f"def {name}(" not in source:
        missing.append((entry["module"], entry["line"], cited))
  assert not missing, missing


def test_the_committed_summary_is_of_the_modules_as_they_stand():
  """results/mutation/summary.json lists every module of MODULES and calls one done only for the source it has now
  (a module changed since its pass is run again, or marked not run by ``experiments/mutation.py --report``), and
  the results README's heading counts the done modules as the summary does."""
  summary = json.loads((REPOSITORY / "results" / "mutation" / "summary.json").read_text())
  entries = {entry["module"]: entry for entry in summary["modules"]}
  assert list(entries) == [module.path for module in mutation.MODULES]
  changed = [
    path
    for path, entry in entries.items()
    if entry["status"] == "done" and entry["source_sha256"] != mutation._sha256(REPOSITORY / path)
  ]
  assert not changed, f"changed since their mutation pass: {changed}; run experiments/mutation.py --modules ..."
  done = sum(entry["status"] == "done" for entry in entries.values())
  heading = (REPOSITORY / "results" / "mutation" / "README.md").read_text().splitlines()[0]
  total = len(mutation.MODULES)
  assert (f"all {total} modules" if done == total else f"{done} of {total} modules") in heading, heading


def test_a_modules_session_is_claimed_by_one_pass_at_a_time(tmp_path, monkeypatch):
  """Two lanes never run one module's session together: a claim held by a live process (this one) is refused; one
  left by a stopped pass (a pid that does not exist) is taken over."""
  monkeypatch.setattr(mutation, "SESSIONS", tmp_path)
  module = mutation.MODULES[0]
  claim = mutation._claim(module)
  assert claim is not None and claim.read_text() == str(os.getpid())
  assert mutation._claim(module) is None
  claim.write_text("999999999")  # no such process
  assert mutation._claim(module) == claim
