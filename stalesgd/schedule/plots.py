"""Plots of staleness distributions and protocol runtimes (matplotlib, no pyplot).

Figures are built with `matplotlib.figure.Figure` and saved through the Agg
canvas, so these functions touch no global pyplot state and work headless,
from scripts, tests and training loops alike.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def _save(figure: Figure, path: str | os.PathLike[str]) -> None:
  directory = os.path.dirname(os.fspath(path))
  if directory:
    os.makedirs(directory, exist_ok=True)
  FigureCanvasAgg(figure)
  figure.savefig(path, dpi=120)


def plot_staleness_histograms(
    staleness: Mapping[str, np.ndarray],
    path: str | os.PathLike[str],
    *,
    title: str = "Staleness of applied gradients",
    log_scale: bool = True,
) -> None:
  """Writes one histogram panel per run: P(sigma) with <sigma> marked.

  Args:
    staleness: run label -> int array of every applied gradient's sigma (e.g.
      ``Schedule.gradient_staleness``).
    path: where to write the image (format from the extension, e.g. .png).
    title: figure title.
    log_scale: logarithmic probability axis, which shows the tail
      (Zhang et al., arXiv 1511.05950, Fig. 1, discuss P(sigma > 2n)).
  """
  if not staleness:
    raise ValueError("staleness must map at least one run label to its staleness values; got an empty mapping")
  columns = min(3, len(staleness))
  rows = math.ceil(len(staleness) / columns)
  figure = Figure(figsize=(4.2 * columns, 3.2 * rows), layout="constrained")
  axes = figure.subplots(rows, columns, squeeze=False).reshape(-1)
  for axis, (label, values) in zip(axes, staleness.items()):
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    probabilities = np.bincount(values) / max(values.size, 1) if values.size else np.zeros(1)
    axis.bar(np.arange(probabilities.size), probabilities, width=1.0, color="tab:blue")
    if values.size:
      axis.axvline(values.mean(), color="tab:red", linestyle="--", label=f"<σ> = {values.mean():.2f}")
      axis.legend(loc="upper right", fontsize="small")
    axis.set_title(label)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("staleness σ")
    axis.set_ylabel("P(σ)")
    if log_scale:
      axis.set_yscale("log")
  for axis in axes[len(staleness):]:
    axis.set_visible(False)
  figure.suptitle(title)
  _save(figure, path)


def plot_protocol_comparison(
    values: Mapping[str, Mapping[str, float]],
    path: str | os.PathLike[str],
    *,
    ylabel: str,
    title: str = "Protocols",
) -> None:
  """Writes grouped bars: one group per protocol, one bar per condition.

  Args:
    values: condition (e.g. ``"no stragglers"``) -> protocol -> value (e.g.
      the speedup over one learner). Protocols missing in a condition are left
      out of that condition's bars.
    path: where to write the image.
    ylabel: label of the value axis.
    title: figure title.
  """
  if not values:
    raise ValueError("values must map at least one condition to protocol values; got an empty mapping")
  protocols = list(dict.fromkeys(name for by_protocol in values.values() for name in by_protocol))
  width = 0.8 / len(values)
  figure = Figure(figsize=(max(6.0, 1.2 * len(protocols)), 4.0), layout="constrained")
  axis = figure.subplots()
  positions = np.arange(len(protocols))
  for index, (condition, by_protocol) in enumerate(values.items()):
    heights = [by_protocol.get(name, np.nan) for name in protocols]
    axis.bar(positions + (index - (len(values) - 1) / 2) * width, heights, width=width, label=condition)
  axis.set_xticks(positions, protocols, rotation=20, ha="right")
  axis.set_ylabel(ylabel)
  axis.set_title(title)
  axis.legend()
  _save(figure, path)
