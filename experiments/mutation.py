"""Mutation testing of the rules the results rest on: how many one-token changes would the suite miss?

For each module of `MODULES` (one Python file: the transforms' rules, the schedule's server rules, protocol
simulation and timing model, the engine's block planner and ring buffer, DC-S3GD's step, Streaming DiLoCo's round
and fragments, the training optimizer chain and the models' multiplier rules, the seed statistics, the claim
decision, the divergence rule, the pilot's choice and pre-registration, the per-learner data order)
this runs cosmic-ray with its default operators, one session per module, each mutant's tests in a fresh process
(cosmic-ray's local distributor starts one test command per mutant: nothing is forked from a process that has
JAX running, and no jit cache is inherited by a mutant). Each mutant runs only the module's own test files
(`Module.tests`, chosen by reading which tests import it), with pytest's ``-x``, the persistent compilation
cache off, and a per-mutant timeout of `--timeout-factor` times the module's unmutated test run (at least
`--min-timeout` seconds). A timeout is reported as such, never counted as a kill.

The mutants are applied to a copy of ``stalesgd/``, ``tests/`` and ``experiments/`` under ``runs/mutation/tree/``
(cosmic-ray edits the file on disk while a mutant's tests run; others' test runs from the checkout never see a
mutant).
The copy is made afresh at every start, so a stop in the middle of a mutant leaves nothing mutated behind.
Each module's session is ``runs/mutation/sessions/<module>.sqlite``: a stopped pass resumes where it stopped
(cosmic-ray's ``exec`` runs only the work items without a result, and the mutant a stop interrupted, recorded
as incompetent, is forgotten first: `forget_incompetent`); a session whose module source or test
command changed since it was made is set aside and made again, except a widening: a test file added to the
module's list keeps the session's kills and runs its survivors again with the wider command (`session_change`).

Sessions are not committed: on a fresh clone a module the summary holds as done, for the source it has now, keeps
its figures there (the entry says so) and is not run again unless ``--again`` is given; its controls run again
with ``--controls-only``.

Controls: `CONTROLS_FILE` holds known-bad mutants written by hand before any run (at least one per module). Each
is applied to the copy and its module's test command is run by cosmic-ray's own test runner
(``cosmic_ray.testing.run_tests``) with the same command and timeout as the module's mutants; every control must
come out killed. A control's outcome is kept while its module's source and test files are unchanged (a control
that survived runs again once a test is added). Equivalent mutants, with the reason and the evidence, are kept by
hand in `EQUIVALENTS_FILE`; one kind is recognised here instead (`annotation_spans`): a mutant that changes only a
function's annotation in a module with ``from __future__ import annotations``, where Python keeps annotations as
strings and never evaluates them. Such mutants are marked skipped before a session runs (not run), and listed
as equivalent with that reason.

``results/mutation/summary.json``: the tool and its version, the configuration, per module the mutants, killed,
survived, timed out and incompetent (and the killed share of the non-equivalent mutants, timeouts counted as not
killed), per mutant the operator, line, outcome, diff and the test that killed it (pytest's ``FAILED`` line), and
the controls' outcomes and the equivalent mutants.

The tool lives in its own virtual environment (it is not in the project's, and not in ``make test``)::

  make mutation-venv      # python3 -m venv .venv-mutation && .venv-mutation/bin/pip install cosmic-ray==8.7.0

(the pin is pyproject.toml's ``mutation`` extra). Then, when no long study is running (every mutant is a test
run on these cores)::

  mkdir -p runs/mutation
  nohup nice -n 10 .venv/bin/python experiments/mutation.py --budget-minutes 600 > runs/mutation/log.txt 2>&1 &
  .venv/bin/python experiments/mutation.py --modules stalesgd/transforms/_staleness.py   # one module
  .venv/bin/python experiments/mutation.py --report      # only read the sessions and write the summary

Two passes may run side by side on different modules, each in its own copy and lock, ``--lane a`` and
``--lane b`` (each module's session is claimed by one pass at a time; a module another lane holds is skipped).

``--controls-only`` runs each module's unmutated tests and its controls, not its mutants (a quick check of the
table). ``--rerun-survivors`` runs the chosen modules' survived and timed-out mutants again with the current
tests (after a test was added to kill them; the session records when). `--budget-minutes` stops starting new
modules once it is spent (the module in progress finishes); run the same command again to continue.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "mutation"
TREE = RUNS / "tree"
SESSIONS = RUNS / "sessions"
LOCK = RUNS / "lock"
SUMMARY = ROOT / "results" / "mutation" / "summary.json"
CONTROLS_FILE = ROOT / "experiments" / "mutation_controls.json"
EQUIVALENTS_FILE = ROOT / "experiments" / "mutation_equivalents.json"
MUTATION_VENV = ROOT / ".venv-mutation"
PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"
TOOL = "cosmic-ray"
# What the copy under TREE holds: the package, the tests (with their conftest and helpers), the scripts some tests
# drive (experiments/, e.g. the pre-registration check of committed results) and pytest's settings.
COPIED = ("stalesgd", "tests", "experiments", "pyproject.toml")
PYTEST_OPTIONS = ("-x", "-q", "-p", "no:cacheprovider")
# The test processes' environment: JAX on the CPU, no persistent compilation cache (tests/conftest.py makes one
# only when JAX_COMPILATION_CACHE_DIR is unset; empty, JAX keeps none), the copy's stalesgd imported first.
TEST_ENVIRONMENT = {
  "JAX_PLATFORMS": "cpu",
  "JAX_ENABLE_COMPILATION_CACHE": "false",
  "JAX_COMPILATION_CACHE_DIR": "",
  "TF_CPP_MIN_LOG_LEVEL": "3",
  "PYTHONDONTWRITEBYTECODE": "1",
}


class Module(NamedTuple):
  """One mutated file, the test files that cover it, and whether its slow tests are left out."""

  path: str
  tests: tuple[str, ...]
  what: str
  not_slow: bool = False


_T = "tests/transforms/"
_S = "tests/schedule/"
_SCHEDULE_TESTS = (_S + "test_schedule_protocols.py", _S + "test_schedule_simulate.py")
MODULES: tuple[Module, ...] = (
  # transforms: the update rules.
  Module("stalesgd/transforms/_staleness.py", (_T + "test_transforms_staleness.py",), "staleness rules (Zhang et al.)"),
  Module(
    "stalesgd/transforms/_delay_compensation.py",
    (_T + "test_transforms_delay_compensation.py", _T + "test_transforms_delay_compensation_reductions.py"),
    "delay compensation (DC-ASGD)",
  ),
  Module("stalesgd/transforms/_gap_aware.py", (_T + "test_transforms_gap_aware.py",), "Gap-Aware"),
  Module(
    "stalesgd/transforms/_mean_square.py",
    (_T + "test_transforms_delay_compensation.py", _T + "test_transforms_delay_compensation_reductions.py"),
    "MeanSquare (DC-ASGD-a's per-learner second moment)",
  ),
  Module(
    "stalesgd/transforms/_contributions.py",
    # Stack.displacements' sign matters only to delay compensation (Gap-Aware takes its absolute value).
    (
      _T + "test_transforms_contributions.py",
      _T + "test_transforms_staleness.py",
      _T + "test_transforms_delay_compensation.py",
    ),
    "stacks of contributions, their average",
  ),
  Module("stalesgd/transforms/_delayed.py", (_T + "test_delayed.py",), "fixed and per-gradient delays"),
  Module("stalesgd/transforms/_modulated_step.py", (_T + "test_modulated_step.py",), "the modulated step"),
  Module("stalesgd/transforms/_delayed_nesterov.py", (_T + "test_delayed_nesterov.py",), "delayed Nesterov"),
  Module(
    "stalesgd/transforms/_local_run.py",
    (_T + "test_local_run.py", "tests/decentral/test_diloco_shard_map.py"),
    "local runs and the outer step (DiLoCo)",
  ),
  Module(
    "stalesgd/transforms/_aliases.py",
    (_T + "test_transforms_staleness.py", _T + "test_transforms_delay_compensation.py"),
    "staleness_aware_sgd, dc_asgd",
  ),
  Module(
    "stalesgd/transforms/_moving_average.py",
    (_T + "test_transforms_gap_aware.py", _T + "test_transforms_delay_compensation.py"),
    "the exponential moving average of Gap-Aware and MeanSquare",
  ),
  Module(
    "stalesgd/transforms/_hyperparameters.py",
    (_T + "test_transforms_staleness.py", _T + "test_transforms_gap_aware.py"),
    "a hyperparameter's value at an update (schedules)",
  ),
  # schedule: server rules, protocol simulation, timing model.
  Module(
    "stalesgd/schedule/_parameter_server.py",
    # The server link's queueing (contention, shards) is pinned in the timing tests; the least-visited data shard
    # and the run cut at a budget of inner steps in the data-shard tests.
    (*_SCHEDULE_TESTS, _S + "test_schedule_timing.py", _S + "test_schedule_data_shards.py"),
    "the parameter server and its link",
  ),
  Module("stalesgd/schedule/_ssp.py", _SCHEDULE_TESTS, "stale-synchronous server rule"),
  Module("stalesgd/schedule/_softsync.py", _SCHEDULE_TESTS, "arrival-order (softsync / async) server rule"),
  Module("stalesgd/schedule/_backup.py", _SCHEDULE_TESTS, "backup-worker server rule"),
  Module(
    "stalesgd/schedule/_decentralized.py",
    # The outer rounds' timing (fragments, delay, the ring all-reduce) is pinned in the timing tests.
    (*_SCHEDULE_TESTS, _S + "test_schedule_timing.py"),
    "decentralised all-reduce schedule",
  ),
  Module(
    "stalesgd/schedule/_protocols.py",
    # c (contributions_per_update) and the config fields' mapping to options are read by training only; the
    # data-shard and inner-step options are checked in the data-shard tests, outer rounds' timing in the timing
    # tests.
    (
      *_SCHEDULE_TESTS,
      "tests/training/test_effective_batch.py",
      _S + "test_schedule_data_shards.py",
      _S + "test_schedule_timing.py",
    ),
    "the protocol table and simulate",
  ),
  Module(
    "stalesgd/schedule/_timing.py",
    (_S + "test_schedule_timing.py", _S + "test_schedule_simulate.py"),
    "the timing model",
  ),
  Module(
    "stalesgd/schedule/_durations.py",
    (_S + "test_schedule_timing.py", _S + "test_schedule_protocols.py"),
    "per-learner step durations",
  ),
  # engine.
  Module("stalesgd/engine/_blocks.py", ("tests/engine/test_engine_blocks.py",), "the block planner"),
  Module("stalesgd/engine/_ring_buffer.py", ("tests/engine/test_engine_blocks.py",), "the ring buffer of weights"),
  # decentral.
  Module("stalesgd/decentral/_dcs3gd.py", ("tests/decentral/test_dcs3gd.py",), "DC-S3GD's step"),
  Module(
    "stalesgd/decentral/_fragments.py",
    # The slow test (a whole streaming run, 24 of the file's 27 s) reads the fragments a run reports; the fast ones
    # pin each assignment by hand and on the zoo's models.
    ("tests/decentral/test_fragments.py",),
    "Streaming DiLoCo's fragments of layers",
    not_slow=True,
  ),
  Module(
    "stalesgd/decentral/_streaming.py",
    # The slow test (30 compiled programs) only sweeps the cases the fast ones pin by hand and by the oracle.
    # test_fragments.py checks the leaf-to-fragment assignment the round is given (`fragment_of_leaves`).
    ("tests/decentral/test_streaming_diloco.py", "tests/decentral/test_fragments.py"),
    "Streaming DiLoCo's round: syncs, applications, eager updates, mixing",
    not_slow=True,
  ),
  # training: the optimizer chain; models: the multiplier rules.
  Module(
    "stalesgd/training/_optimizer.py",
    (
      "tests/training/test_optimizer_solver.py",
      "tests/configs/test_config_optimizers.py",
      "tests/training/test_optimizer_delay_compensation.py",
    ),
    "multipliers, decay placement, learning-rate schedule and warm-up",
  ),
  Module(
    "stalesgd/training/_solvers.py",
    ("tests/training/test_optimizer_solver.py", "tests/configs/test_config_optimizers.py"),
    "the optax solvers a config may name",
  ),
  Module(
    "stalesgd/models/_spec.py",
    # The model specification also computes precise batch-norm statistics and keys dropout by the batch's seed
    # (each pinned in its own tests).
    (
      "tests/training/test_optimizer_solver.py",
      "tests/models/test_models_zoo.py",
      "tests/models/test_models_precise_bn.py",
      "tests/models/test_models_dropout.py",
    ),
    "a model's multipliers by parameter path, its initialisation and precise batch norm",
  ),
  Module(
    "stalesgd/models/_cifar10_full.py",
    (
      "tests/models/test_models_zoo.py",
      "tests/configs/test_config_optimizers.py",
      "tests/models/test_models_forward_reference.py",
    ),
    "cifar10_full's Caffe and Rudra multiplier rules and its forward pass",
  ),
  Module(
    "stalesgd/models/_alexnet.py",
    (
      "tests/models/test_models_zoo.py",
      "tests/models/test_models_caffe_layers.py",
      "tests/models/test_models_forward_reference.py",
      "tests/models/test_models_dropout.py",
    ),
    "AlexNet's decay multipliers, its forward pass, fillers and dropout option",
  ),
  # studies: the rules that decide the claims.
  Module("stalesgd/studies/_seed_statistics.py", ("tests/studies/test_study_statistics.py",), "the paired interval"),
  Module(
    "stalesgd/studies/_study.py",
    # A study's Pilot (its definition and the families it requires) is checked in the pilot tests.
    (
      "tests/studies/test_study_statistics.py",
      "tests/studies/test_experiment_studies.py",
      "tests/studies/test_pilot.py",
    ),
    "a claim's rule and decision, a study's pilot",
  ),
  Module(
    "stalesgd/studies/_report.py",
    # The report marks a run that fell back to chance as diverged (mark_collapse): the divergence tests.
    ("tests/studies/test_study_statistics.py", "tests/studies/test_divergence_rule.py"),
    "claims decided from runs",
  ),
  Module("stalesgd/studies/_divergence.py", ("tests/studies/test_divergence_rule.py",), "the numeric divergence rule"),
  Module("stalesgd/studies/_pilot.py", ("tests/studies/test_pilot.py",), "the pilot's choice of a value per family"),
  Module(
    "stalesgd/studies/_registration.py",
    ("tests/studies/test_registration.py",),
    "pre-registration judged from the runs' records",
    not_slow=True,
  ),
  # data: the per-learner data order.
  Module(
    "stalesgd/data/_learner_batches.py",
    # Lazily decoded splits (the Inception crop path) are read in the Inception-crop tests.
    ("tests/data/test_data_learner_batches.py", "tests/data/test_inception_crop.py"),
    "learner j's k-th batch",
  ),
  Module(
    "stalesgd/data/_counter_hash.py",
    ("tests/data/test_counter_hash_reference.py", "tests/data/test_data_learner_batches.py"),
    "the counter-based batch keys",
  ),
)


# ---- pure parts (tests/repository/test_mutation_runner.py) -------------------------------------------------------


def slug_of(path: str) -> str:
  """``stalesgd/transforms/_staleness.py`` -> ``stalesgd.transforms._staleness``."""
  return path.removesuffix(".py").replace("/", ".")


def test_command(module: Module, python: str = str(PROJECT_PYTHON)) -> str:
  """The command cosmic-ray runs for each of ``module``'s mutants (from the copy's root)."""
  words = [python, "-m", "pytest", *PYTEST_OPTIONS]
  if module.not_slow:
    words += ["-m", "not slow"]
  return shlex.join([*words, *module.tests])


def summary_test_command(module: Module) -> str:
  """`test_command` as ``results/mutation/summary.json`` records it: the project's interpreter relative to the
  repository root (``.venv/bin/python``), so that the committed summary names no absolute path of the machine."""
  return test_command(module, python=PROJECT_PYTHON.relative_to(ROOT).as_posix())


def apply_control(source: str, old: str, new: str) -> str:
  """``source`` with its one occurrence of ``old`` replaced; refuses an absent or ambiguous ``old``."""
  count = source.count(old)
  if count != 1:
    raise ValueError(f"a control's old text must occur exactly once; it occurs {count} times: {old!r}")
  return source.replace(old, new, 1)


_KILLER = re.compile(r"^(?:FAILED|ERROR) (tests/\S+)", re.MULTILINE)


def killing_test(output: str | None) -> str | None:
  """The test named by pytest's first ``FAILED`` / ``ERROR`` line of ``output``, else None."""
  found = _KILLER.search(output or "")
  return found.group(1) if found else None


