"""The rule for floats a fixture wrote on another host (`tests.helpers.cross_host`): exact on the same host,
to the stated tolerance elsewhere, and never looser for integers, strings or differences beyond it."""

from __future__ import annotations

import pytest

from tests.helpers import cross_host

HERE = {"cpu_model": "AMD EPYC", "jax": "0.10.2", "jaxlib": "0.10.2"}
ELSEWHERE = {"cpu_model": "Intel(R) Xeon(R) Processor", "jax": "0.10.2", "jaxlib": "0.10.2"}
RECORD = {"step": 24, "train_loss": 0.7485488057136536, "test_error": 31.000000000000007, "staleness_max": 0}
# The difference seen between an AMD EPYC and an Intel Xeon at step 24 of the study fixture's run.
MOVED_IN_LAST_BITS = {**RECORD, "train_loss": 0.7485487461}


def test_the_running_host_is_described_by_the_recorded_fields():
  assert set(cross_host.this_host()) == set(cross_host.HOST_FIELDS)
  assert cross_host.same_host(cross_host.this_host())
  assert not cross_host.same_host({**cross_host.this_host(), "cpu_model": "a processor no machine has"})


def test_the_same_host_compares_bit_for_bit():
  cross_host.assert_records_agree([RECORD], [RECORD], HERE, num_test=300, running_host=HERE)
  with pytest.raises(AssertionError, match=r"exactly \(same host\).*train_loss"):
    cross_host.assert_records_agree([MOVED_IN_LAST_BITS], [RECORD], HERE, num_test=300, running_host=HERE)


def test_another_host_compares_to_the_stated_tolerance():
  cross_host.assert_records_agree([MOVED_IN_LAST_BITS], [RECORD], ELSEWHERE, num_test=300, running_host=HERE)
  one_flip = {**RECORD, "test_error": RECORD["test_error"] + 100.0 / 300}  # one of 300 test examples
  cross_host.assert_records_agree([one_flip], [RECORD], ELSEWHERE, num_test=300, running_host=HERE)


@pytest.mark.parametrize(
  "changed",
  [
    {"train_loss": RECORD["train_loss"] * (1 + 10 * cross_host.CROSS_HOST_RTOL)},
    {"test_error": RECORD["test_error"] + 2 * 100.0 / 300},  # two examples
    {"step": 25},
    {"staleness_max": 1},
  ],
)
def test_another_host_still_refuses_what_the_tolerance_does_not_cover(changed):
  with pytest.raises(AssertionError, match="cross-host tolerance|!="):
    cross_host.assert_records_agree([{**RECORD, **changed}], [RECORD], ELSEWHERE, num_test=300, running_host=HERE)


def test_a_missing_field_or_record_is_refused_on_any_host():
  with pytest.raises(AssertionError, match="fields"):
    cross_host.assert_records_agree([{"step": 24}], [RECORD], ELSEWHERE, num_test=300, running_host=HERE)
  with pytest.raises(AssertionError, match="records"):
    cross_host.assert_records_agree([], [RECORD], ELSEWHERE, num_test=300, running_host=HERE)
