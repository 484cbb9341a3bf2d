"""The validation split held out of the training data (stalesgd.data._validation_split)."""

import numpy as np
import pytest

from stalesgd.data import load_dataset
from stalesgd.data._sources import ArraySource
from stalesgd.data._validation_split import VALIDATION_SPLIT_SEED, hold_out_validation


def _numbered(size: int) -> ArraySource:
  """Images whose single pixel is their index, so each example can be told apart."""
  return ArraySource(np.arange(size, dtype=np.uint8).reshape(size, 1, 1, 1), np.arange(size) % 3)


def test_the_held_out_share_is_the_first_of_the_fixed_permutation_and_the_rest_trains():
  kept, held_out = hold_out_validation(_numbered(10), 0.3)
  order = np.random.default_rng(VALIDATION_SPLIT_SEED).permutation(10)
  assert held_out.images.ravel().tolist() == sorted(order[:3].tolist())
  assert kept.images.ravel().tolist() == sorted(order[3:].tolist())
  assert held_out.labels.tolist() == [index % 3 for index in sorted(order[:3].tolist())]


def test_the_two_parts_are_disjoint_and_cover_the_training_split():
  kept, held_out = hold_out_validation(_numbered(200), 0.2)
  assert len(held_out) == 40 and len(kept) == 160
  together = sorted(kept.images.ravel().tolist() + held_out.images.ravel().tolist())
  assert together == list(range(200))


def test_the_split_does_not_depend_on_anything_but_the_fraction():
  first = hold_out_validation(_numbered(50), 0.2)[1].images.ravel().tolist()
  second = hold_out_validation(_numbered(50), 0.2)[1].images.ravel().tolist()
  assert first == second


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 0.01])
def test_a_fraction_that_holds_out_nothing_or_everything_is_refused(fraction):
  with pytest.raises(ValueError, match="validation_fraction"):
    hold_out_validation(_numbered(10), fraction)


def test_a_lazily_read_split_is_refused():
  class Lazy:
    image_shape = (1, 1, 1)

    def __len__(self):
      return 10

  with pytest.raises(ValueError, match="held in memory"):
    hold_out_validation(Lazy(), 0.2)


def test_load_dataset_evaluates_on_the_held_out_examples_and_never_on_the_test_split():
  full = load_dataset("digits", source="embedded")
  carved = load_dataset("digits", source="embedded", validation_fraction=0.2)
  assert carved.evaluation_split == "validation" and full.evaluation_split == "test"
  assert carved.num_train + carved.num_test == full.num_train
  test_rows = {row.tobytes() for row in full.test.images}
  train_rows = {row.tobytes() for row in full.train.images}
  assert all(row.tobytes() in train_rows for row in carved.test.images)
  # The digits hold a few identical images in both splits; the held-out ones come from the training split anyway.
  assert sum(row.tobytes() in test_rows for row in carved.test.images) < len(carved.test.images) // 10
  assert carved.description()["evaluation_split"] == "validation"
  assert "evaluation_split" not in full.description()
