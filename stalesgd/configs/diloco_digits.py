r"""DiLoCo, streaming DiLoCo and the one-round-delayed outer step on the embedded 8x8 digits.

M = 8 learners (one per device), mu = 8, ``small_cnn``, H = 20 inner steps of SGD (0.01, momentum 0.9) per round,
outer Nesterov SGD (0.7, momentum 0.9; Douillard et al.), 30 epochs (36 rounds). Variants (``get_config(arg)``):
``diloco`` (default); ``streaming_p{P}_tau{T}_alpha{A}`` for P in (1, 2, 4), tau in (1, 5), alpha in (0, 0.5)
(Douillard et al., arXiv 2501.18512); ``delayed`` (P = 1, tau = H, alpha = 0: the one-round-delayed step);
``eager`` (the same with Kale et al.'s eager updates, arXiv 2502.12996). The
simulated network: an all-reduce of the whole model takes 5 inner steps' time (``timing.bandwidth``).

Commands::

  stalesgd-train --config=diloco_digits:streaming_p2_tau5_alpha0.5 --workdir=runs/streaming1
  stalesgd-reproduce --study=streaming_diloco_digits --seeds=3
  stalesgd-reproduce --study=delayed_outer_step_digits  # or stalesgd-reproduce --study=eager_outer_step_digits
  stalesgd-reproduce --study=kale_outer_steps_digits --pilot --workdir=runs/kale/pilot  # then --seeds=3
  stalesgd-reproduce --study=streaming_diloco_digits_piloted --pilot --workdir=runs/st/pilot  # then --seeds=3

Cost: 15-60 s per run on 2 CPU cores beside other work (results/kale_outer_steps_digits_3seeds: 27 runs, 282 s).

Result (3 seeds): at the outer rate 0.7, DiLoCo 2.2 %, streaming 1.2-2.0 % (results/streaming_diloco_digits_3seeds,
fragments of arrays), eager 33-91 % (unstable). At outer rates piloted per family (0.1-0.2), DiLoCo 1.3-1.6 %, the
one-round-delayed step 1.1-1.6 %, eager 1.2-1.3 % at M = 2, 4, 8 (results/kale_outer_steps_digits_3seeds).
Inner rate 0.01: chosen on one DiLoCo run before the grids (0.03 made DiLoCo diverge).
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs.arguments import parse_config_argument
from stalesgd.training import default_config

LOCAL_STEPS = 20
STREAMING = tuple((fragments, delay, mix) for fragments in (1, 2, 4) for delay in (1, 5) for mix in (0.0, 0.5))
VARIANTS = ("diloco", "delayed", "eager") + tuple(f"streaming_p{p}_tau{t}_alpha{a:g}" for p, t, a in STREAMING)
# An all-reduce of the model costs this many inner steps of simulated time, so overlapping it matters.
ALLREDUCE_IN_STEPS = 5
MODEL_BYTES = 212_008  # small_cnn's 53,002 float32 parameters on 8x8x1 images


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The run selected by ``arg`` (one of `VARIANTS`; see the module docstring)."""
  arguments = parse_config_argument(arg, variants=VARIANTS, default="diloco", has_quick=False)
  variant = arguments.variant
  config = default_config()
  config.dataset, config.data_source = "digits", "embedded"
  config.model = "small_cnn"
  config.learners = 8
  config.batch_per_learner = 8
  config.num_epochs = 30.0
  config.learning_rate = 0.01
  config.momentum = 0.9
  config.eval_every_epochs = 5.0
  config.log_every_updates = 5
  config.local_steps = LOCAL_STEPS
  config.protocol = "diloco"
  # small_cnn on the digits has 53,002 float32 parameters (212,008 bytes, config.timing.model_bytes = 0 reads
  # them); a ring all-reduce moves 2 (M - 1) / M of them, so this bandwidth makes one take ALLREDUCE_IN_STEPS
  # inner steps of 8 ms (a fragment: its own share of that, docs/algorithms.md, *Fragments of layers*).
  step_seconds = config.timing.compute_time_per_example * config.batch_per_learner
  config.timing.bandwidth = 2 * 7 / 8 * MODEL_BYTES / (ALLREDUCE_IN_STEPS * step_seconds)
  if variant in ("delayed", "eager"):
    config.protocol, config.outer.delay = "streaming_diloco", LOCAL_STEPS
    config.eager_updates = variant == "eager"
  elif variant != "diloco":
    fragments, delay, mix = next(s for s in STREAMING if f"streaming_p{s[0]}_tau{s[1]}_alpha{s[2]:g}" == variant)
    config.protocol = "streaming_diloco"
    config.outer.fragments, config.outer.delay, config.outer.mix = fragments, delay, mix
  return config
