r"""Synchronous DiLoCo over a mesh: one learner per device, the mean pseudo-gradient by an all-reduce.

The round of `stalesgd.transforms._local_run.diloco_round` (Douillard et al., arXiv 2311.08105, Algorithm 1) on
real collectives: learner m, on the m-th device along the learners axis, runs its local run of H inner steps from
the replicated outer weights :math:`\theta`, and

.. math::
  \bar\Delta = \mathrm{pmean}_m \Delta_m, \quad \theta \leftarrow \theta + \mathrm{OuterOpt}(\bar\Delta)

is computed on every device from the all-reduced mean, so :math:`\theta` and the outer state stay replicated
without being sent. The learners' inner states, pseudo-gradients and losses stay on their devices. The local run is
the same function as the one-device round's (the transforms layer), so the two differ only in how the mean is
reduced (an all-reduce here, ``jnp.mean`` over a vmapped axis there) and in how XLA compiles one learner's program
against a vmapped one.

The training stack runs ``protocol='diloco'`` as the corner P = 1, tau = 0, alpha = 0 of
`stalesgd.decentral._streaming.sharded_streaming_round`, one code path for every outer loop; this round is the
same computation written plainly (one replicated theta, no fragments, pseudo-gradients and per-step losses
returned), for a loop of one's own, and the reference that tests/decentral/test_diloco_shard_map.py holds the
streaming round's corner to.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from jax.sharding import Mesh, PartitionSpec

from stalesgd.parallel._sharding import LEARNERS_AXIS, check_learners_axis, mesh_learners
from stalesgd.transforms._local_run import DiLoCoRound, LossFn, local_run, outer_step


def sharded_diloco_round(
  loss_fn: LossFn,
  inner_optimizer: optax.GradientTransformation,
  outer_optimizer: optax.GradientTransformation,
  mesh: Mesh,
  params: Any,
  outer_state: Any,
  inner_states: Any,
  batches: Any,
  *,
  axis_name: str = LEARNERS_AXIS,
  reset_inner_state: bool = False,
  has_aux: bool = False,
  unroll: int | bool = 1,
) -> DiLoCoRound:
  r"""One synchronous DiLoCo round with one learner per device of ``mesh`` along ``axis_name`` (module docstring).

  The same arguments and result as `diloco_round`, plus the mesh: M is the size of the mesh's ``axis_name`` axis.
  ``params`` and ``outer_state`` are replicated (and come back so); ``inner_states`` and ``batches`` have a
  leading learners axis of size M, split over it (one learner per device), as do the returned inner states,
  pseudo-gradients, losses and aux. Pure and jit-able with the loss, optimizers, mesh and options bound.

  Inside, the replicated :math:`\theta` is cast to device-varying before the local run, so each learner's gradient
  is its own (the gradient with respect to a replicated value would come back summed over the axis).

  Raises:
    ValueError: naming the argument, when the mesh has no ``axis_name`` axis or a leaf of ``inner_states`` or
      ``batches`` has no leading axis of size M.
  """
  learners = mesh_learners(mesh, axis_name)
  check_learners_axis("batches", batches, learners)
  if not reset_inner_state:
    check_learners_axis("inner_states", inner_states, learners)

  def per_learner(params, outer_state, inner_state, learner_batches):
    unstack = lambda tree: jax.tree.map(lambda leaf: leaf[0], tree)
    restack = lambda tree: jax.tree.map(lambda leaf: leaf[None], tree)
    start = jax.tree.map(lambda leaf: jax.lax.pcast(leaf, axis_name, to="varying"), params)
    run = local_run(
      loss_fn,
      inner_optimizer,
      start,
      unstack(inner_state),
      unstack(learner_batches),
      reset_inner_state=reset_inner_state,
      has_aux=has_aux,
      unroll=unroll,
    )
    mean = jax.lax.pmean(run.pseudo_gradient, axis_name)
    params, outer_state = outer_step(outer_optimizer, params, outer_state, mean)
    return (
      params,
      outer_state,
      restack(run.inner_state),
      restack(run.pseudo_gradient),
      restack(run.losses),
      restack(run.aux),
    )

  replicated, split = PartitionSpec(), PartitionSpec(axis_name)
  round_fn = jax.shard_map(
    per_learner,
    mesh=mesh,
    in_specs=(replicated, replicated, split, split),
    out_specs=(replicated, replicated, split, split, split, split),
  )
  return DiLoCoRound(*round_fn(params, outer_state, inner_states, batches))
