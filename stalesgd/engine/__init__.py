"""Exact, fast execution of a `stalesgd.schedule.Schedule` (docs/design.md, *Engine*)."""

from stalesgd.engine._blocks import Block, BlockPlan, block_starting_at, plan_blocks
from stalesgd.engine._emulator import (
  GRADIENT_STRATEGIES,
  UNROLLED_SLOTS_PER_DEVICE,
  BlockMetrics,
  Engine,
  EngineState,
  default_gradient_strategy,
)
from stalesgd.engine._ring_buffer import RingBuffer, ring_bytes, ring_depth

__all__ = [
  "GRADIENT_STRATEGIES",
  "UNROLLED_SLOTS_PER_DEVICE",
  "Block",
  "BlockMetrics",
  "BlockPlan",
  "Engine",
  "EngineState",
  "RingBuffer",
  "block_starting_at",
  "default_gradient_strategy",
  "plan_blocks",
  "ring_bytes",
  "ring_depth",
]