def outcome_of(result: Mapping[str, Any] | None) -> str:
  """One work item's outcome: killed, survived, timed out, incompetent, no mutation, or pending.

  cosmic-ray records a test command that ran past its timeout as killed with the output ``"timeout"``; here it
  is ``"timed out"``, never a kill.
  """
  if result is None:
    return "pending"
  worker = result.get("worker_outcome")
  if worker == "no-test" or worker == "skipped":
    return "no mutation"
  if worker != "normal":
    return "incompetent"
  test = result.get("test_outcome")
  if test == "killed":
    return "timed out" if (result.get("output") or "").strip() == "timeout" else "killed"
  if test == "survived":
    return "survived"
  return "incompetent"


def _diff_lines(diff: str | None) -> list[str]:
  return [line for line in (diff or "").splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


ANNOTATION_ONLY = (
  "equivalent: changes only a function's annotation (a parameter's, the return's or a local variable's) in a "
  "module with `from __future__ import annotations` (PEP 563): Python stores it as a string and never evaluates "
  "it, and stalesgd never reads it back (no typing.get_type_hints)"
)

Position = tuple[int, int]  # (line from 1, column from 0), as cosmic-ray's work items and Python's ast count


def annotation_spans(source: str) -> list[tuple[Position, Position]]:
  """The (start, end) of every annotation that ``source`` never evaluates: with ``from __future__ import
  annotations``, each function's parameter and return annotations and its local variables' annotations (empty
  without that import, where a function's annotations are evaluated when it is defined).

  Class-level and module-level annotations are left out: they are kept in ``__annotations__``, which NamedTuple and
  dataclass machinery read.
  """
  tree = ast.parse(source)
  deferred = any(
    isinstance(node, ast.ImportFrom)
    and node.module == "__future__"
    and any(a.name == "annotations" for a in node.names)
    for node in tree.body
  )
  if not deferred:
    return []
  annotations: list[ast.expr] = []
  for function in ast.walk(tree):
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      continue
    arguments = function.args
    for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg):
      if argument is not None and argument.annotation is not None:
        annotations.append(argument.annotation)
    if isinstance(function, ast.Lambda):
      continue
    if function.returns is not None:
      annotations.append(function.returns)
    for statement in function.body:
      for node in ast.walk(statement):
        if isinstance(node, ast.AnnAssign):
          annotations.append(node.annotation)
  return [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in annotations]


