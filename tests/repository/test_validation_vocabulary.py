"""One vocabulary of value checks: `stalesgd._validation`, its message format, and no second vocabulary.

Every plain value check (an integer or real range, a choice, a bool) goes through
`stalesgd._validation`, whose one message format is
``<name>=<value!r>; allowed: <allowed values or range>``. A scan of the package
holds that no other module defines value-check helpers: a public ``check_*`` /
``require_*`` function outside the vocabulary must be listed below with the
concept it checks, a private one (``_check_*``) is one module's own step and is
imported by no other module, and type predicates (``is_number``, ``_is_int``,
...) live in the vocabulary only.
"""

from __future__ import annotations

import ast
import math
import pathlib
import re
import sys
from fractions import Fraction

import numpy as np
import pytest

import stalesgd
from stalesgd import _validation as validation

PACKAGE_ROOT = pathlib.Path(stalesgd.__file__).parent
VOCABULARY = PACKAGE_ROOT / "_validation.py"

# Public check_* / require_* functions that check a concept, not a value's type and range: (module, name) -> why.
CONCEPT_CHECKS = {
  ("_extras.py", "require_training_stack"): "a program refuses to start without the training stack installed",
  ("data/preparation/_layouts.py", "check_directory"): "a source directory's layout of class folders and images",
  ("decentral/_streaming.py", "check_settings"): "streaming DiLoCo's P, tau and alpha against H and the arrays",
  ("data/preparation/_tfds_writer.py", "check_array_split"): "a split's arrays against the tfds builder's features",
  ("data/preparation/_tfds_writer.py", "check_not_prepared"): "a prepared data set is not overwritten by accident",
  ("models/_loss.py", "check_loss_name"): "a loss is the default or an importable function",
  ("parallel/_sharding.py", "check_learners_axis"): "a per-learner tree holds one learner per device of the mesh",
  ("schedule/_timing.py", "check_learners"): "a timing model's per-learner settings fit the number of learners",
  ("studies/_tasks.py", "check_tasks"): "every run of a grid: its config and its run directory, before any starts",
  ("training/_component_checks.py", "check_dataset"): "a config's data set and the fields its source reads",
  ("training/_component_checks.py", "check_model"): "a config's model: a registered name or a factory and its options",
  ("training/_component_checks.py", "check_optimizer"): "a config's solver, its options, what the SGD fields mean",
  ("training/_config_fields.py", "check_fields"): "a config section's fields, each by the kind its declaration names",
  ("training/_local_runs.py", "check_local_runs"): "a run's local-run fields together with its protocol",
  ("training/_workdir.py", "check_same_run"): "a run directory holds a run of this config",
  ("training/_workdir.py", "check_same_data"): "a resumed run reads the data its run directory recorded",
  ("training/checkpoint/_integrity.py", "check_checksums"): "a restored state's CRC-32s against the saved ones",
  ("transforms/_contributions.py", "check_tree_structure"): "two pytrees have the same structure",
  ("transforms/_contributions.py", "check_same_tree"): "two pytrees have the same structure, shapes and dtypes",
  ("transforms/_mean_square.py", "check_learner"): "learner indices (arrays, possibly traced) fit the MeanSquare",
  ("utils/_import_path.py", "check_options"): "a factory's options against its signature",
  ("records/_paths.py", "check_workdir"): "a run directory's path or URL",
}
HELPER = re.compile(r"^(check|require)_")
PRIVATE_HELPER = re.compile(r"^_(check|require)_")
PREDICATE = re.compile(r"^_?is_(int|integer|number|numeric|real|float|finite|bool|positive|nonnegative)")


def _modules() -> list[tuple[str, ast.Module]]:
  return [
    (path.relative_to(PACKAGE_ROOT).as_posix(), ast.parse(path.read_text()))
    for path in sorted(PACKAGE_ROOT.rglob("*.py"))
    if path != VOCABULARY
  ]


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
  return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_module_but_the_vocabulary_defines_value_check_helpers():
  found = {
    (module, function.name)
    for module, tree in _modules()
    for function in _functions(tree)
    if HELPER.match(function.name)
  }
  unlisted = sorted(found - set(CONCEPT_CHECKS))
  assert not unlisted, f"use stalesgd._validation, or list a concept's check with its reason: {unlisted}"
  assert not set(CONCEPT_CHECKS) - found, "a listed check is gone: remove it from CONCEPT_CHECKS"


