"""Tests for stalesgd.reports._plots: figures from metric records with gaps, staleness histograms."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib import image
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from stalesgd.reports._plots import (
  Run,
  curve_points,
  plot_curves,
  plot_staleness_histograms,
  set_figure_title,
)


def _records(final_error: float, evaluate_every: int = 4, with_sim_time: bool = True) -> list[dict]:
  """Records like the trainer's: training fields every update, test fields every few updates."""
  records = []
  for step in range(1, 41):
    record = {"step": step, "epoch": step / 10, "train_loss": 2.0 / step}
    if with_sim_time:
      record["sim_time"] = 0.25 * step
    if step % evaluate_every == 0:
      record["test_error"] = final_error + 50.0 / step
    records.append(record)
  return records


def _assert_is_a_drawn_png(path):
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  pixels = image.imread(path)
  assert pixels.shape[0] > 100 and pixels.shape[1] > 100
  assert np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0).shape[0] > 10  # Not a blank canvas.
  return pixels


def test_curve_points_use_only_records_with_both_fields_sorted_by_x():
  records = [
    {"epoch": 2.0, "test_error": 10.0},
    {"epoch": 1.0},
    {"epoch": 0.5, "test_error": 30.0},
    {"test_error": 5.0},
    {"epoch": 3.0, "test_error": float("nan")},
    {"epoch": 4.0, "test_error": None},
  ]
  x_values, y_values = curve_points(records, "epoch", "test_error")
  np.testing.assert_array_equal(x_values, [0.5, 2.0])
  np.testing.assert_array_equal(y_values, [30.0, 10.0])
  x_values, _ = curve_points(records, "sim_time", "test_error")
  assert x_values.shape == (0,)


@pytest.mark.slow
def test_plot_curves_draws_each_run_and_tolerates_missing_fields(tmp_path):
  runs = [
    Run("hardsync", _records(18.0)),
    Run("8-softsync, fixed α0", _records(30.0, evaluate_every=5)),
    ("async without sim_time", _records(25.0, with_sim_time=False)),
  ]
  path = plot_curves(runs, tmp_path / "figures" / "test_error.png", title="demo")
  pixels = _assert_is_a_drawn_png(path)
  assert pixels.shape[1] > pixels.shape[0]  # Two panels side by side.
  other = plot_curves([Run("hardsync", _records(5.0))], tmp_path / "other.png", title="demo")
  assert _assert_is_a_drawn_png(other).shape == pixels.shape
  assert not np.array_equal(image.imread(other), pixels)


@pytest.mark.slow
def test_plot_curves_with_no_matching_records_still_writes_a_figure(tmp_path):
  path = plot_curves(
    [Run("no evaluations yet", [{"step": 1, "epoch": 0.1}])], tmp_path / "empty.png", y="test_error", x=("epoch",)
  )
  _assert_is_a_drawn_png(path)


def test_plot_curves_rejects_empty_inputs(tmp_path):
  with pytest.raises(ValueError, match="runs is empty"):
    plot_curves([], tmp_path / "x.png")
  with pytest.raises(ValueError, match="x is empty"):
    plot_curves([Run("a", [])], tmp_path / "x.png", x=())


@pytest.mark.slow
def test_staleness_histograms(tmp_path):
  generator = np.random.default_rng(0)
  staleness = {
    "hardsync": np.zeros(1000, dtype=np.int64),
    "8-softsync": generator.poisson(8, size=(100, 30)),
    "async": generator.geometric(1 / 30, size=3000).astype(np.int32) - 1,
  }
  _assert_is_a_drawn_png(plot_staleness_histograms(staleness, tmp_path / "staleness.png", title="λ = 30"))
  _assert_is_a_drawn_png(plot_staleness_histograms({"one": [3]}, tmp_path / "linear.png", log_scale=False))


@pytest.mark.parametrize(
  "staleness, message",
  [
    ({}, "staleness is empty"),
    ({"a": []}, r"staleness\['a'\] is empty"),
    ({"a": [0.5, 1.0]}, r"staleness\['a'\] has dtype float64; allowed: integer"),
    ({"a": [2, -1]}, r"staleness\['a'\] holds -1"),
  ],
)
def test_staleness_histograms_reject_bad_input(tmp_path, staleness, message):
  with pytest.raises(ValueError, match=message):
    plot_staleness_histograms(staleness, tmp_path / "bad.png")


@pytest.mark.parametrize("width", [5.5, 8.0, 11.0])
def test_a_long_title_is_wrapped_to_the_figures_width(width):
  figure = Figure(figsize=(width, 4.2), layout="constrained")
  figure.subplots()
  title = "Zhang et al. and Rudra's mu x lambda rule at 140 epochs: lambda=30, mu=4 vs the single learner " * 2
  set_figure_title(figure, title.strip())
  canvas = FigureCanvasAgg(figure)
  canvas.draw()
  extent = figure._suptitle.get_window_extent(canvas.get_renderer())
  assert figure.get_suptitle().replace("\n", " ") == title.strip()  # wrapped at spaces, nothing lost
  assert extent.x0 >= 0 and extent.x1 <= figure.bbox.width, (extent, figure.bbox.width)
