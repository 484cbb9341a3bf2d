r"""Streaming DiLoCo's fragments: which weight arrays are synced together, formed of whole layers.

Douillard et al. (*Streaming DiLoCo*, arXiv 2501.18512, §2.2) split the model into P fragments of whole layers
(transformer blocks) and compare two patterns, sequential (fragment p holds a contiguous run of layers) and strided
(layer j in fragment j mod P), preferring strided, mildly. This module forms them for any params pytree.

* **A layer** is one entry of the params tree's first level: flax's ``{"conv1": {"kernel", "bias"}, ...}`` gives
  one layer per module the model calls, so a kernel and its bias (and a residual block's convolutions, batch norms
  and shortcut, each block one entry in the zoo's ResNets) stay together. A first level of one entry (a model
  wrapping everything in one submodule) is looked through: the layers are the entries of the first level with
  more than one (the longest common prefix of the leaves' key paths is dropped). An array on that level is a layer
  of its own.
* **The layers' order** is the model's: the order in which the model's ``init`` creates its parameters, which is
  the insertion order of the params dict that the flax module's un-jitted ``init`` returns (a submodule's
  variables are created when it is first called, so this is the forward pass's call order; `model_leaf_order`
  records it during an abstract trace). It is not the order of ``jax.tree.leaves``: jax flattens a dict in sorted
  key order, and `stalesgd.models.ModelSpec.init` is jitted, so the params a run holds come back sorted
  (``classifier`` before ``conv1``). Without an order, the tree's own order is used (sorted, for a dict).
* **Patterns** (`FRAGMENT_PATTERNS`): ``strided`` (the default, the paper's preference): layer j in fragment
  j mod P. ``sequential``: contiguous runs of layers, balanced so that the largest fragment (in parameters) is as
  small as it can be (`balanced_runs`: the smallest bound a greedy front-to-back fill meets, found by bisection;
  exact). ``array_strided``: the rule before fragments were formed of layers, array i of ``jax.tree.leaves`` in
  fragment i mod P (a kernel and its bias may part; kept to resume and reproduce runs made with it).

P may not exceed the number of layers (for ``array_strided``, of arrays). The assignment is returned as each
leaf's fragment in ``jax.tree`` leaf order, what `stalesgd.decentral._streaming` takes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from stalesgd import _validation as validation
from stalesgd._key_paths import key_path_names

FRAGMENT_PATTERNS = ("strided", "sequential", "array_strided")
"""``config.outer.fragment_pattern``'s values (module docstring)."""
DEFAULT_FRAGMENT_PATTERN = "strided"
LEGACY_FRAGMENT_PATTERN = "array_strided"
"""What streaming DiLoCo ran before fragments were formed of layers."""

Path = tuple[str, ...]


class Layer(NamedTuple):
  """One layer: its name (key path below the dropped common prefix, joined by ``/``), its leaves' indices in
  ``jax.tree`` leaf order, and its number of parameters."""

  name: str
  leaves: tuple[int, ...]
  size: int


def _dict_leaf_paths(tree: Any, prefix: Path = ()) -> list[Path]:
  """The key paths of a nested mapping's leaves in insertion order (jax would sort them)."""
  if isinstance(tree, Mapping):
    return [path for key, value in tree.items() for path in _dict_leaf_paths(value, prefix + (str(key),))]
  return [prefix]


def model_leaf_order(model: Any, image_shape: tuple[int, int, int] | None = None) -> tuple[Path, ...]:
  """The key paths of ``model``'s params in the order its ``init`` creates them (module docstring).

  ``model``: a `stalesgd.models.ModelSpec` (its flax ``module``, called as ``module.init(rng, images,
  train=False)``, as ``ModelSpec.init`` does, but un-jitted, under `jax.eval_shape`: nothing is allocated).
  """
  shape = tuple(image_shape or model.default_image_shape)
  order: list[Path] = []

  def init(rng):
    variables = model.module.init(rng, jnp.zeros((1, *shape), jnp.float32), train=False)
    order.extend(_dict_leaf_paths(variables["params"]))  # still the dict flax built, in creation order
    return variables["params"]

  jax.eval_shape(init, jax.random.key(0))
  return tuple(order)


def _common_prefix(paths: Sequence[Path]) -> int:
  """The length of the longest common prefix of ``paths`` (a single path: all but its last name)."""
  if len(paths) == 1:
    return len(paths[0]) - 1 if paths[0] else 0
  length = 0
  while all(len(path) > length for path in paths) and len({path[length] for path in paths}) == 1:
    length += 1
  return length