def in_annotation(spans: Sequence[tuple[Position, Position]], start: Sequence[int], end: Sequence[int]) -> bool:
  """Whether the source range ``start``-``end`` lies inside one of ``spans``."""
  first, last = tuple(start), tuple(end)
  return any(span_start <= first and last <= span_end for span_start, span_end in spans)


def skip_annotation_mutants(session: pathlib.Path, source: str) -> int:
  """Marks the session's mutants that change only an unevaluated annotation (`annotation_spans`) as skipped, with
  `ANNOTATION_ONLY` as their output, so that ``cosmic-ray exec`` does not run them. Returns how many."""
  spans = annotation_spans(source)
  if not spans:
    return 0
  with sqlite3.connect(session) as database:
    rows = database.execute(
      "SELECT m.job_id, m.start_pos_row, m.start_pos_col, m.end_pos_row, m.end_pos_col FROM mutation_specs m "
      "WHERE m.job_id NOT IN (SELECT job_id FROM work_results)"
    ).fetchall()
    skipped = [job for job, *position in rows if in_annotation(spans, position[:2], position[2:])]
    database.executemany(
      "INSERT INTO work_results (worker_outcome, output, test_outcome, diff, job_id) VALUES (?, ?, NULL, NULL, ?)",
      [("SKIPPED", ANNOTATION_ONLY, job) for job in skipped],
    )
  return len(skipped)


