"""Writes local examples as a registered tfds data set, with tfds's own builder and no TensorFlow.

The output must be what ``tfds.data_source(name, data_dir=..., download=False)``
opens: the registered builder (``tfds.builder_cls("cifar10")`` etc.) reads its
features from its own code and looks in ``<data_dir>/<name>/<version>/``. So
rather than describing the data set again, `local_builder` subclasses that very
builder and replaces only `_split_generators` (which would download) with the
local examples; tfds then serialises, shards and writes the ArrayRecord files,
``dataset_info.json`` and ``features.json`` exactly as ``download_and_prepare``
does after a download. Checked in the installed tfds 4.9.10:

* ``tfds.dataset_builders.store_as_tfds_dataset`` (an ad-hoc builder) writes a
  data set only its own name can find, with features that would have to repeat
  the registered ones, and tests ``isinstance(data, tf.data.Dataset)``;
* tfds encodes numpy images with TensorFlow (``tf.image.encode_png``), but
  stores encoded bytes as they are, so arrays are handed over as PNG bytes
  (lossless; encoded with PIL on several threads, as tfds itself would encode a
  PIL image) and ImageNet JPEGs as their file's bytes;
* the GCS mirror check (``try_download_gcs``) would open a network connection,
  so it is off.

Shuffling is disabled: the examples keep the order of the input files (keys are
their positions), so a split read back through tfds equals the same split read
from npz, element for element, and a run trains identically from either.
(A tfds preparation from the internet orders examples by a hash of their key.)
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import io
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TextIO

import numpy as np
from PIL import Image

from stalesgd.data._sources import ArraySource
from stalesgd.reports._progress import format_duration, format_rate

# Seconds between progress lines within a split (each split's end is always reported).
PROGRESS_INTERVAL_SECONDS = 10.0
# Threads encoding images / reading files ahead of tfds's writer, and how many items each batch of work holds.
PREPARATION_THREADS = min(8, os.cpu_count() or 1)
CHUNK = 512


@dataclasses.dataclass(frozen=True)
class SplitExamples:
  """One split's examples, as feature dicts of the registered builder, and their count.

  Attributes:
    examples: an iterable of feature dicts (e.g. ``{"image": ..., "label": 3}``),
      consumed once, in the order they are to be stored.
    num_examples: how many there are (for progress and the final check).
  """

  examples: Iterable[dict[str, Any]]
  num_examples: int


def ordered_map(function: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Any]:
  """``map(function, items)`` on `PREPARATION_THREADS` threads, in order, `CHUNK` items ahead.

  PNG encoding (zlib) and file reads release the GIL, so threads overlap them
  with tfds's serialisation; only two chunks of results are held at a time.
  """
  with concurrent.futures.ThreadPoolExecutor(PREPARATION_THREADS) as pool:
    pending: collections.deque[list[concurrent.futures.Future]] = collections.deque()
    for start in range(0, len(items), CHUNK):
      pending.append([pool.submit(function, item) for item in items[start : start + CHUNK]])
      if len(pending) > 1:
        yield from (future.result() for future in pending.popleft())
    while pending:
      yield from (future.result() for future in pending.popleft())


def png_bytes(image: np.ndarray) -> bytes:
  """uint8 [H, W, C] -> PNG, as tfds encodes a PIL image (one channel: a grayscale PNG)."""
  buffer = io.BytesIO()
  Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, format="png")
  return buffer.getvalue()


def array_examples(source: ArraySource, *, id_prefix: str | None = None) -> SplitExamples:
  """Examples of an in-memory split: ``image`` (PNG bytes, lossless) and ``label``.

  Args:
    source: the split.
    id_prefix: when given, each example also gets ``id = f"{id_prefix}{index:05d}"``
      (tfds's CIFAR-10 has this feature, e.g. ``"train_00042"``).
  """

  def generate() -> Iterator[dict[str, Any]]:
    for index, image in enumerate(ordered_map(png_bytes, source.images)):
      example: dict[str, Any] = {"image": image, "label": int(source.labels[index])}
      if id_prefix is not None:
        example["id"] = f"{id_prefix}{index:05d}"
      yield example

  return SplitExamples(generate(), len(source))


def check_array_split(builder: Any, split: str, source: ArraySource) -> None:
  """Raises ValueError unless ``source`` fits the builder's ``image`` shape and ``label`` classes.

  Checked before writing, so a wrong input (MNIST arrays given as CIFAR-10, say)
  fails with both shapes named rather than deep inside tfds.
  """
  expected = tuple(builder.info.features["image"].shape)
  shape = tuple(source.image_shape)
  if len(shape) != len(expected) or any(want is not None and want != got for want, got in zip(expected, shape)):
    raise ValueError(
      f"{builder.name} {split}: images must be [N, {', '.join(map(str, expected))}] "
      f"(tfds {builder.name} {builder.version}); got [N, {', '.join(map(str, shape))}]"
    )
  num_classes = builder.info.features["label"].num_classes
  if len(source) and int(source.labels.max()) >= num_classes:
    raise ValueError(
      f"{builder.name} {split}: labels must lie in [0, {num_classes}); got maximum {int(source.labels.max())}"
    )


def local_builder(name: str, data_dir: str | None) -> Any:
  """An instance of the registered tfds builder ``name`` whose splits come from local files.

  It writes to, and reads from, the directory the registered builder uses
  (``<data_dir>/<name>/<version>/``); set its splits with `write_splits`.
  """
  import tensorflow_datasets as tfds  # Deferred, as in tfds_source: importing it takes seconds.

  base = tfds.builder_cls(name)

  class LocalFilesBuilder(base, skip_registration=True):  # type: ignore[misc, valid-type]
    """`base` with its download replaced by examples handed over in memory."""

    def __init__(self, **kwargs: Any):
      self.local_splits: dict[str, Iterable[tuple[int, dict[str, Any]]]] = {}
      super().__init__(**kwargs)

    def _info(self) -> Any:
      info = super()._info()
      # DatasetInfo has no setter; the proto field is what the writer reads.
      info.as_proto.disable_shuffling = True
      return info

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterable[tuple[int, dict[str, Any]]]]:
      del dl_manager  # Nothing is downloaded.
      return dict(self.local_splits)

  LocalFilesBuilder.name = base.name  # Same name, same directory as the registered builder.
  return LocalFilesBuilder(data_dir=data_dir)


def _with_progress(
  name: str, split: str, examples: Iterable[dict[str, Any]], total: int, stream: TextIO | None, counter: list[int]
) -> Iterator[tuple[int, dict[str, Any]]]:
  """(position, example) pairs, printing ``name split: done/total`` lines with rate and ETA."""
  start = last = time.monotonic()
  for index, example in enumerate(examples):
    yield index, example
    counter[0] = index + 1
    now = time.monotonic()
    if stream is not None and (now - last >= PROGRESS_INTERVAL_SECONDS or index + 1 == total):
      last = now
      rate = (index + 1) / max(now - start, 1e-9)
      eta = max(total - index - 1, 0) / rate
      stream.write(
        f"{name} {split}: {index + 1}/{total} examples ({100 * (index + 1) / max(total, 1):.1f}%), "
        f"{format_rate(rate)} examples/s, {format_duration(now - start)}, "
        f"ETA {format_duration(eta)}\n"
      )
      stream.flush()


def check_not_prepared(builder: Any, *, overwrite: bool) -> None:
  """Raises FileExistsError if ``builder``'s data set is already prepared and not ``overwrite``.

  (tfds itself would silently keep the old data.)
  """
  if builder.is_prepared() and not overwrite:
    raise FileExistsError(
      f"{builder.name} {builder.version} is already prepared in {builder.data_dir}; "
      "pass --overwrite (overwrite=True) to replace it, or choose another --data_dir"
    )


def write_splits(
  builder: Any,
  splits: Mapping[str, SplitExamples],
  *,
  overwrite: bool = False,
  label_names: Sequence[str] | None = None,
  progress: TextIO | None = sys.stderr,
) -> str:
  """Writes ``splits`` with ``builder`` (from `local_builder`) and returns the data set's directory.

  Args:
    builder: from `local_builder`.
    splits: split name -> its examples, in the order to store them.
    overwrite: replace a data set already prepared there (otherwise an error).
    label_names: class names to record for the ``label`` feature, if the
      registered builder leaves them to its download (CIFAR-10 does).
    progress: where to print progress lines; None prints nothing.

  Raises:
    FileExistsError: the data set is already prepared there and not ``overwrite``.
    ValueError: a split's example count differs from the one announced.
  """
  import tensorflow_datasets as tfds

  check_not_prepared(builder, overwrite=overwrite)
  if builder.is_prepared():
    # A builder opened on a prepared directory holds that data set's info, which
    # tfds will not rewrite; remove the old data (the inputs are read and
    # checked by now) and start from a fresh builder.
    shutil.rmtree(builder.data_dir)
    builder = local_builder(builder.name, os.fspath(builder.data_dir_root))
  if label_names is not None:
    builder.info.features["label"].names = list(label_names)
  counters = {split: [0] for split in splits}
  builder.local_splits = {
    split: _with_progress(
      builder.name, split, split_examples.examples, split_examples.num_examples, progress, counters[split]
    )
    for split, split_examples in splits.items()
  }
  download_config = tfds.download.DownloadConfig(try_download_gcs=False)
  # tfds creates a downloads/ folder even when nothing is downloaded: keep it out of data_dir.
  with tempfile.TemporaryDirectory(prefix="stalesgd-prepare-") as download_dir:
    builder.download_and_prepare(download_dir=download_dir, download_config=download_config, file_format="array_record")
  for split, split_examples in splits.items():
    written = builder.info.splits[split].num_examples
    if written != split_examples.num_examples or counters[split][0] != written:
      raise ValueError(
        f"{builder.name} {split}: {split_examples.num_examples} examples announced, "
        f"{counters[split][0]} generated, {written} written to {builder.data_dir}"
      )
  return str(builder.data_dir)
