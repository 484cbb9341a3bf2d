"""stalesgd: training neural networks with stale gradients, in JAX."""

__version__ = "0.1.0"