def equivalent_key(module: str, operator: str, occurrence: int) -> tuple[str, str, int]:
  return (module, operator, int(occurrence))


def module_summary(
  module: str,
  records: Iterable[Sequence[Any]],
  equivalents: Iterable[Mapping[str, Any]] = (),
  source: str | None = None,
) -> dict[str, Any]:
  """Counts and per-mutant rows of one module from ``cosmic-ray dump`` records ``[work_item, result]``.

  ``killed_percent`` is the killed share of the decided, non-equivalent mutants: timeouts count as not killed
  (undecided), incompetent mutants and pending ones are left out of the denominator. With the module's
  ``source``, a mutant inside an unevaluated annotation (`annotation_spans`) is equivalent, run or skipped, and
  only the equivalents listed for that source (their ``source_sha256``) count: an operator's occurrence numbers
  another mutant once the source changed.
  """
  spans = annotation_spans(source) if source is not None else []
  digest = hashlib.sha256(source.encode("utf-8")).hexdigest() if source is not None else None
  known = {
    equivalent_key(entry["module"], entry["operator"], entry["occurrence"]): entry
    for entry in equivalents
    if entry["module"] == module and (digest is None or entry.get("source_sha256") == digest)
  }
  mutants = []
  for work_item, result in records:
    (mutation,) = work_item["mutations"]
    outcome = outcome_of(result)
    annotation_only = in_annotation(spans, mutation["start_pos"], mutation["end_pos"])
    if outcome == "no mutation" and not annotation_only:
      continue
    if outcome == "no mutation":
      outcome = "skipped"
    key = equivalent_key(module, mutation["operator_name"], mutation["occurrence"])
    row = {
      "job_id": work_item["job_id"],
      "operator": mutation["operator_name"],
      "occurrence": mutation["occurrence"],
      "line": mutation["start_pos"][0],
      "function": mutation.get("definition_name"),
      "outcome": outcome,
      "killed_by": killing_test(result.get("output")) if outcome == "killed" else None,
      "diff": _diff_lines(result.get("diff")) if result else [],
      "equivalent": key in known or annotation_only,
    }
    if annotation_only:
      row["equivalent_reason"] = ANNOTATION_ONLY
    if outcome == "killed" and row["killed_by"] is None:
      tail = (result.get("output") or "").strip().splitlines()
      row["output_tail"] = tail[-1][:200] if tail else ""
    mutants.append(row)
  mutants.sort(key=lambda row: (row["line"], row["operator"], row["occurrence"]))
  counts = {
    name: sum(row["outcome"] == outcome for row in mutants)
    for name, outcome in (
      ("killed", "killed"),
      ("survived", "survived"),
      ("timed_out", "timed out"),
      ("incompetent", "incompetent"),
      ("pending", "pending"),
      ("skipped_annotation_only", "skipped"),
    )
  }
  equivalent = sum(row["equivalent"] and row["outcome"] != "killed" for row in mutants)
  # The denominator: killed, survived and timed out, less the equivalent ones among the last two (a skipped or a
  # pending equivalent was never in it).
  undecidable = sum(row["equivalent"] and row["outcome"] in ("survived", "timed out") for row in mutants)
  decided = counts["killed"] + counts["survived"] + counts["timed_out"] - undecidable
  return {
    "mutants": len(mutants),
    **counts,
    "equivalent": equivalent,
    "killed_percent_of_non_equivalent": round(100.0 * counts["killed"] / decided, 2) if decided > 0 else None,
    "survivors": [row for row in mutants if row["outcome"] == "survived" and not row["equivalent"]],
    "mutant_list": mutants,
  }


