"""Comparing floats a fixture recorded on one host with those computed on another.

A run's last bits depend on the CPU and on the versions that compile it (XLA picks other kernels and fusions):
the same commit gave other weights on an AMD EPYC and an Intel Xeon (docs/studies.md), and on two generations of
AMD EPYC that a virtual machine names alike. So a fixture records the host it was written on (`HOST_FIELDS`:
`stalesgd.training._provenance.cpu_identity`, jax, jaxlib; `this_host`), and a test compares what it computes with
the fixture's numbers

* exactly, on the same host: any change of a bit is a change of the code;
* on another host, to the tolerance `cross_host_tolerance` states: integers and strings still exactly; floats
  to ``CROSS_HOST_RTOL`` relative (plus ``CROSS_HOST_ATOL``); a classification metric on an evaluation split to
  one example of that split, since a weight moved in its last bits may flip one borderline prediction.

A fixture that lacks a field (written before the CPU's family and instruction sets were recorded) is from
another host for every running host: its CPU cannot be told from another generation's.

`assert_records_agree` applies the rule to lists of metric records (``metrics.jsonl``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from stalesgd.training._provenance import BITS_HOST_FIELDS, bits_host

HOST_FIELDS = BITS_HOST_FIELDS
CROSS_HOST_RTOL = 1e-4  # relative; the observed cross-host differences of a 47-update run were below 1e-6
CROSS_HOST_ATOL = 1e-6
# Metrics counted over an evaluation split, with the scale of one example: percent (error) or a fraction.
ONE_EXAMPLE_SCALE = {"test_error": 100.0, "test_accuracy": 1.0}


def this_host() -> dict[str, str | None]:
  """The running host's `HOST_FIELDS` (what a fixture records)."""
  return bits_host()


def same_host(recorded: Mapping[str, Any], running: Mapping[str, Any] | None = None) -> bool:
  """Whether ``recorded`` (a fixture's host) names the running host in every one of `HOST_FIELDS`; a field that
  either leaves unknown (None or missing) makes them different hosts."""
  running = this_host() if running is None else running
  return all(recorded.get(field) is not None and recorded.get(field) == running.get(field) for field in HOST_FIELDS)


def cross_host_tolerance(field: str, num_test: int) -> float:
  """The absolute tolerance of ``field`` between two hosts, for a value of about 1: see the module docstring."""
  if field in ONE_EXAMPLE_SCALE:
    return ONE_EXAMPLE_SCALE[field] / num_test
  return CROSS_HOST_ATOL


def _disagreement(field: str, actual: Any, expected: Any, exact: bool, num_test: int) -> str | None:
  floats = isinstance(actual, float) or isinstance(expected, float)
  numbers = all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in (actual, expected))
  if exact or not (floats and numbers):
    return None if actual == expected else f"{field}: {actual!r} != {expected!r}"
  if math.isclose(actual, expected, rel_tol=CROSS_HOST_RTOL, abs_tol=cross_host_tolerance(field, num_test)):
    return None
  return (
    f"{field}: {actual!r} vs {expected!r}, beyond the cross-host tolerance (rel {CROSS_HOST_RTOL:g}, "
    f"abs {cross_host_tolerance(field, num_test):g})"
  )


def assert_records_agree(
  actual: Sequence[Mapping[str, Any]],
  expected: Sequence[Mapping[str, Any]],
  recorded_host: Mapping[str, Any],
  *,
  num_test: int,
  running_host: Mapping[str, Any] | None = None,
) -> None:
  """Asserts ``actual`` agrees with ``expected``, written on ``recorded_host``: exactly on the same host, else to
  the cross-host tolerance (module docstring). ``num_test`` is the evaluation split's size."""
  assert len(actual) == len(expected), f"{len(actual)} records != {len(expected)} expected"
  exact = same_host(recorded_host, running_host)
  problems = []
  for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
    if set(got) != set(want):
      problems.append(f"record {index}: fields {sorted(set(got) ^ set(want))} differ")
      continue
    problems += [
      f"record {index}: {problem}"
      for field in want
      if (problem := _disagreement(field, got[field], want[field], exact, num_test)) is not None
    ]
  rule = "exactly (same host)" if exact else f"to the cross-host tolerance (written on {dict(recorded_host)})"
  assert not problems, f"records disagree {rule}: " + "; ".join(problems[:10])
