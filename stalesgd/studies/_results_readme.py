"""A study directory's ``README.md``: what was run, on what, how long, what it gave and decided.

Written by the study's report (`stalesgd.studies._report.write_report`) from what the runs recorded in their
own directories (``summary.json``: the code and host of every session, the wall time; ``dataset.json``: the
data and its sha256), so a results directory copied anywhere still says where its numbers came from. The
``## Notes`` section is kept by hand (history, caveats, what superseded the results): a new report keeps it
as it finds it, word for word.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from stalesgd.records import _run_directory as run_directory
from stalesgd.studies._study import Study

README_FILENAME = "README.md"
NOTES_HEADING = "## Notes"
NO_NOTES = "(none yet: this section is kept by hand and survives a new report)"
PLOTS = (("test_error.png", "test error"), ("train_loss.png", "training loss"), (run_directory.STALENESS, "staleness"))


def _read_json(path: pathlib.Path) -> dict[str, Any] | None:
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None


def kept_notes(path: pathlib.Path) -> str:
  """The body of an existing README's ``## Notes`` section (to its end), or `NO_NOTES`."""
  if not path.exists():
    return NO_NOTES
  text = path.read_text(encoding="utf-8")
  start = text.find(f"\n{NOTES_HEADING}\n")
  if start < 0:
    return NO_NOTES
  return text[start + len(NOTES_HEADING) + 2 :].strip("\n") or NO_NOTES


def _duration(seconds: float | None) -> str:
  """ "-" when not recorded, whole seconds under a minute, else minutes (and hours from 60 min)."""
  if seconds is None:
    return "-"
  if seconds < 59.5:
    return f"{round(seconds)} s"
  minutes = round(seconds / 60)
  return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def provenance_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
  """Bullets: the code, hosts, devices, data and wall time the runs recorded."""
  commits, versions, hosts, loads, data, walls = set(), set(), set(), [], set(), []
  for row in rows:
    workdir = pathlib.Path(row["workdir"])
    summary = _read_json(workdir / run_directory.SUMMARY) or {}
    for session in summary.get("sessions", []):
      commits.add(str(session.get("stalesgd_commit")))
      versions.add(str(session.get("stalesgd_version")))
      host = session.get("host") or {}
      if host:
        cpu_id = f" ({host['cpu_id']})" if host.get("cpu_id") else ""  # the generation a model name may hide
        hosts.add(f"{host.get('cpu_model')}{cpu_id}, {host.get('cores')} cores")
        loads.append(host["load_average"][0] if host.get("load_average") else None)
    dataset = _read_json(workdir / run_directory.DATASET) or {}
    digests = dataset.get("content_sha256") or {}
    if dataset:
      data.add(
        f"{dataset.get('name')} from {dataset.get('source')} ({dataset.get('num_train')} train, "
        f"{dataset.get('num_test')} test; sha256 train {str(digests.get('train'))[:16]}..., "
        f"test {str(digests.get('test'))[:16]}...)"
        if digests
        else f"{dataset.get('name')} from {dataset.get('source')}"
      )
    if isinstance(row.get("wall_time"), (int, float)):
      walls.append(float(row["wall_time"]))
  known_loads = [load for load in loads if load is not None]
  devices = sorted({str(row.get("host_devices")) for row in rows})
  lines = [
    f"- code: stalesgd {', '.join(sorted(versions)) or 'unknown'} at {', '.join(sorted(commits)) or 'unknown'}",
    f"- host: {'; '.join(sorted(hosts)) or 'not recorded (runs older than host records)'}"
    + (
      f"; 1-minute load average at the sessions' starts {min(known_loads):.1f}-{max(known_loads):.1f}"
      if known_loads
      else ""
    ),
    f"- host devices per run: {', '.join(devices)}",
    f"- data: {'; '.join(sorted(data)) or 'not recorded'}",
  ]
  if walls:
    lines.append(
      f"- wall time: {_duration(sum(walls))} in all, {len(walls)} runs of {_duration(min(walls))} to "
      f"{_duration(max(walls))} (per run below and in runs.csv)"
      + ("" if len(walls) == len(rows) else f"; {len(rows) - len(walls)} run(s) recorded none (e.g. diverged)")
    )
  return lines


def per_run_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """variant | seed | epochs | final test error | wall time | status, one line per run."""
  lines = ["| variant | seed | epochs | final test error (%) | wall time | status |", "|---|--:|--:|--:|--:|---|"]
  for row in rows:
    final = row.get("final_test_error")
    epochs = row.get("epochs")
    lines.append(
      f"| {row['variant']} | {row['seed']} | {'-' if epochs is None else f'{epochs:.2f}'} | "
      f"{'-' if final is None else f'{final:.2f}'} | {_duration(row.get('wall_time'))} | {row.get('status')} |"
    )
  return "\n".join(lines) + "\n"


def write_readme(
  study: Study,
  rows: Sequence[Mapping[str, Any]],
  workdir: pathlib.Path,
  *,
  table: str,
  decisions: str,
  command: str | None,
  registration: str = "",
) -> None:
  """Writes ``workdir/README.md`` (see the module docstring), keeping its ``## Notes`` section."""
  path = workdir / README_FILENAME
  notes = kept_notes(path)
  plots = [f"![{label}]({name})" for name, label in PLOTS if (workdir / name).exists()]
  parts = [
    f"# {study.title}\n",
    f"The claim: {study.finding}.\n",
    "Written by the study's report from what its runs recorded (`stalesgd.studies._results_readme`); only the "
    "*Notes* section is kept by hand.\n",
    "## Command\n",
    f"```\n{command or '(not recorded: run through run_study without a command)'}\n```\n",
    "## Code, machine, data\n",
    "\n".join(provenance_lines(rows)) + "\n",
    "## Results (test error %, mean ± std over seeds)\n",
    table.rstrip("\n") + "\n",
    f"## Decisions ({registration or 'pre-registration not checked'})\n",
    decisions.rstrip("\n") + "\n",
    "## Runs\n",
    per_run_table(rows),
  ]
  if plots:
    parts += ["## Plots\n", "\n".join(plots) + "\n"]
  parts += [f"{NOTES_HEADING}\n", notes + "\n"]
  path.write_text("\n".join(parts), encoding="utf-8")
