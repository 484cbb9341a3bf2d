"""A packaged config is a config file like a user's own: it imports only public names (docs/own_experiment.md)."""

import ast
import pathlib

import pytest

from stalesgd import configs

CONFIG_DIR = pathlib.Path(configs.__file__).parent


@pytest.mark.parametrize("path", sorted(p for p in CONFIG_DIR.glob("*.py") if not p.name.startswith("_")), ids=str)
def test_a_packaged_config_imports_no_private_module(path):
  tree = ast.parse(path.read_text())
  modules = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
  modules += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
  private = [m for m in modules if m != "__future__" and any(part.startswith("_") for part in m.split("."))]
  names = [
    alias.name
    for node in ast.walk(tree)
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stalesgd")
    for alias in node.names
    if alias.name.startswith("_")
  ]
  assert not private and not names, (path.name, private, names)
