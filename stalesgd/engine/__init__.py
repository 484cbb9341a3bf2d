"""Exact, fast execution of a `stalesgd.schedule.Schedule` (docs/design.md, *Engine*)."""

from stalesgd.engine.engine import (GRADIENT_STRATEGIES, UNROLLED_SLOTS_PER_DEVICE, Engine, EngineState,
                                    WaveMetrics, default_gradient_strategy)
from stalesgd.engine.ring_buffer import RingBuffer, ring_bytes, ring_depth
from stalesgd.engine.waves import Wave, WavePlan, block_starting_at, plan_waves

__all__ = [
    "GRADIENT_STRATEGIES", "UNROLLED_SLOTS_PER_DEVICE", "Engine", "EngineState", "RingBuffer", "Wave", "WaveMetrics", "WavePlan",
    "block_starting_at", "default_gradient_strategy", "plan_waves", "ring_bytes", "ring_depth",
]
