"""The environment side of a run: the env of the `env` section (a built-in JAX env, or a Python env
with its task file read and split), the conversation format, the rollout configs and the mesh.

    env = make_env(cfg, tokenizer)         # a JAX `Env`, or a `bmrl.rollout.pyenv.PythonEnv` with its tasks
    fmt = run_format(cfg, env)

This module and `bmrl.assembly.tasks` are where the env kind is decided (with config validation); what
they build is handed down in a `bmrl.assembly.Run`, and its player plays either kind behind one protocol.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax

from bmrl.chat import ChatFormatError, TagLayoutError, env_format
from bmrl.config import Config, ConfigError
from bmrl.data.suites import read_task_suite, task_splits
from bmrl.distributed import gather_objects, process_share
from bmrl.envs import make
from bmrl.envs.python.protocol import EntryError, load_entry
from bmrl.envs.python.tasks import TaskFileError, read_tasks
from bmrl.parallel import MeshConfig, make_mesh
from bmrl.rollout import RolloutConfig
from bmrl.rollout.host import HostConfig
from bmrl.rollout.pyenv import CORPUS_TASKS, PythonEnv, host_format, reset_texts
from bmrl.sampling import SamplingConfig


def is_host(cfg: Config) -> bool:
    """Whether the run's env is a Python one played from the host (`env.kind=python`): asked here and in
    `bmrl.assembly.tasks` only."""
    return cfg.env.kind == "python"


def env_label(cfg: Config) -> str:
    """The environment as a comparison names it: a JAX env's name, `python <entry>` for a Python env."""
    return f"python {cfg.env.entry}" if is_host(cfg) else cfg.env.name


def env_name(cfg: Config) -> str:
    """The environment as the study's reports name it: a JAX env's name, a Python env's entry."""
    return cfg.env.entry if is_host(cfg) else cfg.env.name


def replays_states(cfg: Config) -> bool:
    """Whether probes and error injection can replay the env's oracle states (a JAX env's; a Python env's
    states live in user code): its player's `replays_states`."""
    return not is_host(cfg)


def env_line(cfg: Config) -> str:
    """The environment as an evaluation report's settings state it: name (or entry and task file) and options."""
    if is_host(cfg):
        return f"{cfg.env.entry} (python) {dict(cfg.env.options)}, tasks {cfg.data.tasks}"
    return f"{cfg.env.name} {dict(cfg.env.options)}"


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
    try:
        tasks = read_tasks(cfg.data.tasks)
    except TaskFileError as err:
        raise ConfigError("data.tasks", str(err)) from None
    return factory, python_splits(cfg, tasks), first_observations(factory, tasks)


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


def host_config(cfg: Config):
    """The `HostConfig` of a python-kind `env` section (timeout, workers, what a fault does)."""
    return HostConfig(step_timeout_s=cfg.env.step_timeout_s, workers=cfg.env.workers, on_fault=cfg.env.on_fault,
                      groups=cfg.env.pipeline_groups)


def make_env(cfg: Config, tokenizer, parts: tuple | None = None):
    """The environment of the `env` section for `tokenizer`: a JAX `Env` (its options and
    `show_budget`), or for kind python a `bmrl.rollout.pyenv.PythonEnv` with its tasks (from `parts`,
    `python_parts(cfg)`, when given)."""
    if is_host(cfg):
        factory, splits, observations = parts or python_parts(cfg)
        return PythonEnv.build(cfg.env.entry, factory, splits.tasks, tokenizer, host_config(cfg), texts=observations,
                               duplicates=splits.duplicates)

    options = dict(cfg.env.options)
    if cfg.env.show_budget and "max_budget" not in options and cfg.rollout.max_turns > 128:
        options["max_budget"] = cfg.rollout.max_turns  # the shown number table must reach every cap
    try:
        return make(cfg.env.name, tokenizer, **{**options, "show_budget": cfg.env.show_budget})
    except (TypeError, ValueError) as err:
        raise ConfigError("env.options", str(err)) from None


def run_format(cfg: Config, env):
    """The run's conversation format from the `format` section: `env`'s tokenizer's chat template (or
    the plain format), `format.kind`'s reply layout and `format.system_prompt` before the instructions
    (`bmrl.chat.env_format` for a JAX env, `bmrl.rollout.pyenv.host_format` for a Python env)."""
    f = cfg.format
    try:
        if is_host(cfg):
            return host_format(env, f.kind, f.system_prompt)
        return env_format(env, f.kind, f.system_prompt)
    except TagLayoutError as err:
        raise ConfigError("format.kind", str(err)) from None
    except ChatFormatError as err:
        raise ConfigError("model.path", f"{err} Use a model whose chat template bmrl can reproduce.") from None


# Platform defaults of the rollout's speed knobs (config null), measured side by side: on CPU, live-row
# compaction (BudgetMix {2,4,6,8} over all 8: 0.79-0.86 vs 1.0 off) and 64-key cache blocks are fastest;
# on an H200 compaction cost more than it saved (1.37 vs 1.04: a decode step there re-reads the weights
# for every chunk of rows) and 256-key blocks decoded 1.45x faster than 64 (bench/device.py, README).
PLATFORM_DEFAULTS = {"cpu": {"compact_min_rows": RolloutConfig.compact_min_rows,  # RolloutConfig's own: 16, 64
                             "attention_block": RolloutConfig.attention_block},
                     "accelerator": {"compact_min_rows": 0, "attention_block": 256}}


def platform_default(name: str, value: int | None) -> int:
    """`value`, or, when the config leaves it null, the default of the platform jax runs on."""
    if value is not None:
        return value
    return PLATFORM_DEFAULTS["cpu" if jax.default_backend() == "cpu" else "accelerator"][name]


def rollout_config(cfg: Config, for_eval: bool = False):
    """The `RolloutConfig` of the `rollout` section; evaluation samples at `eval.temperature`; the speed
    knobs left null take the platform's defaults (`PLATFORM_DEFAULTS`)."""
    r = cfg.rollout
    temperature = cfg.eval.temperature if for_eval else r.temperature
    return RolloutConfig(
        max_turns=r.max_turns,
        max_reply_tokens=r.max_reply_tokens,
        max_len=r.max_len,
        sampling=SamplingConfig(temperature=temperature, top_k=r.top_k, top_p=r.top_p),
        compact_min_rows=platform_default("compact_min_rows", r.compact_min_rows), compact_steps=r.compact_steps,
        attention_block=platform_default("attention_block", r.attention_block),
    )


def mesh_config(cfg: Config):
    """The `MeshConfig` of the `mesh` section, refused (ConfigError) if the devices cannot form it."""
    mesh = MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    try:
        make_mesh(mesh)
    except ValueError as err:
        raise ConfigError("mesh", f"{dataclasses.asdict(mesh)}: {err}") from None
    return mesh


__all__ = ["SIZE_KEYS", "env_label", "env_line", "env_name", "host_config", "is_host", "make_env", "mesh_config", "python_parts",
           "python_sizes", "python_splits", "replays_states", "rollout_config", "run_format"]
