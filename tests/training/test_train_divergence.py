"""A diverging run stops with `FloatingPointError` naming the update and leaves a good checkpoint behind.

Async DC-ASGD-a with alpha_0 = 10^4 on the tiny MLP: the first block's losses
(at the initial weights) are finite, a checkpoint of its result is started,
and the loss becomes NaN a couple of blocks later. The checkpoint is written in
the background, so the run must finish writing it before the error leaves
`train_and_evaluate`; otherwise a process that dies of the error loses it.
"""

from __future__ import annotations

import pathlib
import re

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from stalesgd.training._loop import TrainingDiverged, train_and_evaluate
from tests.helpers.train_helpers import complete_checkpoints, read_metrics, tiny_config

DIVERGING_LEARNING_RATE = 1e4


@pytest.mark.slow
def test_non_finite_loss_stops_the_run_and_the_last_checkpoint_is_good(tmp_path):
  workdir = tmp_path / "run"
  config = tiny_config(
    "async_dc", learning_rate=DIVERGING_LEARNING_RATE, checkpoint_every_seconds=1, log_every_updates=1
  )
  with pytest.raises(
    FloatingPointError, match=r"the training loss became (nan|inf|-inf) at update \d+ \(epoch "
  ) as error:
    train_and_evaluate(config, str(workdir))
  bad_update = int(re.search(r"at update (\d+)", str(error.value)).group(1))
  assert isinstance(error.value, TrainingDiverged) and error.value.update == bad_update
  assert "learning_rate" in str(error.value)  # says what to change

  records = read_metrics(workdir)
  assert records and all(np.isfinite(record["train_loss"]) for record in records)
  assert records[-1]["step"] <= bad_update  # nothing logged from the update that diverged on
  assert not (workdir / "summary.json").exists()

  # Every save that was started is complete (no orbax temporary directory left).
  leftovers = [path.name for path in (workdir / "checkpoints").iterdir() if not path.name.isdigit()]
  assert leftovers == []
  saved = complete_checkpoints(workdir)
  assert saved and saved[-1] <= bad_update
  state = ocp.StandardCheckpointer().restore(pathlib.Path(workdir) / "checkpoints" / str(saved[-1]) / "state")
  assert int(state["step"]) == saved[-1]
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    assert np.all(np.isfinite(np.asarray(leaf))), jax.tree_util.keystr(path)