def test_no_module_but_the_vocabulary_defines_type_predicates():
  predicates = [
    f"{module}: {function.name}"
    for module, tree in _modules()
    for function in _functions(tree)
    if PREDICATE.match(function.name)
  ]
  assert not predicates, f"use stalesgd._validation.is_integer / is_real: {predicates}"


def test_a_private_check_is_its_own_modules_step():
  imported = [
    f"{module}:{node.lineno} imports {alias.name}"
    for module, tree in _modules()
    for node in ast.walk(tree)
    if isinstance(node, ast.ImportFrom)
    for alias in node.names
    if PRIVATE_HELPER.match(alias.name)
  ]
  assert not imported, imported


def test_the_vocabulary_imports_the_standard_library_only():
  tree = ast.parse(VOCABULARY.read_text())
  modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
  modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
  assert {module.split(".")[0] for module in modules} <= set(sys.stdlib_module_names) | {"__future__"}, modules


# -- the primitives ------------------------------------------------------------------------------------------------


def _message(check, *args, **kwargs) -> str:
  with pytest.raises(ValueError) as error:
    check(*args, **kwargs)
  return str(error.value)


def test_reject_is_the_one_format():
  assert _message(validation.reject, "config.timing.latency", -1.0, "a finite number >= 0") == (
    "config.timing.latency=-1.0; allowed: a finite number >= 0"
  )


@pytest.mark.parametrize(
  "value, kwargs, message",
  [
    (0, dict(low=1), "n=0; allowed: an integer >= 1"),
    (9, dict(low=1, high=8), "n=9; allowed: an integer >= 1 and <= 8"),
    (31, dict(low=1, high=30, high_label="learners"), "n=31; allowed: an integer >= 1 and <= learners=30"),
    (6, dict(high=5), "n=6; allowed: an integer <= 5"),  # no lower bound given: none checked
    (True, dict(low=0), "n=True; allowed: an integer >= 0"),  # a bool is not an integer
    (2.0, dict(low=0), "n=2.0; allowed: an integer >= 0"),  # nor is an integral float
    ("3", dict(low=0), "n='3'; allowed: an integer >= 0"),
    (None, dict(low=0), "n=None; allowed: an integer >= 0"),
    (0, dict(low=1, optional=True), "n=0; allowed: None or an integer >= 1"),
    (np.int64(3), dict(low=0, builtin_only=True), "n=np.int64(3); allowed: a Python int >= 0"),  # its type is wrong
    (-1, dict(low=0, builtin_only=True), "n=-1; allowed: an integer >= 0"),  # a Python int: its value is wrong
    (-1, dict(low=0, note="(calls of delay)"), "n=-1; allowed: an integer >= 0 (calls of delay)"),
  ],
)
def test_check_integer_refuses(value, kwargs, message):
  assert _message(validation.check_integer, "n", value, **kwargs) == message


def test_check_integer_bounds_are_inclusive_and_it_returns_a_python_int():
  assert validation.check_integer("n", 1, low=1, high=8) == 1
  assert validation.check_integer("n", 8, low=1, high=8) == 8
  result = validation.check_integer("n", np.int64(3), low=0)
  assert result == 3 and type(result) is int
  assert validation.check_integer("n", None, low=0, optional=True) is None
  assert validation.check_integer("n", 2**70, low=0) == 2**70  # no upper bound unless given


