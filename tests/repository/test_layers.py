"""The two layers: the core needs only jax, optax and numpy, and no import runs upward.

The core (`CORE_PACKAGES`) is what a user of the optax transforms, the timing
model or the engine installs; the training stack builds on it. The order of
`PACKAGE_ORDER` is the picture of README *Layout*: a module may import from its
own package or from one earlier in the list, never from a later one.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import stalesgd
from stalesgd._extras import TRAINING_STACK_MODULES

PACKAGE_ROOT = pathlib.Path(stalesgd.__file__).parent
CORE_PACKAGES = ("transforms", "schedule", "parallel", "engine", "decentral")
PACKAGE_ORDER = CORE_PACKAGES + (
  "utils",
  "records",
  "reports",
  "cluster",
  "data",
  "models",
  "training",
  "configs",
  "studies",
  "cli",
)
# Top-level modules the core may load: the validation vocabulary and a leaf's path as names (standard library
# only, so every layer imports them).
CORE_MODULES = ("stalesgd._validation", "stalesgd._key_paths")
# The programs' list of the training stack (stalesgd._extras), by top-level package, without absl (optax itself
# imports absl.logging), plus etils (orbax's and tfds's path library).
TRAINING_STACK_DISTRIBUTIONS = tuple(
  sorted({name.split(".")[0] for name in TRAINING_STACK_MODULES} - {"absl"} | {"etils"})
)


def _package_of(path: pathlib.Path) -> str:
  relative = path.relative_to(PACKAGE_ROOT)
  return relative.parts[0] if len(relative.parts) > 1 else ""


def _stalesgd_imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """(line, first package below stalesgd) of every stalesgd import in the file, wherever it is."""
  imports = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module] if node.module != "stalesgd" else [f"stalesgd.{alias.name}" for alias in node.names]
    elif isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    else:
      continue
    for name in names:
      parts = name.split(".")
      if parts[0] == "stalesgd" and len(parts) > 1:
        imports.append((node.lineno, parts[1]))
  return imports


def test_every_package_is_placed_in_the_order():
  packages = {path.name for path in PACKAGE_ROOT.iterdir() if (path / "__init__.py").exists()}
  assert packages == set(PACKAGE_ORDER)


def test_at_most_four_top_level_modules():
  modules = [path.name for path in PACKAGE_ROOT.glob("*.py") if path.name != "__init__.py"]
  assert len(modules) <= 4, modules


def test_no_module_imports_a_later_layer():
  upward = []
  for path in sorted(PACKAGE_ROOT.rglob("*.py")):
    package = _package_of(path)
    if not package:
      continue  # stalesgd/__init__.py and the top-level modules: checked by the core-import test
    rank = PACKAGE_ORDER.index(package)
    for line, imported in _stalesgd_imports(path):
      if imported in PACKAGE_ORDER and PACKAGE_ORDER.index(imported) > rank:
        upward.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} imports stalesgd.{imported}")
  assert not upward, "\n".join(upward)


@pytest.mark.slow
def test_the_core_imports_nothing_of_the_training_stack():
  """In a fresh interpreter where the training stack's packages cannot be imported at all."""
  program = textwrap.dedent(f"""
      import importlib.abc, sys
      BLOCKED = {TRAINING_STACK_DISTRIBUTIONS!r}
      class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] in BLOCKED:
            raise ImportError(f"the core imported {{name}}")
      sys.meta_path.insert(0, Block())
      import stalesgd, stalesgd.transforms, stalesgd.schedule, stalesgd.parallel, stalesgd.engine, stalesgd.decentral
      loaded = sorted(name for name in sys.modules if name.startswith("stalesgd.")
                      and name.split(".")[1] not in {CORE_PACKAGES!r} and name not in {CORE_MODULES!r})
      assert not loaded, loaded
      print("ok")
      """)
  completed = subprocess.run(
    [sys.executable, "-c", program], capture_output=True, text=True, check=False, cwd=PACKAGE_ROOT.parent
  )
  assert completed.returncode == 0 and completed.stdout.strip() == "ok", completed.stderr[-3000:]


