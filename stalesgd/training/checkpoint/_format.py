"""Checkpoint format versions: what each format changed, and reading an older format by renaming its keys.

A checkpoint's metadata records the format it was written in (`FORMAT_KEY`)
and the stalesgd version that wrote it (`WRITER_KEY`). The format changes
when the layout of the saved state changes, e.g. a field of a checkpointed
NamedTuple is renamed. History:

* format 1: checkpoints without `FORMAT_KEY`, written before formats were
  recorded (stalesgd 0.1 and 0.2.0 development trees). The staleness
  transform's state field is ``applied_scale`` in the oldest of them and
  ``lr_scale`` in the later ones (`stalesgd.ScaleByStalenessState`).
* format 2: the metadata records the format and the writer's version; the
  field is ``lr_scale``.

Reading an older format is a *migration* when every change since it is a
rename of tree keys (NamedTuple fields or dict keys): `migrated_path` maps a
saved key path to today's, and `stalesgd.training.checkpoint.Checkpointer`
restores the saved layout and rebuilds today's. Anything else (a leaf added
or removed, a changed shape) is refused, naming the version that wrote the
checkpoint, since only that version can resume it exactly.

To change the format: bump `FORMAT`, append a `Migration` for it (an empty
``renames`` where the new format only adds metadata), and keep the committed
fixture test (``tests/training/test_checkpoint_format.py``) reading the older
fixture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

FORMAT = 2
"""The format this version writes."""

FORMAT_KEY = "_checkpoint_format"
"""Metadata key: the format a checkpoint was written in (absent: format 1)."""

WRITER_KEY = "_written_by"
"""Metadata key: ``stalesgd.__version__`` of the code that wrote the checkpoint (absent before format 2)."""

UNRECORDED_FORMAT = 1
"""The format of checkpoints that record none."""

KeyPath = tuple[str, ...]
"""A leaf's place in a tree as key names: dict keys, NamedTuple fields and sequence indices, as strings."""


class Migration(NamedTuple):
  """What reading format ``to_format - 1`` as ``to_format`` takes.

  Attributes:
    to_format: the format this migration produces.
    renames: old key name -> new key name, applied to every component of a
      saved key path (a key without the old name is left as it is, so one
      migration serves checkpoints written before and after the rename).
    change: what changed, in words (shown in docs and errors).
  """

  to_format: int
  renames: Mapping[str, str]
  change: str


MIGRATIONS: tuple[Migration, ...] = (
  Migration(
    2,
    {"applied_scale": "lr_scale"},
    "ScaleByStalenessState.applied_scale became lr_scale; the metadata records the format and the writer",
  ),
)


def stalesgd_version() -> str:
  """The running code's ``stalesgd.__version__`` (what a checkpoint records as its writer)."""
  import stalesgd  # the package this module is part of: its __version__

  return stalesgd.__version__


def saved_format(metadata: Mapping[str, Any]) -> int:
  """The format a checkpoint's metadata says it was written in."""
  return int(metadata.get(FORMAT_KEY, UNRECORDED_FORMAT))


def writer(metadata: Mapping[str, Any]) -> str:
  """Who wrote a checkpoint, in words, e.g. ``"stalesgd 0.2.0 (checkpoint format 2)"``."""
  version = metadata.get(WRITER_KEY)
  format_ = saved_format(metadata)
  if version is None:
    return f"a stalesgd version before checkpoints recorded their format (0.2.0 or earlier; format {format_})"
  return f"stalesgd {version} (checkpoint format {format_})"


def migrations_from(format_: int, *, current: int | None = None) -> tuple[Migration, ...]:
  """The migrations that take ``format_`` to the ``current`` format (default `FORMAT`), in order.

  Raises:
    ValueError: if ``format_`` is newer than ``current`` (this version cannot read it).
  """
  current = FORMAT if current is None else current
  if format_ > current:
    raise ValueError(f"checkpoint format {format_} is newer than this version's {current}")
  return tuple(migration for migration in MIGRATIONS if format_ < migration.to_format <= current)


def migrated_path(path: KeyPath, migrations: tuple[Migration, ...]) -> KeyPath:
  """A saved key path as today's code names it, after ``migrations`` in order."""
  for migration in migrations:
    path = tuple(migration.renames.get(key, key) for key in path)
  return path
