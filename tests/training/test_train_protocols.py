"""Every protocol through `train_and_evaluate`, on the embedded digits, for a few updates.

Parameter-server protocols (emulated exactly) and decentralized ones (real
collectives, one learner per each of the 8 devices), with the staleness rules
and delay compensations selected by the config: each run finishes, its losses
are finite, and what the config selected visibly reaches the optimizer (a
staleness rule scales stale gradients down; a correction changes the weights).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stalesgd.data import load_dataset
from stalesgd.training._config_readers import updates_per_epoch
from stalesgd.training._loop import train_and_evaluate
from tests.helpers.train_helpers import evaluation_records, read_metrics, tiny_config

EPOCHS = 0.1  # 3 synchronous updates of 64 images, 19 asynchronous ones of 8
CASES = {
  "hardsync": dict(protocol="hardsync"),
  "softsync-inverse": dict(protocol="softsync", n=2, staleness_rule="inverse"),
  "async": dict(protocol="async"),
  "async-dc_adaptive": dict(protocol="async", delay_compensation="adaptive", dc_lambda=2.0),
  "ssp-dc_constant": dict(protocol="ssp", ssp_bound=1, delay_compensation="constant", dc_lambda=0.5),
  "backup": dict(protocol="backup", backup_workers=2),
  "drop_stale-polynomial": dict(protocol="drop_stale", n=8, max_staleness=3, staleness_rule="polynomial"),
  "allreduce_sync": dict(protocol="allreduce_sync"),
  "s3gd": dict(protocol="s3gd", allreduce_staleness=1),
  "dcs3gd-constant": dict(protocol="dcs3gd", allreduce_staleness=1, delay_compensation="constant", dc_lambda=0.5),
}


@pytest.fixture(scope="module")
def digits_train_size():
  return load_dataset("digits", source="embedded").num_train


class Runs:
  """Runs each case at most once per module; later tests reuse the outputs."""

  def __init__(self, root):
    self.root = root
    self._done = {}

  def __call__(self, case: str):
    if case not in self._done:
      config = tiny_config("hardsync", num_epochs=EPOCHS, **CASES[case])
      workdir = self.root / case
      self._done[case] = (config, workdir, train_and_evaluate(config, str(workdir)))
    return self._done[case]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return Runs(tmp_path_factory.mktemp("protocols"))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_protocol_finishes_with_finite_losses(case, runs, digits_train_size):
  config, workdir, summary = runs(case)
  assert summary["protocol"] == config.protocol and summary["learners"] == 8
  assert summary["updates"] == math.ceil(EPOCHS * updates_per_epoch(config, digits_train_size)) > 1
  assert not summary["preempted"]
  records = read_metrics(workdir)
  assert records[-1]["step"] == summary["updates"]
  assert all(np.isfinite(record["train_loss"]) for record in records)
  assert evaluation_records(records)[-1]["step"] == summary["updates"]
  assert 0.0 <= summary["test_accuracy"] <= 1.0


@pytest.mark.slow
def test_staleness_appears_where_the_protocol_has_it(runs):
  for case in ("hardsync", "backup", "allreduce_sync"):
    assert runs(case)[2]["staleness_max"] == 0, case
  for case in ("softsync-inverse", "async", "ssp-dc_constant", "s3gd", "dcs3gd-constant"):
    assert runs(case)[2]["staleness_max"] >= 1, case
  assert runs("backup")[2]["dropped_gradients"] > 0  # the 2 slowest gradients of a round are discarded
  drop_stale = runs("drop_stale-polynomial")[2]
  assert drop_stale["dropped_gradients"] > 0
  assert drop_stale["staleness_max"] <= CASES["drop_stale-polynomial"]["max_staleness"]


@pytest.mark.slow
def test_staleness_rule_scales_stale_gradients_down(runs):
  for case in ("softsync-inverse", "drop_stale-polynomial"):
    scales = [record["lr_scale"] for record in read_metrics(runs(case)[1])]
    assert min(scales) < 1.0, case
  # Without a rule every gradient enters with weight 1.
  assert all(record["lr_scale"] == 1.0 for record in read_metrics(runs("async")[1]))


@pytest.mark.slow
def test_delay_compensation_changes_the_weights(runs):
  assert runs("async")[2]["params_sha256"] != runs("async-dc_adaptive")[2]["params_sha256"]
  assert runs("s3gd")[2]["params_sha256"] != runs("dcs3gd-constant")[2]["params_sha256"]


@pytest.mark.slow
def test_drop_stale_that_drops_nothing_says_so(tmp_path, capsys):
  # 1-softsync (the config's default n) has sigma <= 2, so max_staleness=4 can never drop a gradient.
  config = tiny_config("hardsync", num_epochs=0.05, protocol="drop_stale", n=1, max_staleness=4)
  train_and_evaluate(config, str(tmp_path / "nothing"))
  assert "protocol 'drop_stale' dropped no gradient" in capsys.readouterr().out
  config = tiny_config("hardsync", num_epochs=0.05, protocol="drop_stale", n=8, max_staleness=3)
  train_and_evaluate(config, str(tmp_path / "drops"))
  assert "dropped no gradient" not in capsys.readouterr().out
