"""docs/api.md is the public API: its lists equal the packages' ``__all__``, and the 0.1 paths still import.

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
import warnings

import pytest

from stalesgd import _moved

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


@pytest.mark.parametrize("old, new", sorted(_moved.MOVED_MODULES.items()))
def test_a_moved_module_path_imports_with_a_deprecation_warning(old, new):
  sys.modules.pop(old, None)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = importlib.import_module(old)
  messages = [str(warning.message) for warning in caught if issubclass(warning.category, DeprecationWarning)]
  assert any(message.startswith(f"{old} moved to ") and _moved.REMOVED_IN in message for message in messages)
  target = importlib.import_module(new)
  public = [name for name in vars(target) if not name.startswith("_")]
  assert public and all(getattr(module, name) is getattr(target, name) for name in public)


def test_old_import_forms_work_in_a_fresh_interpreter():
  """``from stalesgd import train`` and ``from stalesgd.train import ...`` as 0.1 code wrote them."""
  program = (
    "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
    "try:\n  from stalesgd import config\nexcept DeprecationWarning as warning:\n  print(warning)\n"
    "warnings.simplefilter('ignore')\n"
    "from stalesgd.train import train_and_evaluate\n"
    "from stalesgd.checkpoint.checkpointer import Checkpointer\n"
    "import stalesgd.training\n"
    "assert train_and_evaluate is stalesgd.training.train_and_evaluate\n"
    "assert Checkpointer is stalesgd.training.checkpoint.Checkpointer\n"
  )
  completed = subprocess.run(
    [sys.executable, "-c", program], capture_output=True, text=True, check=False, cwd=API_DOC.parents[1]
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert completed.stdout.startswith("stalesgd.config moved to stalesgd.training in stalesgd 0.2")
