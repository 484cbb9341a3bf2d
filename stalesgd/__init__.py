"""stalesgd: training neural networks with stale gradients, in JAX.

The optax transforms are re-exported here, e.g. ``stalesgd.dc_asgd(0.1)``.
"""

from stalesgd.transforms import (
  STALENESS_RULES,
  DelayedNesterovState,
  DelayedState,
  ModulatedStepState,
  ScaleByDelayCompensationState,
  ScaleByGapAwareState,
  ScaleByStalenessState,
  average_contributions,
  contributions_in_stack,
  dc_asgd,
  delay_compensated_gradient,
  delayed,
  delayed_nesterov,
  lr_scale,
  modulated_step,
  scale_by_delay_compensation,
  scale_by_delayed_nesterov,
  scale_by_gap_aware,
  scale_by_staleness,
  staleness_aware_sgd,
  staleness_weight,
  update_mean_square,
)

__version__ = "0.2.0"

__all__ = [
  "average_contributions",
  "contributions_in_stack",
  "dc_asgd",
  "delay_compensated_gradient",
  "delayed",
  "delayed_nesterov",
  "DelayedNesterovState",
  "DelayedState",
  "lr_scale",
  "modulated_step",
  "ModulatedStepState",
  "scale_by_delay_compensation",
  "scale_by_delayed_nesterov",
  "scale_by_gap_aware",
  "scale_by_staleness",
  "ScaleByDelayCompensationState",
  "ScaleByGapAwareState",
  "ScaleByStalenessState",
  "staleness_aware_sgd",
  "STALENESS_RULES",
  "staleness_weight",
  "update_mean_square",
]
