"""The rule for floats a fixture wrote on another host (`tests.helpers.cross_host`): exact on the same host,
to the stated tolerance elsewhere, and never looser for integers, strings or differences beyond it."""

from __future__ import annotations

import pytest

from stalesgd.training._provenance import cpu_identity
from tests.helpers import cross_host

ZEN = "avx avx2 f16c fma sse2 sse4_1 sse4_2 sse4a ssse3"
HERE = {"cpu_model": "AMD EPYC", "cpu_id": "AuthenticAMD family 23 model 1", "cpu_isa": ZEN, "jax": "0.10.2",
        "jaxlib": "0.10.2"}  # fmt: skip
ELSEWHERE = {**HERE, "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_id": "GenuineIntel family 6 model 106"}
# Two processors of a virtual machine's /proc/cpuinfo (abridged); the model name hides the generation.
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512bw avx512_bf16 sha_ni hypervisor

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse sse2
"""
RECORD = {"step": 24, "train_loss": 0.7485488057136536, "test_error": 31.000000000000007, "staleness_max": 0}
# The difference seen between an AMD EPYC and an Intel Xeon at step 24 of the study fixture's run.
MOVED_IN_LAST_BITS = {**RECORD, "train_loss": 0.7485487461}


def test_the_running_host_is_described_by_the_recorded_fields():
  assert set(cross_host.this_host()) == set(cross_host.HOST_FIELDS)
  assert cross_host.same_host(cross_host.this_host())
  assert not cross_host.same_host({**cross_host.this_host(), "cpu_model": "a processor no machine has"})


def test_the_cpu_is_told_by_its_family_model_and_vector_instruction_sets_not_only_its_name():
  assert cpu_identity(CPUINFO) == {
    "cpu_model": "AMD EPYC",
    "cpu_id": "AuthenticAMD family 25 model 17",  # the first processor's
    "cpu_isa": "avx avx2 avx512_bf16 avx512bw avx512f f16c fma sse2 sse4_1 sse4_2 ssse3",
  }
  named_alike = {**HERE, "cpu_id": "AuthenticAMD family 25 model 17"}  # another generation of AMD EPYC
  assert not cross_host.same_host(named_alike, running=HERE)
  assert not cross_host.same_host({**HERE, "cpu_isa": ZEN + " avx512f"}, running=HERE)  # a VM showing AVX-512
  # A fixture written before the family and instruction sets were recorded is another host everywhere.
  assert not cross_host.same_host({"cpu_model": "AMD EPYC", "jax": "0.10.2", "jaxlib": "0.10.2"}, running=HERE)


def test_a_host_without_proc_cpuinfo_records_only_the_processor_name():
  identity = cpu_identity("")
  assert identity["cpu_id"] is None and identity["cpu_isa"] is None
  assert not cross_host.same_host({**HERE, **identity}, running={**HERE, **identity})  # nothing tells its CPU


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
