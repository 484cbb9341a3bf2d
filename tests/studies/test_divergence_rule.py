"""The numeric rule that calls a run diverged when it learned, then fell back to chance for good
(`stalesgd.studies._divergence.collapse_update`), and what the report does with such a run."""

from __future__ import annotations

import json
import math

import pytest

from stalesgd.studies import _divergence as divergence
from stalesgd.studies._report import write_report
from stalesgd.studies._study import Claim, Study, Variant

CHANCE = math.log(10)  # 2.302...; within 5 %: [2.187, 2.418]; learned: below 1.151


def _records(losses):
  return [{"step": 10 * (index + 1), "epoch": index + 1.0, "train_loss": loss} for index, loss in enumerate(losses)]


@pytest.mark.parametrize(
  "losses, update",
  [
    ([2.3, 1.0, 0.5, 2.30, 2.31, 2.29], 40),  # learned, then chance for its last 3 records: from update 40
    ([2.3, 1.0, 0.5, 2.30, 2.31, 2.29, 2.30], 40),
    ([2.3, 1.0, 0.5, 0.4, 2.31, 2.29], None),  # only 2 records at chance: not yet
    ([2.3, 2.3, 2.3, 2.3, 2.3], None),  # never learned: a failure, not a divergence
    ([2.3, 1.2, 2.3, 2.3, 2.3], None),  # 1.2 is not below half of chance
    ([2.3, 1.0, 2.30, 2.31, 1.5, 2.29], None),  # left chance again: not "for the rest of the run"
    ([2.3, 1.0, 2.0, 2.0, 2.0], None),  # 2.0 is outside 5 % of chance
    ([2.3, 1.0, 2.19, 2.41, 2.2], 30),  # both edges of the band
  ],
)
@pytest.mark.timeout(20)  # a walk back that never moves fails here instead of hanging the run
def test_the_rule_by_hand(losses, update):
  assert divergence.collapse_update(_records(losses), CHANCE) == update


# A chance of 20 makes both thresholds exact in binary: half of it is 10.0, 5 % of it is 1.0 (0.05 x 20 rounds to
# 1.0), so a loss can sit on each edge.
EXACT = 20.0


@pytest.mark.parametrize(
  "losses, update",
  [
    ([10.0, 20.0, 20.0, 20.0], None),  # exactly half of chance is not below it: never learned
    ([9.0, 21.0, 19.0, 21.0], 20),  # exactly 5 % above and below chance is within the band
    ([9.0, 21.5, 20.0, 20.0], None),  # 7.5 % above is not: two records at chance only
    # learned at the third record; the stretch back at chance begins right after it (update 40), not later
    ([20.0, 20.0, 5.0, 20.0, 20.0, 20.0, 20.0], 40),
  ],
)
@pytest.mark.timeout(20)
def test_the_rules_thresholds_on_their_edges(losses, update):
  assert (divergence.COLLAPSE_LEARNED * EXACT, divergence.COLLAPSE_BAND * EXACT) == (10.0, 1.0)
  assert divergence.COLLAPSE_LEARNED == 0.5
  assert divergence.collapse_update(_records(losses), EXACT) == update


def test_a_collapsed_run_is_reported_as_diverged_and_left_out(tmp_path):
  study = Study(
    "toy",
    "toy",
    "b matches a",
    (Variant("a", "demo", "hardsync"), Variant("b", "demo", "softsync_inverse")),
    paper_data=False,
    has_quick=False,
    last_evaluations=1,
    claims=(Claim("b matches a", "b", "a", "matches", 2.0),),
  )
  rows = []
  for label, seed, losses, error in (
    ("a", 0, [2.3, 0.5, 0.4, 0.3], 10.0),
    ("a", 1, [2.3, 0.5, 0.4, 0.3], 11.0),
    ("b", 0, [2.3, 0.5, 0.4, 0.3], 10.5),
    ("b", 1, [2.3, 0.5, 2.3, 2.3, 2.3], 90.0),  # collapsed at update 30
  ):
    directory = tmp_path / label / f"seed_{seed}"
    directory.mkdir(parents=True)
    (directory / "dataset.json").write_text(json.dumps({"num_classes": 10}))
    records = _records(losses)
    records[-1]["test_error"] = error
    (directory / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    rows.append({"variant": label, "slug": label, "seed": seed, "n": None, "workdir": str(directory)})
    rows[-1].update(status="ok", test_error=error, epochs=1.0)
  text = write_report(study, rows, tmp_path)
  assert rows[3]["status"] == "diverged: back at chance loss from update 30"
  assert "10.50 (1 seed); 1 diverged" in text  # b's value is its one learning seed, not an average with 90 %
  assert "not decided (1 seed: no interval)" in text
  assert "Left out, diverged (a diverged run is no error rate): b seed 1 (diverged: back at chance loss" in text
  # b's one seed paired with a diverged: no paired runs are left, and the decision still names the seed left out;
  # a claim with nothing left out names none.
  (tmp_path / "b_diverged").mkdir()
  write_report(study, [dict(rows[0]), dict(rows[1]), dict(rows[3])], tmp_path / "b_diverged")
  (entry,) = json.loads((tmp_path / "b_diverged" / "decisions.json").read_text())
  assert entry["decision"] == "not decided (no paired runs)"
  assert entry["diverged_left_out"] == ["b seed 1 (diverged: back at chance loss from update 30)"]
  (tmp_path / "a_only").mkdir()
  write_report(study, [dict(rows[0]), dict(rows[1])], tmp_path / "a_only")
  (entry,) = json.loads((tmp_path / "a_only" / "decisions.json").read_text())
  assert entry["decision"] == "not run" and "diverged_left_out" not in entry
