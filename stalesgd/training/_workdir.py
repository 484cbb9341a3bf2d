"""A run's directory and its config: whether a config may resume the run a workdir holds.

A run writes its config to ``<workdir>/config.json``; a restart with the same
workdir resumes only if its config is the same run (`check_same_run`), so a
checkpoint of one config is never restored into another.
"""

from __future__ import annotations

import json
import os

import ml_collections
from etils import epath

from stalesgd.training._run_config import default_config
from stalesgd.utils import _run_directory as run_directory
from stalesgd.utils._paths import write_whole

# Fields a resumed run may change: they decide when to log, save, how to batch
# evaluation or how many threads decode, never the weights or the metrics' values.
RESUMABLE_CHANGES = (
  "log_every_updates",
  "checkpoint_every_seconds",
  "keep_checkpoints",
  "eval_batch_size",
  "data_workers",
)


def _multiplier_set_before_it_existed(saved: dict) -> str | None:
  """cifar10_full with multipliers ran Caffe's prototxt multipliers before ``multiplier_set`` (Rudra's default)."""
  return "caffe" if saved.get("model") == "cifar10_full" and saved.get("model_multipliers") else None


# Fields whose default changed the behaviour of runs saved before the field existed: a saved config without
# the field counts as the value that reproduces what those runs did, not as today's default.
BEHAVIOUR_BEFORE_FIELD = {"multiplier_set": _multiplier_set_before_it_existed}


def config_changes(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """``field: old -> new`` for every top-level field that differs, except `RESUMABLE_CHANGES`.

  A field that ``saved`` lacks but `default_config` has was added after the run
  was saved; it counts as its default there (a new field's default keeps the
  behaviour from before it existed), so the run resumes unless it is set
  otherwise. The fields of `BEHAVIOUR_BEFORE_FIELD` are the exception: their
  default changed what an earlier run computes, so a saved config without them
  counts as the value that reproduces that run (``multiplier_set``: a
  cifar10_full run saved before it ran Caffe's multipliers, ``"caffe"``).
  """
  current = json.loads(config.to_json())
  defaults = json.loads(default_config().to_json())
  earlier = {field: before(saved) for field, before in BEHAVIOUR_BEFORE_FIELD.items() if field not in saved}
  saved = {**{field: defaults[field] for field in defaults.keys() - saved.keys()}, **earlier, **saved}
  return [
    f"{field}: {saved.get(field)!r} -> {current.get(field)!r}"
    for field in sorted(saved.keys() | current.keys())
    if field not in RESUMABLE_CHANGES and saved.get(field) != current.get(field)
  ]


def check_same_run(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str]) -> None:
  """Refuses a workdir that holds a run of another config, before anything is resumed or reused.

  A checkpoint of one config restored into another would silently mix two runs.

  Raises:
    ValueError: naming the workdir and the fields that differ.
  """
  path = epath.Path(workdir) / run_directory.CONFIG
  if not path.exists():
    return
  changes = config_changes(json.loads(path.read_text()), config)
  if changes:
    hint = ""
    if any(change.startswith("multiplier_set: 'caffe'") for change in changes):
      hint = (
        " (it was started with Caffe's cifar10_full multipliers, before Rudra's release became the default: "
        "--config.multiplier_set=caffe resumes it as it began)"
      )
    raise ValueError(
      f"{workdir} holds a run of another config ({', '.join(changes)}){hint}; allowed: the same config "
      f"(only {', '.join(RESUMABLE_CHANGES)} may change on resume), or another workdir"
    )


def write_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str]) -> None:
  """Writes ``<workdir>/config.json`` whole (`write_whole`): the other processes of a restarted run read it
  (`check_same_run`) while process 0 rewrites it, and see the old file or the new one, never a part."""
  write_whole(epath.Path(workdir) / run_directory.CONFIG, config.to_json(indent=2))