# ---- running ------------------------------------------------------------------------------------------------------


def _now() -> str:
  return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_json(path: pathlib.Path, default: Any) -> Any:
  return json.loads(path.read_text(encoding="utf-8")) if path.exists() else default


def _write_json(path: pathlib.Path, value: Any) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  temporary = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # two lanes may write the summary at once
  temporary.write_text(json.dumps(value, indent=1, sort_keys=False) + "\n", encoding="utf-8")
  temporary.replace(path)


def _tool(name: str) -> pathlib.Path:
  return MUTATION_VENV / "bin" / name


def _pinned_version() -> str:
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
  (pin,) = [entry for entry in extras["mutation"] if entry.startswith(TOOL)]
  return pin.split("==", 1)[1]


def tool_version() -> str | None:
  if not _tool(TOOL).exists():
    return None
  printed = subprocess.run([str(_tool(TOOL)), "--version"], capture_output=True, text=True, check=True).stdout
  return printed.strip().rsplit(" ", 1)[-1]


def _environment() -> dict[str, str]:
  environment = dict(os.environ)
  environment.update(TEST_ENVIRONMENT)
  environment["PYTHONPATH"] = str(TREE)
  return environment


def _lock() -> None:
  RUNS.mkdir(parents=True, exist_ok=True)
  if LOCK.exists():
    pid = int(LOCK.read_text().strip() or 0)
    try:
      os.kill(pid, 0)
    except (ProcessLookupError, ValueError):
      pass
    else:
      raise SystemExit(f"another mutation pass (pid {pid}) is running; {LOCK} names it")
  LOCK.write_text(str(os.getpid()))


def copy_tree() -> None:
  """A fresh copy of the package and its tests under TREE (nothing mutated is left from a stop)."""
  if TREE.exists():
    shutil.rmtree(TREE)
  TREE.mkdir(parents=True)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
  for name in COPIED:
    source = ROOT / name
    if source.is_dir():
      shutil.copytree(source, TREE / name, ignore=ignore)
    else:
      shutil.copy2(source, TREE / name)
  # The mutants must reach the tests: the copy's stalesgd, not the checkout's editable install, is imported.
  found = subprocess.run(
    [str(PROJECT_PYTHON), "-c", "import stalesgd; print(stalesgd.__file__)"],
    cwd=TREE,
    env=_environment(),
    capture_output=True,
    text=True,
    check=True,
  ).stdout.strip()
  if not pathlib.Path(found).resolve().is_relative_to(TREE.resolve()):
    raise SystemExit(f"the copy's test processes import stalesgd from {found}, not from {TREE}")


def _run_tests_with_tool(command: str, timeout: float) -> tuple[str, str]:
  """``command`` run by cosmic-ray's own test runner, as for a mutant; returns (test outcome, output)."""
  program = (
    "import json, sys\n"
    "from cosmic_ray.testing import run_tests\n"
    "outcome, output = run_tests(sys.argv[1], float(sys.argv[2]))\n"
    "print(json.dumps([outcome.value, output]))\n"
  )
  finished = subprocess.run(
    [str(_tool("python")), "-c", program, command, str(timeout)],
    cwd=TREE,
    env=_environment(),
    capture_output=True,
    text=True,
    check=True,
  )
  outcome, output = json.loads(finished.stdout.strip().splitlines()[-1])
  return outcome, output


def _config_text(module: Module, timeout: float) -> str:
  lines = [
    "[cosmic-ray]",
    f"module-path = {json.dumps(module.path)}",
    f"timeout = {timeout:.1f}",
    "excluded-modules = []",
    f"test-command = {json.dumps(test_command(module))}",
    "",
    "[cosmic-ray.distributor]",
    'name = "local"',
    "",
  ]
  return "\n".join(lines)


_SESSION_FILES = {"session": ".sqlite", "config": ".toml", "meta": ".json", "controls": ".controls.json"}


def _module_files(module: Module) -> dict[str, pathlib.Path]:
  # Not Path.with_suffix: the slug's last dotted part ("._staleness") would be taken for a suffix.
  slug = slug_of(module.path)
  return {name: SESSIONS / f"{slug}{ending}" for name, ending in _SESSION_FILES.items()}


def _baseline(module: Module) -> tuple[bool, float, str]:
  start = time.monotonic()
  finished = subprocess.run(
    shlex.split(test_command(module)), cwd=TREE, env=_environment(), capture_output=True, text=True
  )
  return finished.returncode == 0, time.monotonic() - start, (finished.stdout + finished.stderr)[-2000:]


def per_mutant_timeout(unmutated_seconds: float, min_timeout: float, factor: float) -> float:
  """A mutant's timeout: ``factor`` times the module's unmutated test run, at least ``min_timeout`` seconds."""
  return max(min_timeout, factor * unmutated_seconds)


def session_change(
  meta: Mapping[str, Any], module: Module, source_sha256: str, python: str = str(PROJECT_PYTHON)
) -> str:
  """How ``module`` today differs from the one its session was made for.

  ``"same"``: the same source and test command. ``"widened"``: the same source and pytest options, and the
  session's test files are a strict subset of today's (a test file added to the module's list): a mutant one of
  the session's files killed is still killed by the wider command (the failing test is still run), so only the
  survivors and timeouts need running again. ``"stale"``: anything else (a changed source, a test file removed,
  other options); the session is set aside and made again.
  """
  if meta.get("source_sha256") != source_sha256:
    return "stale"
  if meta.get("test_command") == test_command(module, python):
    return "same"
  before = tuple(meta.get("tests", ()))
  same_options = test_command(module._replace(tests=before), python) == meta.get("test_command")
  return "widened" if same_options and set(before) < set(module.tests) else "stale"


