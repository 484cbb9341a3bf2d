"""experiments/compression_gap.py on run directories written by hand: per-seed gaps by both statistics at both
lengths, the time to each run's final error, and unfinished runs left out."""

import json

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from experiments import compression_gap


def _run(root, study, variant, seed, errors, *, finished=True, step_time=2.0):
  """A kept run: evaluations of ``errors`` every ``step_time`` simulated seconds, and its summary if finished."""
  run = root / study / "runs" / variant / f"seed_{seed}"
  run.mkdir(parents=True)
  lines = []
  for index, error in enumerate(errors, start=1):
    lines.append(json.dumps({"step": index, "train_loss": 1.0, "sim_time": index * step_time}))  # a log record
    lines.append(json.dumps({"step": index, "sim_time": index * step_time, "test_error": error}))
  (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  if finished:
    (run / "summary.json").write_text(json.dumps({"preempted": False}))
  return run


@pytest.fixture
def studies(tmp_path):
  # Compressed: reference ends 10, 8, 6 (last 3 mean 8, last 6); variant ends 12, 11, 10 (mean 11, last 10).
  _run(tmp_path, "short", "ref", 0, [20, 10, 8, 6])
  _run(tmp_path, "short", "var", 0, [30, 12, 11, 10])
  # Full: reference 9, 7, 5 (mean 7, last 5); variant 9, 8, 4 (mean 7, last 4): the gap closes.
  _run(tmp_path, "long", "ref", 0, [40, 30, 9, 7, 5])
  _run(tmp_path, "long", "var", 0, [40, 20, 9, 8, 4])
  # Seed 1 ran compressed only; its full-length variant has not finished.
  _run(tmp_path, "short", "ref", 1, [9, 9, 9])
  _run(tmp_path, "short", "var", 1, [10, 10, 10])
  _run(tmp_path, "long", "ref", 1, [9, 9, 9])
  _run(tmp_path, "long", "var", 1, [10, 10, 10], finished=False)
  return tmp_path / "short", tmp_path / "long"


def test_the_gaps_per_seed_by_both_statistics_at_both_lengths(studies):
  short, long = studies
  rows = compression_gap.gap_rows(short, long, "ref", ["var"])
  assert rows[0] == {
    "variant": "var",
    "seed": 0,
    "compressed_last3": pytest.approx(11 - 8),
    "full_last3": pytest.approx(7 - 7),
    "compressed_last": pytest.approx(10 - 6),
    "full_last": pytest.approx(4 - 5),
  }
  assert rows[1]["seed"] == 1 and rows[1]["compressed_last3"] == pytest.approx(1)
  assert rows[1]["full_last3"] is None and rows[1]["full_last"] is None  # the unfinished run counts for nothing


def test_the_time_to_a_runs_final_error_is_its_first_evaluation_within_the_tolerance(studies):
  _, long = studies
  rows = {row["variant"]: row for row in compression_gap.time_rows(long, ["ref", "var"], 1.0) if row["seed"] == 0}
  # ref: final 7, first evaluation <= 8 is the 4th (7), at 8 s; var: final 7, first <= 8 is the 4th (8), at 8 s.
  assert rows["ref"]["final"] == pytest.approx(7) and rows["ref"]["time_to_final"] == 8.0
  assert rows["var"]["time_to_final"] == 8.0 and rows["var"]["total_time"] == 10.0
  # With no tolerance, ref reaches 7 at its 4th evaluation; var first reaches 7 at its 5th (4), at 10 s.
  exact = {row["variant"]: row for row in compression_gap.time_rows(long, ["ref", "var"], 0.0) if row["seed"] == 0}
  assert exact["ref"]["time_to_final"] == 8.0 and exact["var"]["time_to_final"] == 10.0


def test_the_program_writes_both_tables_and_refuses_a_directory_without_runs(studies, tmp_path, capsys):
  short, long = studies
  out = tmp_path / "gaps.md"
  args = [f"--compressed={short}", f"--full={long}", "--reference=ref", "--variants", "var"]
  assert compression_gap.main([*args, f"--out={out}"]) == 0
  text = out.read_text()
  assert "| var | 0 | +3.00 | +0.00 | +4.00 | -1.00 |" in text
  assert "| var | 1 | +1.00 | — | +1.00 | — |" in text
  assert "| ref | 0 | 7.00 | 8.0 | 10.0 |" in text
  with pytest.raises(SystemExit):
    compression_gap.main(
      [f"--compressed={tmp_path / 'nothing'}", f"--full={long}", "--reference=ref", "--variants", "var"]
    )
  assert "keeps no runs/" in capsys.readouterr().err


def test_each_length_and_statistic_gets_the_paired_interval_over_its_finished_seeds(studies, tmp_path):
  short, long = studies
  (row,) = compression_gap.interval_rows(compression_gap.gap_rows(short, long, "ref", ["var"]))
  # Compressed, last 3: gaps 3 (seed 0) and 1 (seed 1): mean 2, s_d = sqrt(2), t_{0.975, 1} = 12.7062,
  # half-width 12.7062 * sqrt(2) / sqrt(2) = 12.7062.
  assert row["compressed_last3"].mean == pytest.approx(2.0)
  assert row["compressed_last3"].low == pytest.approx(2.0 - 12.7062, abs=1e-4)
  assert row["compressed_last3"].high == pytest.approx(2.0 + 12.7062, abs=1e-4)
  assert row["compressed_last3"].count == 2
  # Compressed, last alone: gaps 4 and 1: mean 2.5, s_d = 3 / sqrt(2), half-width 12.7062 * 1.5 = 19.0593.
  assert row["compressed_last"].low == pytest.approx(2.5 - 19.0593, abs=1e-4)
  # At full length only seed 0 has both runs finished: one seed gives no interval.
  assert row["full_last3"] is None and row["full_last"] is None
  # A variant whose full-length runs have not started has no seed at that length at all.
  _run(tmp_path, "short", "later", 0, [12, 12, 12])
  _run(tmp_path, "short", "later", 1, [10, 10, 10])
  (_, later) = compression_gap.interval_rows(compression_gap.gap_rows(short, long, "ref", ["var", "later"]))
  assert later["compressed_last3"].mean == pytest.approx((4 + 1) / 2) and later["full_last3"] is None
  out = tmp_path / "gaps.md"
  args = [f"--compressed={short}", f"--full={long}", "--reference=ref", "--variants", "var", f"--out={out}"]
  assert compression_gap.main(args) == 0
  assert "| var | +2.00 [-10.71, +14.71] (2) | — | +2.50 [-16.56, +21.56] (2) | — |" in out.read_text()


def _full_length_gaps(variant: str, gaps: tuple[float, ...]) -> list[dict]:
  """`gap_rows`' rows for ``variant`` with only the full-length gap (mean of the last 3) known, seeds 0, 1, ..."""
  return [
    {"variant": variant, "seed": seed, **dict.fromkeys(compression_gap.GAP_COLUMNS), "full_last3": gap}
    for seed, gap in enumerate(gaps)
  ]


def test_the_figure_is_drawn_with_a_lone_dot_for_a_seed_missing_at_one_length(studies, tmp_path):
  short, long = studies
  figure = tmp_path / "figures" / "gaps.png"
  args = [f"--compressed={short}", f"--full={long}", "--reference=ref", "--variants", "var"]
  assert compression_gap.main([*args, f"--out={tmp_path / 'gaps.md'}", f"--figure={figure}", "--margin=2"]) == 0
  assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  (panel,) = compression_gap.gap_figure(compression_gap.gap_rows(short, long, "ref", ["var"]), "ref", margin=2).axes
  seeds = {line.get_label(): line.get_ydata().tolist() for line in panel.lines if line.get_label().startswith("seed")}
  assert seeds == {"seed 0": [3.0, 0.0], "seed 1": [1.0]}  # seed 1's full-length run has not finished
  # The compressed length has 2 seeds, so an interval bar; the full length has 1, so none.
  assert [container.lines[0].get_xdata().tolist() for container in panel.containers] == [[0.15]]
  # Only the full length has 2 seeds: its bar carries the panel's one interval legend entry.
  gaps = _full_length_gaps("var", (1.0, 2.0))
  gaps[0]["compressed_last3"] = 3.0
  (full_only,) = compression_gap.gap_figure(gaps, "ref", margin=2).axes
  assert [container.lines[0].get_xdata().tolist() for container in full_only.containers] == [[1.15]]
  legend = [text.get_text() for text in full_only.get_legend().get_texts()]
  assert legend == ["margin ±2", "seed 0", "seed 1", "paired 95 % interval"], legend
  (empty,) = compression_gap.gap_figure([], "ref").axes  # nothing finished yet: one panel that says so
  assert [text.get_text() for text in empty.texts] == ["no finished pair of runs yet"]
  with pytest.raises(SystemExit):
    compression_gap.main([*args, f"--figure={figure}", "--margin=0"])


def test_the_figures_axis_label_fits_inside_one_panel_with_a_long_reference_name():
  """The study's references are slugs such as `baseline_lambda_1_mu_128`: the y label names it and must not run
  past the edge of a one-variant figure (3.8 inches tall)."""
  gaps = _full_length_gaps("1_softsync_mu_lambda_120_mu_4", (0.3, 0.5))
  figure = compression_gap.gap_figure(gaps, "baseline_lambda_1_mu_128", margin=2)
  canvas = FigureCanvasAgg(figure)  # the canvas savefig draws on, with its layout
  canvas.draw()
  (panel,) = figure.axes
  label = panel.yaxis.label
  assert "baseline_lambda_1_mu_128" in label.get_text()
  extent = label.get_window_extent(canvas.get_renderer())
  inside = figure.bbox
  assert inside.y0 <= extent.y0 and extent.y1 <= inside.y1 and inside.x0 <= extent.x0, (extent, inside)
