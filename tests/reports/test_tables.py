"""Tests for stalesgd.reports._tables: result tables in Markdown and CSV, published numbers beside ours."""

from __future__ import annotations

import csv

import pytest

from stalesgd.reports._tables import markdown_table, table_columns, write_results_table

ROWS = [
  {"protocol": "hardsync", "n": 1, "test_error": 18.234, "published_test_error": 18.0},
  {"protocol": "softsync", "n": 30, "published_test_error": 22.5, "test_error": 21.0, "note": "α0/σ"},
  {"protocol": "async", "n": 30, "test_error": None},
]


def test_table_columns_put_published_numbers_beside_ours():
  assert table_columns(ROWS) == ["protocol", "n", "test_error", "published_test_error", "note"]
  assert table_columns([{"published_only": 1.0, "ours": 2.0}]) == ["published_only", "ours"]


def test_markdown_table():
  assert markdown_table(ROWS) == (
    "| protocol |  n | test_error | published_test_error | note |\n"
    "| -------- | -: | ---------: | -------------------: | ---- |\n"
    "| hardsync |  1 |      18.23 |                18.00 |      |\n"
    "| softsync | 30 |      21.00 |                22.50 | α0/σ |\n"
    "| async    | 30 |            |                      |      |\n"
  )
  assert markdown_table(ROWS, ["n", "protocol"], float_format="{:.1f}").splitlines()[2] == "|  1 | hardsync |"
  with pytest.raises(ValueError, match="no columns"):
    markdown_table([])


def test_write_results_table_markdown_and_csv(tmp_path):
  markdown_path = write_results_table(ROWS, tmp_path / "tables" / "results.md")
  assert markdown_path.read_text(encoding="utf-8") == markdown_table(ROWS)
  csv_path = write_results_table(ROWS, tmp_path / "tables" / "results.csv")
  with open(csv_path, encoding="utf-8", newline="") as file:
    read_back = list(csv.DictReader(file))
  assert list(read_back[0]) == table_columns(ROWS)
  assert read_back[0]["test_error"] == "18.234"  # CSV keeps full precision.
  assert read_back[2] == {"protocol": "async", "n": "30", "test_error": "", "published_test_error": "", "note": ""}
  with pytest.raises(ValueError, match=r"path suffix '\.txt'"):
    write_results_table(ROWS, tmp_path / "results.txt")
