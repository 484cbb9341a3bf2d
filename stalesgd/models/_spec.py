"""`ModelSpec`: everything the trainer and the engine need from a model.

The trainer and the emulator never look inside a network. They initialise it,
differentiate a loss that is a pure function of (params, batch), evaluate it,
and read per-parameter learning-rate and weight-decay multipliers. A `ModelSpec`
bundles those functions around a flax module whose call signature is
``module(images, *, train: bool) -> logits``.

Batch normalisation (see `stalesgd.models._batch_norm`) uses batch statistics in
the training forward, so ``loss_fn`` needs only the parameters and the batch.
Dropout, where a model uses it, draws its mask from the batch's
``"dropout_seed"`` (`stalesgd.data.LearnerBatches` with ``dropout_seeds=True``
derives it from (seed, learner, k)), so a gradient recomputed at the same
weights on the same batch is the same number. Evaluation uses
population statistics recomputed at the evaluated weights by
`ModelSpec.batch_stats_for_eval` ("precise BN", Wu & Johnson,
arXiv 2105.07576). For models without batch normalisation those statistics are
an empty dict and ``predict`` needs only ``{"params": params}``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from stalesgd._key_paths import key_path_names
from stalesgd.models._batch_norm import MOMENTS_COLLECTION

Params = Any
Variables = dict[str, Any]
Batch = Mapping[str, jax.Array]
MultiplierRule = Callable[[tuple[str, ...]], float]
"""Maps a parameter's path of names, e.g. ``("conv1", "bias")``, to a multiplier."""
MultiplierSet = tuple[MultiplierRule, MultiplierRule]
"""A named source's (learning-rate rule, weight-decay rule), e.g. Caffe's prototxt or Rudra's release file."""
LossFunction = Callable[[jax.Array, jax.Array], Mapping[str, jax.Array]]
"""A user's loss: ``(outputs [B, ...], labels [B]) -> {"loss": [B], metric: [B], ...}``, per example
(`stalesgd.models._loss`); training minimises the batch mean of ``"loss"``, evaluation reports every mean."""


def unit_multiplier(path: tuple[str, ...]) -> float:
  """The default rule: every parameter gets multiplier 1.0."""
  del path
  return 1.0


def _validated_image_shape(image_shape: tuple[int, ...]) -> tuple[int, int, int]:
  shape = tuple(image_shape)
  if len(shape) != 3 or not all(isinstance(side, int) and side > 0 for side in shape):
    raise ValueError(f"image_shape must be (height, width, channels) of positive ints; got {image_shape!r}")
  return shape  # type: ignore[return-value]


