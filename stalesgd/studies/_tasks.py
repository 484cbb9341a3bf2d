"""The runs of a study's grid: one `Task` per variant and seed, its config, command and directory.

`plan_tasks` lays the grid out (variant by variant, seeds 0 .. seeds - 1
within a variant; a task's index is its ``--task=INDEX``); `check_tasks`
validates every config and refuses a directory holding another run before any
run starts. A task runs in ``<study workdir>/<variant slug>/seed_<seed>``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from stalesgd.studies._registration import registration_record
from stalesgd.studies._study import Study, Variant
from stalesgd.studies._study_runs import StudySettings, run_directory_name, study_run
from stalesgd.training._config_checks import validate_config
from stalesgd.training._config_readers import is_decentralized
from stalesgd.training._run_config import flatten_config
from stalesgd.training._workdir import check_same_run


@dataclasses.dataclass(frozen=True)
class Task:
  """One run of a study's grid: a variant with a seed, its config, command and directory.

  Attributes:
    index: its place in the grid (`plan_tasks`'s order; ``--task=INDEX``).
    variant: the variant.
    seed: the run's ``config.seed``.
    config: the run's config.
    command: the training command that rebuilds the config (`Variant.command`).
    directory: ``<study workdir>/<variant slug>/seed_<seed>``.
    registration: the grid's `stalesgd.studies._registration.registration_record`, which the run records before
      its first update.
  """

  index: int
  variant: Variant
  seed: int
  config: ml_collections.ConfigDict
  command: str
  directory: pathlib.Path
  registration: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def label(self) -> str:
    return f"{self.variant.label}, seed {self.seed}"


def plan_tasks(
  study: Study,
  workdir: str | pathlib.Path,
  settings: StudySettings = StudySettings(),
  *,
  variants: Sequence[str] | None = None,
  seeds: int = 1,
  first_seed: int = 0,
) -> list[Task]:
  """Every run of the grid, variant by variant and seed by seed within a variant (seeds ``first_seed`` ..
  ``first_seed + seeds - 1``: a confirmatory grid names seeds its pilot or an earlier grid never used).

  Raises:
    ValueError: for an unknown variant, ``seeds`` < 1 or ``first_seed`` < 0.
  """
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise ValueError(f"seeds={seeds!r}; allowed: an integer >= 1 (runs seeds 0 .. seeds - 1)")
  if isinstance(first_seed, bool) or not isinstance(first_seed, int) or first_seed < 0:
    raise ValueError(f"first_seed={first_seed!r}; allowed: an integer >= 0 (the first seed run)")
  workdir = pathlib.Path(workdir)
  seed_values = range(first_seed, first_seed + seeds)
  registration = registration_record(study, seeds=seed_values, settings=dataclasses.asdict(settings))
  tasks = []
  for variant in study.select(variants):
    for seed in seed_values:
      config, command = study_run(study, variant, settings, seed=seed)
      directory = workdir / variant.slug / run_directory_name(seed)
      tasks.append(Task(len(tasks), variant, seed, config, command, directory, registration))
  return tasks


def check_tasks(tasks: Sequence[Task], num_devices: Callable[[ml_collections.ConfigDict], int] | None) -> None:
  """Validates every run's config and refuses a directory that holds another run, before any run starts.

  Args:
    tasks: the runs.
    num_devices: the number of devices a run's config will see; None checks
      only the directories (nothing will train).
  """
  for task in tasks:
    if num_devices is not None:
      validate_config(task.config, num_devices=num_devices(task.config))
    check_same_run(task.config, task.directory)


def gpus_needed(config: ml_collections.ConfigDict) -> int:
  """GPUs one run takes on a GPU host: one per learner for a decentralized protocol, else one."""
  return int(config.learners) if is_decentralized(config) else 1


def varied_fields(tasks: Sequence[Task]) -> tuple[str, ...]:
  """The config fields (flattened) whose values differ between the grid's runs: TensorBoard shows them first."""
  flats = [flatten_config(task.config) for task in tasks]
  fields = sorted(set().union(*flats)) if flats else []
  return tuple(field for field in fields if len({json.dumps(flat.get(field), sort_keys=True) for flat in flats}) > 1)


def command_with_workdir(task: Task, host_devices: int | None = None) -> str:
  """The run's training command with its ``--workdir`` (and host device count): what reruns it alone."""
  prefix = "" if host_devices is None else f"JAX_NUM_CPU_DEVICES={host_devices} "
  return f"{prefix}{task.command} --workdir={task.directory}"
