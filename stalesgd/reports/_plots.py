"""Figures for comparing runs: learning curves, bands over seeds, staleness histograms (tables: `._tables`).

The inputs are what the trainer leaves behind: the records of each run's
``metrics.jsonl`` (read them with `stalesgd.records.read_jsonl`) and arrays of
staleness values. Records hold the fields the trainer writes (``step``,
``epoch``, ``sim_time``, ``wall_time``, ``train_loss``, ``test_accuracy``,
``test_error`` in percent, ``staleness_mean``, ``staleness_max``,
``lr_scale``, ``images_per_s``); evaluation fields appear only every few
updates, so each curve uses only the records that have both of its fields.

Figures are drawn with matplotlib's object API on the Agg renderer (a
`matplotlib.figure.Figure`, never pyplot), so nothing opens a window, nothing is
shared between calls, and it works on machines without a display.

Example::

  runs = [Run("hardsync", read_jsonl("runs/hardsync/metrics.jsonl")),
          Run("8-softsync, α0/σ", read_jsonl("runs/softsync8/metrics.jsonl"))]
  plot_curves(runs, "runs/test_error.png")
  plot_staleness_histograms({"8-softsync": schedule.gradient_staleness}, "runs/staleness.png")
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from etils import epath

from stalesgd.records._metrics import integer_bins
from stalesgd.records._paths import write_whole
from stalesgd.reports._tables import plottable

if TYPE_CHECKING:
  from matplotlib.figure import Figure

AXIS_LABELS = {
  "step": "server update",
  "epoch": "epoch",
  "sim_time": "simulated wall-clock time (s)",
  "wall_time": "wall-clock time (s)",
  "train_loss": "training loss",
  "test_accuracy": "test accuracy",
  "test_error": "test error (%)",
  "staleness_mean": "mean staleness",
  "staleness_max": "max staleness",
  "lr_scale": "learning-rate scale",
  "images_per_s": "images/s",
}


def new_figure(**options: Any) -> Figure:
  """A `matplotlib.figure.Figure` (Agg, no pyplot) with ``options``.

  matplotlib is imported here, at the first figure, not with this module: a process that never draws (a run
  stopped or refused before its end, a ``--help``) does not pay its 0.4 s import.
  """
  from matplotlib.figure import Figure  # deferred: see the docstring

  return Figure(**options)


class Run(NamedTuple):
  """One line in a figure: a label and the run's metric records."""

  label: str
  records: Sequence[Mapping[str, Any]]


