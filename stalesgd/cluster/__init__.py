"""Starting a process of a run: joining a multi-process run, and JAX's persistent compilation cache.

Exported for a user's own program: `initialize` (joining a multi-process run under SLURM, Open MPI, Kubernetes
or another MPI; a single process needs nothing). Private: ``_distributed`` (the launchers' detection and
``jax.distributed.initialize``), ``_compilation_cache``.
"""

from stalesgd.cluster._distributed import initialize

__all__ = ["initialize"]
