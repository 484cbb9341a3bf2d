"""Fixtures of the training-loop tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def compilation_cache(tmp_path_factory):
  """A persistent JAX compilation cache for every ``experiments.main`` subprocess of the session."""
  return tmp_path_factory.mktemp("jax_compilation_cache")
