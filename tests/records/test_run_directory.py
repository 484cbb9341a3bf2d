"""A run directory's file names are defined once, in `stalesgd.records._run_directory`.

The loop writes them, the sweep and the report read them, the checkpoint
resumes from them: a name spelled out anywhere else would let one of them
drift (a renamed summary the sweep no longer finds would retrain every
finished run). The scan reads every string constant of the package's code,
docstrings excluded, and the names the module owns.
"""

from __future__ import annotations

import ast
import pathlib

import stalesgd
from stalesgd.records import _run_directory as run_directory

PACKAGE = pathlib.Path(stalesgd.__file__).parent
OWNER = pathlib.Path(run_directory.__file__)
# Names a run directory holds that are also ordinary words in other contexts: the checkpointer's own subfolder
# argument is the caller's choice ("checkpoints" appears only in run_directory and docstrings).
RUN_FILE_NAMES = {name for name in run_directory.RUN_FILES if "*" not in name}


def _docstring_nodes(tree: ast.AST) -> set[int]:
  nodes = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        nodes.add(id(body[0].value))
  return nodes


def literal_run_file_names(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, name) of every string constant in ``path`` (not a docstring) equal to a run directory's file name."""
  tree = ast.parse(path.read_text())
  docstrings = _docstring_nodes(tree)
  return [
    (node.lineno, node.value)
    for node in ast.walk(tree)
    if isinstance(node, ast.Constant)
    and isinstance(node.value, str)
    and id(node) not in docstrings
    and node.value in RUN_FILE_NAMES
  ]


def test_the_scan_finds_a_literal_file_name(tmp_path):
  module = tmp_path / "module.py"
  module.write_text('"""Writes summary.json."""\n\nPATH = "summary.json"\n')
  assert literal_run_file_names(module) == [(3, "summary.json")]


def test_no_module_but_the_owner_spells_a_run_directory_file_name():
  found = {
    f"{path.relative_to(PACKAGE.parent)}:{line}": name
    for path in sorted(PACKAGE.rglob("*.py"))
    if path != OWNER
    for line, name in literal_run_file_names(path)
  }
  assert found == {}, f"use stalesgd.records._run_directory's constants instead: {found}"


def test_the_owner_lists_every_name_it_defines():
  constants = {value for name, value in vars(run_directory).items() if name.isupper() and isinstance(value, str)}
  assert constants == set(run_directory.RUN_FILES)
