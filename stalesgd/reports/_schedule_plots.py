"""A plot of protocol runtimes (matplotlib, no pyplot).

Staleness histograms are `stalesgd.reports._plots.plot_staleness_histograms`. The
figure is built with `matplotlib.figure.Figure` and saved through the Agg
canvas, so it touches no global pyplot state and works headless, from scripts,
tests and training loops alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from stalesgd.reports._plots import new_figure, save_figure


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
  figure = new_figure(figsize=(max(6.0, 1.2 * len(protocols)), 4.0), layout="constrained")
  axis = figure.subplots()
  positions = np.arange(len(protocols))
  for index, (condition, by_protocol) in enumerate(values.items()):
    heights = [by_protocol.get(name, np.nan) for name in protocols]
    axis.bar(positions + (index - (len(values) - 1) / 2) * width, heights, width=width, label=condition)
  axis.set_xticks(positions, protocols, rotation=20, ha="right")
  axis.set_ylabel(ylabel)
  axis.set_title(title)
  axis.legend()
  save_figure(figure, path)
