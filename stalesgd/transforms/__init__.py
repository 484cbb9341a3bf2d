"""Optax transforms for training with stale gradients.

Staleness-dependent scaling, delay compensation (DC-ASGD), Gap-Aware penalties,
the reduction of a stack of contributions, and ready-made chains. Each is an
optax ``GradientTransformationExtraArgs`` whose per-step inputs (``staleness``,
``stale_params``, ``learner``) arrive as keyword-only extra arguments.
"""

from stalesgd.transforms.delay_compensation import delay_compensated_gradient
from stalesgd.transforms.delay_compensation import update_mean_square

__all__ = [
    "delay_compensated_gradient",
    "update_mean_square",
]
