"""What a run directory records about the run: ``summary.json`` and the sessions that computed it.

`run_summary` is ``summary.json``'s content (the last evaluation, the schedule's statistics, the weights' sha256,
`provenance`); `session_record` is one session's entry under `SESSIONS_KEY` (the update it started at, its code,
its host), kept in every checkpoint's metadata and in ``summary.json``, so a resumed run lists each code and each
processor that computed part of it, and `warn_if_code_changed` and `warn_if_cpu_changed` say so when it happens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from stalesgd.reports._progress import ProgressReporter
from stalesgd.training._provenance import (
  CPU_IDENTITY_FIELDS,
  host,
  provenance,
  source_commit,
  source_digest,
  stalesgd_version,
)
from stalesgd.training._runners import Schedule

SESSIONS_KEY = "sessions"  # checkpoint metadata and summary.json: the code each session of the run ran
SOURCE_DIGEST_KEY = "stalesgd_source_sha256"  # a session's `source_digest`: its code, uncommitted changes included


def session_record(first_update: int) -> dict[str, Any]:
  """One session of a run: the update it started at, the code it ran (a resumed run may run other code: version,
  commit and `source_digest`) and the host it started on (CPU, cores, load average at its start:
  `stalesgd.training._provenance.host`)."""
  return {
    "first_update": first_update,
    "stalesgd_version": stalesgd_version(),
    "stalesgd_commit": source_commit(),
    SOURCE_DIGEST_KEY: source_digest(),
    "host": host(),
  }


def ran_other_code(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
  """Whether two sessions ran other code: their source digests differ, or, where either session has none (it
  was recorded before digests were), their version or commit differ or the later one's tree was dirty."""
  if before.get(SOURCE_DIGEST_KEY) and now.get(SOURCE_DIGEST_KEY):
    return before[SOURCE_DIGEST_KEY] != now[SOURCE_DIGEST_KEY]
  code = lambda session: (session.get("stalesgd_version"), session.get("stalesgd_commit"))
  return code(before) != code(now) or str(now.get("stalesgd_commit")).endswith("-dirty")


def warn_if_code_changed(sessions: list[dict[str, Any]], progress: ProgressReporter) -> None:
  """Warns when this session runs other code than the one before it (`ran_other_code`): the run is then no single
  version's."""
  if len(sessions) < 2:
    return
  before, now = sessions[-2], sessions[-1]
  if ran_other_code(before, now):
    progress.write(
      f"warning: updates before {now['first_update']} were computed by {_code(before)}, the rest by {_code(now)}: "
      "the bits need not equal an uninterrupted run of either (summary.json lists every session's code under "
      "sessions)"
    )


def ran_on_other_cpu(before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
  """Whether two sessions are known to have run on processors of different kinds: a field of the host's
  `cpu_identity` that both sessions record differs. A session recorded before the family and instruction sets
  were has the model name only, which may be given to several generations: then only a different name tells."""
  before_host, now_host = before.get("host") or {}, now.get("host") or {}
  recorded = [field for field in CPU_IDENTITY_FIELDS if before_host.get(field) and now_host.get(field)]
  return any(before_host[field] != now_host[field] for field in recorded)


def warn_if_cpu_changed(sessions: list[dict[str, Any]], progress: ProgressReporter) -> None:
  """Warns when this session runs on another kind of processor than the one before it (`ran_on_other_cpu`): the
  run resumes exactly, but computes its later updates with this processor's rounding."""
  if len(sessions) < 2 or not ran_on_other_cpu(sessions[-2], sessions[-1]):
    return
  before, now = sessions[-2], sessions[-1]
  progress.write(
    f"warning: updates before {now['first_update']} were computed on {_cpu(before)}, the rest on {_cpu(now)}: "
    "another kind of processor rounds differently, so the bits need not equal an uninterrupted run on either "
    "(summary.json lists every session's host under sessions)"
  )


def _cpu(session: Mapping[str, Any]) -> str:
  """The session host's model name, with its family and model numbers where recorded."""
  host = session.get("host") or {}
  return f"{host.get('cpu_model')}" + (f" ({host['cpu_id']})" if host.get("cpu_id") else "")


def _code(session: Mapping[str, Any]) -> str:
  """``stalesgd <version> at <commit>``, and the source digest's first 12 digits where the session has one."""
  digest = session.get(SOURCE_DIGEST_KEY)
  return f"stalesgd {session.get('stalesgd_version')} at {session.get('stalesgd_commit')}" + (
    f" (source {digest[:12]})" if digest else ""
  )


def params_digest(params: Any) -> str:
  """sha256 of the weights' bytes in tree order: equal digests mean identical weights.

  Called by every process: weights sharded over several processes (the
  engine's server state) are gathered first.
  """
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(multihost_utils.process_allgather(params, tiled=True)):
    digest.update(np.ascontiguousarray(leaf).tobytes())
  return digest.hexdigest()


def run_summary(
  config: ml_collections.ConfigDict,
  *,
  label: str,
  schedule: Schedule,
  params: Any,
  updates: int,
  epochs: float,
  wall_time: float,
  records: Sequence[Mapping[str, Any]],
  preempted: bool,
) -> dict[str, Any]:
  """``summary.json``: the run's last evaluation in ``records``, its schedule's statistics up to ``updates``."""
  evaluated = [record for record in records if "test_loss" in record]  # every evaluation reports a loss
  last = evaluated[-1] if evaluated else {}
  staleness = schedule.staleness[:updates]
  return {
    "label": label,
    "protocol": config.protocol,
    "learners": config.learners,
    "batch_per_learner": config.batch_per_learner,
    "updates": updates,
    "epochs": epochs,
    "test_accuracy": last.get("test_accuracy"),
    "test_error": last.get("test_error"),
    "train_accuracy": last.get("train_accuracy"),
    "sim_time": float(schedule.update_time[updates - 1]) if updates else 0.0,
    "wall_time": wall_time,
    "staleness_mean": float(staleness.mean()) if staleness.size else 0.0,
    "staleness_max": int(staleness.max()) if staleness.size else 0,
    "dropped_gradients": int(schedule.num_dropped),
    "params_sha256": params_digest(params),
    "preempted": preempted,
    "provenance": provenance(),
  }
