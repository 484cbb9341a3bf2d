"""The config file of docs/own_experiment.md, *A config file of your own*, as written there: it imports only public
names, its variants validate, a misspelt one is refused naming the others, and it trains through the program."""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from stalesgd.training import validate_config

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "own_experiment.md"


def _config_file_text() -> str:
  text = DOC.read_text()
  section = text[text.index("## A config file of your own") :]
  return re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)


@pytest.fixture
def config_module(tmp_path):
  path = tmp_path / "my_config.py"
  path.write_text(_config_file_text())
  namespace: dict = {}
  exec(compile(path.read_text(), str(path), "exec"), namespace)
  return path, namespace


def test_the_config_file_imports_only_public_names():
  tree = ast.parse(_config_file_text())
  modules = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
  modules += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
  assert modules, "the file imports default_config"
  for module in modules:
    assert not any(part.startswith("_") for part in module.split(".")), module


def test_every_variant_is_a_valid_config_and_a_misspelt_one_names_the_variants(config_module):
  _, namespace = config_module
  for variant in namespace["VARIANTS"]:
    validate_config(namespace["get_config"](variant), num_devices=8)
  assert namespace["get_config"]("softsync").staleness_rule == "inverse"
  with pytest.raises(ValueError, match=r"'sofsync'; allowed: one of \('softsync', 'hardsync'\)"):
    namespace["get_config"]("sofsync")


@pytest.mark.slow
def test_the_config_file_trains_through_the_program(config_module, tmp_path):
  path, _ = config_module
  workdir = tmp_path / "run"
  shown = subprocess.run(
    [
      sys.executable,
      "-m",
      "stalesgd.cli.train",
      f"--config={path}:softsync",
      "--config.num_epochs=0.25",
      f"--workdir={workdir}",
    ],
    capture_output=True,
    text=True,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    timeout=600,
  )
  assert shown.returncode == 0, shown.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert 0 <= summary["test_error"] <= 100
  saved = json.loads((workdir / "config.json").read_text())
  assert (saved["protocol"], saved["n"], saved["staleness_rule"]) == ("softsync", 4, "inverse")
