"""A Python env's parts (`env.kind=python`): its entry imported, its task file read and split, the first
observations of its tasks, and its host-loop settings. `bmrl.assembly.host_player.HostPlayer` uses them.

    factory, splits, observations = python_parts(cfg)     # user code imported and reset once per run
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from bmrl.config import Config, ConfigError
from bmrl.data.suites import read_task_suite, task_splits
from bmrl.distributed import gather_objects, process_share
from bmrl.envs.python.protocol import EntryError, load_entry
from bmrl.envs.python.tasks import TaskFileError, read_tasks
from bmrl.rollout.host import HostConfig
from bmrl.rollout.pyenv import CORPUS_TASKS, reset_texts


def python_parts(cfg: Config) -> tuple[Any, Any, list[str]]:
    """(factory, `bmrl.data.TaskSplits`, first observations) of a python-kind env: `env.entry` imported
    from `env.path` (default: the working directory) and `sys.path` with one env built and checked, the
    `data.tasks` file read and split (`python_splits`), and the first observations of the file's tasks
    (`bmrl.rollout.pyenv.reset_texts`). Raises ConfigError naming env.entry, env.options, data.tasks
    or a data size."""
    e = cfg.env
    try:
        factory = load_entry(e.entry, e.options, search=[e.path or os.getcwd()])
    except EntryError as err:
        raise ConfigError(f"env.{err.part}", str(err)) from None
    tasks = read_task_file(cfg)
    return factory, python_splits(cfg, tasks), first_observations(factory, tasks)


def read_task_file(cfg: Config) -> list[dict]:
    """The `data.tasks` file's tasks, in order; ConfigError naming data.tasks when it cannot be read."""
    try:
        return read_tasks(cfg.data.tasks)
    except TaskFileError as err:
        raise ConfigError("data.tasks", str(err)) from None


def first_observations(factory: Callable[[], Any], tasks: Sequence[dict]) -> list[str]:
    """`reset_texts` of the first CORPUS_TASKS tasks, each process resetting its `process_share` of them
    (one reset per task however many hosts run; the texts gathered, in task order, on every process)."""
    tasks = list(tasks)[:CORPUS_TASKS]
    mine = process_share(len(tasks))
    texts = reset_texts(factory, [tasks[i] for i in mine], first_seed=int(mine[0]) if len(mine) else 0)
    return [text for part in gather_objects(texts) for text in part]


SIZE_KEYS = {"train": "train_size", "validation": "val_size", "test": "test_size"}  # split -> its data.* size


def python_sizes(cfg: Config) -> dict[str, int]:
    """How many tasks of each split a Python env keeps: at most `data.<split>_size`, the first ones (a
    task file holds what it holds; the report states the counts)."""
    return {s: getattr(cfg.data, key) for s, key in SIZE_KEYS.items()}


def python_splits(cfg: Config, tasks: list[dict]) -> Any:
    """The `bmrl.data.TaskSplits` of a Python env's `tasks` (the `data.tasks` file's, in order): disjoint
    by content, repeated tasks dropped (`bmrl.data.suites.task_splits`), cut to `python_sizes`; stored
    under `data.data_dir` when set (TFDS array_record, built once, read back), else in memory, the same.

    Raises ConfigError naming data.tasks when the train or test split would be empty (too few tasks:
    about 1 in 16 lands in test).
    """
    full = task_splits(tasks)
    counts = full.counts()
    held = ", ".join(f"{n} {s}" for s, n in counts.items())
    repeats = f" ({full.duplicates} repeated task(s) dropped)" if full.duplicates else ""
    if not counts["train"] or not counts["test"]:
        raise ConfigError("data.tasks", f"{cfg.data.tasks!r}: its {sum(counts.values())} distinct task(s){repeats} "
                          f"split into {held}; a run needs train and test tasks. A task's split is decided by its "
                          "content hash (about 1 in 16 tasks lands in test, 1 in 16 in validation): give more "
                          "distinct tasks (48 give about 3 test tasks).")
    sizes = {split: min(n, counts[split]) for split, n in python_sizes(cfg).items()}
    if cfg.data.data_dir is None:
        return full.head(sizes)
    stored = read_task_suite(cfg.env.entry, tasks, sizes, cfg.data.data_dir)
    return dataclasses.replace(stored, duplicates=full.duplicates)


def host_config(cfg: Config) -> HostConfig:
    """The `HostConfig` of a python-kind `env` section (timeout, workers, what a fault does)."""
    return HostConfig(step_timeout_s=cfg.env.step_timeout_s, workers=cfg.env.workers, on_fault=cfg.env.on_fault,
                      groups=cfg.env.pipeline_groups)


__all__ = ["SIZE_KEYS", "first_observations", "host_config", "python_parts", "python_sizes", "python_splits",
           "read_task_file"]
