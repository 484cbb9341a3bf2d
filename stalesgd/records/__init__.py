"""A run's files: their names in a run directory, its metrics (``metrics.jsonl`` and TensorBoard), and paths.

Exported for a user's own program: `read_jsonl` (a run's ``metrics.jsonl``). Private: ``_run_directory`` (a run
directory's file names), ``_metrics`` (the writer and reader of a run's metrics), ``_paths`` (local or
``gs://`` paths, whole-file writes).
"""

from stalesgd.records._metrics import read_jsonl

__all__ = ["read_jsonl"]
