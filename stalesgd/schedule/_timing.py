"""The timing model: how long each learner computes and how long messages take.

This is the runtime half of Rudra's accuracy/runtime trade-off (Gupta et al.,
arXiv 1509.04210; docs/algorithms.md §5). Compute time per mini-batch is

    compute_time x speed_factor[learner] x jitter[learner, step]

and communication follows the latency-bandwidth model: a message of
``model_bytes`` costs ``latency + model_bytes / bandwidth`` on a learner's
link; a parameter server (optionally sharded over ``server_shards`` nodes,
each with its own link of ``bandwidth``) carries ``model_bytes / server_shards``
per message per shard. Decentralized protocols use the ring all-reduce cost
``2 (M-1)/M x model_bytes / bandwidth + 2 (M-1) x latency`` (Patarasuk & Yuan,
J. Parallel Distrib. Comput. 2009). The model size comes from the caller.

Per-step randomness lives in `stalesgd.schedule._durations`; this module holds
the validated parameters, the per-learner speed factors and the communication
costs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Any

import numpy as np

from stalesgd import _validation as validation

JITTERS = ("deterministic", "lognormal", "exponential", "straggler")

# Stream identifiers under the simulation seed: learner p's step times use
# spawn key (_STEP_STREAM, p); the drawn speed factors use (_SPEED_STREAM,).
_SPEED_STREAM = 0
_STEP_STREAM = 1


def _load_trace(path: str | os.PathLike[str]) -> np.ndarray:
  """Reads a trace file (.npy or .csv) as a float64 array of 1 or 2 dims.

  Raises:
    ValueError: naming the file, when it is missing or unreadable (truncated,
      pickled, a ragged or non-numeric csv), not real numbers, empty, a 0-d
      .npy or of more than 2 dimensions, or holds a value that is not finite and > 0.
  """
  path = os.fspath(path)
  if not path.endswith((".npy", ".csv")):
    raise ValueError(f"trace must be a .npy or .csv file; got {path!r}")
  if not os.path.isfile(path):
    raise ValueError(
      f"trace file {path!r} does not exist; allowed: an existing .npy or .csv file of positive time multipliers"
    )
  try:
    if path.endswith(".npy"):
      values = np.load(path, allow_pickle=False)
    else:
      with warnings.catch_warnings():
        # An empty file is reported below as a ValueError, not a warning.
        warnings.simplefilter("ignore", UserWarning)
        values = np.loadtxt(path, delimiter=",", comments="#", dtype=np.float64, ndmin=1)
  except (ValueError, OSError, EOFError) as error:
    raise ValueError(
      f"trace file {path!r} cannot be read ({type(error).__name__}: {error}); allowed: a .npy array "
      "or a .csv of comma-separated numbers with the same number of columns on every row "
      "(# comments)"
    ) from error
  values = np.asarray(values)
  if values.dtype.kind not in "iuf":
    raise ValueError(f"trace file {path!r} holds {values.dtype} values; allowed: real numbers (int or float)")
  values = values.astype(np.float64)
  if values.size == 0:
    raise ValueError(f"trace must hold at least one value; {path!r} is empty")
  if values.ndim not in (1, 2):
    raise ValueError(f"trace must have 1 or 2 dimensions; {path!r} has shape {values.shape}")
  bad = ~np.isfinite(values) | (values <= 0)
  if np.any(bad):
    first = tuple(int(index) for index in np.argwhere(bad)[0])
    raise ValueError(
      f"trace values must be finite and > 0; {path!r} has {int(bad.sum())} that are not, the first "
      f"{values[first]} at index {first}"
    )
  return values


@dataclasses.dataclass(frozen=True)
class TimingModel:
  """Seeded compute and communication times of learners and a server.

  Compute time of learner p's k-th mini-batch (seconds):
  ``compute_time * speed_factor[p] * jitter[p, k]``.

  Jitter (per step, drawn from learner p's own seeded stream):
    * ``"deterministic"``: 1.
    * ``"lognormal"``: ``exp(jitter_sigma * Z - jitter_sigma**2 / 2)``, Z
      standard normal, so its mean is 1.
    * ``"exponential"``: exponential with mean 1 (memoryless service times).
    * ``"straggler"``: the log-normal jitter (``jitter_sigma = 0`` for none)
      times ``straggler_factor`` with probability ``straggler_prob``, else 1:
      an occasional k-times slower step.

  Speed factors (per learner, fixed for the run; at most one source):
    * ``speed_factors``: one positive factor per learner (2.0 is a learner
      twice as slow).
    * ``speed_factor_sigma > 0``: drawn log-normal factors with mean 1.
    * ``trace``: a ``.npy`` or ``.csv`` file of positive time multipliers
      (csv: comma-separated, ``#`` comments). Shape ``[learners]`` or
      ``[learners, 1]`` (one row per learner): a fixed factor per learner.
      Shape ``[steps, learners]`` (one row per step): learner p's k-th step is
      multiplied by ``trace[k % steps, p]``, which replaces its speed factor;
      with ``compute_time=1`` and ``jitter="deterministic"`` this replays
      measured step times in seconds.
    * none: homogeneous learners (all factors 1).

  Communication (seconds; all zero by default, i.e. compute-bound):
    * ``latency``: per message.
    * ``bandwidth``: bytes per second of every link (learners, server shards).
    * ``model_bytes``: size of a gradient or of the weights, from the caller.
    * ``server_shards``: parameter-server nodes; each message puts
      ``model_bytes / server_shards`` on each shard's link, first come first
      served, so concurrent pushes (or pulls) queue at the server.
    * ``apply_time``: seconds the server needs to apply one update; the
      server is sequential, so updates never overlap.

  The default is homogeneous learners with light log-normal jitter
  (sigma 0.1) and free communication.

  Example (2% of steps 5x slower; the 89,578-parameter CIFAR-10 network in
  float32 over 10 Gbit/s links with 50 us latency)::

    timing = TimingModel(
        compute_time=0.05, jitter="straggler", straggler_prob=0.02, straggler_factor=5.0,
        latency=50e-6, bandwidth=1.25e9, model_bytes=4 * 89_578)
    schedule = simulate("backup", learners=30, backup=3, num_updates=1000, seed=0, timing=timing)

  Raises:
    ValueError: at construction, naming the field, the bad value and the
      allowed values (negative times, unknown jitter, straggler settings
      without ``jitter="straggler"``, several speed-factor sources, an empty
      or non-positive trace).

  Attributes:
    compute_time: mean seconds to compute one mini-batch gradient.
    jitter: one of ``JITTERS``.
    jitter_sigma: log-normal sigma (``"lognormal"`` and ``"straggler"``).
    straggler_prob: probability that a step straggles (``"straggler"`` only).
    straggler_factor: slowdown of a straggling step (``"straggler"`` only).
    speed_factors: fixed per-learner factors, or None.
    speed_factor_sigma: log-normal sigma of drawn per-learner factors.
    trace: path of a trace file, or None.
    latency: seconds per message.
    bandwidth: bytes per second per link.
    model_bytes: bytes per message.
    server_shards: number of parameter-server nodes.
    apply_time: server seconds per update.
  """

  compute_time: float = 1.0
  jitter: str = "lognormal"
  jitter_sigma: float = 0.1
  straggler_prob: float = 0.0
  straggler_factor: float = 1.0
  speed_factors: tuple[float, ...] | None = None
  speed_factor_sigma: float = 0.0
  trace: str | None = None
  latency: float = 0.0
  bandwidth: float = math.inf
  model_bytes: int = 0
  server_shards: int = 1
  apply_time: float = 0.0
  _trace_values: np.ndarray | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

  def __post_init__(self):
    validation.check_real("compute_time", self.compute_time, low=0, low_open=True)
    validation.check_choice("jitter", self.jitter, JITTERS)
    validation.check_real("jitter_sigma", self.jitter_sigma, low=0)
    self._check_stragglers()
    validation.check_real("speed_factor_sigma", self.speed_factor_sigma, low=0)
    self._check_speed_sources()
    validation.check_real("latency", self.latency, low=0)
    validation.check_real("bandwidth", self.bandwidth, low=0, low_open=True, allow_inf=True)
    validation.check_integer("model_bytes", self.model_bytes, low=0)
    validation.check_integer("server_shards", self.server_shards, low=1)
    validation.check_real("apply_time", self.apply_time, low=0)
    if self.trace is not None:
      object.__setattr__(self, "trace", os.fspath(self.trace))
      object.__setattr__(self, "_trace_values", _load_trace(self.trace))

  def _check_stragglers(self) -> None:
    if self.jitter == "straggler":
      validation.check_real("straggler_prob", self.straggler_prob, low=0, high=1, low_open=True)
      validation.check_real("straggler_factor", self.straggler_factor, low=1)
    elif self.straggler_prob != 0.0 or self.straggler_factor != 1.0:
      # Silently ignoring straggler settings would make a "with stragglers"
      # comparison measure nothing.
      raise ValueError(
        "straggler_prob and straggler_factor need jitter='straggler'; got "
        f"jitter={self.jitter!r}, straggler_prob={self.straggler_prob!r}, "
        f"straggler_factor={self.straggler_factor!r}"
      )

  def _check_speed_sources(self) -> None:
    sources = [
      name
      for name, given in (
        ("speed_factors", self.speed_factors is not None),
        ("speed_factor_sigma", self.speed_factor_sigma > 0),
        ("trace", self.trace is not None),
      )
      if given
    ]
    if len(sources) > 1:
      raise ValueError(f"give at most one of speed_factors, speed_factor_sigma > 0, trace; got {sources}")
    if self.speed_factors is not None:
      factors = tuple(float(factor) for factor in self.speed_factors)
      if not factors:
        raise ValueError("speed_factors must hold one factor per learner; got an empty sequence")
      for index, factor in enumerate(factors):
        validation.check_real(f"speed_factors[{index}]", factor, low=0, low_open=True)
      object.__setattr__(self, "speed_factors", factors)

  # -- per-learner compute ---------------------------------------------------

  def trace_layout(self, learners: int) -> str | None:
    """How the trace applies to ``learners`` learners.

    Returns:
      ``"per_learner"`` (shape ``[learners]`` or ``[learners, 1]``),
      ``"per_step"`` (shape ``[steps, learners]``), or None without a trace.

    Raises:
      ValueError: if the trace's shape fits neither layout.
    """
    if self._trace_values is None:
      return None
    shape = self._trace_values.shape
    if shape[0] == learners and (len(shape) == 1 or shape[1] == 1):
      return "per_learner"
    if len(shape) == 2 and shape[1] == learners:
      return "per_step"
    raise ValueError(
      f"trace {self.trace!r} must have shape [learners] or [learners, 1] (one row per learner) or "
      f"[steps, learners] (one row per step) with learners={learners}; got shape {shape}"
    )

  def per_step_trace(self, learners: int) -> np.ndarray | None:
    """float64 [steps, learners] per-step multipliers, or None if not per step."""
    return self._trace_values if self.trace_layout(learners) == "per_step" else None

  def check_learners(self, learners: int) -> None:
    """Checks that the per-learner settings fit ``learners`` learners.

    Raises:
      ValueError: if ``speed_factors`` or ``trace`` does not fit.
    """
    if self.speed_factors is not None and len(self.speed_factors) != learners:
      raise ValueError(
        f"speed_factors must hold one factor per learner (learners={learners}); got {len(self.speed_factors)}"
      )
    self.trace_layout(learners)

  def speed_factors_for(self, learners: int, seed: int) -> np.ndarray:
    """Per-learner compute-time factors, float64 [learners].

    A per-step trace returns ones: its rows replace the speed factor.

    Args:
      learners: number of learners.
      seed: the simulation seed (drawn factors use their own stream of it).

    Returns:
      The factor each learner's compute time is multiplied by.
    """
    self.check_learners(learners)
    if self.speed_factors is not None:
      return np.asarray(self.speed_factors, dtype=np.float64)
    if self.trace_layout(learners) == "per_learner":
      return self._trace_values.reshape(learners).copy()
    if self.speed_factor_sigma > 0:
      generator = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_SPEED_STREAM,)))
      sigma = self.speed_factor_sigma
      return np.exp(sigma * generator.standard_normal(learners) - sigma**2 / 2)
    return np.ones(learners, dtype=np.float64)

  def step_generator(self, learner: int, seed: int) -> np.random.Generator:
    """The seeded generator of learner ``learner``'s step jitter.

    Each learner has its own stream, so learner p's k-th step time is the same
    under every protocol for a given seed (common random numbers make protocol
    comparisons fair).
    """
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_STEP_STREAM, learner)))

  def draw_jitter(self, generator: np.random.Generator, count: int) -> np.ndarray:
    """Draws ``count`` consecutive per-step jitter multipliers, float64 [count]."""
    if self.jitter == "deterministic":
      return np.ones(count, dtype=np.float64)
    if self.jitter == "exponential":
      return generator.standard_exponential(count)
    sigma = self.jitter_sigma
    multipliers = np.exp(sigma * generator.standard_normal(count) - sigma**2 / 2)
    if self.jitter == "straggler":
      straggles = generator.random(count) < self.straggler_prob
      multipliers = np.where(straggles, multipliers * self.straggler_factor, multipliers)
    return multipliers

  # -- communication ---------------------------------------------------------

  @property
  def transfer_time(self) -> float:
    """Seconds to move one message over a learner's link (no latency)."""
    return self.model_bytes / self.bandwidth if self.model_bytes else 0.0

  @property
  def server_link_time(self) -> float:
    """Seconds one message occupies each server shard's link."""
    return self.transfer_time / self.server_shards

  def allreduce_time(self, learners: int) -> float:
    """Ring all-reduce of ``model_bytes`` over ``learners`` learners (seconds).

    ``2 (M-1)/M * model_bytes / bandwidth + 2 (M-1) * latency``: a
    reduce-scatter and an all-gather, each of M-1 steps moving 1/M of the
    model (Patarasuk & Yuan 2009; Thakur et al., IJHPCA 2005).
    """
    validation.check_integer("learners", learners, low=1)
    return 2 * (learners - 1) / learners * self.transfer_time + 2 * (learners - 1) * self.latency

  # -- provenance ------------------------------------------------------------

  def to_dict(self) -> dict[str, Any]:
    """JSON-serialisable fields (``from_dict`` inverts it)."""
    fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.init}
    if fields["speed_factors"] is not None:
      fields["speed_factors"] = list(fields["speed_factors"])
    return fields

  @classmethod
  def from_dict(cls, fields: dict[str, Any]) -> TimingModel:
    """Rebuilds a model from ``to_dict``'s output (e.g. ``Schedule.options``)."""
    fields = dict(fields)
    if fields.get("speed_factors") is not None:
      fields["speed_factors"] = tuple(fields["speed_factors"])
    return cls(**fields)
