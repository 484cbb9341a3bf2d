"""stalesgd: training neural networks with stale gradients, in JAX.

The optax transforms are re-exported here, e.g. ``stalesgd.dc_asgd(0.1)``.
"""

from stalesgd.transforms import average_contributions
from stalesgd.transforms import contributions_in_stack
from stalesgd.transforms import dc_asgd
from stalesgd.transforms import delay_compensated_gradient
from stalesgd.transforms import delayed
from stalesgd.transforms import DelayedState
from stalesgd.transforms import lr_scale
from stalesgd.transforms import scale_by_delay_compensation
from stalesgd.transforms import scale_by_gap_aware
from stalesgd.transforms import scale_by_staleness
from stalesgd.transforms import ScaleByDelayCompensationState
from stalesgd.transforms import ScaleByGapAwareState
from stalesgd.transforms import ScaleByStalenessState
from stalesgd.transforms import STALENESS_RULES
from stalesgd.transforms import staleness_aware_sgd
from stalesgd.transforms import staleness_weight
from stalesgd.transforms import update_mean_square

from stalesgd import _moved

__version__ = "0.2.0"

__all__ = [
  "average_contributions",
  "contributions_in_stack",
  "dc_asgd",
  "delay_compensated_gradient",
  "delayed",
  "DelayedState",
  "lr_scale",
  "scale_by_delay_compensation",
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

_moved.install()

