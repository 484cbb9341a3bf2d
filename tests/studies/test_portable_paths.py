"""A study's report names no absolute path of the machine that ran it (`stalesgd.studies._portable_paths`).

``runs.csv`` records each run's directory relative to the study's (``<slug>/seed_<s>``) and its command likewise,
the README's command names the data directory ``$DATA_DIR`` and an absolute ``--workdir`` as ``.``, and
``experiments/relative_result_paths.py`` rewrites a report written before these rules the same way, once. A claim
whose arm never ran reads "not run", not "Gap none".
"""

from __future__ import annotations

import csv
import json
import pathlib

from experiments import relative_result_paths as script
from stalesgd.studies import Claim, Study, Variant
from stalesgd.studies import _portable_paths as portable
from stalesgd.studies._report import decisions_markdown, write_report


def _read_csv(path: pathlib.Path) -> list[dict[str, str]]:
  with open(path, newline="", encoding="utf-8") as file:
    return list(csv.DictReader(file))


def test_data_directories_become_a_placeholder_and_other_paths_relative_to_the_study():
  study = "/work/pinned/kale_digits"
  command = (
    "CIFAR10_NPZ=/tmp/cifar10_npz stalesgd-reproduce --study=s --data_dir=/work/data/mnist "
    f"--config.data_dir=/tmp/x --pilot_dir=/work/pinned/kale_pilot --workdir={study}"
  )
  assert portable.portable_text(command, study) == (
    "CIFAR10_NPZ=$DATA_DIR stalesgd-reproduce --study=s --data_dir=$DATA_DIR "
    "--config.data_dir=$DATA_DIR --pilot_dir=../kale_pilot --workdir=."
  )
  # A run's directory anywhere in the text; prose and relative paths are left alone; a second pass changes nothing.
  text = f"| {study}/diloco/seed_0 | alpha0/sigma, 120/140 | --workdir=runs/demo | (docs/studies.md)."
  once = portable.portable_text(text, study)
  assert once == "| diloco/seed_0 | alpha0/sigma, 120/140 | --workdir=runs/demo | (docs/studies.md)."
  assert portable.portable_text(once, study) == once
  # Without the study's directory, only data directories can be placed.
  assert portable.portable_text(command, None).startswith("CIFAR10_NPZ=$DATA_DIR stalesgd-reproduce")
  assert portable.absolute_paths("see /tmp/x.json, and a/b or x / y or /_A}") == ["/tmp/x.json"]


def test_a_runs_csv_row_is_written_relative_and_the_row_read_keeps_its_path(tmp_path):
  row = {
    "workdir": str(tmp_path / "hardsync" / "seed_1"),
    "command": f"python -m stalesgd.cli.train --config.data_dir=/tmp/d --workdir={tmp_path}/hardsync/seed_1",
  }
  written = portable.portable_row(row, tmp_path)
  assert written == {
    "workdir": "hardsync/seed_1",
    "command": "python -m stalesgd.cli.train --config.data_dir=$DATA_DIR --workdir=hardsync/seed_1",
  }
  assert row["workdir"] == str(tmp_path / "hardsync" / "seed_1")
  # A study run with a relative --workdir (runs/demo) writes the same relative directories.
  relative = {"workdir": "runs/demo/hardsync/seed_0", "command": "train --workdir=runs/demo/hardsync/seed_0"}
  assert portable.portable_row(relative, "runs/demo") == {
    "workdir": "hardsync/seed_0",
    "command": "train --workdir=hardsync/seed_0",
  }


def _study() -> Study:
  return Study(
    "toy",
    "Toy",
    "demo: b matches a",
    (Variant("a", "demo", "hardsync"), Variant("b", "demo", "async_dc"), Variant("c", "demo", "softsync_fixed")),
    paper_data=False,
    has_quick=False,
    last_evaluations=1,
    claims=(Claim("b matches a", "b", "a", "matches", 5.0), Claim("c matches a", "c", "a", "matches", 5.0)),
  )


