"""A user's code by import path (``package.module:attribute``): `stalesgd.utils._import_path`, read by the data,
model, loss and solver fields of a config (docs/own_experiment.md). Nothing is exported.

The leaf modules this package held are split by job: `stalesgd.cluster` (starting a process), `stalesgd.records`
(a run's files), `stalesgd.reports` (figures, tables, progress).
"""

__all__: list[str] = []
