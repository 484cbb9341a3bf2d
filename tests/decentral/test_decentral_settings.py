"""DCS3GDSettings validation and the named protocols."""

from __future__ import annotations

import optax
import pytest

from stalesgd.decentral import PROTOCOLS, DCS3GDSettings, settings_for_protocol


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"staleness": -1}, "staleness=-1; allowed: an integer >= 0"),
    ({"staleness": 1.5}, "staleness=1.5"),
    ({"staleness": True}, "staleness=True"),
    ({"lambda_mode": "global"}, "lambda_mode='global'; allowed: one of \\('constant', 'adaptive', 'layerwise'\\)"),
    ({"dc_lambda": -0.1}, r"dc_lambda=-0\.1; allowed: a number >= 0 \(inf allowed\) or an optax schedule"),
    ({"dc_lambda": "0.2"}, "dc_lambda='0.2'"),
    ({"mean_square_decay": 1.0}, r"mean_square_decay=1\.0; allowed: a finite number >= 0 and < 1"),
    ({"eps": 0.0}, r"eps=0\.0; allowed: a number > 0 \(inf allowed\)"),
    ({"eager": True, "staleness": 0}, "eager=True needs staleness >= 1"),
    ({"axis_name": ""}, "axis_name=''; allowed: a non-empty string"),
  ],
)
def test_bad_config_raises_value_error_naming_the_field(kwargs, message):
  with pytest.raises(ValueError, match=message):
    DCS3GDSettings(**kwargs)


def test_named_protocols():
  assert PROTOCOLS == ("allreduce_sync", "s3gd", "dcs3gd")  # the table's order (stalesgd.schedule.PROTOCOL_TABLE)
  dcs3gd = settings_for_protocol("dcs3gd")
  assert (dcs3gd.staleness, dcs3gd.dc_lambda, dcs3gd.lambda_mode, dcs3gd.corrects) == (1, 0.2, "layerwise", True)
  s3gd = settings_for_protocol("s3gd", staleness=2)
  assert (s3gd.staleness, s3gd.corrects) == (2, False)
  sync = settings_for_protocol("allreduce_sync")
  assert (sync.staleness, sync.corrects) == (0, False)
  assert settings_for_protocol("dcs3gd", dc_lambda=optax.linear_schedule(0.0, 0.2, 100)).corrects


@pytest.mark.parametrize(
  "protocol, overrides, message",
  [
    ("dcs3gd_fast", {}, "protocol='dcs3gd_fast'; allowed: one of"),
    ("dcs3gd", {"lamda": 0.1}, "unknown DCS3GDSettings fields \\['lamda'\\]"),
    ("s3gd", {"dc_lambda": 0.1}, "protocol='s3gd' has no correction"),
    ("s3gd", {"staleness": 0}, "needs staleness >= 1"),
    ("allreduce_sync", {"staleness": 1}, "protocol='allreduce_sync' is synchronous"),
  ],
)
def test_protocol_overrides_that_contradict_the_protocol_are_rejected(protocol, overrides, message):
  with pytest.raises(ValueError, match=message):
    settings_for_protocol(protocol, **overrides)
