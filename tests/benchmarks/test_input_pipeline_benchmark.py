"""The input-pipeline benchmark's parts on a tiny generated set (its --quick run takes longer than a test should)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from experiments.benchmarks import input_pipeline


def test_generated_set_is_prepared_and_every_pipeline_is_timed(tmp_path):
  data_dir = input_pipeline.write_imagenet_like(tmp_path, 12)
  examples = input_pipeline.open_train_split(data_dir)
  assert len(examples) == 12
  with Image.open(io.BytesIO(examples[0]["image"])) as picture:
    assert picture.format == "JPEG" and 240 <= min(picture.size) and max(picture.size) <= 800
  rows = input_pipeline.time_pipelines(
    examples, batch_size=4, image_size=32, batches_per_round=1, rounds=2, workers=[1, 2], grain_workers=[]
  )
  assert [(row["pipeline"], row["workers"]) for row in rows] == [
    ("serial_center_pad", 1),
    ("threads", 1),
    ("threads", 2),
  ]
  assert all(row["images_per_s"] > 0 and len(row["images_per_s_rounds"]) == 2 for row in rows)
  assert rows[1]["speedup_over_one_thread"] == 1.0
  assert "threads" in input_pipeline.format_table(rows)
  # The threads decode batch g's training crops, whatever their number.
  one, two = (input_pipeline.threaded_inception(examples, 4, 32, workers) for workers in (1, 2))
  np.testing.assert_array_equal(one(5), two(5))


def test_grain_records_map_to_the_threads_batches():
  # With W workers grain gives worker w the records w, w + W, ... and batches each worker's records apart.
  examples = [{"image": b"", "label": 0}] * 1000
  for workers in (1, 2, 3):
    source = input_pipeline._Positioned(examples, batch_size=4, workers=workers, first_batch=5)
    for worker in range(workers):
      records = worker + workers * np.arange(12)  # this worker's first three batches
      positions = np.array([source[record]["position"] for record in records]).reshape(3, 4)
      batches = 5 + worker + workers * np.arange(3)  # the loader's batches k W + w, after the first 5
      np.testing.assert_array_equal(positions, batches[:, None] * 4 + np.arange(4))
