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

Cost: 10-16 s per run on 2 CPU cores beside other work (results/kale_outer_steps_digits_3seeds: 27 runs, 6 min).

Result (3 seeds, test error, at outer rates piloted per family on a validation split, 0.1-0.2): M = 8, DiLoCo
1.48 ± 0.17 %, the 12 streaming variants 1.37-1.93 % (results/streaming_diloco_digits_piloted_3seeds); M = 2, 4, 8,
DiLoCo 1.26-1.63 %, the one-round-delayed step 1.07-1.59 %, eager 1.22-1.33 % (results/kale_outer_steps_digits_3seeds).
At the outer rate 0.7 (superseded): DiLoCo 2.22 %, streaming 1.15-2.04 % (results/streaming_diloco_digits_3seeds),
eager 33-91 % (results/eager_outer_step_digits_3seeds). Inner rate 0.01: chosen on one DiLoCo run before the grids.
"""

from __future__ import annotations

import ml_collections

from stalesgd.configs import ConfigResult
from stalesgd.configs.arguments import parse_config_argument
from stalesgd.training import default_config

# The numbers the docstring's Result quotes, checked against results/ (tests/configs/test_config_results.py).
RESULTS = (
  ConfigResult("results/streaming_diloco_digits_piloted_3seeds", "DiLoCo", value=1.48, std=0.17),
  ConfigResult("results/streaming_diloco_digits_piloted_3seeds", "streaming P=2 tau=5 alpha=0.5", value=1.37),
  ConfigResult("results/streaming_diloco_digits_piloted_3seeds", "streaming P=2 tau=5 alpha=0", value=1.93),
  ConfigResult("results/kale_outer_steps_digits_3seeds", "DiLoCo M=4", value=1.26),
  ConfigResult("results/kale_outer_steps_digits_3seeds", "DiLoCo M=2", value=1.63),
  ConfigResult("results/kale_outer_steps_digits_3seeds", "one-round-delayed M=2", value=1.07),
  ConfigResult("results/kale_outer_steps_digits_3seeds", "one-round-delayed M=8", value=1.59),
  ConfigResult("results/kale_outer_steps_digits_3seeds", "eager M=4", value=1.22),
  ConfigResult("results/kale_outer_steps_digits_3seeds", "eager M=2", value=1.33),
  ConfigResult("results/streaming_diloco_digits_3seeds", "DiLoCo", value=2.22),
  ConfigResult("results/streaming_diloco_digits_3seeds", "streaming P=4 tau=5 alpha=0.5", value=1.15),
  ConfigResult("results/streaming_diloco_digits_3seeds", "streaming P=4 tau=1 alpha=0", value=2.04),
  ConfigResult("results/eager_outer_step_digits_3seeds", "eager M=8", value=33.0, decimals=0),
  ConfigResult("results/eager_outer_step_digits_3seeds", "eager M=2", value=91.0, decimals=0),
)

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
