"""The contributions per update c and the effective batch c mu that each protocol's run config implies, by hand.

`stalesgd.training._config_readers` maps the config's fields to the protocol's options (n, ssp_bound,
backup_workers, max_staleness, allreduce_staleness) and asks the schedule for c; the learning-rate decay
boundaries and the run's length are in updates of c mu examples.
"""

from __future__ import annotations

import pytest

from stalesgd.training._config_readers import contributions_per_update, examples_per_update, updates_per_epoch
from stalesgd.training._run_config import default_config

TRAIN = 60_000

# lambda = 8 learners (M for the all-reduce protocols), mu = 16; the other protocol fields at default_config's
# values (n 1, ssp_bound 1, backup_workers 1, max_staleness 4, allreduce_staleness 1) unless set here.
EFFECTIVE_BATCH = [
  # protocol, fields, c, c mu, updates per epoch of 60,000 examples
  ("hardsync", {}, 8, 128, 468.75),
  ("softsync", {"n": 1}, 8, 128, 468.75),
  ("softsync", {"n": 2}, 4, 64, 937.5),
  ("softsync", {"n": 3}, 2, 32, 1875.0),  # floor(8 / 3)
  ("softsync", {"n": 8}, 1, 16, 3750.0),
  ("async", {}, 1, 16, 3750.0),
  ("ssp", {"ssp_bound": 3}, 8, 128, 468.75),
  ("backup", {"backup_workers": 1}, 7, 112, 60_000 / 112),
  ("backup", {"backup_workers": 3}, 5, 80, 750.0),
  ("drop_stale", {"n": 1, "max_staleness": 2}, 8, 128, 468.75),
  ("drop_stale", {"n": 8, "max_staleness": 2}, 1, 16, 3750.0),
  ("allreduce_sync", {}, 8, 128, 468.75),
  ("s3gd", {"allreduce_staleness": 2}, 8, 128, 468.75),
  ("dcs3gd", {}, 8, 128, 468.75),
]


@pytest.mark.parametrize("protocol, fields, contributions, examples, per_epoch", EFFECTIVE_BATCH)
def test_effective_batch_of_each_protocol_by_hand(protocol, fields, contributions, examples, per_epoch):
  config = default_config()
  config.protocol = protocol
  config.update(fields)
  assert (config.learners, config.batch_per_learner) == (8, 16)
  assert contributions_per_update(config) == contributions
  assert examples_per_update(config) == examples
  assert updates_per_epoch(config, TRAIN) == pytest.approx(per_epoch, rel=1e-12)
