"""Staleness inside any training loop: apply each gradient some calls after it was computed.

`delayed` wraps any optax transform (a staleness rule, delay compensation, any
optimizer). The loop computes each gradient at today's weights, as a plain loop
does; the wrapper holds it back and applies it later, with the weights it was
computed at as ``stale_params``, so that `scale_by_staleness` and
`scale_by_delay_compensation` inside see what a parameter server with stale
learners would give them.

**A fixed delay** (``staleness`` = tau):

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

**Per-gradient delays** (``max_delay`` = D; each call passes ``delay=d_s``, an
int in [0, D], e.g. drawn from a timing model):

* the gradient g_s received at call s is *due* at call s + d_s (d_s = 0: at
  once, in the call that receives it);
* call t applies every gradient due then as one stack of c_t >= 1
  contributions through ``inner`` (`stalesgd.transforms._contributions`), in
  the order they arrived, so that ``average_contributions`` in ``inner`` gives
  the softsync update (Zhang et al., eq. 2)

    w <- w - (alpha / c_t) sum_{s : s + d_s = t} s(sigma_s) g_s;

  with none due (c_t = 0) it applies nothing (a zero update) and ``inner``
  does not advance;
* a gradient's staleness sigma_s is the number of updates applied (calls that
  applied at least one gradient) after its weights w_s were read and before
  its own update: sigma_s = U(t) - U(s), with U(t) the updates applied before
  call t; its ``stale_params`` are w_s.

With every d_s = tau this is the fixed delay: call t >= tau applies g_{t-tau}
alone, U(t) = t - tau = u and U(t - tau) = max(u - tau, 0), so sigma = min(u,
tau). A stack of one gives the transforms' unstacked result bit for bit, so
the updates equal those of ``staleness=tau`` bit for bit (tested). ``inner``
sees exactly the c_t due gradients, not padded slots: call t runs the branch
of a `jax.lax.switch` for its c_t, so averages and the state statistics of
the per-contribution transforms (the running mean staleness, DC-ASGD-a's
MeanSquare) count only real gradients, with no masks. The price is compile
time: the program holds ``inner``'s update for each stack size 1 .. D+1 (only
one runs per call). ``inner`` must reduce a stack (``average_contributions``
before the server part), as for `stalesgd.engine.Engine`.

Memory, all in the optimizer state (checkpointed with it): a fixed delay keeps
tau gradients, per-gradient delays D+1 gradient slots plus three int32
vectors of D+1; with ``keep_params`` as many weight copies (needed by delay
compensation and Gap-Aware; the staleness rules alone need only the count).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from stalesgd import _validation as validation


class DelayedState(NamedTuple):
  """State of `delayed`.

  Attributes:
    count: calls so far (int32 scalar).
    pending_grads: the held gradients, leaf shapes ``[slots, ...]``: tau slots
      for a fixed delay (call t writes slot t mod tau, after reading the
      gradient of call t - tau there), D+1 for per-gradient delays (call t
      writes slot t mod (D+1), whose gradient was due by call t - 1).
    pending_params: the weights each pending gradient was computed at, like
      ``pending_grads`` (None without ``keep_params``).
    inner_state: the wrapped transform's state, advanced only by applied
      gradients.
    due_call: per-gradient delays only (else None): int32 [D+1], the call at
      which each slot's gradient is due (-1: empty).
    read_at: per-gradient delays only: int32 [D+1], the updates applied before
      each slot's gradient was received, U(s).
    applied: per-gradient delays only: int32 scalar, the updates applied so
      far (calls that applied at least one gradient).
  """

  count: jax.Array
  pending_grads: Any
  pending_params: Any
  inner_state: Any
  due_call: Any = None
  read_at: Any = None
  applied: Any = None


def delayed(
  inner: optax.GradientTransformation,
  *,
  staleness: int | None = None,
  max_delay: int | None = None,
  keep_params: bool = True,
) -> optax.GradientTransformationExtraArgs:
  """Applies every gradient ``staleness`` calls after it arrives, through ``inner`` (module docstring).

  Give exactly one of ``staleness`` (the same delay for every gradient) and
  ``max_delay`` (each call passes its gradient's own delay).

  Args:
    inner: the transform that applies the delayed gradients; it receives the
      extra arguments ``staleness`` and, with ``keep_params``,
      ``stale_params``, besides any the loop passes. With ``max_delay`` they
      come as a stack (``staleness`` of shape [c]), so ``inner`` must reduce
      it with `stalesgd.average_contributions`.
    staleness: tau >= 0, the delay in calls; 0 passes every gradient straight
      to ``inner`` with staleness 0 and ``stale_params`` = the current weights.
    max_delay: D >= 0, the largest per-gradient delay; then every
      ``update`` needs ``delay=d``, an integer in [0, D] (a Python int or an
      int array, possibly traced; a traced one outside [0, D] is clipped).
    keep_params: whether to keep the weights each gradient was computed at
      (one weight copy per gradient slot), for ``stale_params``.

  Returns:
    An optax ``GradientTransformationExtraArgs``; its ``update`` needs
    ``params``.

  Raises:
    ValueError: for a negative or non-integer ``staleness`` or ``max_delay``,
      for both or neither of them, and (at ``update``) for a missing or bad
      ``delay`` or an ``inner`` that does not reduce a stack.

  Example::

    tx = stalesgd.delayed(optax.chain(stalesgd.scale_by_staleness("inverse"), optax.sgd(0.1)), staleness=7)
    state = tx.init(params)
    grads = jax.grad(loss)(params, batch)            # at today's weights
    updates, state = tx.update(grads, state, params)  # applies the gradient of 7 calls ago

    tx = stalesgd.delayed(optax.chain(stalesgd.scale_by_staleness("inverse"), stalesgd.average_contributions(),
                                      optax.sgd(0.1)), max_delay=7)
    updates, state = tx.update(grads, state, params, delay=3)  # this gradient is applied 3 calls from now
  """
  if (staleness is None) == (max_delay is None):
    raise ValueError(
      f"staleness={staleness!r}, max_delay={max_delay!r}; allowed: exactly one of them, staleness=tau (every "
      "gradient delayed by tau calls) or max_delay=D (each call passes its own delay=d in [0, D])"
    )
  name, value = ("staleness", staleness) if max_delay is None else ("max_delay", max_delay)
  validation.check_integer(
    name, value, low=0, builtin_only=True, note="(calls between a gradient's arrival and its application)"
  )
  inner = optax.with_extra_args_support(inner)
  slots = value if max_delay is None else max_delay + 1

  def init_fn(params):
    queue = lambda: jax.tree.map(lambda leaf: jnp.zeros((slots,) + jnp.shape(leaf), jnp.result_type(leaf)), params)
    state = DelayedState(
      count=jnp.zeros((), jnp.int32),
      pending_grads=queue(),
      pending_params=queue() if keep_params else None,
      inner_state=inner.init(params),
    )
    if max_delay is None:
      return state
    return state._replace(
      due_call=jnp.full((slots,), -1, jnp.int32),
      read_at=jnp.zeros((slots,), jnp.int32),
      applied=jnp.zeros((), jnp.int32),
    )

  def inner_update(grads, inner_state, params, staleness, stale_params, extra_args):
    stale = {"stale_params": stale_params} if keep_params else {}
    return inner.update(grads, inner_state, params, staleness=staleness, **stale, **extra_args)

  def hold(updates, inner_state):
    return jax.tree.map(jnp.zeros_like, updates), inner_state

  def fixed_update(updates, state, params, extra_args):
    tau = staleness
    if tau == 0:
      out, inner_state = inner_update(updates, state.inner_state, params, jnp.zeros((), jnp.int32), params, extra_args)
      return out, state._replace(count=state.count + 1, inner_state=inner_state)
    slot = state.count % tau
    due_grads = _read_slot(state.pending_grads, slot)
    due_params = _read_slot(state.pending_params, slot) if keep_params else None
    applied = state.count - tau  # the inner transform's update index u, when >= 0

    def apply(inner_state):
      sigma = jnp.minimum(applied, tau).astype(jnp.int32)
      return inner_update(due_grads, inner_state, params, sigma, due_params, extra_args)

    out, inner_state = jax.lax.cond(applied >= 0, apply, lambda s: hold(updates, s), state.inner_state)
    return out, state._replace(
      count=state.count + 1,
      pending_grads=_write_slot(state.pending_grads, slot, updates),
      pending_params=_write_slot(state.pending_params, slot, params) if keep_params else None,
      inner_state=inner_state,
    )

  def per_gradient_update(updates, state, params, delay, extra_args):
    call, slot = state.count, state.count % slots
    pending_grads = _write_slot(state.pending_grads, slot, updates)
    pending_params = _write_slot(state.pending_params, slot, params) if keep_params else None
    due_call = state.due_call.at[slot].set(call + _checked_delay(delay, max_delay))
    read_at = state.read_at.at[slot].set(state.applied)
    due = due_call == call
    arrival = call - (call - jnp.arange(slots)) % slots  # the call whose gradient each slot holds
    order = jnp.argsort(jnp.where(due, arrival, call + 1))  # the due gradients first, oldest first
    sigma = state.applied - read_at  # U(t) - U(s)

    def apply(size):
      def branch(inner_state):
        taken = order[:size]
        take = lambda tree: jax.tree.map(lambda leaf: leaf[taken], tree)
        stale_params = take(pending_params) if keep_params else None
        out, inner_state = inner_update(
          take(pending_grads), inner_state, params, sigma[taken], stale_params, extra_args
        )
        _check_reduced(out, params, size)
        return out, inner_state

      return branch

    branches = [lambda s: hold(updates, s)] + [apply(size) for size in range(1, slots + 1)]
    num_due = jnp.sum(due, dtype=jnp.int32)
    out, inner_state = jax.lax.switch(num_due, branches, state.inner_state)
    return out, DelayedState(
      call + 1, pending_grads, pending_params, inner_state, due_call, read_at, state.applied + (num_due > 0)
    )

  def update_fn(updates, state, params=None, *, delay=None, **extra_args):
    if params is None:
      raise ValueError("stalesgd.delayed needs params: call tx.update(grads, state, params)")
    if max_delay is None:
      if delay is not None:
        raise ValueError(
          f"delay={delay!r} was passed to delayed(staleness={staleness}), whose delay is fixed; for per-gradient "
          "delays build it with delayed(inner, max_delay=D)"
        )
      return fixed_update(updates, state, params, extra_args)
    return per_gradient_update(updates, state, params, delay, extra_args)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _read_slot(queue: Any, slot: jax.Array) -> Any:
  return jax.tree.map(lambda leaf: leaf[slot], queue)


def _write_slot(queue: Any, slot: jax.Array, value: Any) -> Any:
  return jax.tree.map(lambda leaf, new: leaf.at[slot].set(new), queue, value)


def _checked_delay(delay: Any, max_delay: int) -> jax.Array:
  """``delay`` as an int32 scalar in [0, max_delay]; a concrete value outside it is refused, a traced one clipped."""
  allowed = f"allowed: an integer scalar in [0, max_delay={max_delay}] (calls until this gradient is applied)"
  if delay is None:
    raise ValueError(
      f"delayed(max_delay={max_delay}) needs delay= at every call: tx.update(grads, state, params, delay=d); {allowed}"
    )
  if isinstance(delay, bool) or jnp.ndim(delay) != 0 or not jnp.issubdtype(jnp.result_type(delay), jnp.integer):
    raise ValueError(f"delay={delay!r}; {allowed}")
  if not isinstance(delay, jax.core.Tracer) and not 0 <= int(delay) <= max_delay:
    raise ValueError(f"delay={int(delay)}; {allowed}")
  return jnp.clip(jnp.asarray(delay, jnp.int32), 0, max_delay)


def _check_reduced(updates: Any, params: Any, size: int) -> None:
  """Refuses (at trace time) an ``inner`` whose updates keep the stack's leading axis."""
  for (path, leaf), param in zip(jax.tree_util.tree_leaves_with_path(updates), jax.tree.leaves(params)):
    if jnp.shape(leaf) != jnp.shape(param):
      raise ValueError(
        f"inner returned updates{jax.tree_util.keystr(path)} of shape {jnp.shape(leaf)} for a stack of {size} due "
        f"gradients; params{jax.tree_util.keystr(path)} has shape {jnp.shape(param)}. With max_delay, the gradients "
        "due at one call reach inner as a stack: put stalesgd.average_contributions() in inner before the server "
        "part, e.g. optax.chain(stalesgd.scale_by_staleness('inverse'), stalesgd.average_contributions(), "
        "optax.sgd(lr))"
      )
