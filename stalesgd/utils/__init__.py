"""Leaf utilities of the training stack: nothing here imports another stalesgd layer.

`stalesgd.data`, `stalesgd.training` and the programs use them; the core
(`transforms`, `schedule`, `engine`, `decentral`, `parallel`) does not.

* `MetricWriter`, `read_jsonl` (`._metrics`): ``metrics.jsonl`` and TensorBoard.
* `ProgressReporter` (`._progress`): progress lines with rates and ETA.
* `plot_curves`, `plot_bands`, `plot_staleness_histograms`,
  `plot_protocol_comparison`, `write_results_table` (`._plots`,
  `._schedule_plots`): figures and tables (matplotlib).
* `enable_compilation_cache` (`._compilation_cache`): JAX's persistent cache.
* `initialize`, `detect_environment`, `ClusterSpec` (`._distributed`):
  multi-process start-up (SLURM, Open MPI, Kubernetes, other MPIs).
"""

from stalesgd.utils._compilation_cache import enable_compilation_cache
from stalesgd.utils._distributed import (
  DISTRIBUTED_MODES,
  JAX_CLUSTER_VARIABLES,
  ClusterSpec,
  detect_environment,
  initialize,
  resolve_cluster,
)
from stalesgd.utils._metrics import MetricWriter, read_jsonl
from stalesgd.utils._plots import (
  Band,
  Run,
  markdown_table,
  plot_bands,
  plot_curves,
  plot_staleness_histograms,
  write_results_table,
)
from stalesgd.utils._progress import ProgressReporter
from stalesgd.utils._schedule_plots import plot_protocol_comparison

__all__ = [
  "DISTRIBUTED_MODES",
  "JAX_CLUSTER_VARIABLES",
  "Band",
  "ClusterSpec",
  "MetricWriter",
  "ProgressReporter",
  "Run",
  "detect_environment",
  "enable_compilation_cache",
  "initialize",
  "markdown_table",
  "plot_bands",
  "plot_curves",
  "plot_protocol_comparison",
  "plot_staleness_histograms",
  "read_jsonl",
  "resolve_cluster",
  "write_results_table",
]