def _is_stale(meta: Mapping[str, Any], module: Module) -> bool:
  """Whether a session was made for another source or test command of ``module`` than today's (not a widening)."""
  return session_change(meta, module, _sha256(ROOT / module.path)) == "stale"


def _widen(
  module: Module, files: Mapping[str, pathlib.Path], meta: dict[str, Any], min_timeout: float, factor: float
) -> bool:
  """Moves a widened session (`session_change`) to today's test files: measures the wider command unmutated,
  keeps the larger of the two timeouts, rewrites the session's configuration and forgets its survivors and
  timeouts so that they run again. Returns False (the session untouched) when the wider tests fail unmutated."""
  passed, seconds, tail = _baseline(module)
  if not passed:
    print(f"{module.path}: its wider test list fails unmutated; the session is left as it was\n{tail}", flush=True)
    return False
  timeout = max(meta["timeout_seconds"], per_mutant_timeout(seconds, min_timeout, factor))
  files["config"].write_text(_config_text(module, timeout), encoding="utf-8")
  forgotten = forget_survivors(files["session"])
  added = [test for test in module.tests if test not in meta["tests"]]
  meta.setdefault("widenings", []).append(
    {"at": _now(), "tests_added": added, "baseline_seconds": round(seconds, 1), "survivors_rerun": forgotten}
  )
  meta.update(tests=list(module.tests), test_command=test_command(module), timeout_seconds=round(timeout, 1))
  _write_json(files["meta"], meta)
  print(f"{module.path}: tests widened by {added}; {len(forgotten)} survivors and timeouts run again", flush=True)
  return True


def _set_aside_if_stale(module: Module, files: Mapping[str, pathlib.Path]) -> None:
  meta = _read_json(files["meta"], None)
  if meta is None or not _is_stale(meta, module):
    return
  stamp = meta.get("source_sha256", "unknown")[:8]
  slug = slug_of(module.path)
  for name, ending in _SESSION_FILES.items():
    if files[name].exists():
      files[name].rename(SESSIONS / f"{slug}.stale-{stamp}{ending}")
  print(f"{module.path}: source or tests changed since its session was made; the old session is set aside", flush=True)


def tests_digest(module: Module, root: pathlib.Path = ROOT) -> str:
  """One sha256 over the module's test files: a control's outcome is kept only while its module and these stay."""
  digest = hashlib.sha256()
  for test in module.tests:
    digest.update(test.encode() + b"\0" + (root / test).read_bytes() + b"\0")
  return digest.hexdigest()


def run_controls(module: Module, controls: Sequence[Mapping[str, Any]], timeout: float, digest: str) -> None:
  files = _module_files(module)
  done = _read_json(files["controls"], {})
  tests = tests_digest(module)
  for control in controls:
    kept = done.get(control["id"], {})
    if (kept.get("source_sha256"), kept.get("tests_sha256")) == (digest, tests):
      continue
    target = TREE / control["file"]
    original = target.read_text(encoding="utf-8")
    start = time.monotonic()
    try:
      target.write_text(apply_control(original, control["old"], control["new"]), encoding="utf-8")
      outcome, output = _run_tests_with_tool(test_command(module), timeout)
    finally:
      target.write_text(original, encoding="utf-8")
    result = outcome_of({"worker_outcome": "normal", "test_outcome": outcome, "output": output})
    done[control["id"]] = {
      "file": control["file"],
      "description": control["description"],
      "outcome": result,
      "killed_by": killing_test(output) if result == "killed" else None,
      "seconds": round(time.monotonic() - start, 1),
      "source_sha256": digest,
      "tests_sha256": tests,
      "load_average": list(os.getloadavg()),
    }
    _write_json(files["controls"], done)
    print(f"  control {control['id']}: {result} ({done[control['id']]['killed_by']})", flush=True)


def _claim(module: Module) -> pathlib.Path | None:
  """Claims ``module``'s session for this process (a file naming its pid), or None when a live pass holds it."""
  SESSIONS.mkdir(parents=True, exist_ok=True)
  claim = SESSIONS / f"{slug_of(module.path)}.claim"
  for _ in range(2):
    try:
      with open(claim, "x", encoding="utf-8") as file:
        file.write(str(os.getpid()))
      return claim
    except FileExistsError:
      try:
        os.kill(int(claim.read_text(encoding="utf-8").strip() or 0), 0)
      except (ProcessLookupError, ValueError, FileNotFoundError):
        claim.unlink(missing_ok=True)  # its pass stopped: take it over
      else:
        return None
  return None


def run_module(module: Module, arguments: argparse.Namespace, controls: Sequence[Mapping[str, Any]]) -> None:
  claim = _claim(module)
  if claim is None:
    print(f"{module.path}: another lane's pass is running it; skipped", flush=True)
    return
  try:
    _run_module(module, arguments, controls)
  finally:
    claim.unlink(missing_ok=True)


