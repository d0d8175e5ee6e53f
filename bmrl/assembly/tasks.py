"""The tasks of a run: train / validation / test splits, disjoint by content (`bmrl.data.suites`), of a JAX
env's levels (seeds) or a Python env's task file, and how they were split (for reports).

    tasks = split_tasks(cfg, "test", cfg.eval.num_tasks, run=run)   # {"seed": int32[n]}, or n task dicts
    summary = suite_summary(cfg, run)
"""

from __future__ import annotations

from typing import Any

from bmrl.assembly.env import is_host, make_env, python_splits
from bmrl.config import Config, ConfigError
from bmrl.data import level_hashes, suite_overlap
from bmrl.data.suites import compute_splits, read_suite, suite_name
from bmrl.envs import _CharTokenizer
from bmrl.envs.python.tasks import TaskFileError, read_tasks


def suite_sizes(cfg: Config) -> dict[str, int]:
    """The sizes of a JAX env's splits: `data.train_size`, `data.val_size` and `data.test_size`, the
    held-out ones at least `eval.num_tasks` (every evaluation takes a prefix)."""
    d, n = cfg.data, max(cfg.eval.num_tasks, 1)
    return {"train": d.train_size, "validation": max(d.val_size, n), "test": max(d.test_size, n)}


def data_dir(cfg: Config) -> str | None:
    """Where the run's task suites are stored (`data.data_dir`; `bmrl reproduce` sets `<out_dir>/data`
    for all its stages), or None: computed in memory, the same splits."""
    return cfg.data.data_dir


def run_splits(cfg: Config, run: Any = None, sizes: dict[str, int] | None = None):
    """The `bmrl.data.Splits` of a JAX env's run (`run.env`'s levels, else the env of `cfg`).

    Stored under `data.data_dir` (TFDS array_record, built once, then read back) when it is set; else
    computed in memory (once per process), the same splits.
    """
    env = run.env if run is not None else make_env(cfg, _CharTokenizer())  # levels need no tokenizer
    sizes = sizes or suite_sizes(cfg)
    if cfg.data.data_dir is not None:
        return read_suite(env, sizes, cfg.data.data_dir)
    return _memo(compute_splits, env, sizes)


_SPLITS: dict[str, Any] = {}


def _memo(compute, env, sizes):
    """`compute(env, sizes)` once per process per (env, level options, sizes)."""
    key = suite_name(env, sizes)
    if key not in _SPLITS:
        _SPLITS[key] = compute(env, sizes)
    return _SPLITS[key]


def split_tasks(cfg: Config, split: str, n: int | None = None, run: Any = None) -> Any:
    """The first n tasks of `split` ("train", "validation" or "test"): `{"seed": int32[n]}` of a JAX
    env (default n: its size, `suite_sizes`; `run_splits` says how the splits are made); for a
    Python env the first n (default all) of `run.env`'s task dicts (`python_splits`)."""
    if is_host(cfg):
        if run is None:
            raise ValueError("the tasks of a Python env live in its Run: pass run=build_run(cfg).")
        return run.env.split(split, n)
    sizes = suite_sizes(cfg)
    if split not in sizes:
        raise ValueError(f"Unknown split {split!r}; valid splits are {list(sizes)}.")
    n = sizes[split] if n is None else n
    return {"seed": run_splits(cfg, run, {**sizes, split: max(sizes[split], n)}).head(split, n)}


def eval_split(cfg: Config, run: Any = None) -> str:
    """The split that training-time evaluation reads: validation (a Python env whose task file put no
    task in it: test)."""
    if is_host(cfg) and not split_tasks(cfg, "validation", run=run):
        return "test"
    return "validation"


def suite_summary(cfg: Config, run: Any = None) -> dict:
    """How the run's tasks were split, for reports: the split sizes, `overlap` = how many of the
    `eval.num_tasks` test tasks have a level (content hash) among the training tasks', `disjoint_by`
    ("content", or "seed" for a JAX env with too few levels) and `path` (the stored suites' directory,
    or None); a Python env's also `duplicates` (its task file's repeated tasks, dropped)."""
    n = max(cfg.eval.num_tasks, 1)
    if is_host(cfg):
        if run is None:  # the task file's splits, without importing the env

            try:
                splits = python_splits(cfg, read_tasks(cfg.data.tasks))
            except TaskFileError as err:
                raise ConfigError("data.tasks", str(err)) from None
            tasks, duplicates = splits.tasks, splits.duplicates
        else:
            tasks, duplicates = run.env.tasks, run.env.duplicates
        train, val, test = tasks["train"], tasks["validation"], tasks["test"][:n]
        overlap = suite_overlap(level_hashes(None, train), level_hashes(None, test))
        return {"train": len(train), "validation": len(val), "test": len(test), "overlap": overlap,
                "disjoint_by": "content", "duplicates": duplicates, "path": data_dir(cfg)}
    splits = run_splits(cfg, run)
    return {**{s: len(v) for s, v in splits.seeds.items()}, "test": n,
            "overlap": suite_overlap(splits.hashes["train"], splits.hashes["test"][:n]), "disjoint_by": splits.by,
            "path": data_dir(cfg)}


def suite_line(suites: dict) -> str:
    """One report line for `suite_summary`'s dict: how the splits were made and their overlap."""
    what = "task" if "duplicates" in suites else "level"  # a Python env's task file, or a JAX env's levels
    how = (f"disjoint by {what} content" if suites["disjoint_by"] == "content"
           else "disjoint by seed only (too few distinct levels to split by content)")
    if suites.get("duplicates"):
        how += f" ({suites['duplicates']} repeated task(s) of the task file dropped)"
    line = (f"Tasks: {suites['train']} train, {suites['validation']} validation, {suites['test']} test, {how}; "
            f"{suites['overlap']} of the {suites['test']} test tasks repeat a training {what}.")
    if suites["overlap"]:
        line += " The test levels repeat training levels: held-out results measure partly seen levels."
    return line


__all__ = ["data_dir", "eval_split", "run_splits", "split_tasks", "suite_line", "suite_sizes", "suite_summary"]
