"""The runnable examples in the transforms' docstrings give the outputs they show."""

from __future__ import annotations

import doctest

import pytest

from stalesgd.transforms import _aliases as aliases
from stalesgd.transforms import _contributions as contributions
from stalesgd.transforms import _delay_compensation as delay_compensation
from stalesgd.transforms import _gap_aware as gap_aware
from stalesgd.transforms import _mean_square as mean_square
from stalesgd.transforms import _staleness as staleness


@pytest.mark.parametrize(
  "module",
  [aliases, contributions, delay_compensation, gap_aware, mean_square, staleness],
  ids=lambda module: module.__name__.rsplit(".", 1)[-1],
)
def test_docstring_examples(module):
  result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.attempted > 0
  assert result.failed == 0
