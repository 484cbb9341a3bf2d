"""Streaming DiLoCo's fragments of whole layers (stalesgd/decentral/_fragments.py), their timing, and a run with them.

The small tree below has four layers of uneven sizes, created (the model's order) as Dense_2 (16), Dense_10 (10),
conv (55), out (4); jax flattens it sorted, Dense_10 before Dense_2, so its leaves in ``jax.tree`` order are
0-1 Dense_10 (bias, kernel), 2-3 Dense_2, 4-5 conv, 6-7 out. Every assignment is worked out by hand in the test.
"""

from __future__ import annotations

import itertools
import json
import random

import flax.linen as nn
import jax
import numpy as np
import pytest

from stalesgd.decentral._fragments import (
  assign_fragments,
  balanced_runs,
  fragment_layers,
  fragment_sizes,
  layers,
  model_leaf_order,
)
from stalesgd.models import ModelSpec, get_model

ORDER = (  # the model's order: created Dense_2, Dense_10, conv, out
  ("Dense_2", "kernel"),
  ("Dense_2", "bias"),
  ("Dense_10", "kernel"),
  ("Dense_10", "bias"),
  ("conv", "kernel"),
  ("conv", "bias"),
  ("out", "kernel"),
  ("out", "bias"),
)


def uneven_tree():
  shapes = {"Dense_2": ((3, 4), (4,)), "Dense_10": ((4, 2), (2,)), "conv": ((5, 10), (5,)), "out": ((3, 1), (1,))}
  return {name: {"kernel": np.zeros(kernel), "bias": np.zeros(bias)} for name, (kernel, bias) in shapes.items()}


# First in the file: a loop that never ends (the bisection, the common prefix) fails here within seconds (a test
# failure) instead of hanging a test below until the run's timeout.
@pytest.mark.timeout(20)
def test_the_loops_end():
  """Bounds tried for [5, 5] in 2 runs, a single run of 3, 4 and of 2, 2, 2, 2 (the odd bounds 5 and 7 refused in
  turn before 8), and sums past 256 (ints compared by value: the bisection over [300, 300] ends at B = 300); the
  common prefix of a nested tree (one wrapping name, ``params``)."""
  assert balanced_runs([5, 5], 2) == (0, 1)
  assert balanced_runs([3, 4], 1) == (0, 0)
  assert balanced_runs([2, 2, 2, 2], 1) == (0, 0, 0, 0)
  assert balanced_runs([1, 2, 3], 3) == (0, 1, 2)
  assert balanced_runs([300, 300], 2) == (0, 1)
  assert [layer.name for layer in layers({"params": uneven_tree()})] == ["Dense_10", "Dense_2", "conv", "out"]


def test_layers_keep_kernel_and_bias_together_in_the_models_order():
  tree = uneven_tree()
  found = layers(tree, ORDER)
  assert [(layer.name, layer.leaves, layer.size) for layer in found] == [
    ("Dense_2", (2, 3), 16),
    ("Dense_10", (0, 1), 10),
    ("conv", (4, 5), 55),
    ("out", (6, 7), 4),
  ]
  assert [layer.name for layer in layers(tree)] == ["Dense_10", "Dense_2", "conv", "out"]  # no order: jax's