def layers(params: Any, order: Sequence[Path] | None = None) -> tuple[Layer, ...]:
  """``params``' layers (module docstring) in the model's order.

  Args:
    params: the weights, any pytree.
    order: key paths of its leaves in the model's order (`model_leaf_order`); a layer's place is that of its
      first leaf there. None: the tree's own leaf order.

  Raises:
    ValueError: if ``order`` does not name exactly the tree's leaves.
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  paths = [key_path_names(path) for path, _ in flat]
  sizes = [math.prod(jnp.shape(leaf)) for _, leaf in flat]
  if order is not None and sorted(map(tuple, order)) != sorted(paths):
    raise ValueError(
      f"the model's parameter order names {len(order)} arrays, not the {len(paths)} of the weights "
      f"(first of the weights: {paths[:3]}); allowed: the key paths of the same tree"
    )
  cut = _common_prefix(paths) if paths else 0
  members: dict[Path, list[int]] = {}
  for index, path in enumerate(paths):
    members.setdefault(path[: cut + 1], []).append(index)
  ranked = list(members)
  if order is not None:
    first = {}
    for place, path in enumerate(order):
      first.setdefault(tuple(path)[: cut + 1], place)
    ranked.sort(key=first.__getitem__)
  return tuple(Layer("/".join(key[cut:]), tuple(members[key]), sum(sizes[i] for i in members[key])) for key in ranked)


def balanced_runs(sizes: Sequence[int], parts: int) -> tuple[int, ...]:
  """Each item's part when ``sizes`` are cut into ``parts`` non-empty contiguous runs whose largest sum is as
  small as it can be (1 <= parts <= len(sizes)).

  The bound is the smallest B for which a fill from the front (each run takes items while its sum stays <= B and
  enough items remain for the runs after it) uses at most ``parts`` runs, found by bisection over integers; that
  fill at B is returned (of the partitions with the smallest maximum, the one whose runs end as late as they can,
  front to back). A run's sum never exceeds B: the fill reaches at least as far as any partition bounded by B,
  and where enough items must be left, each is a run of its own, and no item exceeds B.
  """
  sizes = [int(size) for size in sizes]
  if not 1 <= parts <= len(sizes):
    raise ValueError(f"parts={parts}; allowed: 1 to the number of sizes, {len(sizes)}")

  def fill(bound: int) -> list[int] | None:
    owner, part, total = [], 0, 0
    for index, size in enumerate(sizes):
      remaining_items, remaining_parts = len(sizes) - index, parts - part - 1
      if owner and (total + size > bound or remaining_items <= remaining_parts):
        part, total = part + 1, 0
        if part == parts:
          return None
      owner.append(part)
      total += size
    return owner if total <= bound else None

  low, high = max(sizes), sum(sizes)
  while low < high:
    middle = (low + high) // 2
    if fill(middle) is None:
      low = middle + 1
    else:
      high = middle
  return tuple(fill(low))


def assign_fragments(
  params: Any,
  fragments: int,
  pattern: str = DEFAULT_FRAGMENT_PATTERN,
  order: Sequence[Path] | None = None,
  *,
  field: str = "fragments",
) -> tuple[int, ...]:
  """Each leaf's fragment, in ``jax.tree`` leaf order (module docstring).

  Args:
    params: the weights.
    fragments: P.
    pattern: one of `FRAGMENT_PATTERNS`.
    order: the model's leaf order (`model_leaf_order`), or None for the tree's own.
    field: how an error names P (e.g. ``"config.outer.fragments"``).

  Raises:
    ValueError: naming ``field`` (and the number of layers) if P exceeds the layers, or naming the pattern.
  """
  pattern = validation.check_choice("fragment_pattern", pattern, FRAGMENT_PATTERNS)
  if pattern == "array_strided":
    count = len(jax.tree.leaves(params))
    fragments = validation.check_integer(field, fragments, low=1, high=count, high_label="arrays")
    return tuple(index % fragments for index in range(count))
  found = layers(params, order)
  fragments = validation.check_integer(field, fragments, low=1, high=len(found), high_label="layers")
  if pattern == "strided":
    of_layer = tuple(j % fragments for j in range(len(found)))
  else:
    of_layer = balanced_runs([layer.size for layer in found], fragments)
  owner = [0] * sum(len(layer.leaves) for layer in found)
  for layer, fragment in zip(found, of_layer):
    for index in layer.leaves:
      owner[index] = fragment
  return tuple(owner)


def fragment_sizes(params: Any, owner: Sequence[int]) -> tuple[int, ...]:
  """Parameters in each fragment, given each leaf's fragment (`assign_fragments`)."""
  sizes = [0] * (max(owner) + 1)
  for leaf, fragment in zip(jax.tree.leaves(params), owner, strict=True):
    sizes[fragment] += math.prod(jnp.shape(leaf))
  return tuple(sizes)


def fragment_layers(
  params: Any, owner: Sequence[int], order: Sequence[Path] | None = None
) -> tuple[tuple[str, ...], ...]:
  """The layers' names in each fragment, in the model's order (for logs; arrays named by path where a layer is
  split, as ``array_strided`` may)."""
  names: list[list[str]] = [[] for _ in range(max(owner) + 1)]
  for layer in layers(params, order):
    parts = sorted({owner[index] for index in layer.leaves})
    for fragment in parts:
      names[fragment].append(layer.name if len(parts) == 1 else f"{layer.name}[part]")
  return tuple(tuple(group) for group in names)
