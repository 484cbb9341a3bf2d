"""The Inception random-resized crop: its draws, its window rule, its pixels, and its independence of threads."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from stalesgd.data import Dataset, LearnerBatches
from stalesgd.data._center_crop import decode_and_center_crop
from stalesgd.data._counter_hash import AUGMENTATION_STREAM, batch_keys
from stalesgd.data._inception_crop import (
  ATTEMPTS,
  MAX_AREA,
  MAX_RATIO,
  MIN_AREA,
  MIN_RATIO,
  crop_window,
  decode_inception_crop,
  draw_inception_crops,
)
from stalesgd.data._normalization import fit_normalization
from stalesgd.data._sources import LazyImageSource

# (area, log-ratio) uniforms no attempt can fit in a 10 x 10 image: ~92% of the area at a 4:3 ratio is 11 x 8.
_NEVER_FITS_10X10 = np.tile([0.9, 0.99, 0.5, 0.5], (ATTEMPTS, 1))


def _jpeg(array: np.ndarray, quality: int = 90) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
  return buffer.getvalue()


def _examples(count: int, seed: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  sizes = [(30 + 7 * (index % 5), 24 + 5 * (index % 3)) for index in range(count)]
  return [
    {"image": _jpeg(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)), "label": index % 7}
    for index, (width, height) in enumerate(sizes)
  ]


def test_window_of_hand_checked_uniforms():
  # 100 x 50: area 0.08 x 5000 = 400 at ratio exp(0) = 1 -> 20 x 20, left floor(0.5 x 81) = 40, top 0.
  assert crop_window(100, 50, [[0.0, 0.5, 0.5, 0.0]]) == (40, 0, 20, 20)
  # Full area at ratio 4/3 on 100 x 50: sqrt(5000 x 4/3) = 81.6 -> 82 wide, sqrt(5000 x 3/4) = 61.2 -> 61 > 50
  # high: rejected; the second attempt (area 0.08 + 0.92 x 0.5 = 0.54 -> 2700, ratio 3/4 -> 45 x 60) is too
  # high too; the third (2700 at 4/3 -> 60 x 45) fits, at the far corner for uniforms just below 1.
  rows = [[1.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0], [0.5, 1.0, 0.999, 0.999]]
  assert crop_window(100, 50, rows) == (40, 5, 60, 45)
  assert crop_window(10, 10, _NEVER_FITS_10X10) is None


def test_windows_lie_inside_and_keep_area_and_ratio_within_bounds():
  draws = draw_inception_crops(batch_keys(0, AUGMENTATION_STREAM, np.arange(64)), 64)
  rng = np.random.default_rng(1)
  fitted = 0
  for uniforms in draws.uniforms:
    width = int(rng.integers(1, 700))  # photo-like shapes, from 1 x 1 up, aspect ratios in [1/2, 2]
    height = max(1, round(width * float(np.exp(rng.uniform(np.log(0.5), np.log(2.0))))))
    window = crop_window(width, height, uniforms)
    if window is None:
      continue
    fitted += 1
    left, top, crop_width, crop_height = window
    assert 0 <= left and left + crop_width <= width and 0 <= top and top + crop_height <= height
    assert crop_width >= 1 and crop_height >= 1
    # Sides are rounded from sqrt(A rho) and sqrt(A / rho): within half a pixel of sides whose area lies in
    # [0.08, 1] W H and whose ratio lies in [3/4, 4/3].
    assert (crop_width - 0.5) * (crop_height - 0.5) <= MAX_AREA * width * height + 1e-9
    assert (crop_width + 0.5) * (crop_height + 0.5) >= MIN_AREA * width * height - 1e-9
    assert (crop_width - 0.5) / (crop_height + 0.5) <= MAX_RATIO + 1e-9
    assert (crop_width + 0.5) / max(crop_height - 0.5, 1e-9) >= MIN_RATIO - 1e-9
  assert fitted > 0.98 * len(draws.uniforms)  # the centre-crop fallback is rare


def test_draws_are_a_function_of_seed_batch_and_sample():
  global_batches = np.array([0, 1, 7, 123456789])
  draws = draw_inception_crops(batch_keys(3, AUGMENTATION_STREAM, global_batches), 16)
  assert draws.uniforms.shape == (64, ATTEMPTS, 4) and draws.uniforms.dtype == np.float64
  assert draws.flips.shape == (64,) and draws.flips.dtype == bool
  assert 0.0 <= draws.uniforms.min() and draws.uniforms.max() < 1.0
  # Batches drawn in another order, or one by one, give each (g, j) the same draws.
  reverse = draw_inception_crops(batch_keys(3, AUGMENTATION_STREAM, global_batches[::-1]), 16)
  np.testing.assert_array_equal(
    reverse.uniforms.reshape(4, 16, ATTEMPTS, 4)[::-1].reshape(64, ATTEMPTS, 4), draws.uniforms
  )
  alone = draw_inception_crops(batch_keys(3, AUGMENTATION_STREAM, [7]), 16)
  np.testing.assert_array_equal(alone.uniforms, draws.uniforms[32:48])
  np.testing.assert_array_equal(alone.flips, draws.flips[32:48])
  other_seed = draw_inception_crops(batch_keys(4, AUGMENTATION_STREAM, global_batches), 16)
  assert not np.any(other_seed.uniforms == draws.uniforms)
  many = draw_inception_crops(batch_keys(0, AUGMENTATION_STREAM, np.arange(256)), 32)
  assert abs(many.flips.mean() - 0.5) < 0.02 and abs(many.uniforms.mean() - 0.5) < 0.01


def test_crop_of_output_size_is_the_exact_window_and_flip_mirrors_it():
  image = np.random.default_rng(2).integers(0, 256, (12, 20, 3), dtype=np.uint8)  # W = 20, H = 12
  # Area 64 at ratio 1 -> an 8 x 8 window, left floor(0.5 x 13) = 6, top floor(0.25 x 5) = 1.
  uniforms = np.array([[(64 / 240 - MIN_AREA) / (MAX_AREA - MIN_AREA), 0.5, 0.5, 0.25]])
  assert crop_window(20, 12, uniforms) == (6, 1, 8, 8)
  crop = decode_inception_crop(image, uniforms, False, 8, 9)
  np.testing.assert_array_equal(crop, image[1:9, 6:14])  # an 8 -> 8 bilinear resize copies the pixels
  np.testing.assert_array_equal(decode_inception_crop(image, uniforms, True, 8, 9), image[1:9, 6:14][:, ::-1])
  png = io.BytesIO()
  Image.fromarray(image).save(png, format="PNG")
  np.testing.assert_array_equal(decode_inception_crop(png.getvalue(), uniforms, False, 8, 9), crop)


def test_flip_mirrors_a_jpeg_crop():
  data = _examples(1)[0]["image"]
  uniforms = draw_inception_crops(batch_keys(0, AUGMENTATION_STREAM, [5]), 1).uniforms[0]
  plain = decode_inception_crop(data, uniforms, False, 16, 18)
  assert plain.shape == (16, 16, 3) and plain.dtype == np.uint8
  np.testing.assert_array_equal(decode_inception_crop(data, uniforms, True, 16, 18), plain[:, ::-1])


def test_no_fitting_attempt_falls_back_to_the_centre_crop():
  image = np.random.default_rng(3).integers(0, 256, (10, 10, 3), dtype=np.uint8)
  data = _jpeg(image)
  np.testing.assert_array_equal(
    decode_inception_crop(data, _NEVER_FITS_10X10, False, 6, 8), decode_and_center_crop(data, 6, 8)
  )
  np.testing.assert_array_equal(
    decode_inception_crop(data, _NEVER_FITS_10X10, True, 6, 8), decode_and_center_crop(data, 6, 8)[:, ::-1]
  )


def test_large_jpegs_are_decoded_at_a_reduced_scale_only_when_the_crop_stays_large():
  # A 1200 x 1200 window of a 1600 x 1200 photo-like image, cropped to 100 x 100: decoded at 1/8 scale
  # (200 x 150) the window is still 150 >= 100 pixels wide; the result is close to the full-resolution crop.
  rng = np.random.default_rng(4)
  coarse = rng.integers(0, 256, (13, 17, 3), dtype=np.uint8)
  image = np.asarray(Image.fromarray(coarse).resize((1600, 1200), Image.BICUBIC))
  data = _jpeg(image)
  uniforms = np.array([[(1200 * 1200 / (1600 * 1200) - MIN_AREA) / (MAX_AREA - MIN_AREA), 0.5, 0.5, 0.0]])
  assert crop_window(1600, 1200, uniforms) == (200, 0, 1200, 1200)
  fast = decode_inception_crop(data, uniforms, False, 100, 114)
  full = np.asarray(Image.fromarray(image).resize((100, 100), Image.BILINEAR, box=(200, 0, 1400, 1200)))
  assert np.abs(fast.astype(int) - full).mean() < 3.0


def test_threads_give_the_serial_arrays():
  examples = _examples(23)
  serial = LazyImageSource(examples, image_size=16, workers=1)
  threaded = LazyImageSource(examples, image_size=16, workers=4)
  indices = np.array([5, 0, 22, 5, 13, 7, 1, 19, 3, 11, 2, 17])
  draws = draw_inception_crops(batch_keys(9, AUGMENTATION_STREAM, [0, 1, 2]), 4)
  for one, other in (
    (serial.read(indices), threaded.read(indices)),
    (serial.read_inception_crops(indices, draws), threaded.read_inception_crops(indices, draws)),
  ):
    np.testing.assert_array_equal(one[0], other[0])
    np.testing.assert_array_equal(one[1], other[1])
  with pytest.raises(ValueError, match="need one draw per index"):
    serial.read_inception_crops(indices[:5], draws)
  for bad in (0, -1, 2.0, True):
    with pytest.raises(ValueError, match=r"workers \(decoding threads\) must be a positive int"):
      LazyImageSource(examples, image_size=16, workers=bad)


def test_a_decoding_error_on_a_thread_reaches_the_caller():
  source = LazyImageSource(_examples(3) + [{"image": b"not an image", "label": 0}], image_size=16, workers=3)
  with pytest.raises(Exception, match="cannot identify image file"):
    source.read(np.arange(4))


def _lazy_dataset(examples: list[dict], workers: int) -> Dataset:
  train = LazyImageSource(examples, image_size=16, workers=workers)
  test = LazyImageSource(examples[:4], image_size=16, workers=workers)
  return Dataset(
    name="imagenet_like",
    source="tfds",
    train=train,
    test=test,
    num_classes=7,
    normalization=fit_normalization("per_channel", train),
  )


def test_learner_batches_use_the_inception_crop_on_lazy_splits_whatever_the_threads():
  examples = _examples(40)
  batches = {
    workers: LearnerBatches(_lazy_dataset(examples, workers), batch_per_learner=4, learners=3, seed=5, augment=True)
    for workers in (1, 3)
  }
  assert batches[1].augmentation == "inception_crop_flip"
  learner, k = np.array([0, 2, 1, 0]), np.array([0, 0, 4, 9])
  together = batches[1](learner, k)
  np.testing.assert_array_equal(batches[3](learner, k)["image"], together["image"])
  alone = batches[3](learner[2:3], k[2:3])  # (learner, k) alone, in another call, on other threads
  np.testing.assert_array_equal(alone["image"][0], together["image"][2])
  # The pixels are the Inception crops of (seed, g = k lambda + l, j), not the centre crops.
  global_batch = 4 * 3 + 1
  draws = draw_inception_crops(batch_keys(5, AUGMENTATION_STREAM, [global_batch]), 4)
  indices = batches[1].sample_indices(np.array([1]), np.array([4]))[0]
  expected = [
    decode_inception_crop(examples[index]["image"], draws.uniforms[j], bool(draws.flips[j]), 16, 18)
    for j, index in enumerate(indices)
  ]
  dataset = batches[1].dataset
  np.testing.assert_allclose(together["image"][2], dataset.preprocess(np.stack(expected)), rtol=0, atol=0)
  plain = LearnerBatches(dataset, batch_per_learner=4, learners=3, seed=5, augment=False)
  assert plain.augmentation == "none"
  np.testing.assert_array_equal(plain(learner, k)["image"][2], dataset.preprocess(dataset.train.read(indices)[0]))


def test_in_memory_splits_keep_the_pad_crop():
  from stalesgd.data import load_dataset

  batches = LearnerBatches(
    load_dataset("digits", source="embedded"), batch_per_learner=4, learners=2, seed=0, augment=True
  )
  assert batches.augmentation == "pad_crop_flip"