def test_the_report_writes_no_absolute_path_and_says_not_run(tmp_path):
  rows = []
  for slug, error in (("a", 10.0), ("b", 12.0)):
    directory = tmp_path / slug / "seed_0"
    directory.mkdir(parents=True)
    record = {"step": 10, "epoch": 1.0, "sim_time": 1.0, "train_loss": 1.0, "test_error": error}
    (directory / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    rows.append(
      {
        "variant": slug,
        "slug": slug,
        "seed": 0,
        "n": None,
        "workdir": str(directory),
        "status": "ok",
        "wall_time": 3.0,
        "command": f"python -m stalesgd.cli.train --config.data_dir=/tmp/mnist --workdir={directory}",
      }
    )
  command = f"stalesgd-reproduce --study=toy --data_dir=/tmp/mnist --workdir={tmp_path}"
  write_report(_study(), rows, tmp_path, command=command)
  written = _read_csv(tmp_path / "runs.csv")
  assert [row["workdir"] for row in written] == ["a/seed_0", "b/seed_0"]
  assert written[0]["command"] == "python -m stalesgd.cli.train --config.data_dir=$DATA_DIR --workdir=a/seed_0"
  readme = (tmp_path / "README.md").read_text()
  assert "stalesgd-reproduce --study=toy --data_dir=$DATA_DIR --workdir=.\n" in readme
  for name in ("runs.csv", "README.md", "results.csv", "decisions.md", "decisions.json"):
    assert str(tmp_path) not in (tmp_path / name).read_text(), name
  assert rows[0]["workdir"] == str(tmp_path / "a" / "seed_0")  # the rows the sweep returns keep their paths
  # c never ran: its claim is "not run", with no gap; b's is decided as before.
  decided = {entry["claim"]: entry for entry in json.loads((tmp_path / "decisions.json").read_text())}
  assert decided["c matches a"]["decision"] == "not run" and decided["c matches a"]["not_run"] == ["c"]
  assert "**c matches a**: not run. No run of `c` in this grid. Rule:" in readme
  assert "Gap none" not in readme and "Gap +2.00 (1 seed: no interval)" in readme


def test_no_paired_runs_where_both_arms_ran_says_so_without_a_gap():
  entry = {
    "claim": "b fails",
    "rule": "r",
    "decision": "not decided (no paired runs)",
    "diverged_left_out": ["b seed 0 (diverged at update 3)"],
  }
  assert decisions_markdown([entry]) == (
    "- **b fails**: not decided (no paired runs). No seed has a value of both arms. Rule: r. Left out, diverged "
    "(a diverged run is no error rate): b seed 0 (diverged at update 3).\n"
  )


def test_the_script_rewrites_an_older_report_once_and_leaves_run_records(tmp_path, capsys):
  machine = "/work/pinned/zhang_e20"
  kept = tmp_path / "zhang_cifar10_e20_3seeds"
  (kept / "runs" / "hardsync" / "seed_0").mkdir(parents=True)
  record = kept / "runs" / "hardsync" / "seed_0" / "config.json"
  record.write_text(json.dumps({"data_dir": "/tmp/cifar10_npz"}))
  (kept / "README.md").write_text(
    "## Command\n\n```\nstalesgd-reproduce --study=zhang_cifar10 --data_dir=/tmp/cifar10_npz "
    f"--workdir={machine}\n```\n\n## Notes\n\n- `CIFAR10_NPZ=/tmp/cifar10_npz experiments/run_pinned.sh x y`; "
    "the copy in /home/someone/data.\n"
  )
  with open(kept / "runs.csv", "w", newline="", encoding="utf-8") as file:
    writer = csv.writer(file, lineterminator="\n")
    writer.writerow(["variant", "workdir", "command", "wall_time"])
    writer.writerow(
      ["hardsync", f"{machine}/hardsync/seed_0", f"train --lr='(1,2)' --workdir={machine}/hardsync/seed_0", 1]
    )
  (kept / "progress").mkdir()
  (kept / "progress" / "progress.md").write_text(f"Beside each run, the run in {machine}/hardsync/seed_0.\n")

  assert script.main([str(kept), "--check"]) == 1
  assert script.main([str(kept)]) == 0
  rows = _read_csv(kept / "runs.csv")
  assert rows == [
    {
      "variant": "hardsync",
      "workdir": "hardsync/seed_0",
      "command": "train --lr='(1,2)' --workdir=hardsync/seed_0",
      "wall_time": "1",
    }
  ]
  readme = (kept / "README.md").read_text()
  assert "--data_dir=$DATA_DIR --workdir=.\n" in readme and "`CIFAR10_NPZ=$DATA_DIR experiments/run_pinned.sh" in readme
  assert (kept / "progress" / "progress.md").read_text() == "Beside each run, the run in hardsync/seed_0.\n"
  assert json.loads(record.read_text()) == {"data_dir": "/tmp/cifar10_npz"}  # a run's own record is left as written
  # What it cannot place (prose) it names, to be edited by hand; a second pass changes nothing.
  assert "/home/someone/data." not in capsys.readouterr().err  # the sentence's full stop is not part of the path
  before = {path: path.read_text() for path in kept.rglob("*") if path.is_file()}
  assert script.main([str(kept)]) == 0
  assert {path: path.read_text() for path in kept.rglob("*") if path.is_file()} == before
  assert "absolute path left (edit by hand): " in capsys.readouterr().err
  assert script.main([str(kept), "--check"]) == 1  # the prose path is still there
