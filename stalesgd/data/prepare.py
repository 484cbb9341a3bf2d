"""Offline data preparation: local files -> a tfds data directory that ``source='tfds'`` reads.

::

  python -m stalesgd.data.prepare cifar10 --from=DIR --data_dir=DATA_DIR
  python -m stalesgd.data.prepare mnist --from=DIR --data_dir=DATA_DIR
  python -m stalesgd.data.prepare imagenet2012 --from=DIR --data_dir=DATA_DIR

``tfds build`` needs the internet (and, for most data sets, TensorFlow);
stalesgd's tfds source only opens prepared data (`stalesgd.data._tfds_source`).
This command closes the gap for a copy already on disk: it reads

* ``cifar10``: the python batches (``cifar-10-batches-py``), the binary batches
  (``cifar-10-batches-bin``) or ``cifar10_{train,test}.npz``;
* ``mnist`` / ``fashion_mnist``: the four IDX files (``.gz`` or not) or
  ``<name>_{train,test}.npz``;
* ``imagenet2012``: ``train/<wnid>/*.JPEG`` and ``val/<wnid>/*.JPEG``;

and writes ``DATA_DIR/<name>/<version>/``: ArrayRecord shards per split plus
``dataset_info.json`` and ``features.json``, through the registered tfds builder
itself (`stalesgd.data.preparation._tfds_writer`), so ``tfds.data_source(name,
data_dir=DATA_DIR, download=False)`` finds it with the features, split names
and example counts of a tfds preparation, without TensorFlow or a network.
Examples keep the input's order. docs/data.md describes the layouts.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from stalesgd._extras import require_training_stack

require_training_stack("stalesgd-prepare")  # before the first import of the training stack

from stalesgd.data._tfds_source import TFDS_SPLITS
from stalesgd.data.preparation import _cifar10 as cifar10
from stalesgd.data.preparation import _imagenet as imagenet
from stalesgd.data.preparation import _mnist as mnist
from stalesgd.data.preparation import _tfds_writer as tfds_writer
from stalesgd.data.preparation._layouts import MissingInputError, check_directory

# Every data set the tfds source reads can be prepared.
PREPARABLE = tuple(TFDS_SPLITS)
USAGE = f"python -m stalesgd.data.prepare {{{'|'.join(PREPARABLE)}}} --from=DIR [--data_dir=DIR] [--overwrite]"


def prepare(
  name: str,
  from_dir: str,
  data_dir: str | None = None,
  *,
  overwrite: bool = False,
  progress: TextIO | None = sys.stderr,
) -> str:
  """Converts the data set ``name`` found in ``from_dir`` into a tfds data set under ``data_dir``.

  Args:
    name: one of `PREPARABLE`.
    from_dir: the directory holding the input files (see the module docstring).
    data_dir: the tfds data directory to write (None: tfds's default,
      ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``); pass the same one as
      ``data_dir`` / ``--config.data_dir`` with ``source='tfds'``.
    overwrite: replace the data set if it is already prepared there.
    progress: where to print what is read and the conversion's progress; None
      prints nothing.

  Returns:
    The written data set's directory, ``<data_dir>/<name>/<version>``.

  Raises:
    ValueError: ``name`` is not preparable, or an input file is malformed.
    MissingInputError: ``from_dir`` lacks files the data set needs (a
      FileNotFoundError naming them).
    FileExistsError: already prepared there and not ``overwrite``.
  """
  if name not in TFDS_SPLITS:
    raise ValueError(f"cannot prepare dataset {name!r}; allowed: {', '.join(PREPARABLE)}")
  check_directory(from_dir)
  builder = tfds_writer.local_builder(name, data_dir)
  tfds_writer.check_not_prepared(builder, overwrite=overwrite)
  features = builder.info.features
  label_names = None
  if name == imagenet.NAME:
    description, files = imagenet.read_splits(from_dir, features["label"].names)
    splits = {split: imagenet.file_examples(files[split]) for split in TFDS_SPLITS[name]}
  else:
    if name == cifar10.NAME:
      description, arrays = cifar10.read_splits(from_dir)
      label_names = cifar10.LABEL_NAMES
    else:
      description, arrays = mnist.read_splits(name, from_dir)
    splits = {}
    for split in TFDS_SPLITS[name]:
      tfds_writer.check_array_split(builder, split, arrays[split])
      splits[split] = tfds_writer.array_examples(arrays[split], id_prefix=f"{split}_" if "id" in features else None)
  if progress is not None:
    counts = ", ".join(f"{split} {examples.num_examples}" for split, examples in splits.items())
    progress.write(f"{name}: read {description} ({counts} examples); writing {builder.data_dir}\n")
    progress.flush()
  return tfds_writer.write_splits(builder, splits, overwrite=overwrite, label_names=label_names, progress=progress)


def _main(argv: list[str]) -> None:
  import tensorflow_datasets as tfds
  from absl import app, flags

  if len(argv) != 2:
    raise app.UsageError(f"name one data set to prepare, one of {', '.join(PREPARABLE)}; usage: {USAGE}")
  tfds.disable_progress_bar()  # Its per-split bars and shuffling lines; `prepare` prints its own.
  values = flags.FLAGS
  from_dir = os.path.expanduser(values["from"].value)
  data_dir = os.path.expanduser(values.data_dir) if values.data_dir else None
  try:
    path = prepare(argv[1], from_dir, data_dir, overwrite=values.overwrite)
  except (ValueError, MissingInputError, FileExistsError) as error:
    sys.exit(f"stalesgd.data.prepare: {error}")
  data_dir = data_dir or "<the tfds default data_dir>"
  print(
    f"prepared {argv[1]} in {path}\nread it with load_dataset({argv[1]!r}, source='tfds', "
    f"data_dir={data_dir!r}), or train with --config.data_source=tfds --config.data_dir={data_dir}"
  )


def run() -> None:
  """The command line: defines the flags (here, so importing `prepare` defines none) and runs."""
  from absl import app, flags

  flags.DEFINE_string("from", None, "Directory holding the data set's local files (layouts: docs/data.md).")
  flags.DEFINE_string(
    "data_dir",
    None,
    "tfds data directory to write (default: tfds's, $TFDS_DATA_DIR or "
    "~/tensorflow_datasets); pass it as --config.data_dir with --config.data_source=tfds.",
  )
  flags.DEFINE_bool("overwrite", False, "Replace the data set if it is already prepared in --data_dir.")
  flags.mark_flag_as_required("from")
  app.run(_main)


if __name__ == "__main__":
  run()