@pytest.mark.parametrize(
  "value, kwargs, message",
  [
    (-1.0, dict(low=0), "x=-1.0; allowed: a finite number >= 0"),
    (0.0, dict(low=0, low_open=True), "x=0.0; allowed: a finite number > 0"),
    (1.0, dict(low=0, high=1, high_open=True), "x=1.0; allowed: a finite number >= 0 and < 1"),
    (1.5, dict(low=0, high=1), "x=1.5; allowed: a finite number >= 0 and <= 1"),
    (math.nan, dict(low=0), "x=nan; allowed: a finite number >= 0"),
    (math.inf, dict(low=0), "x=inf; allowed: a finite number >= 0"),
    (math.nan, dict(low=0, allow_inf=True), "x=nan; allowed: a number >= 0 (inf allowed)"),  # NaN never
    (-math.inf, dict(allow_inf=True), "x=-inf; allowed: a number (inf allowed)"),  # +inf only
    (True, dict(low=0), "x=True; allowed: a finite number >= 0"),  # a bool is not a number
    ("0.1", dict(low=0), "x='0.1'; allowed: a finite number >= 0"),
    (-1, dict(low=0, optional=True), "x=-1; allowed: None or a finite number >= 0"),
    (np.float32(0.5), dict(builtin_only=True), "x=np.float32(0.5); allowed: a finite Python int or float"),
    (
      np.float32(9),
      dict(allow_inf=True, builtin_only=True),
      "x=np.float32(9.0); allowed: a Python int or float (inf allowed)",
    ),
    (-1.0, dict(low=0, builtin_only=True), "x=-1.0; allowed: a finite number >= 0"),  # a float: its value is wrong
    (-1.0, dict(low=0, note="or a schedule"), "x=-1.0; allowed: a finite number >= 0 or a schedule"),
  ],
)
def test_check_real_refuses(value, kwargs, message):
  assert _message(validation.check_real, "x", value, **kwargs) == message


def test_check_real_accepts_and_returns_the_value_unchanged():
  assert validation.check_real("x", 0, low=0) == 0  # an int is a real number; bounds are inclusive by default
  assert validation.check_real("x", 1.0, low=0, high=1) == 1.0
  assert validation.check_real("x", math.inf, low=0, allow_inf=True) == math.inf
  value = np.float32(0.25)
  assert validation.check_real("x", value, low=0, high=1) is value
  assert validation.check_real("x", np.float64(0.25), builtin_only=True) == 0.25  # numpy's float64 is a float
  assert validation.check_real("x", Fraction(1, 3), low=0) == Fraction(1, 3)
  assert validation.check_real("x", 10**400, low=0) == 10**400  # an integer is finite, however large
  assert validation.check_real("x", None, optional=True) is None


def test_check_choice():
  assert validation.check_choice("rule", "b", ("a", "b")) == "b"
  assert _message(validation.check_choice, "rule", "c", ("a", "b")) == "rule='c'; allowed: one of ('a', 'b')"
  assert _message(validation.check_choice, "rule", ["a"], ["a", "b"]) == "rule=['a']; allowed: one of ('a', 'b')"
  assert _message(validation.check_choice, "rule", np.array(["a"]), ("a",)).startswith("rule=array(")
  protocols = ("hardsync", "softsync", "async")
  assert _message(validation.check_choice, "config.protocol", "softsnc", protocols) == (
    "config.protocol='softsnc'; allowed: one of ('hardsync', 'softsync', 'async'); did you mean 'softsync'?"
  )
  assert _message(validation.check_choice, "config.protocol", "Async", protocols).endswith("did you mean 'async'?")
  assert "did you mean" not in _message(validation.check_choice, "config.protocol", "ps", protocols)  # none is close
  assert "did you mean" not in _message(validation.check_choice, "config.protocol", 7, protocols)  # not a str


def test_check_bool():
  assert validation.check_bool("flag", False) is False
  assert _message(validation.check_bool, "flag", 1) == "flag=1; allowed: True or False"
  assert _message(validation.check_bool, "flag", np.bool_(True)) == "flag=np.True_; allowed: True or False"


def test_the_predicates():
  assert validation.is_integer(np.int32(1)) and not validation.is_integer(np.int32(1), builtin_only=True)
  assert not validation.is_integer(True) and not validation.is_integer(1.0)
  assert validation.is_real(math.nan) and validation.is_real(np.float32(1)) and not validation.is_real(False)
  assert not validation.is_real(np.float32(1), builtin_only=True) and validation.is_real(1, builtin_only=True)
