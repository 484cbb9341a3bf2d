"""The repository's scripts that are not installed (the wheel holds `stalesgd` only).

* ``benchmarks/``: the measurements behind docs/performance.md, each writing ``results/<name>.json``;
* ``schedule_stats.py``: the timing model's staleness statistics;
* ``dcs3gd_wallclock.py``: what DC-S3GD's staleness buys in simulated wall-clock time;
* ``run_digests.py``: digests of a tiny run of every protocol, which a pure refactor must leave unchanged;
* ``run_pinned.sh``: long study grids from a pinned commit, resumable, and saving what finished.

Training runs and studies have one command each, installed with the package: ``stalesgd-train`` and
``stalesgd-reproduce`` (`stalesgd.cli`).
"""
