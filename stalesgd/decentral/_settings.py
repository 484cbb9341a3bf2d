"""What distinguishes the all-reduce protocols: staleness, correction, eager updates.

`DCS3GDSettings` holds the hyperparameters of one step of `stalesgd.decentral.DCS3GD`;
`settings_for_protocol` builds the settings of a named protocol
(``"dcs3gd"``, ``"s3gd"``, ``"allreduce_sync"``), which is how a training loop
selects one from a config string.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optax

from stalesgd import _validation as validation
from stalesgd import schedule
from stalesgd.parallel import _sharding as sharding

LAMBDA_MODES = ("constant", "adaptive", "layerwise")
# lambda_0 of each mode where a run does not choose one, from each mode's source: DC-ASGD-c 0.04 and DC-ASGD-a 2.0
# (Zheng et al., arXiv 1609.08326, Sec. 6), layer-wise 0.2 (the DC-S3GD release's default; docs/algorithms.md).
DEFAULT_LAMBDA_0 = {"constant": 0.04, "adaptive": 2.0, "layerwise": 0.2}
# The all-reduce protocols DC-S3GD runs (not the outer-loop ones: diloco's rounds are stalesgd.decentral._streaming).
PROTOCOLS = tuple(name for name in schedule.DECENTRALIZED_PROTOCOLS if not schedule.protocol_row(name).outer_loop)


@dataclasses.dataclass(frozen=True)
class DCS3GDSettings:
  """Hyperparameters of DC-S3GD and the protocols it contains.

  Attributes:
    staleness: all-reduce staleness S >= 0: the averaged update of step t is
      applied at step t + S. S = 1 is DC-S3GD's overlap (the all-reduce of
      step t's update is issued in step t+1 with no dependency on its
      forward/backward, so it can run during it; `DCS3GD.overlap_report`
      checks the compiled step); S = 0 is synchronous all-reduce SGD.
    dc_lambda: lambda_0 of the first-order correction (a number or an optax
      schedule of the step); 0 disables the correction (plain S3GD).
    lambda_mode: ``"constant"`` (lambda = lambda_0), ``"adaptive"``
      (lambda_0 / sqrt(MeanSquare + eps), DC-ASGD-a's normalisation, with one
      MeanSquare per learner) or ``"layerwise"`` (lambda_0 ||g|| / ||g g D|| per
      parameter leaf; reconstructed, see `stalesgd.decentral._dcs3gd`).
    mean_square_decay: m of the adaptive mode's MeanSquare.
    eps: epsilon of the adaptive mode.
    eager: eager updates (Kale et al., arXiv 2502.12996): a learner's own
      pending updates enter its local weights with weight 1/M, as they will in
      the consensus, instead of 1. Needs staleness >= 1.
    axis_name: the mesh axis the learners are laid out along.
  """

  staleness: int = 1
  dc_lambda: optax.ScalarOrSchedule = 0.2
  lambda_mode: str = "layerwise"
  mean_square_decay: float = 0.95
  eps: float = 1e-7
  eager: bool = False
  axis_name: str = sharding.LEARNERS_AXIS

  def __post_init__(self):
    validation.check_integer("staleness", self.staleness, low=0, builtin_only=True)
    validation.check_choice("lambda_mode", self.lambda_mode, LAMBDA_MODES)
    if not callable(self.dc_lambda):
      validation.check_real("dc_lambda", self.dc_lambda, low=0, allow_inf=True, note="or an optax schedule")
    validation.check_real("mean_square_decay", self.mean_square_decay, low=0, high=1, high_open=True)
    validation.check_real("eps", self.eps, low=0, low_open=True, allow_inf=True)
    if self.eager and self.staleness == 0:
      raise ValueError(
        f"eager=True needs staleness >= 1 (there is no pending update at staleness=0); got staleness={self.staleness}"
      )
    if not isinstance(self.axis_name, str) or not self.axis_name:
      validation.reject("axis_name", self.axis_name, "a non-empty string")

  @property
  def corrects(self) -> bool:
    """Whether the step computes the correction at all (dc_lambda is not the number 0)."""
    return callable(self.dc_lambda) or self.dc_lambda != 0


def settings_for_protocol(protocol: str, **overrides: Any) -> DCS3GDSettings:
  """The settings of a named all-reduce protocol.

  The protocol's row of `stalesgd.schedule.PROTOCOL_TABLE` fixes some fields
  (``fixed_settings``); the others keep `DCS3GDSettings`'s defaults unless
  overridden:

  * ``"dcs3gd"``: DC-S3GD, staleness 1, layer-wise lambda with lambda_0 = 0.2.
  * ``"s3gd"``: stale-synchronous SGD without correction (dc_lambda = 0),
    staleness 1.
  * ``"allreduce_sync"``: synchronous all-reduce SGD (staleness 0, no
    correction).

  Args:
    protocol: one of `PROTOCOLS`.
    **overrides: `DCS3GDSettings` fields that replace the protocol's defaults.

  Returns:
    The validated settings.

  Raises:
    ValueError: unknown protocol, unknown field, or an override that
      contradicts the protocol (a correction for ``s3gd``, staleness for
      ``allreduce_sync``).
  """
  validation.check_choice("protocol", protocol, PROTOCOLS)
  fields = {field.name for field in dataclasses.fields(DCS3GDSettings)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"unknown DCS3GDSettings fields {unknown}; allowed: {sorted(fields)}")
  row = schedule.protocol_row(protocol)
  settings = DCS3GDSettings(**{**row.fixed_settings, **overrides})
  if not row.corrects and settings.corrects:
    raise ValueError(
      f"protocol={protocol!r} has no correction; got dc_lambda={settings.dc_lambda!r} "
      f"(use protocol={schedule.CORRECTED_DECENTRALIZED_PROTOCOLS[0]!r})"
    )
  fixed_staleness = row.fixed_settings.get("staleness")
  if fixed_staleness is not None and settings.staleness != fixed_staleness:
    raise ValueError(
      f"protocol={protocol!r} is synchronous; got staleness={settings.staleness} (use protocol='s3gd' or 'dcs3gd')"
    )
  if fixed_staleness is None and not row.corrects and settings.staleness == 0:  # that is allreduce_sync
    raise ValueError(
      f"protocol={protocol!r} is stale-synchronous and needs staleness >= 1; got staleness=0 "
      "(use protocol='allreduce_sync')"
    )
  return settings
