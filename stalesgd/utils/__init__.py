"""Leaf modules of the training stack, one job each: nothing here imports another stalesgd layer.

`stalesgd.data`, `stalesgd.training`, `stalesgd.studies` and the programs use them; the core (`transforms`,
`schedule`, `engine`, `decentral`, `parallel`) does not. By job:

* starting a process: ``_distributed`` (joining a multi-process run under SLURM, Open MPI, Kubernetes or another
  MPI), ``_compilation_cache`` (JAX's persistent cache);
* a run's files: ``_run_directory`` (their names), ``_metrics`` (``metrics.jsonl`` and TensorBoard),
  ``_paths`` (local or ``gs://`` paths, whole-file writes), ``_import_path`` (a user's code by
  ``package.module:attribute``);
* showing results: ``_plots`` (figures), ``_schedule_plots`` (a schedule's figures), ``_tables`` (Markdown and
  CSV tables), ``_progress`` (a long run's progress line).

Exported for a user's own program: `initialize`, `read_jsonl` (a run's ``metrics.jsonl``) and `plot_curves`
(test error against epochs and simulated time).
"""

from stalesgd.utils._distributed import initialize
from stalesgd.utils._metrics import read_jsonl
from stalesgd.utils._plots import plot_curves

__all__ = [
  "initialize",
  "plot_curves",
  "read_jsonl",
]