@pytest.mark.parametrize(
  "pattern, fragments, owner, sizes",
  [
    # strided: Dense_2 -> 0, Dense_10 -> 1, conv -> 0, out -> 1 (P = 2); with P = 3, out -> 0
    ("strided", 1, (0,) * 8, (85,)),
    ("strided", 2, (1, 1, 0, 0, 0, 0, 1, 1), (71, 14)),
    ("strided", 3, (1, 1, 0, 0, 2, 2, 0, 0), (20, 10, 55)),
    ("strided", 4, (1, 1, 0, 0, 2, 2, 3, 3), (16, 10, 55, 4)),
    # sequential over 16, 10, 55, 4: P = 2 cuts 16 10 | 55 4 (max 59; 16 | 69 and 81 | 4 are worse); P = 3 cuts
    # 16 10 | 55 | 4 (max 55; 16 | 10 | 59 and 16 | 65 | 4 are worse)
    ("sequential", 2, (0, 0, 0, 0, 1, 1, 1, 1), (26, 59)),
    ("sequential", 3, (0, 0, 0, 0, 1, 1, 2, 2), (26, 55, 4)),
    # the rule before layers: array i in fragment i mod P; sorted, each bias comes before its kernel, so the
    # biases (2 + 4 + 5 + 1) are one fragment and the kernels (8 + 12 + 50 + 3) the other
    ("array_strided", 2, (0, 1, 0, 1, 0, 1, 0, 1), (12, 73)),
  ],
)
def test_hand_computed_assignments(pattern, fragments, owner, sizes):
  tree = uneven_tree()
  got = assign_fragments(tree, fragments, pattern, ORDER)
  assert got == owner
  assert fragment_sizes(tree, got) == sizes
  if pattern != "array_strided":  # kernel (odd jax index) and bias (even) of a layer together
    assert all(got[i] == got[i + 1] for i in range(0, 8, 2))


@pytest.mark.parametrize(
  "pattern, owner",
  [("strided", (1, 1, 0, 0, 0, 0, 1, 1)), ("sequential", (0, 0, 0, 0, 1, 1, 1, 1)), ("array_strided", (0, 1) * 4)],
)
def test_a_pattern_read_at_run_time_is_compared_by_value(pattern, owner):
  """A flag or a config file gives a new str equal to the pattern's name, not the literal itself (P = 2, as above)."""
  fresh = "".join(list(pattern))
  assert fresh is not pattern
  assert assign_fragments(uneven_tree(), 2, fresh, ORDER) == owner


def test_fragment_layers_name_each_fragments_layers_in_the_models_order():
  tree = uneven_tree()
  assert fragment_layers(tree, assign_fragments(tree, 2, "strided", ORDER), ORDER) == (
    ("Dense_2", "conv"),
    ("Dense_10", "out"),
  )
  assert fragment_layers(tree, assign_fragments(tree, 3, "strided", ORDER), ORDER) == (
    ("Dense_2", "out"),
    ("Dense_10",),
    ("conv",),
  )
  assert fragment_layers(tree, assign_fragments(tree, 1, "strided", ORDER), ORDER) == (
    ("Dense_2", "Dense_10", "conv", "out"),
  )
  # array_strided parts every layer: each bias (even jax index) in fragment 0, each kernel in 1
  assert (
    fragment_layers(tree, assign_fragments(tree, 2, "array_strided"), ORDER)
    == (("Dense_2[part]", "Dense_10[part]", "conv[part]", "out[part]"),) * 2
  )


def test_the_balanced_sequential_split_minimises_the_largest_fragment():
  """Against every contiguous partition, for 300 random size lists of 1-9 layers and every P."""
  generator = random.Random(0)
  for _ in range(300):
    sizes = [generator.choice([1, 2, 3, 10, 50, 400]) * generator.randint(1, 5) for _ in range(generator.randint(1, 9))]
    for parts in range(1, len(sizes) + 1):
      owner = balanced_runs(sizes, parts)
      assert list(owner) == sorted(owner) and set(owner) == set(range(parts))  # contiguous, non-empty, P of them
      largest = max(sum(s for s, p in zip(sizes, owner) if p == q) for q in range(parts))
      best = min(
        max(sum(sizes[a:b]) for a, b in zip((0,) + cuts, cuts + (len(sizes),)))
        for cuts in itertools.combinations(range(1, len(sizes)), parts - 1)
      )
      assert largest == best, (sizes, parts, owner)


def test_the_balanced_split_leaves_one_layer_per_fragment_when_it_must_past_256_layers():
  """299 layers of 1 then one of 300, P = 280: the bound is 300, so the first fragment could take all 299 small
  layers, but 279 fragments must follow it: it stops at 21 layers and every later layer is a fragment of its own.
  (Counts past 256 are ints Python does not cache: compared by value, not identity.)"""
  assert balanced_runs([1] * 299 + [300], 280) == (0,) * 21 + tuple(range(1, 280))


