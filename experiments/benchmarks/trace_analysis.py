"""The arithmetic of `experiments.benchmarks.trace_breakdown`: XLA:CPU thunks of a `jax.profiler` trace,
split into convolution / elementwise / collective / idle device time (no flags, so tests import it)."""

from __future__ import annotations

import collections
import re

CATEGORIES = ("convolution", "elementwise", "collective", "idle")
_COLLECTIVE = re.compile(r"^(all-to-all|all-gather|all-reduce|reduce-scatter|collective-permute)")
_CONVOLUTION = re.compile(r"^(ynn_fusion|onednn|convolution|dot|wrapped_reduce-window|reduce-window)")


def category(op_name: str) -> str:
  """The category of one HLO op's thunk (see the module docstring)."""
  if _COLLECTIVE.match(op_name):
    return "collective"
  if _CONVOLUTION.match(op_name):
    return "convolution"
  return "elementwise"


def _exclusive(events: list[dict]) -> list[tuple[dict, float]]:
  """Each event with its duration minus that of the events nested in it (same thread), in microseconds."""
  result = []
  for thread_events in _by(events, "tid").values():
    stack: list[list] = []  # [event, end, exclusive]
    for event in sorted(thread_events, key=lambda e: (e["ts"], -e["dur"])):
      while stack and event["ts"] >= stack[-1][1]:
        result.append((stack[-1][0], stack.pop()[2]))
      if stack:
        stack[-1][2] -= event["dur"]
      stack.append([event, event["ts"] + event["dur"], event["dur"]])
    result.extend((entry[0], entry[2]) for entry in stack)
  return result


def _by(events: list[dict], key: str) -> dict:
  grouped = collections.defaultdict(list)
  for event in events:
    grouped[event[key] if key in event else event["args"][key]].append(event)
  return grouped


def device_seconds(events: list[dict], module: str) -> dict:
  """Microseconds by category, summed over the devices, from a trace's complete ("X") events.

  Only the thunks of ``module`` count; a device's wall clock runs from its
  first traced thunk of the module to its last, and what its thunks do not
  cover is ``idle``.

  Args:
    events: the trace's ``traceEvents``.
    module: the HLO module of the program (`trace_breakdown.PROGRAMS`).

  Returns:
    ``{category: microseconds}``, ``wall_us`` (the longest device's wall
    clock), ``devices`` and ``thunks`` (how many op executions were traced).
  """
  ops = [
    event
    for event in events
    if event.get("ph") == "X"
    and event.get("args", {}).get("hlo_module") == module
    and "hlo_op" in event["args"]
    and "device_ordinal" in event["args"]
  ]
  if not ops:
    raise ValueError(f"the trace holds no thunk of module {module!r}")
  totals = dict.fromkeys(CATEGORIES, 0.0)
  walls = []
  for device_ops in _by(ops, "device_ordinal").values():
    start = min(event["ts"] for event in device_ops)
    wall = max(event["ts"] + event["dur"] for event in device_ops) - start
    busy = 0.0
    for event, exclusive in _exclusive(device_ops):
      totals[category(event["args"]["hlo_op"])] += exclusive
      busy += exclusive
    totals["idle"] += wall - busy
    walls.append(wall)
  return {**totals, "wall_us": max(walls), "devices": len(walls), "thunks": len(ops)}


def per_gradient(parts: list[dict]) -> dict:
  """Device-microseconds per gradient by category over programs that ran side by side (one or several
  processes: `device_seconds` of each plus its ``gradients``), and their summed gradients per second."""
  gradients = sum(part["gradients"] for part in parts)
  row = {name: sum(part[name] for part in parts) / gradients for name in CATEGORIES}
  row["devices"] = sum(part["devices"] for part in parts)
  row["thunks_per_gradient"] = sum(part["thunks"] for part in parts) / gradients
  row["gradients"] = gradients
  row["traced_grads_per_s"] = sum(part["gradients"] / part["seconds"] for part in parts)
  return row
