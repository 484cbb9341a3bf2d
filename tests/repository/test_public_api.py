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


# ----------------------------------------------------------------------------- 0.1 call forms of the factories


def _same_updates(first, second):
  import jax.numpy as jnp
  import numpy as np

  params = {"w": jnp.array([1.0, -2.0])}
  grads = {"w": jnp.array([0.5, 0.25])}
  stale = {"w": jnp.array([0.5, -1.0])}
  results = []
  for tx in (first, second):
    updates, _ = tx.update(grads, tx.init(params), params, staleness=3, stale_params=stale)
    results.append(np.asarray(updates["w"]))
  np.testing.assert_array_equal(*results)


def test_flags_passed_by_position_still_work_with_a_deprecation_warning():
  import stalesgd

  with pytest.warns(DeprecationWarning, match=r"dc_asgd: passing adaptive, momentum by position.*removed in 0\.3\.0"):
    old = stalesgd.dc_asgd(0.1, 0.5, True, 0.9)
  _same_updates(old, stalesgd.dc_asgd(0.1, 0.5, adaptive=True, momentum=0.9))
  with pytest.warns(DeprecationWarning, match="scale_by_delay_compensation: passing adaptive by position"):
    old = stalesgd.scale_by_delay_compensation(2.0, True)
  _same_updates(old, stalesgd.scale_by_delay_compensation(2.0, adaptive=True))
  with pytest.warns(DeprecationWarning, match="staleness_aware_sgd: passing nesterov, rule by position"):
    old = stalesgd.staleness_aware_sgd(0.1, 0.9, True, "exponential")
  _same_updates(old, stalesgd.staleness_aware_sgd(0.1, 0.9, nesterov=True, rule="exponential"))
  with pytest.raises(TypeError, match="multiple values for argument 'adaptive'"):
    stalesgd.dc_asgd(0.1, 0.5, True, adaptive=False)


def test_the_exponential_rules_rate_is_rate_and_decay_still_works_with_a_warning():
  import stalesgd

  with pytest.warns(DeprecationWarning, match=r"scale_by_staleness: the keyword 'decay' is now 'rate'"):
    old = stalesgd.scale_by_staleness("exponential", decay=0.7)
  _same_updates(old, stalesgd.scale_by_staleness("exponential", rate=0.7))
  with pytest.warns(DeprecationWarning, match="staleness_aware_sgd: the keyword 'decay'"):
    stalesgd.staleness_aware_sgd(0.1, rule="exponential", decay=0.7)
  with pytest.warns(DeprecationWarning, match="staleness_weight: the keyword 'decay'"):
    assert float(stalesgd.staleness_weight("exponential", 2.0, decay=0.5)) == pytest.approx(2.718281828**-1.0)
  with pytest.raises(TypeError, match="both 'decay'"):
    stalesgd.scale_by_staleness("exponential", decay=0.7, rate=0.7)