def _run_module(module: Module, arguments: argparse.Namespace, controls: Sequence[Mapping[str, Any]]) -> None:
  files = _module_files(module)
  digest = _sha256(ROOT / module.path)
  _set_aside_if_stale(module, files)
  meta = _read_json(files["meta"], None)
  finished = {entry["module"]: entry for entry in _read_json(SUMMARY, {}).get("modules", [])}
  kept = kept_from_summary(finished.get(module.path), module, None)
  if meta is None and kept is not None and not (arguments.controls_only or arguments.again):
    print(f"{module.path}: done in {SUMMARY.relative_to(ROOT)} for this source; kept (--again runs it anew)")
    return
  if meta is None:
    passed, seconds, tail = _baseline(module)
    timeout = per_mutant_timeout(seconds, arguments.min_timeout, arguments.timeout_factor)
    meta = {
      "module": module.path,
      "source_sha256": digest,
      "tests": list(module.tests),
      "test_command": test_command(module),
      "baseline_passed": passed,
      "baseline_seconds": round(seconds, 1),
      "timeout_seconds": round(timeout, 1),
      "created": _now(),
      "load_average_at_creation": list(os.getloadavg()),
      "exec_runs": [],
    }
    if passed:
      files["session"].unlink(missing_ok=True)
      files["config"].write_text(_config_text(module, timeout), encoding="utf-8")
      subprocess.run(
        [str(_tool(TOOL)), "init", str(files["config"]), str(files["session"])],
        cwd=TREE,
        env=_environment(),
        check=True,
      )
    else:
      print(f"{module.path}: its tests fail unmutated; skipped\n{tail}", flush=True)
    _write_json(files["meta"], meta)  # last: a session without its meta is made again
  if not meta["baseline_passed"]:
    print(f"{module.path}: its tests failed unmutated when the session was made; delete {files['meta']} to retry")
    return
  if session_change(meta, module, digest) == "widened" and not _widen(
    module, files, meta, arguments.min_timeout, arguments.timeout_factor
  ):
    return
  print(f"{module.path}: timeout {meta['timeout_seconds']} s per mutant", flush=True)
  module_controls = [control for control in controls if control["file"] == module.path]
  if not arguments.no_controls:
    run_controls(module, module_controls, meta["timeout_seconds"], digest)
  if arguments.controls_only:
    return
  if arguments.rerun_survivors:
    forgotten = forget_survivors(files["session"])
    meta.setdefault("survivor_reruns", []).append({"at": _now(), "mutants": forgotten})
    print(f"{module.path}: {len(forgotten)} survivors and timeouts run again with the current tests", flush=True)
  interrupted = forget_incompetent(files["session"])
  if interrupted:
    print(f"{module.path}: {len(interrupted)} incompetent results (a stopped pass) run again", flush=True)
  skipped = skip_annotation_mutants(files["session"], (ROOT / module.path).read_text(encoding="utf-8"))
  if skipped:
    print(f"{module.path}: {skipped} mutants inside unevaluated annotations skipped (equivalent)", flush=True)
  started, load = time.monotonic(), list(os.getloadavg())
  subprocess.run(
    [str(_tool(TOOL)), "exec", str(files["config"]), str(files["session"])], cwd=TREE, env=_environment(), check=True
  )
  meta["exec_runs"].append(
    {"ended": _now(), "seconds": round(time.monotonic() - started, 1), "load_average_at_start": load}
  )
  _write_json(files["meta"], meta)


def _forget(session: pathlib.Path, where: str) -> list[str]:
  """Deletes the results of a cosmic-ray session that match the SQL condition ``where``, so that its ``exec`` runs
  those mutants again; returns their job ids. cosmic-ray stores its enums by name ("SURVIVED"); `cosmic-ray dump`
  prints their values ("survived")."""
  with sqlite3.connect(session) as database:
    jobs = [row[0] for row in database.execute(f"SELECT job_id FROM work_results WHERE {where}")]
    database.execute(f"DELETE FROM work_results WHERE {where}")
  return jobs


def forget_survivors(session: pathlib.Path) -> list[str]:
  """Forgets the survived and timed-out results (a timeout is a "killed" result whose output is "timeout",
  `outcome_of`), so the session's timeout and today's tests decide them again: a survivor a new test kills comes
  out killed, a mutant that made the tests hang may now fail one quickly. Returns their job ids."""
  return _forget(session, "(UPPER(test_outcome) = 'SURVIVED' OR TRIM(output) = 'timeout')")


def forget_incompetent(session: pathlib.Path) -> list[str]:
  """Forgets the incompetent results; returns their job ids.

  cosmic-ray records a mutant as incompetent when its worker raised instead of finishing the test command. A pass
  stopped mid-mutant leaves one (the command is killed under it), which says nothing about the mutant; a mutant
  that cannot be applied is recorded so again at every pass, at the cost of one attempt. Skipped mutants
  (``worker_outcome`` SKIPPED, no test outcome) are kept.
  """
  return _forget(session, "UPPER(test_outcome) = 'INCOMPETENT'")


def _dump(session: pathlib.Path) -> list[list[Any]]:
  printed = subprocess.run(
    [str(_tool(TOOL)), "dump", str(session)], cwd=TREE if TREE.exists() else ROOT, capture_output=True, text=True
  )
  printed.check_returncode()
  return [json.loads(line) for line in printed.stdout.splitlines() if line.strip()]


def kept_from_summary(entry: Mapping[str, Any] | None, module: Module, written: str | None) -> dict[str, Any] | None:
  """A finished module's entry of the summary already written, while its session is not on this machine (a fresh
  clone: sessions live under ``runs/``, which is not committed).

  Kept only while the module's source and test command are those the entry was made for; it then says where its
  figures come from. Anything else (an unfinished module, a changed source) is None: the module counts as not run.
  """
  if entry is None or entry.get("status") != "done":
    return None
  if (entry.get("source_sha256"), entry.get("test_command")) != (
    _sha256(ROOT / module.path),
    summary_test_command(module),
  ):
    return None
  return {
    **entry,
    "session": entry.get("session") or f"not on this machine: figures kept from the summary written {written}",
  }


def _decided(summary: Mapping[str, Any]) -> int:
  return summary["killed"] + summary["survived"] + summary["timed_out"]