@functools.partial(jax.jit, static_argnums=1)
def _divide(tree: Any, count: int) -> Any:
  """Every leaf of ``tree`` divided by ``count``, as one program."""
  return jax.tree.map(lambda value: value / count, tree)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelSpec:
  """A classifier as the trainer and the engine see it.

  Attributes:
    name: registry name, e.g. ``"cifar10_full"``.
    module: flax module, ``module(images, *, train) -> logits [B, num_classes]``.
    num_classes: number of output classes.
    default_image_shape: (height, width, channels) the model was designed for.
    learning_rate_rule: per-parameter learning-rate multiplier by path.
    weight_decay_rule: per-parameter weight-decay multiplier by path.
    uses_dropout: whether the training forward needs ``batch["dropout_seed"]``.
    loss: a user's loss and metrics (`LossFunction`); None: softmax cross-entropy on class labels.
    multiplier_sets: the multipliers of each source the model was published with, by name (``"rudra"``,
      ``"caffe"``); the rules above are the default source's. `with_multiplier_set` selects another.
  """

  name: str
  module: nn.Module
  num_classes: int | None
  default_image_shape: tuple[int, int, int]
  learning_rate_rule: MultiplierRule = unit_multiplier
  weight_decay_rule: MultiplierRule = unit_multiplier
  uses_dropout: bool = False
  loss: LossFunction | None = None
  multiplier_sets: Mapping[str, MultiplierSet] = dataclasses.field(default_factory=dict)

  def with_multiplier_set(self, name: str) -> ModelSpec:
    """This model with the learning-rate and weight-decay rules of the source ``name``.

    Raises:
      ValueError: naming the allowed sources, if the model has no set ``name``.
    """
    if name not in self.multiplier_sets:
      allowed = ", ".join(repr(source) for source in self.multiplier_sets) or "none (one set of multipliers only)"
      raise ValueError(f"model {self.name!r} has no multiplier set {name!r}; allowed: {allowed}")
    learning_rate_rule, weight_decay_rule = self.multiplier_sets[name]
    return dataclasses.replace(self, learning_rate_rule=learning_rate_rule, weight_decay_rule=weight_decay_rule)

  def init(self, rng: jax.Array, image_shape: tuple[int, int, int] | None = None) -> Variables:
    """Initial variables: ``{"params": ...}`` plus ``"batch_stats"`` for BN models.

    Args:
      rng: a PRNG key.
      image_shape: (height, width, channels); `default_image_shape` if None.

    Returns:
      A dict of variable collections.
    """
    shape = _validated_image_shape(image_shape or self.default_image_shape)
    return self._jitted_init(rng, jnp.zeros((1, *shape), jnp.float32))

  @functools.cached_property
  def _jitted_init(self) -> Callable[[jax.Array, jax.Array], Variables]:
    # One compiled program instead of one dispatch per initialiser: much faster
    # for deep models on a CPU.
    def init(rng: jax.Array, images: jax.Array) -> Variables:
      variables = self.module.init(rng, images, train=False)
      return {collection: variables[collection] for collection in ("params", "batch_stats") if collection in variables}

    return jax.jit(init)

  def parameter_shapes(self, image_shape: tuple[int, int, int] | None = None) -> Params:
    """The params pytree as `jax.ShapeDtypeStruct` leaves, without allocating it."""
    shapes = jax.eval_shape(functools.partial(self.init, image_shape=image_shape), jax.random.key(0))
    return shapes["params"]

  def num_parameters(self, image_shape: tuple[int, int, int] | None = None) -> int:
    """Number of trainable scalars (evaluated abstractly with `jax.eval_shape`)."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(self.parameter_shapes(image_shape)))

  @functools.cached_property
  def has_batch_norm(self) -> bool:
    """Whether the model has batch-normalisation statistics."""
    shapes = jax.eval_shape(self.init, jax.random.key(0))
    return bool(jax.tree.leaves(shapes.get("batch_stats", {})))

  def loss_fn(self, params: Params, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Mean softmax cross-entropy of the training-mode forward (or the mean of `loss`'s ``"loss"``).

    L(w) = -(1/B) sum_b log softmax(f(w, x_b))[y_b], with batch-normalised layers
    using the batch's own statistics; pure in ``params``.

    Args:
      params: the ``"params"`` collection.
      batch: ``{"image": float32 [B, H, W, C], "label": int32 [B]}``, plus
        ``"dropout_seed"`` (uint32 scalar) when `uses_dropout`.

    Returns:
      (loss, logits [B, num_classes]).
    """
    rngs = {}
    if self.uses_dropout:
      if "dropout_seed" not in batch:
        raise ValueError(
          f"model {self.name!r} uses dropout: its batches need a 'dropout_seed' "
          "(LearnerBatches(..., dropout_seeds=True)); got keys "
          f"{sorted(batch)}"
        )
      rngs["dropout"] = jax.random.key(batch["dropout_seed"])
    logits = self.module.apply({"params": params}, batch["image"], train=True, rngs=rngs)
    if self.loss is not None:  # a user's loss: the batch mean of its per-example "loss"
      return jnp.mean(self.loss(logits, batch["label"])["loss"]), logits
    loss = optax.losses.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return loss, logits

  def predict(self, variables: Variables, images: jax.Array) -> jax.Array:
    """Evaluation-mode logits (population statistics for batch norm).

    Args:
      variables: ``{"params": ..., "batch_stats": ...}``; ``batch_stats`` may be
        absent or empty for models without batch norm.
      images: float32 [B, H, W, C].

    Returns:
      logits [B, num_classes].
    """
    if self.has_batch_norm and not variables.get("batch_stats"):
      raise ValueError(
        f"model {self.name!r} has batch norm: predict needs variables['batch_stats'] (from batch_stats_for_eval)"
      )
    used = {"params": variables["params"]}
    if self.has_batch_norm:
      used["batch_stats"] = variables["batch_stats"]
    return self.module.apply(used, images, train=False)

  @functools.cached_property
  def _add_batch_moments(self) -> Callable[[Any, Params, jax.Array], Any]:
    """jit of (running sum of moments or None, params, images) -> the sum with this batch's moments.

    One program per batch, the addition included: eager additions of (possibly sharded) moments would queue
    one small multi-device program per leaf, the XLA:CPU hazard `batch_stats_for_eval` avoids.
    """

    def add_moments(total: Any, params: Params, images: jax.Array) -> Any:
      _, state = self.module.apply({"params": params}, images, train=True, mutable=[MOMENTS_COLLECTION])
      moments = state[MOMENTS_COLLECTION]
      return moments if total is None else jax.tree.map(jnp.add, total, moments)

    return jax.jit(add_moments)

  def batch_stats_for_eval(self, params: Params, batches: Iterable[Batch]) -> Any:
    """Population batch-norm statistics at ``params`` ("precise BN").

    E[x] = mean_B mu_B and Var[x] = m/(m-1) mean_B sigma_B^2 over the given
    training batches, each layer seeing the training-mode activations of the
    layers below (Wu & Johnson, arXiv 2105.07576; Ioffe & Szegedy,
    arXiv 1502.03167, Alg. 2). Use batches of the training batch size.

    Args:
      params: the weights to evaluate.
      batches: iterable of ``{"image": float32 [B, H, W, C], ...}``.

    Returns:
      The ``batch_stats`` collection (``{}`` for models without batch norm).
    """
    if not self.has_batch_norm:
      return {}
    total, count = None, 0
    for batch in batches:
      total = self._add_batch_moments(total, params, jnp.asarray(batch["image"]))
      # One program in flight at a time: with parameters sharded over several devices each call holds
      # collectives, and on XLA:CPU a queue of such programs can deadlock (a device's launch waits on its
      # in-flight limit while the others wait for it in an all-gather), as the engine's blocks did. A
      # ResNet-20 study aborted so ("Termination timeout for all gather") while the per-batch sums were
      # still eager additions, one program per batch-norm leaf.
      jax.block_until_ready(total)
      count += 1
    if count == 0:
      raise ValueError("batches is empty: precise BN needs at least one training batch")
    return jax.block_until_ready(_divide(total, count))

  def learning_rate_multipliers(self, params: Params) -> Any:
    """Per-parameter learning-rate multipliers, a pytree of floats like ``params``."""
    return jax.tree_util.tree_map_with_path(
      lambda path, _: float(self.learning_rate_rule(key_path_names(path))), params
    )

  def weight_decay_multipliers(self, params: Params) -> Any:
    """Per-parameter weight-decay multipliers, a pytree of floats like ``params``."""
    return jax.tree_util.tree_map_with_path(lambda path, _: float(self.weight_decay_rule(key_path_names(path))), params)