CORE_PROGRAM = """
import jax, jax.numpy as jnp, numpy as np, optax
import stalesgd
from stalesgd import decentral, engine, parallel, schedule

def loss_fn(params, batch):
  return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)

rng = np.random.default_rng(0)
inputs = rng.normal(size=(64, 3)).astype(np.float32)
targets = inputs @ np.array([[1.0], [-2.0], [0.5]], np.float32)
params = {"w": np.zeros((3, 1), np.float32)}

# A transform in a user's loop, with the staleness and the stale weights it needs.
tx = stalesgd.dc_asgd(0.1, dc_lambda=0.04)
state = tx.init(params)
grads = jax.grad(loss_fn)(params, {"x": inputs[:8], "y": targets[:8]})
updates, state = tx.update(grads, state, params, staleness=2, stale_params=params)
assert np.all(np.isfinite(updates["w"]))

# The timing model, then the engine on its schedule.
timeline = schedule.simulate("async", learners=4, num_updates=24, seed=0)
def batch_fn(learner, k):
  first = (np.asarray(k, np.int64) * 8 + np.asarray(learner, np.int64) * 3) % 56
  indices = first[:, None] + np.arange(8)[None]
  return {"x": inputs[indices], "y": targets[indices]}
optimizer = optax.chain(stalesgd.scale_by_staleness("inverse"), stalesgd.average_contributions(), optax.sgd(0.05))
emulator = engine.Engine(loss_fn, optimizer)
plan = emulator.plan(timeline)
final = emulator.run(emulator.init(params, plan), plan, batch_fn)
assert loss_fn(final.params, {"x": inputs, "y": targets}) < loss_fn(params, {"x": inputs, "y": targets})

# DC-S3GD on the devices (one learner each).
mesh = parallel.learner_mesh()
trainer = decentral.DCS3GD(lambda p, b: (loss_fn(p, b), None), optax.sgd(0.05),
                           decentral.settings_for_protocol("dcs3gd"), mesh)
dc_state = trainer.init(params)
for step in range(4):
  rows = lambda learner: slice(8 * (learner % 8), 8 * (learner % 8) + 8)
  batch = parallel.stack_learners(lambda learner: {"x": inputs[rows(learner)], "y": targets[rows(learner)]}, mesh)
  dc_state, _ = trainer.step(dc_state, batch)
assert np.all(np.isfinite(np.asarray(trainer.consensus_params(dc_state)["w"])))
print("ran")
"""


def _run_with_the_training_stack_blocked(program: str) -> subprocess.CompletedProcess:
  blocker = textwrap.dedent(f"""
      import importlib.abc, sys
      class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] in {TRAINING_STACK_DISTRIBUTIONS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
      sys.meta_path.insert(0, Block())
      """)
  environment = {**os.environ, "JAX_NUM_CPU_DEVICES": "4"}  # DC-S3GD with 4 learners
  return subprocess.run(
    [sys.executable, "-c", blocker + program],
    capture_output=True,
    text=True,
    check=False,
    cwd=PACKAGE_ROOT.parent,
    timeout=300,
    env=environment,
  )


@pytest.mark.slow
def test_the_transforms_timing_model_engine_and_dcs3gd_run_with_the_core_alone():
  completed = _run_with_the_training_stack_blocked(CORE_PROGRAM)
  assert completed.returncode == 0 and completed.stdout.strip() == "ran", completed.stderr[-3000:]


@pytest.mark.slow
def test_a_program_without_the_training_stack_names_the_extra_to_install():
  completed = _run_with_the_training_stack_blocked("import stalesgd.cli.train")
  assert completed.returncode == 1
  assert "stalesgd-train needs stalesgd's training stack" in completed.stderr
  assert "pip install 'stalesgd[train]'" in completed.stderr and "flax" in completed.stderr


def test_both_runners_implement_the_runner_protocol():
  from stalesgd import training
  from stalesgd.training._runners import DecentralizedRunner, ParameterServerRunner

  members = [name for name in vars(training.Runner) if not name.startswith("_")]
  assert set(members) == {"block_starts", "block_at", "resume_at", "init", "step", "params", "updates_done"}
  for runner in (ParameterServerRunner, DecentralizedRunner):
    assert all(callable(getattr(runner, name)) or isinstance(getattr(runner, name), property) for name in members)
    assert training.Runner not in runner.__mro__  # structural: neither inherits it, nor a shared mixin
