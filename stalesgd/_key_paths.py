"""A pytree leaf's place as plain names: what a checkpoint migration, Caffe's per-layer multipliers and streaming
DiLoCo's layer fragments match on (standard library only, so every layer may import it)."""

from __future__ import annotations

from typing import Any


def key_path_names(path: tuple[Any, ...]) -> tuple[str, ...]:
  """A jax key path as strings: dict keys, NamedTuple fields and sequence indices (``("opt", "0", "lr_scale")``).

  orbax saves a NamedTuple as a dict of its fields and a tuple as a list, so a saved tree and the tree it was
  saved from spell every path alike.
  """
  names = []
  for key in path:
    for attribute in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey
      if hasattr(key, attribute):
        names.append(str(getattr(key, attribute)))
        break
    else:
      names.append(str(key))
  return tuple(names)
