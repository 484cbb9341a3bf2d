"""Array and lazy (ImageNet-style) sources, and the fitted input normalisations."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from stalesgd.data._normalization import IMAGENET_CHANNEL_MEAN, fit_normalization
from stalesgd.data._sources import ArraySource, LazyImageSource


def _encoded(array: np.ndarray, image_format: str) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format=image_format)
  return buffer.getvalue()


def test_array_source_reads_by_fancy_index_and_validates():
  images = np.arange(5 * 2 * 2, dtype=np.uint8).reshape(5, 2, 2)
  source = ArraySource(images, np.array([4, 3, 2, 1, 0]))
  read_images, labels = source.read(np.array([4, 0, 4]))
  assert source.image_shape == (2, 2, 1) and len(source) == 5
  np.testing.assert_array_equal(read_images[..., 0], images[[4, 0, 4]])
  np.testing.assert_array_equal(labels, [0, 4, 0])
  with pytest.raises(ValueError, match=r"indices must lie in \[0, 5\)"):
    source.read(np.array([5]))
  with pytest.raises(ValueError, match=r"images must be uint8 .* \(float32 for inputs that are not pixels\)"):
    ArraySource(images.astype(np.float64), np.zeros(5, int))
  features = ArraySource(np.linspace(-1, 1, 5 * 3, dtype=np.float32).reshape(5, 1, 3), np.zeros(5, int))
  assert features.float_inputs and not source.float_inputs and features.image_shape == (1, 3, 1)
  np.testing.assert_array_equal(
    features.read(np.array([1]))[0][0, 0, :, 0], np.linspace(-1, 1, 15, dtype=np.float32)[3:6]
  )
  with pytest.raises(ValueError, match="float32 inputs must be finite"):
    ArraySource(np.full((5, 1, 3), np.nan, np.float32), np.zeros(5, int))
  with pytest.raises(ValueError, match="labels must be integers"):
    ArraySource(images, np.zeros(4, int))
  with pytest.raises(ValueError, match="labels must be >= 0"):
    ArraySource(images, -np.ones(5, int))


def test_lazy_source_decodes_resizes_and_centre_crops():
  rng = np.random.default_rng(0)
  square = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
  wide = rng.integers(0, 256, (30, 50, 3), dtype=np.uint8)
  grey = rng.integers(0, 256, (20, 16), dtype=np.uint8)
  examples = [
    {"image": _encoded(square, "PNG"), "label": 3},
    {"image": _encoded(wide, "JPEG"), "label": 7},
    {"image": _encoded(grey, "JPEG"), "label": 1},
    {"image": square, "label": 2},
  ]  # already decoded, as tfds would give without SkipDecoding
  source = LazyImageSource(examples, image_size=8, resize_size=12)
  images, labels = source.read(np.array([0, 1, 2, 3]))
  assert images.shape == (4, 8, 8, 3) and images.dtype == np.uint8 and source.image_shape == (8, 8, 3)
  np.testing.assert_array_equal(labels, [3, 7, 1, 2])
  # A lossless image already at resize_size: the crop is the exact central square.
  np.testing.assert_array_equal(images[0], square[2:10, 2:10])
  np.testing.assert_array_equal(images[3], square[2:10, 2:10])
  with pytest.raises(ValueError, match="image_size <= resize_size"):
    LazyImageSource(examples, image_size=16, resize_size=12)


def test_per_pixel_mean_is_the_training_mean_image_without_scaling():
  images = np.random.default_rng(1).integers(0, 256, (50, 4, 3, 3), dtype=np.uint8)
  normalization = fit_normalization("per_pixel_mean", ArraySource(images, np.zeros(50, int)))
  np.testing.assert_allclose(normalization.offset, images.mean(axis=0), rtol=1e-6)
  np.testing.assert_allclose(normalization(images[:2]), images[:2] - images.mean(axis=0), atol=1e-4)


def test_per_channel_whitens_the_training_split():
  rng = np.random.default_rng(2)
  images = np.clip(rng.normal([40, 120, 200], [10, 30, 20], (64, 5, 5, 3)), 0, 255).astype(np.uint8)
  normalization = fit_normalization("per_channel", ArraySource(images, np.zeros(64, int)))
  normalised = normalization(images).astype(np.float64)
  np.testing.assert_allclose(normalised.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
  np.testing.assert_allclose(normalised.std(axis=(0, 1, 2)), 1.0, rtol=1e-4)


def test_unit_and_raw_scalings():
  images = np.array([[[[0], [255]]]], np.uint8)
  source = ArraySource(images, np.zeros(1, int))
  np.testing.assert_allclose(fit_normalization("unit", source)(images).ravel(), [0.0, 1.0])
  np.testing.assert_array_equal(fit_normalization("raw", source)(images).ravel(), [0.0, 255.0])


def test_lazy_sources_use_imagenet_channel_statistics_and_refuse_the_mean_image():
  source = LazyImageSource([{"image": np.zeros((8, 8, 3), np.uint8), "label": 0}], image_size=8)
  normalization = fit_normalization("per_channel", source)
  np.testing.assert_allclose(normalization.offset, 255 * IMAGENET_CHANNEL_MEAN, rtol=1e-6)
  with pytest.raises(ValueError, match="needs an in-memory training split"):
    fit_normalization("per_pixel_mean", source)
  with pytest.raises(ValueError, match="normalization must be one of"):
    fit_normalization("zca", source)


def test_statistics_equal_float64_sums_bit_for_bit():
  # The fit sums integers exactly (and squares by histogram); the numbers must be those of
  # plain float64 sums, so that a faster fit changes no run.
  images = np.random.default_rng(3).integers(0, 256, (9000, 4, 3, 3), dtype=np.uint8)  # > one chunk
  source = ArraySource(images, np.zeros(images.shape[0], int))
  wide = images.astype(np.float64)
  mean_image = wide.sum(axis=0) / images.shape[0]
  np.testing.assert_array_equal(fit_normalization("per_pixel_mean", source).offset, mean_image.astype(np.float32))
  channel_mean = mean_image.mean(axis=(0, 1))
  square_mean = np.square(wide).sum(axis=(0, 1, 2)) / (images.shape[0] * 4 * 3)
  std = np.sqrt(square_mean - np.square(channel_mean)) / 255
  per_channel = fit_normalization("per_channel", source)
  np.testing.assert_array_equal(per_channel.offset, channel_mean.astype(np.float32))
  np.testing.assert_array_equal(per_channel.scale, (1 / (255 * std)).astype(np.float32))
