"""experiments/run_digests.py's comparison: digests decide only between files of one host."""

from __future__ import annotations

from experiments import run_digests

HOST = {
  "cpu_model": "Intel(R) Xeon(R) Processor",
  "cpu_id": "GenuineIntel family 6 model 106",
  "cpu_isa": "avx avx2 avx512f fma sse4_2",
  "jax": "0.10.2",
  "jaxlib": "0.10.2",
}
RUNS = {"hardsync": {"params_sha256": "a", "metrics_sha256": "b", "scalars_sha256": "c", "records": 3}}


def test_equal_digests_of_one_host_are_unchanged_and_any_difference_names_the_run():
  assert run_digests.compare({"host": HOST, "runs": RUNS}, {"host": dict(HOST), "runs": RUNS}) == (0, "unchanged")
  other = {"hardsync": {**RUNS["hardsync"], "params_sha256": "z"}}
  assert run_digests.compare({"host": HOST, "runs": other}, {"host": HOST, "runs": RUNS}) == (1, "CHANGED: hardsync")


def test_files_of_another_cpu_or_jax_are_not_compared():
  for field, value in (
    ("cpu_model", "AMD EPYC"),
    ("cpu_id", "GenuineIntel family 6 model 85"),  # another generation, named alike
    ("cpu_isa", "avx avx2 fma sse4_2"),  # the same CPU with AVX-512 hidden
    ("cpu_id", None),  # a file taken before the family was recorded
    ("jaxlib", "0.10.1"),
  ):
    status, verdict = run_digests.compare({"host": HOST, "runs": RUNS}, {"host": {**HOST, field: value}, "runs": RUNS})
    assert status == 2 and verdict.startswith("NOT COMPARABLE: taken on another host")
    assert f"{field} {value!r} -> {HOST[field]!r}" in verdict


def test_a_file_without_a_host_is_compared_with_a_warning():
  status, verdict = run_digests.compare({"host": HOST, "runs": RUNS}, dict(RUNS))  # the earlier format: runs only
  assert status == 0
  assert verdict == "warning: the earlier file records no host; compare only files of one host. unchanged"


def test_the_host_is_the_cpu_model_and_the_compiler_versions():
  host = run_digests.digest_host()
  assert set(host) == set(run_digests.COMPARED_HOST_FIELDS) and host["jax"] and host["jaxlib"]