def test_a_bound_too_small_for_more_than_256_fragments_is_refused_by_value():
  """600 layers of 1, P = 300: B = 2, two layers a fragment. The bisection first tries bounds below 2 (bound 1 would
  need 600 runs): the fill stops when its run count reaches P = 300, an int Python does not cache, so only a
  comparison by value refuses the bound."""
  assert balanced_runs([1] * 600, 300) == tuple(index // 2 for index in range(600))


def test_the_bisection_is_over_integers_past_the_precision_of_floats():
  """Sizes a, 1, 6, a with a = 2**53 + 1 (float64 holds integers exactly only to 2**53), P = 2. The cuts give
  a | 1 6 a: a + 7; a 1 | 6 a: a + 6; a 1 6 | a: a + 7. So B = a + 6 = 2**53 + 7 and the runs are (0, 0, 1, 1); a
  float cannot hold 2**53 + 7, and a bisection with a float midpoint returns (0, 0, 0, 1)."""
  a = 2**53 + 1
  assert balanced_runs([a, 1, 6, a], 2) == (0, 0, 1, 1)


def test_errors_name_the_field_and_what_is_allowed():
  tree = uneven_tree()
  with pytest.raises(ValueError, match=r"config\.outer\.fragments=5; allowed: an integer >= 1 and <= layers=4"):
    assign_fragments(tree, 5, "strided", ORDER, field="config.outer.fragments")
  with pytest.raises(ValueError, match=r"fragments=9; allowed: .*<= arrays=8"):
    assign_fragments(tree, 9, "array_strided")
  for pattern in ("strided", "sequential", "array_strided"):
    with pytest.raises(ValueError, match=r"fragments=0; allowed: an integer >= 1"):
      assign_fragments(tree, 0, pattern, ORDER)
  assert assign_fragments(tree, 1, "array_strided") == (0,) * 8  # P = 1 is allowed
  with pytest.raises(TypeError):  # the error's field only by name
    assign_fragments(tree, 2, "strided", ORDER, "config.outer.fragments")
  by_name = assign_fragments(params=tree, fragments=2, pattern="strided", order=ORDER, field="fragments")
  assert by_name == (1, 1, 0, 0, 0, 0, 1, 1)
  with pytest.raises(ValueError, match=r"fragment_pattern='layers'; allowed: one of \('strided', 'sequential'"):
    assign_fragments(tree, 2, "layers")
  with pytest.raises(
    ValueError,
    match=r"names 2 arrays, not the 8 of the weights \(first of the weights: "
    r"\[\('Dense_10', 'bias'\), \('Dense_10', 'kernel'\), \('Dense_2', 'bias'\)\]\)",
  ):
    layers(tree, ORDER[:2])
  with pytest.raises(ValueError, match="the model's parameter order names 6 arrays, not the 8"):
    layers(tree, ORDER[:-2])  # a sorted prefix of the weights' paths: fewer, not other
  with pytest.raises(ValueError, match=r"parts=0; allowed: 1 to the number of sizes, 2"):
    balanced_runs([3, 4], 0)
  with pytest.raises(ValueError, match="shorter than argument 1"):  # one fragment per leaf, not fewer
    fragment_sizes(tree, (0,) * 7)


def test_a_single_wrapping_module_is_looked_through_and_arrays_are_layers_of_their_own():
  wrapped = {"Net": {"a": {"kernel": np.zeros(3), "bias": np.zeros(1)}, "b": {"kernel": np.zeros(2)}}}
  assert [(layer.name, layer.size) for layer in layers(wrapped)] == [("a", 4), ("b", 2)]
  created = (("Net", "b", "kernel"), ("Net", "a", "kernel"), ("Net", "a", "bias"))  # b first, below the wrapper
  assert [(layer.name, layer.leaves) for layer in layers(wrapped, created)] == [("b", (2,)), ("a", (0, 1))]
  flat = {"w": np.zeros(2), "v": np.zeros((2, 2)), "u": np.zeros(3)}
  assert [(layer.name, layer.size) for layer in layers(flat)] == [("u", 3), ("v", 4), ("w", 2)]
  assert assign_fragments(flat, 3) == (0, 1, 2)  # one array per layer: the per-array rule
  # One array: the prefix dropped is all of its path but its own name, which names the layer (paths of 2 and 3).
  for single in ({"dense": {"kernel": np.zeros((2, 3))}}, {"Net": {"dense": {"kernel": np.zeros((2, 3))}}}):
    assert [(layer.name, layer.leaves, layer.size) for layer in layers(single)] == [("kernel", (0,), 6)]
  assert layers({}) == ()  # no leaves: no layers


class _NamedAgainstSorting(nn.Module):
  """Layers created Dense_2, Dense_10, a_out: sorted, Dense_10 would come first."""

  @nn.compact
  def __call__(self, images, *, train):
    del train
    x = images.reshape(images.shape[0], -1)
    x = nn.relu(nn.Dense(5, name="Dense_2")(x))
    x = nn.relu(nn.Dense(3, name="Dense_10")(x))
    return nn.Dense(2, name="a_out")(x)


def test_the_order_is_the_models_not_the_sorted_one():
  model = ModelSpec(name="t", module=_NamedAgainstSorting(), num_classes=2, default_image_shape=(2, 2, 1))
  params = model.init(jax.random.key(0))["params"]  # jitted: its dict comes back sorted
  assert list(params) == ["Dense_10", "Dense_2", "a_out"]
  order = model_leaf_order(model)
  assert [layer.name for layer in layers(params, order)] == ["Dense_2", "Dense_10", "a_out"]
  # strided over (Dense_2: 25, Dense_10: 18, a_out: 8): Dense_2 and a_out in fragment 0
  assert fragment_sizes(params, assign_fragments(params, 2, "strided", order)) == (33, 18)
  # sorted it would have been (Dense_10 + a_out, Dense_2) = (26, 25)
  assert fragment_sizes(params, assign_fragments(params, 2, "strided")) == (26, 25)


class _AuxiliaryHeadInTraining(nn.Module):
  """hidden, then out; in training also an auxiliary classifier on hidden (as GoogLeNet's), which inference skips."""

  @nn.compact
  def __call__(self, images, *, train):
    x = nn.Dense(3, name="hidden")(images.reshape(images.shape[0], -1))
    if train:
      x = x + nn.Dense(3, name="auxiliary")(x)
    return nn.Dense(2, name="out")(x)


def test_the_order_is_read_in_inference_mode_as_the_models_init_creates_its_weights():
  """ModelSpec.init creates the weights with train=False, so a training-only head is not among them; the order
  names exactly those weights, and layers() accepts it for them."""
  model = ModelSpec(name="t", module=_AuxiliaryHeadInTraining(), num_classes=2, default_image_shape=(2, 2, 1))
  order = model_leaf_order(model)
  assert order == (("hidden", "kernel"), ("hidden", "bias"), ("out", "kernel"), ("out", "bias"))
  params = model.init(jax.random.key(0))["params"]
  assert [layer.name for layer in layers(params, order)] == ["hidden", "out"]


def test_a_zoo_resnets_blocks_come_in_forward_order():
  """resnet110's stage1_block10 sorts before stage1_block2; its layers are its stem, 54 blocks, its classifier."""
  model = get_model("resnet110", num_classes=10)
  found = layers(model.parameter_shapes(), model_leaf_order(model))
  names = [layer.name for layer in found]
  assert names[:4] == ["conv_init", "bn_init", "stage1_block1", "stage1_block2"]
  assert names[11] == "stage1_block10" and names[-1] == "classifier" and len(names) == 57


# -- a run


@pytest.mark.slow  # a whole training run (5 epochs of the digits)
def test_a_streaming_run_of_a_zoo_model_with_two_fragments_of_layers_trains(tmp_path):
  """small_cnn on the 8x8 digits, P = 2 strided layers (conv1 + hidden, conv2 + classifier): the run's log and
  summary give the fragments' sizes, its schedule times them, and the test error falls below chance."""
  from stalesgd.configs import diloco_digits
  from stalesgd.training import build_run, train_and_evaluate

  config = diloco_digits.get_config("streaming_p2_tau1_alpha0.5")
  config.num_epochs, config.eval_every_epochs = 5.0, 5.0
  summary = train_and_evaluate(config, str(tmp_path))
  assert summary["fragments"] == {
    "pattern": "strided",
    "parameters": [320 + 32_896, 18_496 + 1_290],
    "layers": [["conv1", "hidden"], ["conv2", "classifier"]],
  }
  assert summary["test_error"] < 50  # percent; chance is 90
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert saved["fragments"]["parameters"] == [33_216, 19_786]
  assert build_run(config).schedule.options["fragment_bytes"] == [4 * 33_216, 4 * 19_786]


# -- an old run directory


def _saved_before_fragment_pattern(config):
  saved = json.loads(config.to_json())
  del saved["outer"]["fragment_pattern"]
  return saved


def test_an_old_streaming_workdir_with_fragments_is_refused_with_the_way_to_resume_it(tmp_path):
  """config.json of a P = 2 streaming run saved before fragment_pattern: it ran array_strided, so today's default
  (strided layers) is another run, refused naming the flag; with the flag it resumes. A P = 1 run (any pattern is
  the same) and a diloco run resume as they are."""
  from stalesgd.training._workdir import check_same_run, config_changes
  from tests.helpers.train_helpers import tiny_config

  streaming = tiny_config("hardsync", protocol="streaming_diloco", local_steps=2)
  streaming.outer.fragments = 2
  (tmp_path / "config.json").write_text(json.dumps(_saved_before_fragment_pattern(streaming)))
  with pytest.raises(
    ValueError, match=r"outer: .*'fragment_pattern': 'array_strided'.*--config\.outer\.fragment_pattern=array_strided"
  ):
    check_same_run(streaming, tmp_path)
  streaming.outer.fragment_pattern = "array_strided"
  check_same_run(streaming, tmp_path)
  one = tiny_config("hardsync", protocol="streaming_diloco", local_steps=2)
  assert config_changes(_saved_before_fragment_pattern(one), one) == []
  diloco = tiny_config("hardsync", protocol="diloco", local_steps=2)
  assert config_changes(_saved_before_fragment_pattern(diloco), diloco) == []


def test_the_streaming_program_checks_the_assignment_it_is_given():
  from stalesgd.decentral._streaming import fragment_of_leaves

  assert fragment_of_leaves(4, 2) == (0, 1, 0, 1)  # none given: strided over arrays
  assert fragment_of_leaves(4, 2, (1, 1, 0, 0)) == (1, 1, 0, 0)
  for bad in ((0, 0, 0, 0), (0, 1, 0), (0, 1, 2, 0)):
    with pytest.raises(ValueError, match=r"fragment_of_leaf=.*; allowed: one fragment per leaf \(4\)"):
      fragment_of_leaves(4, 2, bad)
  # The allowed fragments are named 0..P-1: with P = 4, fragment 3 holds no leaf here.
  with pytest.raises(ValueError, match=r"one fragment per leaf \(5\), each of 0\.\.3 holding one"):
    fragment_of_leaves(5, 4, (0, 1, 2, 2, 2))


def test_each_fragments_leaves_are_grouped_in_leaf_order_beyond_small_ints():
  from stalesgd.decentral._streaming import leaves_of_fragments

  assert leaves_of_fragments(4, 2) == ((0, 2), (1, 3))
  assert leaves_of_fragments(4, 2, (1, 1, 0, 0)) == ((2, 3), (0, 1))
  # 300 fragments of 600 leaves: indices and fragments past CPython's cached small ints (up to 256), where a
  # grouping by identity ('is') rather than by value would lose leaves.
  assert leaves_of_fragments(600, 300) == tuple((p, p + 300) for p in range(300))
  backwards = tuple((599 - index) // 2 for index in range(600))
  assert leaves_of_fragments(600, 300, backwards) == tuple((598 - 2 * p, 599 - 2 * p) for p in range(300))
  with pytest.raises(ValueError, match=r"fragment_of_leaf=.*; allowed: one fragment per leaf \(4\)"):
    leaves_of_fragments(4, 2, (0, 0, 0, 0))  # the assignment is checked