def write_summary(controls: Sequence[Mapping[str, Any]], note: str | None = None) -> dict[str, Any]:
  equivalents = _read_json(EQUIVALENTS_FILE, {"equivalents": []})["equivalents"]
  previous = _read_json(SUMMARY, {})
  kept_entries = {entry["module"]: entry for entry in previous.get("modules", [])}
  kept_controls = {row["id"]: row for row in previous.get("controls", [])}
  modules, control_rows = [], []
  for module in MODULES:
    files = _module_files(module)
    meta = _read_json(files["meta"], None)
    entry: dict[str, Any] = {"module": module.path, "what": module.what, "tests": list(module.tests)}
    entry["test_command"] = summary_test_command(module)
    kept = kept_from_summary(kept_entries.get(module.path), module, previous.get("written"))
    summary = None
    if meta is not None and meta["baseline_passed"] and not _is_stale(meta, module):
      summary = module_summary(
        module.path,
        _dump(files["session"]) if files["session"].exists() else [],
        equivalents,
        (ROOT / module.path).read_text(encoding="utf-8"),
      )
    if kept is not None and (summary is None or not _decided(summary)):
      entry = kept  # a fresh clone's session, made for the controls only, has decided nothing yet
    elif meta is None:
      entry["status"] = "not run"
    elif not meta["baseline_passed"]:
      entry.update(status="tests fail unmutated", meta=meta)
    elif summary is None:
      # The module or its tests changed since the session was made: its outcomes are of other code (the next run
      # sets the session aside and makes it again).
      entry.update(
        status="stale: changed since its session was made; run it again", source_sha256=meta["source_sha256"]
      )
    else:
      entry["status"] = "in progress" if summary["pending"] else "done"
      entry.update(
        {key: meta[key] for key in ("source_sha256", "baseline_seconds", "timeout_seconds", "created", "exec_runs")}
      )
      entry["load_average_at_creation"] = meta["load_average_at_creation"]
      entry.update(summary)
    done = _read_json(files["controls"], {})
    source, tests = _sha256(ROOT / module.path), tests_digest(module)
    for control in controls:
      if control["file"] == module.path:
        row = done.get(control["id"])
        earlier = kept_controls.get(control["id"], {})
        if row is None and (earlier.get("source_sha256"), earlier.get("tests_sha256")) == (source, tests):
          row = {key: value for key, value in earlier.items() if key not in ("id", "file", "description")}
        row = row or {"outcome": "not run"}
        control_rows.append(
          {"id": control["id"], "file": control["file"], "description": control["description"], **row}
        )
    modules.append(entry)
  finished = [entry for entry in modules if entry["status"] == "done"]
  summary = {
    "tool": {"name": TOOL, "version": tool_version(), "pinned": _pinned_version()},
    "written": _now(),
    "scope": "complete"
    if len(finished) == len(modules)
    else f"partial: {len(finished)} of {len(modules)} modules done",
    "note": note,
    "machine": {"cpus": os.cpu_count(), "load_average_when_written": list(os.getloadavg())},
    "configuration": {
      "operators": "cosmic-ray's defaults: every core operator, no filters",
      "distributor": "local: one fresh test process per mutant, sequentially",
      "one session per module": True,
      "pytest_options": list(PYTEST_OPTIONS),
      "environment": {
        **TEST_ENVIRONMENT,
        "PYTHONPATH": "runs/mutation/tree (a copy of stalesgd/, tests/ and experiments/)",
      },
      "timeout": "per module: max(min_timeout, timeout_factor x the unmutated test run), fixed at session creation",
      "timed out": "reported separately, never counted as killed",
      "controls": "hand-written known-bad patches (experiments/mutation_controls.json), each run by cosmic-ray's "
      "own test runner with its module's test command and timeout",
    },
    "modules": modules,
    "controls": control_rows,
    "equivalents": equivalents,
  }
  _write_json(SUMMARY, summary)
  return summary


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--modules", nargs="*", help="module paths (default: all of MODULES)")
  parser.add_argument("--budget-minutes", type=float, default=None, help="start no new module after this")
  parser.add_argument("--report", action="store_true", help="only read the sessions and write the summary")
  parser.add_argument("--timeout-factor", type=float, default=5.0)
  parser.add_argument("--min-timeout", type=float, default=120.0)
  parser.add_argument("--no-controls", action="store_true", help="skip the hand-written controls")
  parser.add_argument("--controls-only", action="store_true", help="run the controls (and baselines), no mutants")
  parser.add_argument(
    "--rerun-survivors", action="store_true", help="run the chosen modules' survivors again (after adding tests)"
  )
  parser.add_argument(
    "--again", action="store_true", help="run a module the summary holds as done for its source (a fresh clone)"
  )
  parser.add_argument("--note", default=None, help="a line for the summary (e.g. the machine's load)")
  parser.add_argument(
    "--lane",
    default=None,
    help="run beside another pass, in its own copy (runs/mutation/tree-LANE) and lock; a module's session is "
    "run by one pass at a time",
  )
  arguments = parser.parse_args(argv)
  if arguments.lane is not None:
    if not re.fullmatch(r"[a-z0-9]+", arguments.lane):
      raise SystemExit(f"--lane={arguments.lane!r}; allowed: lower-case letters and digits")
    global TREE, LOCK
    TREE, LOCK = RUNS / f"tree-{arguments.lane}", RUNS / f"lock-{arguments.lane}"
  version = tool_version()
  if version is None:
    raise SystemExit(f"{TOOL} is not installed in {MUTATION_VENV}: run `make mutation-venv`")
  if version != _pinned_version():
    print(f"warning: {TOOL} {version} in {MUTATION_VENV}, pyproject.toml pins {_pinned_version()}", flush=True)
  controls = _read_json(CONTROLS_FILE, {"controls": []})["controls"]
  if not arguments.report:
    known = {module.path: module for module in MODULES}
    chosen = [known[path] for path in arguments.modules] if arguments.modules else list(MODULES)
    deadline = None if arguments.budget_minutes is None else time.monotonic() + 60 * arguments.budget_minutes
    _lock()
    try:
      copy_tree()
      for module in chosen:
        if deadline is not None and time.monotonic() > deadline:
          print(f"budget spent; not started: {', '.join(m.path for m in chosen[chosen.index(module) :])}")
          break
        run_module(module, arguments, controls)
        write_summary(controls, arguments.note)
      summary = write_summary(controls, arguments.note)  # under the lock: no second pass copies the tree meanwhile
    finally:
      LOCK.unlink(missing_ok=True)
  else:
    summary = write_summary(controls, arguments.note)
  for entry in summary["modules"]:
    if "mutants" in entry:
      print(
        f"{entry['module']}: {entry['mutants']} mutants, {entry['killed']} killed, {entry['survived']} survived, "
        f"{entry['timed_out']} timed out, {entry['incompetent']} incompetent, {entry['pending']} pending"
      )
  print(f"wrote {SUMMARY.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
  main()
