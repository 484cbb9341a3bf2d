"""The progress report of an unfinished grid (`stalesgd.studies._progress`, ``stalesgd-reproduce --progress``).

Run directories are written by hand here (metrics, summaries), so every number below is computed from them:
which runs count, which claims may be decided, and where an earlier, shorter grid's curve lands when stretched.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

from matplotlib.backends.backend_agg import FigureCanvasAgg

from stalesgd.studies import STUDIES
from stalesgd.studies import _progress as progress_module
from stalesgd.studies._progress import write_progress
from stalesgd.studies._tasks import plan_tasks

DEMO = STUDIES["demo"]  # 10 epochs; claims: 8_softsync_a0 worse than hardsync by > 30, a0/sigma matches (±3)


def _write_run(
  directory: pathlib.Path, errors: list[float], *, finished: bool, epochs: list[float] | None = None
) -> None:
  """Evaluations after epochs 1, 2, ... (or at ``epochs``), and a summary if ``finished``."""
  directory.mkdir(parents=True)
  epochs = epochs or [float(index + 1) for index in range(len(errors))]
  records = [{"step": 10 * (index + 1), "epoch": epochs[index], "test_error": e} for index, e in enumerate(errors)]
  (directory / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
  if finished:
    (directory / "summary.json").write_text(json.dumps({"preempted": False, "test_error": errors[-1]}))


def _write_earlier_report(
  directory: pathlib.Path, ran: float = 5.0, points: tuple[tuple[float, float], ...] = ((2.0, 40.0), (4.0, 20.0))
) -> None:
  """A 5-epoch grid's report of hardsync seed 0, ``ran`` epochs run and (epoch, test error) ``points``: by default
  40 % after epoch 2 and 20 % after epoch 4."""
  directory.mkdir()
  with open(directory / "runs.csv", "w", newline="") as file:
    csv.writer(file).writerows([["variant", "seed", "epochs"], ["hardsync", 0, ran]])
  with open(directory / "evaluations.csv", "w", newline="") as file:
    csv.writer(file).writerows([["variant", "seed", "epoch", "test_error"], *(["hardsync", 0, *p] for p in points)])


def test_only_finished_runs_count_and_a_claim_waits_for_all_its_runs(tmp_path):
  tasks = plan_tasks(DEMO, tmp_path, seeds=2, variants=["hardsync", "8_softsync_a0", "8_softsync_a0_sigma"])
  run = {(task.variant.slug, task.seed): task.directory for task in tasks}
  _write_run(run["hardsync", 0], [9.0, 3.0, 2.0, 1.0], finished=True)
  _write_run(run["hardsync", 1], [8.0, 4.0, 2.0, 3.0], finished=True)
  _write_run(run["8_softsync_a0", 0], [90.0, 91.0, 89.0, 90.0], finished=True)
  _write_run(run["8_softsync_a0", 1], [88.0, 90.0, 92.0, 91.0], finished=True)
  _write_run(run["8_softsync_a0_sigma", 0], [9.0, 8.0], finished=False)  # seed 1 not started

  text = write_progress(DEMO, tasks, tmp_path)

  assert text.startswith("# demo: UNFINISHED, 4 of 6 runs finished (")
  rows = {line.split("|")[1].strip() + "/" + line.split("|")[2].strip(): line for line in text.splitlines()[6:12]}
  assert "unfinished: epoch 2 of 10" in rows["8-softsync, a0/sigma/0"] and "| 8.00 " in rows["8-softsync, a0/sigma/0"]
  assert "not started" in rows["8-softsync, a0/sigma/1"]
  assert "finished" in rows["hardsync/1"] and "| 3.00 " in rows["hardsync/1"]
  # The rule's statistic (the demo's: the mean of the last 3 evaluations), of the finished runs only.
  header = [cell.strip() for cell in text.splitlines()[4].strip("|").split("|")]
  final = header.index("final: mean of the last 3 (%)")
  cell = lambda key: rows[key].strip("|").split("|")[final].strip()
  assert (cell("hardsync/0"), cell("hardsync/1"), cell("8-softsync, a0/1")) == ("2.00", "3.00", "91.00")
  assert cell("8-softsync, a0/sigma/0") == "" and cell("8-softsync, a0/sigma/1") == ""
  # The fixed-rate claim: both arms finished. Gaps of the mean of the last 3: seed 0 90 - 2 = 88, seed 1 91 - 3 = 88.
  fixed = next(line for line in text.splitlines() if line.startswith("- **8-softsync"))
  assert ": holds. Gap +88.00" in fixed
  assert "not decided yet: 2 of its 4 runs have not finished." in text
  # Written by hand: the 4 finished runs' summaries record no commit; the running one has recorded nothing yet.
  assert "Of the 4 runs that have recorded how they began: exploratory: the rule was fixed after runs began (" in text
  progress = json.loads((tmp_path / "progress" / "progress.json").read_text())
  assert (progress["finished"], progress["runs"]) == (4, 6)
  assert (tmp_path / "progress" / "progress.png").read_bytes().startswith(b"\x89PNG")


def test_an_earlier_shorter_grid_is_stretched_to_this_schedule(tmp_path):
  tasks = plan_tasks(DEMO, tmp_path / "grid", seeds=1, variants=["hardsync"])
  _write_run(tasks[0].directory, [50.0, 45.0, 40.0, 35.0, 30.0, 25.0], finished=False)  # at epoch 6 of 10
  _write_earlier_report(tmp_path / "earlier")

  text = write_progress(DEMO, tasks, tmp_path / "grid", compare_with=tmp_path / "earlier")

  # Epochs x 10/5: the earlier points land at epochs 4 (40 %) and 8 (20 %); epoch 6 is halfway: 30 %.
  assert "| unfinished: epoch 6 of 10 | 25.00                 | 30.00 " in text
  with open(tmp_path / "grid" / "progress" / "progress.csv", newline="") as file:
    earlier = [row for row in csv.DictReader(file) if row["grid"] == "earlier"]
  assert [(float(row["epoch"]), float(row["test_error"])) for row in earlier] == [(4.0, 40.0), (8.0, 20.0)]


def test_a_finished_run_past_its_nominal_epochs_meets_the_earlier_grids_end(tmp_path):
  tasks = plan_tasks(DEMO, tmp_path / "grid", seeds=1, variants=["hardsync"])
  # Its last update carried it to epoch 10.02 of 10; the earlier grid's to 5.01 of 5 (ends at 20 %, 15 % before).
  _write_run(tasks[0].directory, [30.0, 12.0], finished=True, epochs=[5.0, 10.02])
  _write_earlier_report(tmp_path / "earlier", ran=5.01, points=((2.505, 15.0), (5.01, 20.0)))

  text = write_progress(DEMO, tasks, tmp_path / "grid", compare_with=tmp_path / "earlier")

  # End on end: x 10.02/5.01 = 2 puts the earlier points at 5.01 and 10.02; at 10.02 the earlier grid's last, 20 %.
  assert "| finished | 12.00                 | 20.00 " in text
  with open(tmp_path / "grid" / "progress" / "progress.csv", newline="") as file:
    earlier = [row for row in csv.DictReader(file) if row["grid"] == "earlier"]
  assert [(float(row["epoch"]), float(row["test_error"])) for row in earlier] == [(5.01, 15.0), (10.02, 20.0)]


def test_the_command_writes_it_and_refuses_compare_with_alone(tmp_path):
  command = [sys.executable, "-m", "stalesgd.cli.reproduce", "--study=demo", f"--workdir={tmp_path}"]
  environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
  written = subprocess.run([*command, "--progress"], capture_output=True, text=True, env=environment, timeout=300)
  assert written.returncode == 0, written.stderr[-2000:]
  assert written.stdout.startswith("# demo: UNFINISHED, 0 of 4 runs finished (")
  assert (tmp_path / "progress" / "progress.md").exists()
  refused = subprocess.run(
    [*command, f"--compare_with={tmp_path}"], capture_output=True, text=True, env=environment, timeout=300
  )
  assert refused.returncode == 1 and "--compare_with" in refused.stderr and "only with --progress" in refused.stderr


def test_a_long_title_is_wrapped_inside_the_figure(tmp_path, monkeypatch):
  # The 140-epoch grid's title ("...: UNFINISHED, 6 of 15 runs", 122 characters) ran off both edges of the plot.
  long = dataclasses.replace(
    DEMO, title="Zhang et al. and Rudra's mu x lambda rule at 140 epochs: lambda=30, mu=4 vs the single learner"
  )
  tasks = plan_tasks(long, tmp_path, seeds=1, variants=["hardsync"])
  _write_run(tasks[0].directory, [9.0, 3.0], finished=False)
  drawn = []
  monkeypatch.setattr(progress_module.plots, "save_figure", lambda figure, path: drawn.append(figure))
  write_progress(long, tasks, tmp_path)
  (figure,) = drawn
  canvas = FigureCanvasAgg(figure)
  canvas.draw()  # constrained layout places the title
  renderer = canvas.get_renderer()
  title = figure.get_suptitle()
  extent = figure._suptitle.get_window_extent(renderer)
  assert title.replace("\n", " ") == f"{long.title}: UNFINISHED, 0 of 1 runs"
  assert extent.x0 >= 0 and extent.x1 <= figure.bbox.width, (extent, figure.bbox.width)


def test_a_claim_with_one_run_left_says_so_in_the_singular(tmp_path):
  tasks = plan_tasks(DEMO, tmp_path, variants=["hardsync", "8_softsync_a0_sigma"], seeds=1)
  runs = [
    progress_module.RunProgress(tasks[0], progress_module.FINISHED, [{"epoch": 10.0, "test_error": 2.0}] * 3),
    progress_module.RunProgress(tasks[1], "unfinished", [{"epoch": 1.0, "test_error": 50.0}]),
  ]
  lines = progress_module.claim_lines(DEMO, runs)
  assert any(line.endswith("not decided yet: 1 of its 2 runs has not finished.") for line in lines), lines
