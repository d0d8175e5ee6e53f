"""A JAX env's tasks: train / validation / test splits of its levels (seeds), disjoint by content
(`bmrl.data.suites`), and how they were split (for reports). A Python env's come from its task file
(`bmrl.assembly.python_env`); a run asks its player (`bmrl.assembly.players.split_tasks`).

    seeds = level_seeds(cfg, "test", cfg.eval.num_tasks, env)   # int32[n]
    summary = level_summary(cfg, env)
"""

from __future__ import annotations

from typing import Any

from bmrl.config import Config
from bmrl.data import suite_overlap
from bmrl.data.suites import compute_splits, read_suite, suite_name


def suite_sizes(cfg: Config) -> dict[str, int]:
    """The sizes of a JAX env's splits: `data.train_size`, `data.val_size` and `data.test_size`, the
    held-out ones at least `eval.num_tasks` (every evaluation takes a prefix)."""
    d, n = cfg.data, max(cfg.eval.num_tasks, 1)
    return {"train": d.train_size, "validation": max(d.val_size, n), "test": max(d.test_size, n)}


def data_dir(cfg: Config) -> str | None:
    """Where the run's task suites are stored (`data.data_dir`; `bmrl reproduce` sets `<out_dir>/data`
    for all its stages), or None: computed in memory, the same splits."""
    return cfg.data.data_dir


def run_splits(cfg: Config, env: Any, sizes: dict[str, int] | None = None):
    """The `bmrl.data.Splits` of the levels of JAX env `env`.

    Stored under `data.data_dir` (TFDS array_record, built once, then read back) when it is set; else
    computed in memory (once per process), the same splits.
    """
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


def level_seeds(cfg: Config, split: str, n: int | None, env: Any) -> Any:
    """The first n (default: the split's size, `suite_sizes`) level seeds of `split` ("train",
    "validation" or "test") of JAX env `env`: int32[n]."""
    sizes = suite_sizes(cfg)
    if split not in sizes:
        raise ValueError(f"Unknown split {split!r}; valid splits are {list(sizes)}.")
    n = sizes[split] if n is None else n
    return run_splits(cfg, env, {**sizes, split: max(sizes[split], n)}).head(split, n)


def level_summary(cfg: Config, env: Any) -> dict:
    """`bmrl.assembly.players.suite_summary` of a JAX env: the split sizes, the overlap of the first
    `eval.num_tasks` test levels with the training levels (content hashes), `disjoint_by` ("content", or
    "seed" with too few levels) and `path`."""
    n = max(cfg.eval.num_tasks, 1)
    splits = run_splits(cfg, env)
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


__all__ = ["data_dir", "level_seeds", "level_summary", "run_splits", "suite_line", "suite_sizes"]
