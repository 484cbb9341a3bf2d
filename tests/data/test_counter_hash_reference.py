"""The per-batch random bits against a reference written here from SplitMix64's definition.

SplitMix64 (Steele, Lea, Flood, OOPSLA 2014; Vigna's splitmix64.c) advances its state by 0x9E3779B97F4A7C15 and
mixes it with two xor-shift-multiply rounds. Seeded with 0, its first output is 0xE220A8397B1DCDAF
(16294208416658607535). The reference below is plain Python integers modulo 2^64 and does not use
`stalesgd.data._counter_hash`; a changed constant or shift there changes every augmentation and dropout draw of
every run, and the other data tests (which compare draws with draws) do not notice it.
"""

from __future__ import annotations

import numpy as np

from stalesgd.data._counter_hash import AUGMENTATION_STREAM, DROPOUT_STREAM, batch_keys, sample_hashes, splitmix64

_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
  z = (value + 0x9E3779B97F4A7C15) & _MASK
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
  return z ^ (z >> 31)


def test_the_reference_gives_splitmix64s_published_first_output():
  assert _mix(0) == 0xE220A8397B1DCDAF == 16294208416658607535


def test_splitmix64_is_the_reference_on_random_64_bit_values():
  values = np.random.default_rng(0).integers(0, 2**64, size=200, dtype=np.uint64, endpoint=False)
  values = np.concatenate([values, np.array([0, 1, 2**63, 2**64 - 1], np.uint64)])
  expected = [_mix(int(value)) for value in values]
  assert [int(value) for value in splitmix64(values)] == expected


def test_the_streams_are_the_ones_every_run_drew_from():
  # Augmentation draws come from stream 1 and dropout seeds from stream 2: another number is another random
  # sequence for every run (its results would not reproduce), the same number for both would correlate them.
  assert (AUGMENTATION_STREAM, DROPOUT_STREAM) == (1, 2)


def test_the_sample_counter_sets_the_top_bit_as_adding_two_to_the_63_does():
  """sample_hashes mixes j | 2^63, the formula's j + 2^63: equal for every j < 2^63 (no carry into bit 63), as are
  j ^ 2^63 and j - 2^63 modulo 2^64; the evidence of those mutants' equivalence (experiments/
  mutation_equivalents.json), on the largest batch sizes and random j below 2^63."""
  top = np.uint64(1 << 63)
  j = np.concatenate(
    [np.arange(4096, dtype=np.uint64), np.random.default_rng(1).integers(0, 2**63, size=4096, dtype=np.uint64)]
  )
  with np.errstate(over="ignore"):
    assert np.array_equal(j | top, j + top) and np.array_equal(j | top, j ^ top) and np.array_equal(j | top, j - top)
  assert [int(value) for value in (j | top)[:3]] == [2**63, 2**63 + 1, 2**63 + 2]


def test_batch_keys_and_sample_hashes_follow_their_formulas():
  for seed, stream in ((0, 1), (3, 2), (2**40 + 7, 1)):
    batches = np.array([0, 1, 5, 1000, 2**33], np.uint64)
    base = _mix(_mix(seed) ^ stream)
    expected_keys = [_mix((base + int(g)) & _MASK) for g in batches]  # key = mix(mix(mix(seed) ^ stream) + g)
    keys = batch_keys(seed, stream, batches)
    assert [int(key) for key in keys] == expected_keys
    expected = [_mix(key ^ _mix(j + 2**63)) for key in expected_keys for j in range(3)]  # h = mix(K ^ mix(j + 2^63))
    assert [int(value) for value in sample_hashes(keys, 3)] == expected
