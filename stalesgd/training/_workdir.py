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

from stalesgd.records import _run_directory as run_directory
from stalesgd.records._paths import write_whole
from stalesgd.training._run_config import RESUMABLE_FIELDS, STORED_DC_LAMBDA, default_config


def _multiplier_set_before_it_existed(saved: dict) -> str | None:
  """cifar10_full with multipliers ran Caffe's prototxt multipliers before ``multiplier_set`` (Rudra's default)."""
  return "caffe" if saved.get("model") == "cifar10_full" and saved.get("model_multipliers") else None


# Fields that came with the per-mode lambda_0 defaults (fd2f730): a config.json without any of them was saved
# by a run that read config.dc_lambda left at 0.04 as 0.04 in every mode.
FIELDS_OF_THE_PER_MODE_DEFAULTS = ("multiplier_set", "warmup_epochs", "warmup_learning_rate")
MODES_WHOSE_DEFAULT_CHANGED = ("adaptive", "layerwise")  # 0.04 -> 2.0 and 0.2; constant stayed 0.04


def _dc_lambda_default_before_it_existed(saved: dict) -> str:
  """A run saved before the per-mode lambda_0 defaults with adaptive or layerwise and dc_lambda left at 0.04
  ran lambda_0 = 0.04 (``"dc_asgd"``); any other run computes the same under either meaning (``"per_mode"``)."""
  before = not saved.keys() & set(FIELDS_OF_THE_PER_MODE_DEFAULTS)
  unset = saved.get("dc_lambda") == STORED_DC_LAMBDA and saved.get("delay_compensation") in MODES_WHOSE_DEFAULT_CHANGED
  return "dc_asgd" if before and unset else "per_mode"


# Fields whose default changed the behaviour of runs saved before the field existed: a saved config without
# the field counts as the value that reproduces what those runs did, not as today's default.
BEHAVIOUR_BEFORE_FIELD = {
  "multiplier_set": _multiplier_set_before_it_existed,
  "dc_lambda_default": _dc_lambda_default_before_it_existed,
}


def _fragment_pattern_before_it_existed(saved: dict) -> str:
  """Streaming DiLoCo with P > 1 formed its fragments of arrays strided over jax.tree.leaves
  (``"array_strided"``) before fragments were formed of whole layers; with P = 1 every pattern is the same."""
  outer = saved.get("outer", {})
  streaming = saved.get("protocol") == "streaming_diloco" and outer.get("fragments", 1) != 1
  return "array_strided" if streaming else "strided"


# The same for fields of a section (config.outer, ...): (section, field) -> the value a saved config without it ran.
BEHAVIOUR_BEFORE_SECTION_FIELD = {("outer", "fragment_pattern"): _fragment_pattern_before_it_existed}

# For a change of one of those fields from what an earlier run did: why, and the flag that resumes it as it began.
RESUME_HINTS = {
  "multiplier_set: 'caffe'": (
    "it was started with Caffe's cifar10_full multipliers, before Rudra's release became the default: "
    "--config.multiplier_set=caffe resumes it as it began"
  ),
  "outer.fragment_pattern: 'array_strided'": (
    "it was started before streaming DiLoCo's fragments were formed of whole layers, with arrays strided over "
    "jax.tree.leaves: --config.outer.fragment_pattern=array_strided resumes it as it began"
  ),
  "dc_lambda_default: 'dc_asgd'": (
    "it was started before dc_lambda left at 0.04 meant the mode's own lambda_0, and ran lambda_0 = 0.04 "
    "(now adaptive 2.0, layerwise 0.2): --config.dc_lambda_default=dc_asgd resumes it as it began"
  ),
}


# Sections whose keys are a factory's keyword options, not fields with defaults: a missing key is not a default.
FREE_FORM_SECTIONS = ("model_options", "optimizer_options")


def _as_it_ran(saved: dict) -> dict:
  """``saved`` with the fields of `BEHAVIOUR_BEFORE_SECTION_FIELD` it lacks set to what its run did."""
  saved = dict(saved)
  for (section, field), before in BEHAVIOUR_BEFORE_SECTION_FIELD.items():
    if isinstance(saved.get(section), dict) and field not in saved[section]:
      saved[section] = {**saved[section], field: before(saved)}
  return saved


