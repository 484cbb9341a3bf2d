"""Input layouts: the files one format needs, found in a directory or named when missing.

A user points ``--from`` at whatever they unpacked; the data set may sit in
that directory or in the folder its archive creates (``cifar-10-batches-py``).
`find_layout` tries every accepted layout there and either returns the files of
the first complete one, or raises `MissingInputError` that says which layout was
partly found and which files it lacks (or, when nothing matches, every accepted
layout), so a truncated copy is never silently converted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from stalesgd.data._npz_source import NPZ_SPLITS, npz_path


class MissingInputError(FileNotFoundError):
  """The input directory lacks files a data set needs; the message names them."""


@dataclasses.dataclass(frozen=True)
class Layout:
  """One accepted way of storing a data set's files in a directory.

  Attributes:
    description: what the layout is, e.g. ``"CIFAR-10 python batches"``.
    files: every required file, each as a tuple of accepted names (e.g. with
      and without ``.gz``), first name preferred.
  """

  description: str
  files: tuple[tuple[str, ...], ...]

  def resolve(self, directory: str) -> list[str | None]:
    """The path of each required file in ``directory``, None where absent."""
    found: list[str | None] = []
    for names in self.files:
      paths = [os.path.join(directory, name) for name in names]
      found.append(next((path for path in paths if os.path.isfile(path)), None))
    return found

  def summary(self) -> str:
    """``description (name1, name2 or name2.gz, ...)`` for error messages."""
    return f"{self.description} ({', '.join(' or '.join(names) for names in self.files)})"


def npz_layout(name: str) -> Layout:
  """The layout `stalesgd.data._npz_source` reads: ``<name>_train.npz`` and ``<name>_test.npz``."""
  return Layout(
    "npz arrays of source='npz' (images uint8 [N,H,W(,C)], labels [N])",
    tuple((os.path.basename(npz_path("", name, split)),) for split in NPZ_SPLITS),
  )


def check_directory(from_dir: str) -> None:
  """Raises `MissingInputError` unless ``from_dir`` is an existing directory."""
  if not from_dir or not os.path.isdir(from_dir):
    raise MissingInputError(f"--from={from_dir!r} is not a directory: pass the directory holding the data set's files")


def find_layout(
  dataset: str, from_dir: str, layouts: Sequence[Layout], subdirectories: Sequence[str] = ()
) -> tuple[Layout, list[str]]:
  """(layout, its files' paths) of the first complete layout in ``from_dir``.

  Args:
    dataset: the data set's name, for messages.
    from_dir: the directory to search.
    layouts: accepted layouts, in order of preference.
    subdirectories: folders inside ``from_dir`` to search too (the names the
      data set's archives unpack to), after ``from_dir`` itself.

  Raises:
    MissingInputError: no layout is complete; the message names the files
      missing from the most complete one, or lists every layout when none has
      a single file.
  """
  check_directory(from_dir)
  directories = [from_dir] + [
    os.path.join(from_dir, name) for name in subdirectories if os.path.isdir(os.path.join(from_dir, name))
  ]
  best: tuple[int, Layout, str, list[str | None]] | None = None
  for directory in directories:
    for layout in layouts:
      paths = layout.resolve(directory)
      if all(paths):
        return layout, [path for path in paths if path]
      present = sum(path is not None for path in paths)
      if present and (best is None or present > best[0]):
        best = (present, layout, directory, paths)
  accepted = "; ".join(layout.summary() for layout in layouts)
  if best is not None:
    _, layout, directory, paths = best
    missing = [" or ".join(names) for names, path in zip(layout.files, paths) if path is None]
    raise MissingInputError(
      f"{dataset}: {directory} holds part of the {layout.description} but lacks "
      f"{', '.join(missing)}. Accepted layouts: {accepted}"
    )
  searched = ", ".join(directories)
  raise MissingInputError(f"{dataset}: no input files found in {searched}. Accepted layouts: {accepted}")