def curve_points(records: Sequence[Mapping[str, Any]], x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
  """The (x, y) pairs of the records that have both fields as finite numbers, sorted by x."""
  pairs = []
  for record in records:
    x_value, y_value = record.get(x), record.get(y)
    if plottable(x_value) and plottable(y_value):
      pairs.append((float(x_value), float(y_value)))
  pairs.sort(key=lambda pair: pair[0])
  points = np.array(pairs, dtype=np.float64).reshape(-1, 2)
  return points[:, 0], points[:, 1]


def _line_style(index: int) -> dict[str, Any]:
  # Ten colours, then the same colours dashed, dotted...: sweeps such as
  # DC-ASGD's table have 15 runs.
  return {"color": f"C{index % 10}", "linestyle": ("-", "--", ":", "-.")[(index // 10) % 4]}


def plot_curves(
  runs: Sequence[Run],
  path: str | os.PathLike[str],
  *,
  y: str = "test_error",
  x: Sequence[str] = ("epoch", "sim_time"),
  title: str | None = None,
) -> epath.Path:
  """One figure, one panel per x field, one line per run: e.g. test error vs epoch and vs simulated time.

  Args:
    runs: the runs to compare; a run without any point in a panel is left out
      of that panel (a panel with no points at all says so).
    path: the PNG (or any format matplotlib infers from the suffix) to write;
      its directory is created.
    y: the record field on the vertical axis.
    x: the record fields on the horizontal axes, one panel each.
    title: the figure's title.

  Returns:
    The path written.

  Raises:
    ValueError: if ``runs`` or ``x`` is empty.
  """
  runs = [Run(*run) for run in runs]
  x = tuple(x)
  if not runs:
    raise ValueError("runs is empty; allowed: at least one Run(label, records)")
  if not x:
    raise ValueError("x is empty; allowed: one or more record fields such as ('epoch', 'sim_time')")
  figure = new_figure(figsize=(5.5 * len(x), 4.2), layout="constrained")
  axes = figure.subplots(1, len(x), squeeze=False)[0]
  for panel, x_field in zip(axes, x):
    drawn = 0
    for index, run in enumerate(runs):
      x_values, y_values = curve_points(run.records, x_field, y)
      if x_values.size:
        panel.plot(
          x_values, y_values, label=run.label, marker="." if x_values.size < 30 else None, **_line_style(index)
        )
        drawn += 1
    panel.set_xlabel(AXIS_LABELS.get(x_field, x_field))
    panel.set_ylabel(AXIS_LABELS.get(y, y))
    panel.grid(alpha=0.3)
    if drawn:
      panel.legend(fontsize="small")
    else:
      panel.text(
        0.5, 0.5, f"no records with both {x_field!r} and {y!r}", transform=panel.transAxes, ha="center", va="center"
      )
  if title:
    set_figure_title(figure, title)
  return save_figure(figure, path)


class Band(NamedTuple):
  """One variant's curve over seeds: x values per axis field, the mean, its standard deviation, min and max."""

  label: str
  x: Mapping[str, Sequence[float | None]]
  mean: Sequence[float]
  std: Sequence[float]
  low: Sequence[float]
  high: Sequence[float]


def plot_bands(
  bands: Sequence[Band],
  path: str | os.PathLike[str],
  *,
  y: str = "test_error",
  x: Sequence[str] = ("epoch", "sim_time"),
  title: str | None = None,
) -> epath.Path:
  """Like `plot_curves`, for several seeds per line: the mean, a ± std band, and min/max as dotted edges.

  Args:
    bands: one `Band` per variant; points whose x value is missing are left out.
    path: the image to write; its directory is created.
    y: the field the bands are of (the vertical axis label).
    x: the x fields, one panel each (keys of every band's ``x``).
    title: the figure's title.

  Returns:
    The path written.

  Raises:
    ValueError: if ``bands`` is empty.
  """
  if not bands:
    raise ValueError("bands is empty; allowed: at least one Band")
  x = tuple(x)
  figure = new_figure(figsize=(5.5 * len(x), 4.2), layout="constrained")
  axes = figure.subplots(1, len(x), squeeze=False)[0]
  for panel, x_field in zip(axes, x):
    for index, band in enumerate(bands):
      columns = [
        (float(x_value), mean, std, low, high)
        for x_value, mean, std, low, high in zip(band.x.get(x_field, ()), band.mean, band.std, band.low, band.high)
        if plottable(x_value)
      ]
      if not columns:
        continue
      x_values, mean, std, low, high = (np.array(column, dtype=np.float64) for column in zip(*sorted(columns)))
      style = _line_style(index)
      panel.plot(x_values, mean, label=band.label, marker="." if x_values.size < 30 else None, **style)
      panel.fill_between(x_values, mean - std, mean + std, color=style["color"], alpha=0.2, linewidth=0)
      panel.plot(x_values, low, color=style["color"], linestyle=":", linewidth=0.7)
      panel.plot(x_values, high, color=style["color"], linestyle=":", linewidth=0.7)
    panel.set_xlabel(AXIS_LABELS.get(x_field, x_field))
    panel.set_ylabel(AXIS_LABELS.get(y, y))
    panel.grid(alpha=0.3)
    panel.legend(fontsize="small")
  if title:
    set_figure_title(figure, title)
  return save_figure(figure, path)


def plot_staleness_histograms(
  staleness: Mapping[str, Any], path: str | os.PathLike[str], *, log_scale: bool = True, title: str | None = None
) -> epath.Path:
  """The distribution of staleness σ of one or several runs, one outline per run.

  Probabilities rather than counts, so runs of different lengths compare; a log
  scale by default, because the tail matters (Zhang et al., arXiv 1511.05950,
  report P(σ > 2n) < 1e-4 for n-softsync).

  Args:
    staleness: label -> array of non-negative integer staleness values (any
      shape), e.g. ``schedule.gradient_staleness``.
    path: the image to write; its directory is created.
    log_scale: logarithmic probability axis.
    title: the figure's title.

  Returns:
    The path written.

  Raises:
    ValueError: if there is no run, or a run's array is empty, not integer, or
      negative.
  """
  if not staleness:
    raise ValueError("staleness is empty; allowed: a mapping label -> array of staleness values")
  checked = {label: _check_staleness(label, values) for label, values in staleness.items()}
  figure = new_figure(figsize=(6.5, 4.2), layout="constrained")
  axes = figure.subplots()
  for index, (label, values) in enumerate(checked.items()):
    edges = integer_bins(np.concatenate([values, [0]]))
    counts, _ = np.histogram(values, edges)
    legend = rf"{label} ($\langle\sigma\rangle$ = {values.mean():.2f}, max {values.max()})"
    axes.stairs(counts / values.size, edges, label=legend, linewidth=1.5, **_line_style(index))
  if log_scale:
    axes.set_yscale("log")
  axes.set_xlabel(r"staleness $\sigma$ (server updates)")
  axes.set_ylabel("fraction of gradients")
  axes.grid(alpha=0.3)
  axes.legend(fontsize="small")
  if title:
    axes.set_title(title)
  return save_figure(figure, path)


def _check_staleness(label: str, values: Any) -> np.ndarray:
  values = np.asarray(values).reshape(-1)
  if values.size == 0:
    raise ValueError(f"staleness[{label!r}] is empty; allowed: at least one value")
  if values.dtype.kind not in "iu":
    raise ValueError(f"staleness[{label!r}] has dtype {values.dtype}; allowed: integer values")
  if values.min() < 0:
    raise ValueError(f"staleness[{label!r}] holds {values.min()}; allowed: values >= 0")
  return values.astype(np.int64)


TITLE_CHARACTERS_PER_INCH = 10
"""How many characters of a figure's title fit on a line per inch of its width at matplotlib's default title
size (an 8-inch figure clipped a 122-character line at both edges; 80 fit)."""


def set_figure_title(figure: Figure, title: str) -> None:
  """``figure``'s title, wrapped at whole words to lines that fit its width (`TITLE_CHARACTERS_PER_INCH`)."""
  figure.suptitle(textwrap.fill(title, int(figure.get_figwidth() * TITLE_CHARACTERS_PER_INCH)))


def save_figure(figure: Figure, path: str | os.PathLike[str]) -> epath.Path:
  """Writes ``figure`` as a PNG at ``path``, local or a URL (creating its directory), and returns the path."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  image = io.BytesIO()
  figure.savefig(image, format="png", dpi=120)
  write_whole(path, image.getvalue())
  return path
