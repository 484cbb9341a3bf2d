"""Staleness inside any training loop: apply each gradient a fixed number of updates after it was computed.

`delayed` wraps any optax transform (a staleness rule, delay compensation, any
optimizer). The loop computes each gradient at today's weights, as a plain loop
does; the wrapper holds it back and applies it ``staleness`` = tau calls later,
with the weights it was computed at as ``stale_params``, so that
`scale_by_staleness` and `scale_by_delay_compensation` inside see what a
parameter server with stale learners would give them:

* call t (0-based) receives g_t, computed at w_t, and stores it with w_t;
* calls 0 .. tau-1 apply nothing (zero updates) and leave the inner transform
  untouched;
* call t >= tau applies g_{t-tau} as the inner transform's update u = t - tau,
  with ``staleness`` = min(u, tau), the number of updates applied since
  w_{t-tau} (the first tau gradients were computed at w_0 and see 0, 1, ...,
  tau-1 updates; every later one sees tau), and ``stale_params`` = w_{t-tau}.

With these semantics a loop whose t-th batch is learner (t mod lambda)'s batch
(t div lambda) computes the updates of the deterministic round-robin
asynchronous parameter server with lambda = tau + 1 learners, to float32
rounding (1e-5 relative; XLA fuses the same arithmetic differently) (Zhang et al.,
IJCAI 2016; `stalesgd.schedule.simulate("async", jitter="deterministic")`),
which `tests/transforms/test_delayed.py` checks against `stalesgd.engine`.

Memory: tau gradients, plus tau copies of the weights when ``keep_params``
(needed by delay compensation and Gap-Aware; the staleness rules alone need
only the count), all in the optimizer state, so they are checkpointed with it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class DelayedState(NamedTuple):
  """State of `delayed`.

  Attributes:
    count: calls so far (int32 scalar).
    pending_grads: the last tau gradients, leaf shapes ``[tau, ...]``; call t
      writes slot t mod tau, after reading the gradient of call t - tau there.
    pending_params: the weights each pending gradient was computed at, like
      ``pending_grads`` (None without ``keep_params``).
    inner_state: the wrapped transform's state, advanced only by applied
      gradients.
  """

  count: jax.Array
  pending_grads: Any
  pending_params: Any
  inner_state: Any


def delayed(
  inner: optax.GradientTransformation, *, staleness: int, keep_params: bool = True
) -> optax.GradientTransformationExtraArgs:
  """Applies every gradient ``staleness`` calls after it arrives, through ``inner`` (module docstring).

  Args:
    inner: the transform that applies the delayed gradients; it receives the
      extra arguments ``staleness`` (an int32 scalar) and, with
      ``keep_params``, ``stale_params``, besides any the loop passes.
    staleness: tau >= 0, the delay in calls; 0 passes every gradient straight
      to ``inner`` with staleness 0 and ``stale_params`` = the current weights.
    keep_params: whether to keep the weights each gradient was computed at
      (tau weight copies), for ``stale_params``.

  Returns:
    An optax ``GradientTransformationExtraArgs``; its ``update`` needs
    ``params``.

  Raises:
    ValueError: for a negative or non-integer ``staleness``.

  Example::

    tx = stalesgd.delayed(optax.chain(stalesgd.scale_by_staleness("inverse"), optax.sgd(0.1)), staleness=7)
    state = tx.init(params)
    grads = jax.grad(loss)(params, batch)            # at today's weights
    updates, state = tx.update(grads, state, params)  # applies the gradient of 7 calls ago
  """
  if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
    raise ValueError(
      f"staleness={staleness!r}; allowed: an integer >= 0 (calls between a gradient's arrival and its application)"
    )
  tau = staleness
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    queue = lambda: jax.tree.map(lambda leaf: jnp.zeros((tau,) + jnp.shape(leaf), jnp.result_type(leaf)), params)
    return DelayedState(
      count=jnp.zeros((), jnp.int32),
      pending_grads=queue(),
      pending_params=queue() if keep_params else None,
      inner_state=inner.init(params),
    )

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError("stalesgd.delayed needs params: call tx.update(grads, state, params)")
    if tau == 0:
      stale = {"stale_params": params} if keep_params else {}
      out, inner_state = inner.update(
        updates, state.inner_state, params, staleness=jnp.zeros((), jnp.int32), **stale, **extra_args
      )
      return out, state._replace(count=state.count + 1, inner_state=inner_state)
    slot = state.count % tau
    due_grads = jax.tree.map(lambda queue: queue[slot], state.pending_grads)
    due_params = None if not keep_params else jax.tree.map(lambda queue: queue[slot], state.pending_params)
    store = lambda queue, value: jax.tree.map(lambda q, v: q.at[slot].set(v), queue, value)
    pending_grads = store(state.pending_grads, updates)
    pending_params = None if not keep_params else store(state.pending_params, params)
    applied = state.count - tau  # the inner transform's update index u, when >= 0

    def apply(inner_state):
      stale = {"stale_params": due_params} if keep_params else {}
      return inner.update(
        due_grads, inner_state, params, staleness=jnp.minimum(applied, tau).astype(jnp.int32), **stale, **extra_args
      )

    def hold(inner_state):
      return jax.tree.map(jnp.zeros_like, updates), inner_state

    out, inner_state = jax.lax.cond(applied >= 0, apply, hold, state.inner_state)
    return out, DelayedState(state.count + 1, pending_grads, pending_params, inner_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
