"""Packaging: the wheel's contents, the console scripts, and configs addressed by name.

The wheel holds the `stalesgd` package only (its configs, studies and
command-line programs included) and no top-level ``experiments``: that folder
stays in the repository for the scripts. The programs run from any directory,
with ``--config=NAME[:ARG]`` resolved to the packaged config
(`stalesgd.configs.resolve`) and ``--config=PATH[:ARG]`` to a config file of
one's own; the repository keeps no copies of the packaged configs, and its
documents name one way to run (``stalesgd-train`` / ``stalesgd-reproduce``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest
from absl import flags

from stalesgd import configs
from stalesgd.cli import config_flag
from tests.helpers.packaged_configs import EXPECTED_CONFIGS

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
SCRIPTS = PROJECT["project"]["scripts"]
MINIMUM_SETUPTOOLS = 77  # pyproject.toml's build-system requirement (SPDX license strings)
# Run in a subprocess: the program with `experiments` made unimportable, as in a directory outside any clone
# (PYTHONPATH still points at this checkout, so the stalesgd under test is the one that runs).
WITHOUT_EXPERIMENTS = "import sys; sys.modules['experiments'] = None; from {module} import {function}; {function}()"


def _environment(**extra: str) -> dict[str, str]:
  env = {name: value for name, value in os.environ.items() if name != "JAX_NUM_CPU_DEVICES"}
  env.update(
    JAX_PLATFORMS="cpu",
    TF_CPP_MIN_LOG_LEVEL="3",
    PYTHONUNBUFFERED="1",
    PYTHONPATH=os.pathsep.join([str(REPOSITORY), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
  )
  env.update(extra)
  return env


def _flag_values(argv: list[str]) -> flags.FlagValues:
  flag_values = flags.FlagValues()
  config_flag.define_config_flag("config", "config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return flag_values


# ----------------------------------------------------------------------------- name resolution


def test_the_packaged_config_names_are_the_config_modules_and_not_their_helpers():
  assert set(configs.names()) == EXPECTED_CONFIGS
  for name in configs.names():
    module = importlib.import_module(f"stalesgd.configs.{name}")
    assert callable(module.get_config) and module.VARIANTS, name
  for helper in configs._HELPER_MODULES:
    assert not hasattr(importlib.import_module(f"stalesgd.configs.{helper}"), "get_config"), helper


@pytest.mark.parametrize(
  "value, argument",
  [
    ("demo", ""),
    ("demo:async_dc", ":async_dc"),
    ("demo.py:async_dc", ":async_dc"),
    ("demo:", ":"),
    ("rudra_cifar10:quick,softsync_inverse", ":quick,softsync_inverse"),
  ],
)
def test_a_name_resolves_to_the_packaged_file_keeping_the_argument(value, argument, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # no clone here
  name = value.partition(":")[0].removesuffix(".py")
  path = REPOSITORY / "stalesgd" / "configs" / f"{name}.py"
  assert configs.resolve(value) == f"{path}{argument}"
  assert configs.config_path(name) == path


def test_an_existing_file_is_kept_and_wins_over_a_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "demo.py").write_text("def get_config(arg=None):\n  return {'mine': arg}\n")
  assert configs.resolve("demo.py:x") == "demo.py:x"
  assert configs.resolve(f"{tmp_path / 'demo.py'}") == f"{tmp_path / 'demo.py'}"
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "config.py").write_text("def get_config(arg=None):\n  return {'mine': arg}\n")
  assert configs.resolve("mine/config.py:x") == "mine/config.py:x"


@pytest.mark.parametrize(
  "value",
  [
    "nonexistent",
    "nonexistent.py:quick",
    "demo_typo:async_dc",
    "somewhere/demo.py:async_dc",
    "arguments",
    "quick",
    "__init__",
    "",
  ],
)
def test_an_unknown_name_or_missing_file_is_refused_with_the_names(value, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match="neither a config file .* nor a packaged config's name; allowed") as error:
    configs.resolve(value)
  allowed = str(error.value).split("allowed:")[1]
  assert all(repr(name) in allowed for name in EXPECTED_CONFIGS) and "'arguments'" not in allowed


def test_the_config_flag_takes_a_name_with_overrides_and_refuses_an_unknown_one(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  argv = ["main", "--config=rudra_cifar10:quick,softsync_inverse", "--config.n=30"]
  config = _flag_values(argv).config
  assert (config.protocol, config.n, config.staleness_rule, config.dataset) == ("softsync", 30, "inverse", "digits")
  with pytest.raises(flags.IllegalFlagValueError, match=r"--config=rudra:quick: 'rudra' is neither .*'rudra_cifar10'"):
    _flag_values(["main", "--config=rudra:quick"])


def test_the_config_flag_takes_a_file_of_ones_own_with_its_argument_and_overrides(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "my_demo.py").write_text(
    "from stalesgd.configs import demo\n\n\n"
    "def get_config(arg=None):\n"
    "  config = demo.get_config(arg)\n"
    "  config.num_epochs = 2.0\n"
    "  return config\n"
  )
  config = _flag_values(["main", "--config=configs/my_demo.py:hardsync", "--config.learners=4"]).config
  assert (config.protocol, config.learners, config.num_epochs) == ("hardsync", 4, 2.0)
  by_absolute_path = _flag_values(["main", f"--config={tmp_path / 'configs' / 'my_demo.py'}:hardsync"]).config
  assert by_absolute_path.num_epochs == 2.0


def test_the_repository_keeps_no_copies_of_the_packaged_configs():
  copies = [path for name in configs.names() for path in REPOSITORY.glob(f"experiments/**/{name}.py")]
  assert not copies, f"{copies}: run the packaged config by name (--config=NAME) instead"


# The documents a reader copies commands from; CHANGELOG.md and results/*/README.md record history (a results
# README whose recorded command used a removed form gives today's equivalent in its Notes).
DOCUMENTED = ["README.md", "Makefile", "pyproject.toml", "docs/**/*.md", "launch/**/*", "stalesgd/**/*.py"]
DOCUMENTED += ["experiments/**/*.py", "experiments/**/*.sh"]
REMOVED_FORMS = re.compile(r"experiments[./](main|reproduce)\b|experiments/configs")


def test_the_documents_name_one_way_to_run():
  found = [
    f"{path.relative_to(REPOSITORY)}:{number}: {line.strip()}"
    for pattern in DOCUMENTED
    for path in sorted(REPOSITORY.glob(pattern))
    if path.is_file() and path.suffix not in (".pyc",)
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1)
    if REMOVED_FORMS.search(line)
  ]
  assert not found, "the clone-only forms (use stalesgd-train / stalesgd-reproduce):\n" + "\n".join(found)


# ----------------------------------------------------------------------------- the wheel


@pytest.mark.slow
def test_the_wheel_holds_stalesgd_with_its_configs_and_no_top_level_experiments(tmp_path):
  version = importlib.metadata.version("setuptools")
  if int(version.split(".")[0]) < MINIMUM_SETUPTOOLS:
    pytest.skip(
      f"setuptools {version} here; building offline (--no-build-isolation) needs >= {MINIMUM_SETUPTOOLS}, "
      "which the test extra installs: pip install -c requirements/constraints.txt -e '.[test]'"
    )
  source = tmp_path / "source"  # a copy: the build writes stalesgd.egg-info and build/ next to pyproject.toml
  source.mkdir()
  for name in ("pyproject.toml", PROJECT["project"]["readme"], *PROJECT["project"]["license-files"]):
    shutil.copy(REPOSITORY / name, source / name)
  for folder in ("stalesgd", "experiments"):  # experiments/ is there, as in a clone, and must stay out
    shutil.copytree(
      REPOSITORY / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    )
  built = subprocess.run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--no-deps",
      "--no-build-isolation",
      "--no-index",
      "-w",
      str(tmp_path / "dist"),
      str(source),
    ],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
  )
  assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
  [wheel] = (tmp_path / "dist").glob("stalesgd-*.whl")
  with zipfile.ZipFile(wheel) as archive:
    files = set(archive.namelist())
    info = f"stalesgd-{PROJECT['project']['version']}.dist-info"
    entry_points = archive.read(f"{info}/entry_points.txt").decode()
    top_level = archive.read(f"{info}/top_level.txt").decode().split()
    metadata = archive.read(f"{info}/METADATA").decode()
  assert not [file for file in files if file.startswith("experiments/")]
  assert {file.split("/")[0] for file in files} == {"stalesgd", info}
  assert top_level == ["stalesgd"]
  assert "stalesgd/py.typed" in files
  assert {f"stalesgd/configs/{name}.py" for name in (*EXPECTED_CONFIGS, *configs._HELPER_MODULES)} <= files
  assert {
    "stalesgd/configs/__init__.py",
    "stalesgd/studies/_catalogue.py",
    "stalesgd/studies/_sweep.py",
    "stalesgd/cli/train.py",
    "stalesgd/cli/reproduce.py",
    "stalesgd/cli/config_flag.py",
  } <= files
  assert "[console_scripts]" in entry_points
  for script, target in SCRIPTS.items():
    assert f"{script} = {target}" in entry_points
  # pip install stalesgd is the core: jax, optax and numpy; everything else is behind an extra.
  requirements = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
  unconditional = sorted(
    re.split(r"[<>=!~ \[]", requirement)[0] for requirement in requirements if ";" not in requirement
  )
  assert unconditional == ["jax", "numpy", "optax"]
  train_extra = {
    re.split(r"[<>=!~ \[]", requirement)[0] for requirement in requirements if 'extra == "train"' in requirement
  }
  assert {"flax", "orbax-checkpoint", "tensorflow-datasets", "absl-py", "ml-collections", "tensorboardX"} <= train_extra


# ----------------------------------------------------------------------------- the console scripts


def test_the_console_scripts_are_the_three_programs():
  assert SCRIPTS == {
    "stalesgd-train": "stalesgd.cli.train:run",
    "stalesgd-reproduce": "stalesgd.cli.reproduce:run",
    "stalesgd-prepare": "stalesgd.data.prepare:run",
  }


@pytest.mark.slow
def test_every_console_script_target_imports_and_is_callable_without_experiments(tmp_path):
  """Also: importing a program does not import matplotlib (0.4 s of every start, a refused config's and a killed
  run's included); it comes with the first figure (`stalesgd.reports._plots.new_figure`)."""
  # One process each: the programs define their absl flags at import (train and reproduce share some names).
  check = (
    "import importlib, sys; sys.modules['experiments'] = None; module, _, function = sys.argv[1].partition(':');"
    " target = getattr(importlib.import_module(module), function); assert callable(target), sys.argv[1];"
    " assert 'matplotlib' not in sys.modules, f'{module} imports matplotlib at import'"
  )
  processes = {
    target: subprocess.Popen(
      [sys.executable, "-c", check, target],
      cwd=tmp_path,
      env=_environment(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for target in SCRIPTS.values()
  }
  for target, process in processes.items():
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, f"{target}: {stderr[-3000:]}"


@pytest.mark.slow
def test_train_runs_a_packaged_config_by_name_outside_the_repository(tmp_path):
  workdir = tmp_path / "run"
  program = WITHOUT_EXPERIMENTS.format(module="stalesgd.cli.train", function="run")
  # The demo's async DC-ASGD-a run, 10 updates of the MLP (compiles faster than its CNN): about 10 s.
  completed = subprocess.run(
    [
      sys.executable,
      "-c",
      program,
      "--config=demo:async_dc",
      "--config.num_epochs=0.05",
      "--config.model=mlp",
      f"--workdir={workdir}",
    ],
    cwd=tmp_path,
    env=_environment(),
    capture_output=True,
    text=True,
    timeout=180,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["label"] == "async (lambda=8, mu=8, DC-adaptive)"  # demo.py's async_dc variant
  assert summary["updates"] == 10 and not summary["preempted"]  # 0.05 epochs of 1,497 images at mu = 8


@pytest.mark.slow
def test_train_refuses_an_unknown_config_name_listing_the_names(tmp_path):
  program = WITHOUT_EXPERIMENTS.format(module="stalesgd.cli.train", function="run")
  completed = subprocess.run(
    [sys.executable, "-c", program, "--config=rudra_cifar:quick", f"--workdir={tmp_path}"],
    cwd=tmp_path,
    env=_environment(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert completed.returncode != 0
  assert "--config=rudra_cifar:quick: 'rudra_cifar' is neither a config file" in completed.stderr
  assert all(repr(name) in completed.stderr for name in EXPECTED_CONFIGS), completed.stderr[-3000:]
  assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_reproduce_loads_the_studies_outside_the_repository(tmp_path):
  # Builds every study from the packaged configs, then refuses the variant before any run.
  program = WITHOUT_EXPERIMENTS.format(module="stalesgd.cli.reproduce", function="run")
  completed = subprocess.run(
    [sys.executable, "-c", program, "--study=demo", "--variants=nonexistent", f"--workdir={tmp_path / 'study'}"],
    cwd=tmp_path,
    env=_environment(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert completed.returncode != 0
  assert "--variants" in completed.stderr and "'hardsync'" in completed.stderr, completed.stderr[-3000:]
  assert not (tmp_path / "study").exists()
