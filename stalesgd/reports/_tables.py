"""Result tables for comparing runs: Markdown for reading, CSV for machines (figures: `._plots`).

Rows are mappings of a result's fields (``{"protocol": "async", "test_error": 21.3, "published_test_error":
20.9}``); a published number (``published_<name>``) is placed beside ours. Example::

  write_results_table(rows, "runs/results.md")
  write_results_table(rows, "runs/results.csv")
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from stalesgd import _validation as validation
from stalesgd.records._paths import write_whole

PUBLISHED_PREFIX = "published_"


def plottable(value: Any) -> bool:
  """A record's value that is a point of a curve or a numeric column: a finite Python int or float."""
  return validation.is_real(value, builtin_only=True) and math.isfinite(value)


def table_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
  """All fields of the rows in first-seen order, each ``published_<name>`` right after ``<name>``."""
  seen: list[str] = []
  for row in rows:
    seen.extend(name for name in row if name not in seen)
  ordered = [name for name in seen if not (name.startswith(PUBLISHED_PREFIX) and name[len(PUBLISHED_PREFIX) :] in seen)]
  for name in list(ordered):
    published = PUBLISHED_PREFIX + name
    if published in seen:
      ordered.insert(ordered.index(name) + 1, published)
  return ordered


def _format_cell(value: Any, float_format: str) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return float_format.format(value)
  return str(value)


def markdown_table(
  rows: Sequence[Mapping[str, Any]],
  columns: Sequence[str] | None = None,
  *,
  float_format: str = "{:.2f}",
  column_formats: Mapping[str, str] | None = None,
) -> str:
  """A GitHub-flavoured Markdown table of result rows; missing cells are empty.

  Args:
    rows: one mapping per result, e.g. ``{"protocol": "async", "test_error":
      21.3, "published_test_error": 20.9}``.
    columns: the columns in order; default `table_columns` (published numbers
      beside ours).
    float_format: how floats are shown.
    column_formats: another format for some columns, by name (e.g. three
      significant digits for a quantity that may be 1e-6).

  Returns:
    The table, lines joined with newlines, ending with a newline.

  Raises:
    ValueError: if there are no columns.
  """
  columns = table_columns(rows) if columns is None else list(columns)
  if not columns:
    raise ValueError("the table has no columns; allowed: rows with fields, or explicit columns")
  formats = [(column_formats or {}).get(name, float_format) for name in columns]
  cells = [[_format_cell(row.get(name), form) for name, form in zip(columns, formats)] for row in rows]
  widths = [max([len(name)] + [len(row[index]) for row in cells]) for index, name in enumerate(columns)]
  numeric = [
    all(plottable(row.get(name)) or row.get(name) is None for row in rows)
    and any(row.get(name) is not None for row in rows)
    for name in columns
  ]

  def line(values: Sequence[str]) -> str:
    padded = [
      value.rjust(width) if is_numeric else value.ljust(width)
      for value, width, is_numeric in zip(values, widths, numeric)
    ]
    return "| " + " | ".join(padded) + " |"

  # GitHub needs at least one dash before the alignment colon ("-:").
  rule = [
    "-" * max(width - 1, 1) + ":" if is_numeric else "-" * max(width, 1) for width, is_numeric in zip(widths, numeric)
  ]
  return "\n".join([line(columns), line(rule)] + [line(row) for row in cells]) + "\n"


def write_results_table(
  rows: Sequence[Mapping[str, Any]],
  path: str | os.PathLike[str],
  *,
  columns: Sequence[str] | None = None,
  float_format: str = "{:.2f}",
) -> epath.Path:
  """Writes result rows as Markdown (``.md``) or CSV (``.csv``), by the path's suffix.

  CSV keeps full precision (``float_format`` applies to Markdown only); missing
  cells are empty in both.

  Args:
    rows: one mapping per result; see `markdown_table`.
    path: ``*.md`` or ``*.csv``; its directory is created.
    columns: the columns in order; default `table_columns`.
    float_format: how floats are shown in Markdown.

  Returns:
    The path written.

  Raises:
    ValueError: if the suffix is neither ``.md`` nor ``.csv``.
  """
  path = epath.Path(path)
  if path.suffix not in (".md", ".csv"):
    raise ValueError(f"path suffix {path.suffix!r} ({path}); allowed: '.md' or '.csv'")
  path.parent.mkdir(parents=True, exist_ok=True)
  columns = table_columns(rows) if columns is None else list(columns)
  if path.suffix == ".md":
    write_whole(path, markdown_table(rows, columns, float_format=float_format))
    return path
  text = io.StringIO(newline="")
  writer = csv.DictWriter(text, fieldnames=columns, restval="", extrasaction="ignore")
  writer.writeheader()
  for row in rows:
    writer.writerow({name: ("" if row.get(name) is None else row.get(name)) for name in columns})
  write_whole(path, text.getvalue())
  return path
