"""Optax transforms for training with stale gradients.

Staleness-dependent scaling, delay compensation (DC-ASGD), Gap-Aware penalties,
the reduction of a stack of contributions, ready-made chains, and `delayed`,
which makes any transform apply each gradient a fixed number of calls late, and delayed Nesterov, the outer
optimizer of asynchronous local SGD. Each is an
optax ``GradientTransformationExtraArgs`` whose per-step inputs (``staleness``,
``stale_params``, ``learner``) arrive as keyword-only extra arguments; see
`stalesgd.transforms._contributions` for how a stack of c gradients is passed.
`lr_scale` reads from an optimizer state the learning-rate scale the staleness
rules applied, and `modulated_step` applies it to any optimizer's step (Adam's too).
"""

from stalesgd.transforms._aliases import dc_asgd, staleness_aware_sgd
from stalesgd.transforms._contributions import average_contributions, contributions_in_stack
from stalesgd.transforms._delay_compensation import (
  ScaleByDelayCompensationState,
  delay_compensated_gradient,
  scale_by_delay_compensation,
)
from stalesgd.transforms._delayed import DelayedState, delayed
from stalesgd.transforms._delayed_nesterov import DelayedNesterovState, delayed_nesterov, scale_by_delayed_nesterov
from stalesgd.transforms._gap_aware import ScaleByGapAwareState, scale_by_gap_aware
from stalesgd.transforms._mean_square import update_mean_square
from stalesgd.transforms._modulated_step import ModulatedStepState, modulated_step
from stalesgd.transforms._staleness import RULES as STALENESS_RULES
from stalesgd.transforms._staleness import ScaleByStalenessState, lr_scale, scale_by_staleness, staleness_weight

__all__ = [
  "STALENESS_RULES",
  "DelayedNesterovState",
  "DelayedState",
  "ModulatedStepState",
  "ScaleByDelayCompensationState",
  "ScaleByGapAwareState",
  "ScaleByStalenessState",
  "average_contributions",
  "contributions_in_stack",
  "dc_asgd",
  "delay_compensated_gradient",
  "delayed",
  "delayed_nesterov",
  "lr_scale",
  "modulated_step",
  "scale_by_delay_compensation",
  "scale_by_delayed_nesterov",
  "scale_by_gap_aware",
  "scale_by_staleness",
  "staleness_aware_sgd",
  "staleness_weight",
  "update_mean_square",
]
