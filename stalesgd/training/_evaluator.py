"""Accuracy of a set of weights on the test split and on a fixed training subset.

Evaluation batches are split over the mesh (data parallel) and built as global
arrays from each process's own shards, so every process of a multi-host run
evaluates together and gets the same numbers. Batch-norm models are evaluated
with population statistics recomputed at the evaluated weights ("precise BN",
`stalesgd.models.ModelSpec.batch_stats_for_eval`), because the training path
keeps no running averages.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from stalesgd import data as data_lib
from stalesgd.data import _evaluation_batches as evaluation
from stalesgd.models import ModelSpec
from stalesgd.parallel._sharding import global_array


class Evaluator:
  """Computes ``test_accuracy``, ``test_error`` (percent), ``test_loss`` and ``train_accuracy``.

  With a user's loss (`stalesgd.models.ModelSpec.loss`, ``metric_names`` the names of what it returns), the
  test set's mean of each value instead: ``test_loss``, ``test_<name>``.
  """

  def __init__(
    self,
    model: ModelSpec,
    dataset: data_lib.Dataset,
    mesh: jax.sharding.Mesh,
    *,
    batch_size: int,
    train_examples: int,
    precise_bn_batches: int,
    precise_bn_batch_size: int,
    seed: int,
    metric_names: tuple[str, ...] = (),
  ):
    self.model, self.dataset = model, dataset
    self.metric_names = metric_names
    devices = mesh.devices.size
    self.batch_size = -(-batch_size // devices) * devices  # split evenly over the mesh
    self.train_examples = train_examples
    self._split = NamedSharding(mesh, P(mesh.axis_names[0]))
    self._replicated = NamedSharding(mesh, P())
    self._precise_bn = None
    if model.has_batch_norm:
      size = min(precise_bn_batch_size, dataset.num_train)
      count = max(1, min(precise_bn_batches, dataset.num_train // size))
      self._precise_bn = evaluation.precise_bn_batches(dataset, batch_size=size, num_batches=count, seed=seed)
    self._add_sums = jax.jit(self._add_batch_sums, out_shardings=self._replicated)

  def _add_batch_sums(self, totals, variables, batch):
    """``totals`` plus this batch's [correct, loss, count] sums: one program per batch, the addition included."""
    return totals + self._batch_sums(variables, batch)

  def _batch_sums(self, variables, batch):
    logits = self.model.predict(variables, batch["image"])
    mask = batch["mask"].astype(jnp.float32)
    if self.model.loss is not None:  # a user's loss: the sum of every value it returns, then the count
      values = self.model.loss(logits, batch["label"])
      return jnp.stack([jnp.sum(values[name] * mask) for name in self.metric_names] + [jnp.sum(mask)])
    correct = (jnp.argmax(logits, axis=-1) == batch["label"]).astype(jnp.float32)
    loss = optax.losses.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    return jnp.stack([jnp.sum(correct * mask), jnp.sum(loss * mask), jnp.sum(mask)])

  def _accumulate(self, variables, split: str, num_examples: int | None) -> np.ndarray:
    sums = len(self.metric_names) + 1 if self.model.loss is not None else 3
    totals = global_array(np.zeros(sums, np.float32), self._replicated)
    for batch in evaluation.evaluation_batches(
      self.dataset, batch_size=self.batch_size, split=split, num_examples=num_examples
    ):
      sharded = {key: global_array(np.asarray(value), self._split) for key, value in batch.items()}
      # One program in flight at a time (see `stalesgd.models.ModelSpec.batch_stats_for_eval`).
      totals = jax.block_until_ready(self._add_sums(totals, variables, sharded))
    return np.asarray(jax.device_get(totals), np.float64)

  def variables(self, params: Any) -> dict:
    """``{"params", "batch_stats"}`` for `ModelSpec.predict` at these weights."""
    variables = {"params": params}
    if self._precise_bn is not None:
      variables["batch_stats"] = self.model.batch_stats_for_eval(params, self._precise_bn)
    return variables

  def __call__(self, params: Any) -> dict[str, float]:
    variables = self.variables(params)
    if self.model.loss is not None:
      *totals, count = self._accumulate(variables, "test", None)
      return {f"test_{name}": total / count for name, total in zip(self.metric_names, totals)}
    correct, loss, count = self._accumulate(variables, "test", None)
    results = {
      "test_accuracy": correct / count,
      "test_error": 100.0 * (1.0 - correct / count),
      "test_loss": loss / count,
    }
    if self.train_examples > 0:
      correct, _, count = self._accumulate(variables, "train", self.train_examples)
      results["train_accuracy"] = correct / count
    return results
