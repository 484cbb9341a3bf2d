"""Fixtures of the fault-injection tests: the training-loop tests' helpers, the digits as npz files, reference runs.

Every run here trains `tiny_run_config` on the embedded digits written once to
npz files (`fault_helpers.fault_config`): the same images and labels as the
embedded source, so the same weights, but a command-line run starts about two
seconds sooner (no scikit-learn import), which is what makes several kill -9
and restarts per test affordable.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.helpers import fault_helpers


@pytest.fixture(scope="session")
def digits_npz(tmp_path_factory) -> pathlib.Path:
  """A directory holding ``digits_train.npz`` and ``digits_test.npz`` (the embedded digits' splits)."""
  return fault_helpers.write_digits_npz(tmp_path_factory.mktemp("digits_npz"))


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, digits_npz):
  """``reference_run(variant, **overrides)``: the uninterrupted in-process run of a variant (with config
  overrides), once per session.

  Returns ``(summary, workdir)``; the workdir must not be modified (copy it first).
  """
  runs: dict[tuple, tuple[dict, pathlib.Path]] = {}

  def run(variant: str, **overrides) -> tuple[dict, pathlib.Path]:
    key = (variant, tuple(sorted(overrides.items())))
    if key not in runs:
      workdir = tmp_path_factory.mktemp(f"reference_{variant}") / "run"
      config = fault_helpers.fault_config(variant, digits_npz, **overrides)
      runs[key] = (fault_helpers.train_in_process(config, workdir), workdir)
    return runs[key]

  return run
