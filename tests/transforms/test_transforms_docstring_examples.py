"""The runnable examples in the transforms' docstrings give the outputs they show."""

from __future__ import annotations

import doctest

import pytest

from stalesgd.transforms import aliases
from stalesgd.transforms import contributions
from stalesgd.transforms import delay_compensation
from stalesgd.transforms import gap_aware
from stalesgd.transforms import mean_square
from stalesgd.transforms import staleness


@pytest.mark.parametrize(
    "module", [aliases, contributions, delay_compensation, gap_aware, mean_square, staleness],
    ids=lambda module: module.__name__.rsplit(".", 1)[-1])
def test_docstring_examples(module):
  result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.attempted > 0
  assert result.failed == 0
