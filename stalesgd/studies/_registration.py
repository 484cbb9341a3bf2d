"""Pre-registration, computed from what the runs recorded: were a grid's claims fixed before every run began?

A claim's rule is worth something only if it was written down before anyone saw a result. Each run of a grid
records, before its first update, ``registration.json`` (`write_registration`): the digest of its study's
*registration* (`registration_record`: the claims' variants, references, kinds and margins, the rule's number of
last evaluations, the claimed variants' configs, and the grid's seeds and fixed settings, i.e. every flag but the
data's directory) and the commit it runs from. `judge` calls a grid **pre-registered** only when

* every run recorded the registration digest of the study as it stands now (the same claims, margins, seeds and
  settings), and
* every run started from a clean tree at a commit (``stalesgd_commit`` without ``-dirty``).

A clean commit's code computed that digest, so the commit that introduced those claims is that commit or an
ancestor of it: the claims were committed before the run began. A run that recorded no registration (every run
written before this module) is judged by the commit its first session recorded: pre-registered when that commit
is clean and its tree holds the same claims (`claims_at_commit` reads them from the commit's own code), which a
run from a dirty tree or with no recorded commit cannot show. Anything else is **exploratory**: the rule may
have been fixed after runs began; `Registration.reasons` says which runs fail and why.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stalesgd.records import _run_directory as run_directory
from stalesgd.studies._study import Study

PRE_REGISTERED = "pre-registered"
EXPLORATORY = "exploratory: the rule was fixed after runs began"
UNCHECKED_SETTINGS = ("data_dir",)  # where the data lies on one machine is not part of what was registered


def claims_record(study: Study) -> dict[str, Any]:
  """What a study's claims fix: each claim's variant, reference, kind and margin, the rule's number of last
  evaluations, the config (file, variant, overrides) of every variant a claim names, and a pilot's definition
  (`stalesgd.studies._study.Pilot.record`; a piloted decision grid's overrides hold the values it chose)."""
  named = {slug for claim in study.claims for slug in (claim.variant, claim.reference)}
  pilot = {} if study.pilot is None else {"pilot": study.pilot.record()}  # absent before pilots: digests unchanged
  return {
    **pilot,
    "study": study.name,
    "last_evaluations": study.last_evaluations,
    "claims": [
      {"variant": claim.variant, "reference": claim.reference, "kind": claim.kind, "margin": float(claim.margin)}
      for claim in study.claims
    ],
    "variants": [
      {
        "slug": variant.slug,
        "config_file": variant.config_file,
        "config_variant": variant.config_variant,
        "overrides": {field: repr(value) for field, value in sorted(variant.overrides.items())},
      }
      for variant in study.variants
      if variant.slug in named
    ],
  }


def registration_record(study: Study, *, seeds: Sequence[int], settings: Mapping[str, Any]) -> dict[str, Any]:
  """`claims_record` with the grid's seeds (their values) and fixed settings (`StudySettings` as a mapping, less
  the data's directory)."""
  fixed = {field: value for field, value in sorted(settings.items()) if field not in UNCHECKED_SETTINGS}
  return {**claims_record(study), "seeds": [int(seed) for seed in seeds], "settings": fixed}


def digest(record: Mapping[str, Any]) -> str:
  """sha256 of a record's canonical JSON."""
  return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def write_registration(directory: pathlib.Path, record: Mapping[str, Any], commit: str | None) -> bool:
  """Writes ``directory/registration.json`` before a run's first update; returns whether it wrote it.

  Nothing is written where the run has already begun (its metrics exist) or registered: a registration records
  what held when the run began, never later.
  """
  path = directory / run_directory.REGISTRATION
  if path.exists() or (directory / run_directory.METRICS).exists():
    return False
  directory.mkdir(parents=True, exist_ok=True)
  path.write_text(
    json.dumps({"digest": digest(record), "record": record, "stalesgd_commit": commit}, indent=2) + "\n",
    encoding="utf-8",
  )
  return True


@dataclasses.dataclass(frozen=True)
class RunEvidence:
  """What one run recorded about when it began.

  Attributes:
    label: the run, for the reasons (e.g. ``"hardsync, seed 0"``).
    registration: its ``registration.json`` (None if it wrote none).
    first_commit: the commit of its first session (``-dirty`` for a dirty tree; None if it recorded none).
  """

  label: str
  registration: Mapping[str, Any] | None
  first_commit: str | None


def first_session_commit(summary: Mapping[str, Any]) -> str | None:
  """The commit a run's first session recorded (``summary.json``: its ``sessions``, else its provenance)."""
  sessions = summary.get("sessions") or []
  if sessions:
    return sessions[0].get("stalesgd_commit")
  return (summary.get("provenance") or {}).get("stalesgd_commit")


def evidence_of(label: str, directory: pathlib.Path) -> RunEvidence:
  """A run directory's evidence: its registration, and the first commit from it or from ``summary.json``."""
  registration = None
  if (directory / run_directory.REGISTRATION).exists():
    registration = json.loads((directory / run_directory.REGISTRATION).read_text())
  commit = registration.get("stalesgd_commit") if registration else None
  if commit is None and (directory / run_directory.SUMMARY).exists():
    commit = first_session_commit(json.loads((directory / run_directory.SUMMARY).read_text()))
  return RunEvidence(label, registration, commit)


@dataclasses.dataclass(frozen=True)
class Registration:
  """A grid's verdict: `PRE_REGISTERED` or `EXPLORATORY`, with the reasons of the latter."""

  status: str
  reasons: tuple[str, ...] = ()

  @property
  def pre_registered(self) -> bool:
    return self.status == PRE_REGISTERED

  def describe(self, most: int = 3) -> str:
    if self.pre_registered:
      return PRE_REGISTERED
    shown = "; ".join(self.reasons[:most]) + (
      f"; and {len(self.reasons) - most} more" if len(self.reasons) > most else ""
    )
    return f"{EXPLORATORY} ({shown})"


def judge(
  study: Study,
  runs: Sequence[RunEvidence],
  *,
  registration: Mapping[str, Any] | None,
  claims_at: Callable[[str], Mapping[str, Any] | None],
) -> Registration:
  """The module docstring's rule over ``runs``.

  Args:
    study: the study as it stands now.
    runs: every run of the grid.
    registration: the grid's `registration_record` now (None: unknown, then only the claims are compared).
    claims_at: a commit's `claims_record` of the study, None if it cannot be read (`claims_at_commit`).
  """
  if not study.claims:
    return Registration(EXPLORATORY, ("the study states no claim",))
  now = claims_record(study)
  expected = digest(registration) if registration is not None else None
  reasons = []
  for run in runs:
    commit = run.first_commit
    if commit is None:
      reasons.append(f"{run.label} recorded no commit")
      continue
    if commit.endswith("-dirty"):
      reasons.append(f"{run.label} began from a dirty tree ({commit[:7]}-dirty)")
      continue
    if run.registration is not None:
      if expected is not None and run.registration.get("digest") != expected:
        reasons.append(f"{run.label} registered other claims, seeds or settings than the grid's now")
      elif expected is None and run.registration.get("record", {}).get("claims") != now["claims"]:
        reasons.append(f"{run.label} registered other claims")
      continue
    held = claims_at(commit)
    if held is None:
      reasons.append(f"{run.label}: the claims at its commit {commit[:7]} could not be read")
    elif {key: held.get(key) for key in now} != now:
      reasons.append(f"{run.label} began at {commit[:7]}, whose claims differ from these")
  return Registration(EXPLORATORY, tuple(reasons)) if reasons else Registration(PRE_REGISTERED)


# Run in a fresh interpreter with a commit's own stalesgd first on the path: prints its study's claims_record.
_CLAIMS_AT_COMMIT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from stalesgd.studies import STUDIES
study = STUDIES[sys.argv[2]]
named = {s for c in study.claims for s in (c.variant, c.reference)}
print(json.dumps({
  "study": study.name,
  "last_evaluations": getattr(study, "last_evaluations", 3),
  "claims": [{"variant": c.variant, "reference": c.reference, "kind": c.kind, "margin": float(c.margin)}
             for c in study.claims],
  "variants": [{"slug": v.slug, "config_file": v.config_file, "config_variant": v.config_variant,
                "overrides": {f: repr(x) for f, x in sorted(v.overrides.items())}}
               for v in study.variants if v.slug in named],
}))
"""


@functools.cache
def claims_at_commit(repository: pathlib.Path, commit: str, study_name: str) -> dict[str, Any] | None:
  """The `claims_record` of ``study_name`` as ``commit``'s own code defines it; None if git or that code cannot
  say (not a repository, an unknown commit, no such study then). Its ``stalesgd`` tree is unpacked and imported in
  a fresh interpreter (a few seconds per commit; cached)."""
  with tempfile.TemporaryDirectory() as tree:
    try:
      archive = subprocess.run(
        ["git", "-C", str(repository), "archive", commit, "stalesgd"], capture_output=True, timeout=60, check=True
      )
      subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, capture_output=True, timeout=60, check=True)
      printed = subprocess.run(
        [sys.executable, "-c", _CLAIMS_AT_COMMIT, tree, study_name],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=tree,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
      )
    except (OSError, subprocess.SubprocessError):
      return None
  return json.loads(printed.stdout.strip().splitlines()[-1])
