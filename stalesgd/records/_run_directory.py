"""A run's directory: the one list of the files a run and a study write into it, and what each holds.

Every module that writes or reads one of these names takes it from here. A run
(`stalesgd.training.train_and_evaluate`, written by process 0 only):

* ``config.json`` (`CONFIG`): the run's config; a restart with another config (other than the logging and
  checkpoint cadences, `stalesgd.training.check_same_run`) is refused instead of mixing two runs;
* ``dataset.json`` (`DATASET`): the data's class count, split sizes, image shape, chance-level test error and
  the sha256 of in-memory splits, written at the start; a restart on data with other digests is refused
  (`stalesgd.training._workdir.check_same_data`);
* ``schedule.npz`` (`SCHEDULE`): the simulated cluster's schedule (`stalesgd.schedule.Schedule.load`);
* ``metrics.jsonl`` (`METRICS`) and TensorBoard event files (``events.out.tfevents.*``, `EVENTS_GLOB`):
  ``train_loss``, ``staleness_mean``/``staleness_max``, ``lr_scale``, ``epoch``, ``sim_time`` (simulated
  seconds), ``wall_time``, ``images_per_s``, and at evaluations ``test_accuracy``, ``test_error`` (percent),
  ``test_loss``, ``train_accuracy``; TensorBoard's HParams get the config and the final metrics;
* ``checkpoints/`` (`CHECKPOINTS`): everything needed to resume exactly (weights, ring buffer or in-flight
  updates, optimizer state, position); a damaged step is set aside as ``<step>.unreadable``;
* at the end, ``curves.png`` (`CURVES`, test error against epochs and simulated time), ``staleness.png``
  (`STALENESS`) and ``summary.json`` (`SUMMARY`: final metrics, wall time and its breakdown, the weights'
  sha256, provenance, and every session's code and host).

A study run (`stalesgd.studies`) adds ``registration.json`` (`REGISTRATION`: the digest of its study's claims, seeds
and settings and its commit, written before its first update; `stalesgd.studies._registration`), ``diverged.json``
(`DIVERGED`: the update a non-finite loss stopped the run at) and, when it ran as its own process,
``process.log`` (`PROCESS_LOG`). A study's own directory holds its report (`stalesgd.studies._report`).
"""

from __future__ import annotations

CONFIG = "config.json"
DATASET = "dataset.json"
SCHEDULE = "schedule.npz"
METRICS = "metrics.jsonl"
EVENTS_GLOB = "events.out.tfevents.*"
CHECKPOINTS = "checkpoints"
CURVES = "curves.png"
STALENESS = "staleness.png"
SUMMARY = "summary.json"
DIVERGED = "diverged.json"
REGISTRATION = "registration.json"
PROCESS_LOG = "process.log"

RUN_FILES = {
  CONFIG: "the run's config",
  DATASET: "what the data is, with its sha256",
  SCHEDULE: "the simulated cluster's schedule",
  METRICS: "one JSON record per log interval and evaluation",
  EVENTS_GLOB: "TensorBoard scalars and HParams",
  CHECKPOINTS: "the state a resume restores",
  CURVES: "test error against epochs and simulated time",
  STALENESS: "the histogram of gradient staleness",
  SUMMARY: "final metrics, provenance and sessions",
  DIVERGED: "where a study run diverged",
  REGISTRATION: "the study's claims and commit when a study run began",
  PROCESS_LOG: "a study run's own process output",
}
"""Every name a run's directory may hold (a glob for the event files), with what it is."""
