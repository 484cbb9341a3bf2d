"""Showing results: figures, tables and a long run's progress line.

Exported for a user's own program: `plot_curves` (test error against epochs and simulated time). Private:
``_plots`` (figures from metric records), ``_schedule_plots`` (a schedule's figures), ``_tables`` (Markdown and
CSV result tables), ``_progress`` (the progress line of a long run).
"""

from stalesgd.reports._plots import plot_curves

__all__ = ["plot_curves"]
