"""Leaf utilities of the training stack: nothing here imports another stalesgd layer.

`stalesgd.data`, `stalesgd.training` and the programs use them; the core
(`transforms`, `schedule`, `engine`, `decentral`, `parallel`) does not.

Exported for a user's own program: `initialize` (joining a multi-process run
under SLURM, Open MPI, Kubernetes or another MPI), `read_jsonl` (a run's
``metrics.jsonl``) and `plot_curves` (test error against epochs and simulated
time). The rest is private: ``_metrics`` (``metrics.jsonl`` and TensorBoard),
``_progress``, ``_plots`` and ``_schedule_plots``, ``_compilation_cache``,
``_distributed``, ``_run_directory`` (a run directory's file names).
"""

from stalesgd.utils._distributed import initialize
from stalesgd.utils._metrics import read_jsonl
from stalesgd.utils._plots import plot_curves

__all__ = [
  "initialize",
  "plot_curves",
  "read_jsonl",
]
