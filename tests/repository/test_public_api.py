"""docs/api.md is the public API: its lists equal the packages' ``__all__``; the training stack's stays small.

A name added to or removed from a package's ``__all__`` without docs/api.md
(or the other way round) fails here, so the public surface changes only on
purpose (docs/api.md, *Policy*).
"""

from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
import sys

import pytest

API_DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "api.md"
SECTION = re.compile(r"^## `([\w.]+)`$", re.M)
ITEM = re.compile(r"^- `(\w+)`", re.M)


def documented_api() -> dict[str, list[str]]:
  text = API_DOC.read_text()
  sections = SECTION.split(text)[1:]
  return {package: ITEM.findall(body) for package, body in zip(sections[::2], sections[1::2])}


def test_docs_api_lists_every_public_package():
  root = pathlib.Path(importlib.import_module("stalesgd").__file__).parent
  packages = {".".join(("stalesgd",) + path.parent.relative_to(root).parts) for path in root.rglob("__init__.py")}
  assert set(documented_api()) == packages


@pytest.mark.parametrize("package", sorted(documented_api()))
def test_docs_api_equals_all(package):
  module = importlib.import_module(package)
  assert documented_api()[package] == list(module.__all__)
  for name in module.__all__:
    assert hasattr(module, name), f"{package}.__all__ names {name}, which it does not define"


TRAINING_STACK = (
  "stalesgd.training",
  "stalesgd.training.checkpoint",
  "stalesgd.data",
  "stalesgd.data.preparation",
  "stalesgd.models",
  "stalesgd.configs",
  "stalesgd.studies",
  "stalesgd.utils",
  "stalesgd.records",
  "stalesgd.reports",
  "stalesgd.cluster",
  "stalesgd.cli",
)


def test_the_training_stack_exports_about_35_names():
  """What a user's program calls (docs/api.md, *Policy*); the runners, writers and sweep internals are private."""
  exported = sum(len(documented_api()[package]) for package in TRAINING_STACK)
  assert exported == 43  # 39, then describe_config, run_length, simulate_schedule and ConfigResult


@pytest.mark.parametrize(
  "program",
  [
    "import stalesgd.train",
    "import stalesgd.checkpoint",
    "from stalesgd.transforms import staleness",
  ],
)
def test_the_0_1_module_paths_are_gone_and_no_import_hook_is_installed(program):
  """No 0.1 was released: its development trees' paths were removed, not deprecated (CHANGELOG.md, *Removed*)."""
  checked = (
    "import sys, stalesgd\n"
    "assert not [finder for finder in sys.meta_path if type(finder).__module__.startswith('stalesgd')]\n"
    f"{program}\n"
  )
  completed = subprocess.run(
    [sys.executable, "-c", checked], capture_output=True, text=True, check=False, cwd=API_DOC.parents[1]
  )
  assert "ModuleNotFoundError" in completed.stderr or "ImportError" in completed.stderr, completed.stderr[-2000:]


def test_transform_flags_are_keyword_only():
  import stalesgd

  with pytest.raises(TypeError):
    stalesgd.dc_asgd(0.1, 0.5, True)
  with pytest.raises(TypeError):
    stalesgd.staleness_aware_sgd(0.1, 0.9, True)
  with pytest.raises(TypeError, match="decay"):
    stalesgd.scale_by_staleness("exponential", decay=0.7)
