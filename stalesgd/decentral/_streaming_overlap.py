"""Whether a compiled streaming DiLoCo round lets each fragment's all-reduce overlap inner steps.

Douillard et al.'s streaming DiLoCo hides a fragment's all-reduce behind the inner steps between its sync and the
use of its mean. `overlap_windows` says how many steps each all-reduce of a round program has (from the settings
alone); `overlap_report` reads the compiled round's HLO text (`stalesgd.decentral._hlo`) and says whether that
much matrix work is independent of each all-reduce. What the compiled program allows, not a measured overlap.
The round itself is `stalesgd.decentral._streaming`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stalesgd.decentral import _hlo as hlo
from stalesgd.decentral._streaming import StreamingSettings, carries_round_end, check_settings


def overlap_windows(settings: StreamingSettings) -> list[tuple[int, int, int]]:
  """A round program's all-reduces of pseudo-gradients in program order, as (inner steps done when it is issued,
  fragment, window): the inner steps of the program between it and the use of its mean, which it may overlap.

  A sync before the round's end is all-reduced where it happens; its mean is used tau steps later (eager updates:
  at the fragment's next sync), within the round. A sync at the round's end is all-reduced at the next round's
  start where it is carried (`carries_round_end`), with the next round's steps up to its use as its window;
  otherwise at the end, with window 0 (synchronous DiLoCo: nothing to overlap).
  """
  settings = check_settings(settings, settings.fragments)
  steps, fragments, delay = settings.local_steps, settings.fragments, settings.delay
  windows = []
  for p in range(fragments):
    sync = (p + 1) * steps // fragments
    if sync == steps and carries_round_end(settings):
      windows.append((0, p, steps if settings.eager else delay))
    else:
      used = steps if settings.eager else min(sync + delay, steps)
      windows.append((sync, p, used - sync))
  return sorted(windows)


def overlap_report(text: str, settings: StreamingSettings) -> dict[str, Any]:
  """Whether each fragment's all-reduce in a compiled round leaves its window's inner steps independent of it
  (`overlap_windows`; `stalesgd.decentral._hlo.independence`).

  Args:
    text: the compiled round, ``jax.jit(round).lower(state, batches).compile().as_text()`` of a
      `sharded_streaming_round` with ``settings`` bound.
    settings: its settings.

  Returns:
    A dict: ``all_reduces`` (each one's `hlo.Independence` as a dict, and ``reads``, the numbers of the entry
    parameters it transitively reads: the flattened ``(state, batches)`` when compiled with ``keep_unused=True``),
    in program order,
    ``matrix_work_per_step`` (the round's matrix work over H), ``windows`` (`overlap_windows`), and
    ``overlap_ready``: the P fragments' all-reduces are separate (the first P in program order, the syncs' order;
    a round-end metric may share the last) and the one of each sync with a window of w steps has at least w
    steps' matrix work independent of it, w > 0 for at least one. What the compiled program allows, not a
    measured overlap: that needs a device trace.
  """
  reduces = hlo.all_reduces(text)
  found = hlo.independences(text, [reduce.name for reduce in reduces])
  per_step = len(hlo.matrix_work(text)) / settings.local_steps
  windows = overlap_windows(settings)
  separate = len(found) >= len(windows)
  ready = (
    separate
    and any(window > 0 for _, _, window in windows)
    and all(reduce.independent >= window * per_step for reduce, (_, _, window) in zip(found, windows))
  )
  return {
    "all_reduces": [
      {**dataclasses.asdict(counts), "reads": sorted(reduce.parameters)} for reduce, counts in zip(reduces, found)
    ],
    "matrix_work_per_step": per_step,
    "windows": windows,
    "overlap_ready": ready,
  }