def _section_changes_from_earlier(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """``section.field: old -> new`` for the fields of `BEHAVIOUR_BEFORE_SECTION_FIELD` that ``saved`` lacks and
  the config sets otherwise than its run did (for `RESUME_HINTS`)."""
  current = json.loads(config.to_json())
  found = []
  for (section, field), before in BEHAVIOUR_BEFORE_SECTION_FIELD.items():
    if isinstance(saved.get(section), dict) and field not in saved[section]:
      old, new = before(saved), current.get(section, {}).get(field)
      if old != new:
        found.append(f"{section}.{field}: {old!r} -> {new!r}")
  return found


def config_changes(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """``field: old -> new`` for every top-level field that differs, except `RESUMABLE_FIELDS`.

  A field that ``saved`` lacks but `default_config` has (at the top level or in
  a section such as ``inner``) was added after the run was saved; it counts as
  its default there (a new field's default keeps the
  behaviour from before it existed), so the run resumes unless it is set
  otherwise. The fields of `BEHAVIOUR_BEFORE_FIELD` are the exception: their
  default changed what an earlier run computes, so a saved config without them
  counts as the value that reproduces that run (``multiplier_set``: a
  cifar10_full run saved before it ran Caffe's multipliers, ``"caffe"``;
  ``dc_lambda_default``: an adaptive or layerwise run saved before the per-mode
  lambda_0 defaults with dc_lambda left at 0.04 ran 0.04, ``"dc_asgd"``), and so are
  those of `BEHAVIOUR_BEFORE_SECTION_FIELD` (``outer.fragment_pattern``: a
  streaming_diloco run with P > 1 saved before fragments of layers ran
  ``"array_strided"``).
  """
  current = json.loads(config.to_json())
  defaults = json.loads(default_config().to_json())
  saved = _as_it_ran(saved)
  earlier = {field: before(saved) for field, before in BEHAVIOUR_BEFORE_FIELD.items() if field not in saved}
  saved = {**{field: defaults[field] for field in defaults.keys() - saved.keys()}, **earlier, **saved}
  # A field added later to a section (config.inner, config.timing, ...) counts as its default there too.
  for section, fields in defaults.items():
    if isinstance(fields, dict) and isinstance(saved.get(section), dict) and section not in FREE_FORM_SECTIONS:
      saved[section] = {**{field: fields[field] for field in fields.keys() - saved[section].keys()}, **saved[section]}
  return [
    f"{field}: {saved.get(field)!r} -> {current.get(field)!r}"
    for field in sorted(saved.keys() | current.keys())
    if field not in RESUMABLE_FIELDS and saved.get(field) != current.get(field)
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
  saved = json.loads(path.read_text())
  changes = config_changes(saved, config)
  if changes:
    named = changes + _section_changes_from_earlier(saved, config)
    hints = [hint for start, hint in RESUME_HINTS.items() if any(change.startswith(start) for change in named)]
    hint = "".join(f" ({hint})" for hint in hints)
    raise ValueError(
      f"{workdir} holds a run of another config ({', '.join(changes)}){hint}; allowed: the same config "
      f"(only {', '.join(RESUMABLE_FIELDS)} may change on resume), or another workdir"
    )


def _data_location(config: ml_collections.ConfigDict) -> str:
  """Where the run reads its data from, as the config says it."""
  if config.data_dir is not None:
    return f"data_dir {config.data_dir}"
  defaults = {"tfds": "tfds' default data_dir", "embedded": "the copy embedded in stalesgd"}
  return defaults.get(config.data_source, "data_dir unset")


def check_same_data(config: ml_collections.ConfigDict, description: dict, workdir: str | os.PathLike[str]) -> None:
  """Refuses a workdir whose run started on other data than ``description`` (`stalesgd.data.Dataset.description`).

  ``dataset.json`` records the sha256 of each in-memory split when a run starts; a resume that reads data with
  other digests would continue the run on other examples under the same config. Nothing is compared when either
  side has no digest (a lazily read split, or a ``dataset.json`` written before digests were recorded).

  Raises:
    ValueError: naming the workdir, both digests of each split that differs, and where the data was read from.
  """
  path = epath.Path(workdir) / run_directory.DATASET
  if not path.exists():
    return
  recorded, now = json.loads(path.read_text()).get("content_sha256"), description.get("content_sha256")
  if not recorded or not now or recorded == now:
    return
  differ = [
    f"{split}: recorded {recorded.get(split)} -> now {now.get(split)}"
    for split in sorted(recorded.keys() | now.keys())
    if recorded.get(split) != now.get(split)
  ]
  raise ValueError(
    f"{workdir} holds a run started on other data: the sha256 of {config.dataset!r} ({config.data_source}, "
    f"{_data_location(config)}) differs from {run_directory.DATASET}'s ({'; '.join(differ)}); allowed: the data "
    "the run started with (restore that copy), or another workdir"
  )


def write_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str]) -> None:
  """Writes ``<workdir>/config.json`` whole (`write_whole`): the other processes of a restarted run read it
  (`check_same_run`) while process 0 rewrites it, and see the old file or the new one, never a part."""
  write_whole(epath.Path(workdir) / run_directory.CONFIG, config.to_json(indent=2))
