r"""Decoded ImageNet training images per second: the serial path, a thread pool, and grain.

Generates an ImageNet-shaped data set (random-content JPEGs of quality 90 and
varied sizes around 500x375, smooth colour fields plus noise so that they
compress like photos, about 70-110 kB each), prepares it as tfds ArrayRecord
files with `stalesgd.data.prepare` and reads it through ``tfds.data_source``, as
a run does. Then, side by side within every round, each pipeline decodes
``--batches_per_round`` training batches of ``--batch_size`` images:

* ``serial_center_pad``: the path before the Inception crop, one image at a
  time in the calling thread: the 256 -> 224 centre crop, then the CIFAR-style
  pad-4 crop and flip;
* ``threads``: `LazyImageSource.read_inception_crops` (the Inception crop from
  the original JPEG, `stalesgd.data._inception_crop`) on 1, 2, 4, 8 threads;
* ``grain``: if grain is installed, a ``grain.python.DataLoader`` over the same
  tfds data source with ``worker_count`` worker processes running the same crop
  (same pixels) as a ``MapTransform``. Each round starts a fresh loader and
  times batches after its first, so its process start-up (reported apart) and
  batches it prefetched while other pipelines ran are not counted.

Rates are medians over rounds of images/s; ``results/input_pipeline_benchmark.json``
holds every round, the settings and `experiments.benchmarks.common.machine_description`.

Usage::

  python -m experiments.benchmarks.input_pipeline            # 960 images, 5 rounds of 8 batches of 32
  python -m experiments.benchmarks.input_pipeline --quick    # under a minute, without grain
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from absl import app, flags
from PIL import Image

from stalesgd.data._augmentation import draw_crop_and_flip, random_crop_and_flip
from stalesgd.data._counter_hash import AUGMENTATION_STREAM, batch_keys
from stalesgd.data._inception_crop import decode_inception_crop, draw_inception_crops
from stalesgd.data._sources import LazyImageSource

_IMAGES = flags.DEFINE_integer("images", 960, "Training images to generate.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Images per batch.")
_BATCHES = flags.DEFINE_integer("batches_per_round", 8, "Batches each pipeline decodes per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Rounds (the pipelines alternate within each).")
_WORKERS = flags.DEFINE_list("workers", ["1", "2", "4", "8"], "Thread (and grain process) counts to try.")
_GRAIN = flags.DEFINE_bool("grain", True, "Also time grain, if it is installed.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 224, "Crop side.")
_QUICK = flags.DEFINE_bool(
  "quick",
  False,
  "128 images, 3 rounds of 2 batches of 16, no grain (each grain loader "
  "starts worker processes, slow to start on few cores).",
)
_OUTPUT = flags.DEFINE_string("output", "results/input_pipeline_benchmark.json", "Where to write the JSON.")

SEED = 0
JPEG_QUALITY = 90
CLASSES = 10
# (width, height) of common ImageNet photo shapes; each image scales one by a factor in [0.8, 1.25].
BASE_SIZES = ((500, 375), (375, 500), (500, 333), (500, 500), (640, 480))


def random_photo(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
  """uint8 [height, width, 3]: a bicubically upsampled random colour field plus Gaussian noise."""
  coarse = rng.integers(0, 256, (height // 25 + 2, width // 25 + 2, 3), dtype=np.uint8)
  smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.float32)
  return np.clip(smooth + rng.normal(0.0, 10.0, smooth.shape), 0, 255).astype(np.uint8)


def image_size(rng: np.random.Generator) -> tuple[int, int]:
  width, height = BASE_SIZES[rng.integers(len(BASE_SIZES))]
  scale = rng.uniform(0.8, 1.25)
  return round(width * scale), round(height * scale)


def write_imagenet_like(directory: pathlib.Path, train_images: int) -> str:
  """Writes ``train/<wnid>/*.JPEG`` (and one validation image per class), prepares it; returns the data_dir."""
  import tensorflow_datasets as tfds

  from stalesgd.data.preparation import _tfds_writer as tfds_writer
  from stalesgd.data.prepare import prepare

  data_dir = directory / "tfds"
  wnids = tfds_writer.local_builder("imagenet2012", str(data_dir)).info.features["label"].names[:CLASSES]
  rng = np.random.default_rng(SEED)
  for split, count in (("train", train_images), ("val", CLASSES)):
    for index in range(count):
      folder = directory / "jpeg" / split / wnids[index % CLASSES]
      folder.mkdir(parents=True, exist_ok=True)
      buffer = io.BytesIO()
      Image.fromarray(random_photo(rng, *image_size(rng))).save(buffer, format="JPEG", quality=JPEG_QUALITY)
      (folder / f"{split}_{index:05d}.JPEG").write_bytes(buffer.getvalue())
  tfds.disable_progress_bar()
  prepare("imagenet2012", str(directory / "jpeg"), str(data_dir), progress=None)
  return str(data_dir)


def open_train_split(data_dir: str) -> Any:
  """The prepared training split as ``tfds.data_source`` gives it to a run (JPEG bytes, not decoded)."""
  import tensorflow_datasets as tfds

  return tfds.data_source(
    "imagenet2012", split="train", data_dir=data_dir, download=False, decoders={"image": tfds.decode.SkipDecoding()}
  )


def batch_indices(batch: int, batch_size: int, num_examples: int) -> np.ndarray:
  return (batch * batch_size + np.arange(batch_size)) % num_examples


def serial_center_pad(examples: Any, batch_size: int, image_size: int) -> Callable[[int], np.ndarray]:
  """Batch g by the path before the Inception crop: centre crop one by one, then pad-4 crop and flip."""
  source = LazyImageSource(examples, image_size=image_size, workers=1)

  def read(batch: int) -> np.ndarray:
    images, _ = source.read(batch_indices(batch, batch_size, len(source)))
    offsets, flips = draw_crop_and_flip(batch_keys(SEED, AUGMENTATION_STREAM, [batch]), batch_size, 4)
    return random_crop_and_flip(images, offsets, flips, 4)

  return read


def threaded_inception(examples: Any, batch_size: int, image_size: int, workers: int) -> Callable[[int], np.ndarray]:
  """Batch g's Inception crops on ``workers`` threads (`LazyImageSource.read_inception_crops`)."""
  source = LazyImageSource(examples, image_size=image_size, workers=workers)

  def read(batch: int) -> np.ndarray:
    draws = draw_inception_crops(batch_keys(SEED, AUGMENTATION_STREAM, [batch]), batch_size)
    return source.read_inception_crops(batch_indices(batch, batch_size, len(source)), draws)[0]

  return read


class _Positioned:
  """A grain data source whose batches are the threads' batches first_batch, first_batch + 1, ...

  A DataLoader with W worker processes gives worker w the records w, w + W,
  w + 2W, ... and batches each worker's records apart, its k-th batch being the
  loader's batch k W + w. So record r = w + W q (q = k B + i) is sample i of
  batch first_batch + k W + w, i.e. example p mod N at position p = that batch x B + i.
  """

  def __init__(self, examples: Any, *, batch_size: int, workers: int, first_batch: int):
    self.examples, self.batch_size, self.workers, self.first_batch = examples, batch_size, max(1, workers), first_batch

  def __len__(self) -> int:
    return 1 << 40

  def __getitem__(self, record: int) -> dict[str, Any]:
    worker, within = divmod(int(record), self.workers)[::-1]
    batch, sample = divmod(within, self.batch_size)
    position = (self.first_batch + batch * self.workers + worker) * self.batch_size + sample
    return {"position": position, **self.examples[position % len(self.examples)]}


def _grain_crop_transform(batch_size: int, image_size: int):
  import grain.python as grain

  class InceptionCrop(grain.MapTransform):
    """Element at position p = g batch_size + j -> the crop of sample j of batch g, as the threads give it."""

    def map(self, element: dict[str, Any]) -> np.ndarray:
      batch, sample = divmod(int(element["position"]), batch_size)
      draws = draw_inception_crops(batch_keys(SEED, AUGMENTATION_STREAM, [batch]), batch_size)
      return decode_inception_crop(
        element["image"], draws.uniforms[sample], bool(draws.flips[sample]), image_size, round(image_size * 256 / 224)
      )

  return InceptionCrop()


def grain_batches(
  examples: Any, batch_size: int, image_size: int, workers: int, first_batch: int
) -> Iterator[np.ndarray]:
  """Batches first_batch, first_batch + 1, ... from a fresh grain DataLoader with ``workers`` processes."""
  import grain.python as grain

  source = _Positioned(examples, batch_size=batch_size, workers=workers, first_batch=first_batch)
  sampler = grain.IndexSampler(
    num_records=len(source), shard_options=grain.NoSharding(), shuffle=False, num_epochs=1, seed=SEED
  )
  loader = grain.DataLoader(
    data_source=source,
    sampler=sampler,
    worker_count=workers,
    operations=[_grain_crop_transform(batch_size, image_size), grain.Batch(batch_size, drop_remainder=True)],
  )
  return iter(loader)


def _grain_available() -> bool:
  try:
    import grain.python  # noqa: F401  (imported only to learn whether it is installed)
  except ImportError:
    return False
  return True


def time_pipelines(
  examples: Any,
  *,
  batch_size: int,
  image_size: int,
  batches_per_round: int,
  rounds: int,
  workers: list[int],
  grain_workers: list[int],
) -> list[dict[str, Any]]:
  """Images/s of every pipeline in every round (they alternate within a round); rows with medians."""
  pipelines: dict[tuple[str, int], Callable[[int], np.ndarray]] = {
    ("serial_center_pad", 1): serial_center_pad(examples, batch_size, image_size)
  }
  for count in workers:
    pipelines[("threads", count)] = threaded_inception(examples, batch_size, image_size, count)
  for read in pipelines.values():
    read(0)  # warm-up: thread start, page cache
  reference = threaded_inception(examples, batch_size, image_size, 1)
  for count in grain_workers:  # grain crops the very pixels of the threads, batch for batch
    iterator = grain_batches(examples, batch_size, image_size, count, 0)
    for batch in range(2 * count):
      np.testing.assert_array_equal(next(iterator), reference(batch), err_msg=f"grain, {count} workers, batch {batch}")
    del iterator
  rates = {key: [] for key in [*pipelines, *[("grain", count) for count in grain_workers]]}
  startup = {count: [] for count in grain_workers}
  for round_index in range(rounds):
    first = 1 + round_index * batches_per_round
    for key, read in pipelines.items():
      start = time.perf_counter()
      for batch in range(first, first + batches_per_round):
        read(batch)
      rates[key].append(batches_per_round * batch_size / (time.perf_counter() - start))
    for count in grain_workers:
      start = time.perf_counter()
      iterator = grain_batches(examples, batch_size, image_size, count, max(0, first - count))
      for _ in range(count):  # one batch from every worker process: all started, their next batches begun
        next(iterator)
      startup[count].append(time.perf_counter() - start)
      start = time.perf_counter()
      for _ in range(batches_per_round):
        next(iterator)
      rates[("grain", count)].append(batches_per_round * batch_size / (time.perf_counter() - start))
      del iterator
  serial = statistics.median(rates[("threads", 1)]) if 1 in workers else None
  rows = []
  for (pipeline, count), samples in rates.items():
    median = statistics.median(samples)
    row = {
      "pipeline": pipeline,
      "workers": count,
      "images_per_s": median,
      "images_per_s_rounds": samples,
      "speedup_over_one_thread": median / serial if serial else None,
    }
    if pipeline == "grain":
      row["startup_s_median"] = statistics.median(startup[count])
    rows.append(row)
  return rows


def format_table(rows: list[dict[str, Any]]) -> str:
  lines = [f"{'pipeline':>18} {'workers':>7} {'images/s':>9} {'x 1 thread':>10}  rounds"]
  for row in rows:
    speedup = f"{row['speedup_over_one_thread']:.2f}" if row["speedup_over_one_thread"] else "-"
    lines.append(
      f"{row['pipeline']:>18} {row['workers']:>7} {row['images_per_s']:9.1f} {speedup:>10}  "
      f"{[round(rate) for rate in row['images_per_s_rounds']]}"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  from experiments.benchmarks.common import machine_description

  images, batch_size, batches, rounds = _IMAGES.value, _BATCH.value, _BATCHES.value, _ROUNDS.value
  workers = [int(count) for count in _WORKERS.value]
  grain_workers = workers if _GRAIN.value and _grain_available() else []
  if _QUICK.value:
    images, batch_size, batches, rounds, grain_workers = 128, 16, 2, 3, []
  machine = machine_description()
  with open("/proc/loadavg") as f:
    load_at_start = f.read().strip()
  with tempfile.TemporaryDirectory(prefix="stalesgd_input_pipeline_") as scratch:
    start = time.perf_counter()
    data_dir = write_imagenet_like(pathlib.Path(scratch), images)
    examples = open_train_split(data_dir)
    sizes = [len(examples[index]["image"]) for index in range(len(examples))]
    print(
      f"{len(examples)} JPEGs, mean {np.mean(sizes) / 1e3:.0f} kB, written and prepared in "
      f"{time.perf_counter() - start:.1f} s",
      flush=True,
    )
    rows = time_pipelines(
      examples,
      batch_size=batch_size,
      image_size=_IMAGE_SIZE.value,
      batches_per_round=batches,
      rounds=rounds,
      workers=workers,
      grain_workers=grain_workers,
    )
  print(format_table(rows))
  with open("/proc/loadavg") as f:
    load_at_end = f.read().strip()
  result = {
    "machine": machine,
    "loadavg_at_start": load_at_start,
    "loadavg_at_end": load_at_end,
    "settings": {
      "images": images,
      "batch_size": batch_size,
      "batches_per_round": batches,
      "rounds": rounds,
      "image_size": _IMAGE_SIZE.value,
      "jpeg_quality": JPEG_QUALITY,
      "mean_jpeg_bytes": float(np.mean(sizes)),
      "grain": grain_workers != [],
      "quick": _QUICK.value,
    },
    "rows": rows,
  }
  os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
  with open(_OUTPUT.value, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
