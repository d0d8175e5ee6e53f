"""Task suites: train / validation / test tasks disjoint by content, of a JAX env or a Python env's task file.

    splits = compute_splits(env, {"train": 4096, "validation": 64, "test": 256})   # a JAX env, in memory
    splits = read_suite(env, sizes, data_dir)    # the same, stored once as TFDS array_record, read back
    splits.seeds["test"], splits.hashes["test"], splits.by                         # int32[n], uint64[n]
    tasks = task_splits(read_tasks("tasks.jsonl"))          # a Python env's task dicts by split
    tasks = read_task_suite(entry, task_list, sizes, data_dir)        # the same, stored and read back

The rule (`_assign`): a task's split is decided by its content hash (`bmrl.data.content`): hash % 16
== 0 test, 1 validation, else train; each split keeps the first n tasks whose content is new to it. So
the splits are disjoint by content and distinct within, and prefixes are stable (the first n of a
larger draw are the same).

A JAX env's tasks are level seeds from one stream keyed by the env name, its content the level they
build (`compute_splits`). An env with too few distinct levels to fill a split within a bounded draw
(the corridor has two) falls back to disjoint seeds (train 4s, validation 4s+2, test 2s+1):
`by == "seed"`, and its test levels may repeat training levels (`suite_overlap` counts them).

A Python env's tasks are the lines of its task file in file order, its content the task's canonical
JSON (`task_splits`): every task lands in the split of its hash (a repeated line is dropped: it would
repeat a task of the same split), so a file of N tasks gives about N/16 test and N/16 validation tasks.
`sizes` (None = all) keep the first n of a split.

Stored suites (`TaskSuite`, "task_suite") are one builder config per suite, named `<env>_<digest>`: for
a JAX env of (env, the options that shape levels, sizes, VERSION), records hold seed, index, content
hash; for a task file of (the tasks' canonical JSON in file order, sizes, VERSION), named after the
entry, records hold the task's JSON text, index, content hash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import hashlib
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from bmrl.data.content import CHUNK, canonical, level_hashes

__all__ = ["SPLITS", "Splits", "TaskSplits", "TaskSuite", "build_suite", "compute_splits", "level_options",
           "read_suite", "read_task_suite", "suite_name", "suite_overlap", "task_splits", "task_suite_name"]

VERSION = "2.0.0"
SPLITS = ("train", "validation", "test")
BUCKETS = 16  # hash % BUCKETS: 0 -> test, 1 -> validation, else train
SLACK = 4  # a split may take SLACK x its expected draws before the env falls back to seeds
DRAW = 4096  # seeds drawn from the stream at a time (the stream, so the splits, do not depend on CHUNK)


@dataclasses.dataclass(frozen=True)
class Splits:
    """The level seeds `int32[n]` and content hashes `uint64[n]` of each split, and how they were made:
    `by` = "content" (disjoint levels) or "seed" (disjoint seeds only: the fallback)."""

    seeds: dict[str, np.ndarray]
    hashes: dict[str, np.ndarray]
    by: str
    FEATURES: ClassVar = {"seed": np.int32, "index": np.int32, "hash": np.uint64, "by_content": np.bool_}

    def head(self, split: str, n: int) -> np.ndarray:
        """The first `n` seeds of `split`, refused past its size."""
        return self.seeds[split][:_checked(split, n, len(self.seeds.get(split, ())))]

    def records(self, split: str) -> Iterator[dict]:
        """`split` as stored records (`FEATURES`)."""
        for i, (seed, h) in enumerate(zip(self.seeds[split].tolist(), self.hashes[split].tolist())):
            yield {"seed": seed, "index": i, "hash": h, "by_content": self.by == "content"}

    @classmethod
    def from_records(cls, records: dict[str, list[dict]]) -> Splits:
        """The splits of stored records (each split's in index order)."""
        by = "content" if all(bool(r["by_content"]) for rs in records.values() for r in rs) else "seed"
        return cls({s: np.asarray([int(r["seed"]) for r in rs], np.int32) for s, rs in records.items()},
                   {s: np.asarray([int(r["hash"]) for r in rs], np.uint64) for s, rs in records.items()}, by)


@dataclasses.dataclass(frozen=True, eq=False)
class TaskSplits:
    """A Python env's task dicts and their content hashes `uint64[n]` by split, in file order; always
    disjoint by content. `duplicates`: how many of the file's tasks were dropped as repeats."""

    tasks: dict[str, list[dict]]
    hashes: dict[str, np.ndarray]
    duplicates: int = 0
    by: ClassVar[str] = "content"
    FEATURES: ClassVar = {"task": str, "index": np.int32, "hash": np.uint64}

    def counts(self) -> dict[str, int]:
        """How many tasks each split holds."""
        return {s: len(self.tasks[s]) for s in SPLITS}

    def head(self, sizes: dict[str, int | None]) -> TaskSplits:
        """The first `sizes[split]` tasks of each split (None or absent: all), refused past its size."""
        n = {s: len(self.tasks[s]) if sizes.get(s) is None else _checked(s, sizes[s], len(self.tasks[s]))
             for s in SPLITS}
        return TaskSplits({s: self.tasks[s][: n[s]] for s in SPLITS}, {s: self.hashes[s][: n[s]] for s in SPLITS},
                          self.duplicates)

    def records(self, split: str) -> Iterator[dict]:
        """`split` as stored records (`FEATURES`): the task as JSON text in its own key order."""
        for i, (task, h) in enumerate(zip(self.tasks[split], self.hashes[split].tolist())):
            yield {"task": json.dumps(task, ensure_ascii=False), "index": i, "hash": h}

    @classmethod
    def from_records(cls, records: dict[str, list[dict]]) -> TaskSplits:
        """The splits of stored records (each split's in index order); `duplicates` is not stored."""
        return cls({s: [json.loads(_text(r["task"])) for r in rs] for s, rs in records.items()},
                   {s: np.asarray([int(r["hash"]) for r in rs], np.uint64) for s, rs in records.items()})


def _checked(split: str, n: int, size: int) -> int:
    """`n`, refused when `split` is unknown or holds fewer than `n` tasks."""
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits are {list(SPLITS)}.")
    if n > size:
        raise ValueError(f"{n} tasks asked of split {split!r} of {size}; raise its data size.")
    return n


def _text(value) -> str:
    """A stored text feature (bytes when read through the data source) as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def level_options(env) -> dict[str, Any]:
    """`env`'s options that can shape a level (all but the budget line's)."""
    return {k: v for k, v in sorted(env.options.items()) if k not in type(env).COMMON_OPTIONS}


def suite_name(env, sizes: dict[str, int]) -> str:
    """`<env>_<digest>`: the builder config name of `env`'s splits at `sizes` (this VERSION)."""
    key = json.dumps([env.name, level_options(env), [int(sizes[s]) for s in SPLITS], VERSION], default=str)
    return f"{env.name}_{hashlib.blake2b(key.encode(), digest_size=6).hexdigest()}"


def _bucket_split(hashes: np.ndarray) -> np.ndarray:
    """Split index (into SPLITS) of each content hash."""
    b = (hashes % BUCKETS).astype(np.int64)
    return np.where(b == 0, 2, np.where(b == 1, 1, 0))


def _assign(items: list, hashes: np.ndarray, kept: dict[str, tuple[list, list]], seen: dict[str, set],
            sizes: dict[str, int | None]) -> int:
    """The rule, item by item in order: each goes to its content hash's split and is kept there (in
    `kept[split]` = (items, hashes)) when the split wants more (`sizes[split]`, None = all) and its
    content is new to it (`seen[split]`). Returns how many were kept."""
    new = 0
    for item, h, i in zip(items, hashes.tolist(), _bucket_split(hashes).tolist()):
        s = SPLITS[i]
        if (sizes[s] is None or len(kept[s][0]) < sizes[s]) and h not in seen[s]:
            seen[s].add(h)
            kept[s][0].append(item)
            kept[s][1].append(h)
            new += 1
    return new


def compute_splits(env, sizes: dict[str, int]) -> Splits:
    """`env`'s splits at `sizes` by the module's rule (content, or the seed fallback)."""
    sizes = {s: int(sizes[s]) for s in SPLITS}
    share = {"train": (BUCKETS - 2) / BUCKETS, "validation": 1 / BUCKETS, "test": 1 / BUCKETS}
    max_draws = SLACK * max(sizes[s] / share[s] for s in SPLITS)
    rng = np.random.default_rng(zlib.crc32(f"bmrl/{env.name}".encode()))
    seen = {s: set() for s in SPLITS}
    kept = {s: ([], []) for s in SPLITS}
    draws = 0
    unfilled = lambda: any(len(kept[s][0]) < sizes[s] for s in SPLITS)  # noqa: E731
    while unfilled():
        if draws >= max_draws:
            return _seed_splits(env, sizes)
        block = rng.integers(0, 2**31 - 1, size=DRAW, dtype=np.int64).astype(np.int32)
        new = 0
        for lo in range(0, DRAW, CHUNK):  # hashed a chunk at a time, only as far as the splits need
            if not unfilled():
                break
            seeds = block[lo:lo + CHUNK]
            new += _assign(seeds.tolist(), level_hashes(env, {"seed": seeds}), kept, seen, sizes)
        draws += DRAW
        if new == 0:  # a whole block of draws without a new level for an unfilled split: too few levels
            return _seed_splits(env, sizes)
    return Splits({s: np.asarray(kept[s][0], np.int32) for s in SPLITS},
                  {s: np.asarray(kept[s][1], np.uint64) for s in SPLITS}, "content")


def task_splits(tasks: list[dict], sizes: dict[str, int | None] | None = None) -> TaskSplits:
    """A Python env's `tasks` (file order) split by the module's rule, all of them, then cut to the first
    `sizes[split]` of each (None: all; more than a split holds: ValueError)."""
    hashes = level_hashes(None, tasks)
    kept = {s: ([], []) for s in SPLITS}
    distinct = _assign(list(tasks), hashes, kept, {s: set() for s in SPLITS}, dict.fromkeys(SPLITS))
    splits = TaskSplits({s: kept[s][0] for s in SPLITS}, {s: np.asarray(kept[s][1], np.uint64) for s in SPLITS},
                        len(tasks) - distinct)
    return splits.head(sizes or {})


def task_suite_name(entry: str, tasks: list[dict], sizes: dict[str, int | None] | None = None) -> str:
    """`<entry>_<digest>`: the builder config name of `tasks`' splits at `sizes` (this VERSION); `entry`
    (the env's `module:factory`) only names it, the digest is of the tasks' content in file order."""
    key = json.dumps([[canonical(t) for t in tasks], [(sizes or {}).get(s) for s in SPLITS], VERSION])
    stem = re.sub(r"[^0-9a-z]+", "_", entry.lower()).strip("_") or "tasks"
    return f"{stem}_{hashlib.blake2b(key.encode(), digest_size=6).hexdigest()}"


def _seed_splits(env, sizes: dict[str, int]) -> Splits:
    """The fallback: distinct seeds per split from a stream keyed by env name and split; train 4s,
    validation 4s+2, test 2s+1 (so train even, test odd as before), disjoint by seed only."""
    seeds = {}
    for i, split in enumerate(SPLITS):
        rng = np.random.default_rng([zlib.crc32(f"bmrl/{env.name}".encode()), i])
        drawn: dict[int, None] = {}
        while len(drawn) < sizes[split]:
            for s in rng.integers(0, 2**28, size=max(sizes[split], 64)).tolist():
                if len(drawn) < sizes[split]:
                    drawn.setdefault(s)
        base = np.fromiter(drawn, np.int64, len(drawn))
        seeds[split] = {"train": 4 * base, "validation": 4 * base + 2, "test": 2 * base + 1}[split].astype(np.int32)
    return Splits(seeds, {s: level_hashes(env, {"seed": v}) for s, v in seeds.items()}, "seed")


def suite_overlap(train_hashes, test_hashes) -> int:
    """How many test tasks have a level (content hash) that is also among the training tasks'."""
    return int(np.isin(np.asarray(test_hashes, np.uint64), np.asarray(train_hashes, np.uint64)).sum())


# ---- stored as TFDS array_record ---------------------------------------------------------------


def _tfds():
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.utils import gcs_utils

    gcs_utils._is_gcs_disabled = True  # suites are built here, never downloaded
    tfds.display_progress_bar(False)
    return tfds


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One stored suite: its builder config name and description, the class of its splits (`Splits` or
    `TaskSplits`: FEATURES, records, from_records) and how to compute them."""

    name: str
    description: str
    kind: type
    compute: Callable[[], Any]


def _env_spec(env, sizes: dict[str, int]) -> _Spec:
    return _Spec(suite_name(env, sizes), f"{env.name} {level_options(env)} sizes {dict(sizes)}", Splits,
                 lambda: compute_splits(env, sizes))


def _task_spec(entry: str, tasks: list[dict], sizes: dict[str, int | None] | None) -> _Spec:
    return _Spec(task_suite_name(entry, tasks, sizes), f"{entry}: {len(tasks)} tasks, sizes {dict(sizes or {})}",
                 TaskSplits, lambda: task_splits(tasks, sizes))


def _builder_class():
    tfds = _tfds()

    class TaskSuite(tfds.core.GeneratorBasedBuilder):
        """The splits of one suite (`_Spec`): a builder config made per run (`suite_name`, `task_suite_name`)."""

        VERSION = tfds.core.Version(VERSION)
        RELEASE_NOTES: ClassVar = {"2.0.0": "Train/validation/test disjoint by content (a JAX env's levels or a task "
                                              "file's tasks); records hold the hash."}
        BUILDER_CONFIGS: ClassVar = []

        def __init__(self, *, spec: _Spec | None = None, **kwargs):
            self.spec = spec
            super().__init__(**kwargs)

        def _info(self):
            features = {k: tfds.features.Text() if v is str else v for k, v in self.spec.kind.FEATURES.items()}
            return tfds.core.DatasetInfo(builder=self, description=self.builder_config.description,
                                         features=tfds.features.FeaturesDict(features))

        def _split_generators(self, dl_manager):  # TFDS writes no empty split: one is read back empty
            splits = self.spec.compute()
            return {s: self._generate_examples(splits, s) for s in SPLITS if len(splits.hashes[s])}

        def _generate_examples(self, splits, split):
            for record in splits.records(split):
                yield record["index"], record

    return TaskSuite


TaskSuite = None  # the builder class, made on first use (importing TFDS costs seconds)
_READ: dict[tuple[str, str], Any] = {}  # (data_dir, suite name) -> splits read in this process


def _builder(spec: _Spec, data_dir):
    global TaskSuite
    if TaskSuite is None:
        TaskSuite = _builder_class()
    tfds = _tfds()
    config = tfds.core.BuilderConfig(name=spec.name, version=VERSION, description=spec.description)
    return TaskSuite(spec=spec, config=config, data_dir=str(data_dir), file_format="array_record")


@contextlib.contextmanager
def _quiet():
    """TFDS says what it does on stdout and through absl warnings ("Using custom data configuration",
    "Downloading and preparing dataset"): nothing is downloaded here, so keep a run's output clean."""
    from absl import logging as absl_logging

    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        absl_logging.set_verbosity(level)


def _prepare(spec: _Spec, data_dir):
    """The builder of `spec` under `data_dir`, its suite written (a no-op when stored already). On a
    multi-process run (a `data_dir` every host sees) process 0 writes it while the others wait, then
    they open it: two writers of one suite collide in TFDS's final rename."""
    from bmrl.distributed import main_writes  # imports JAX: only a run that builds suites needs it

    made = []

    def write() -> None:
        made.append(_builder(spec, data_dir))
        made[0].download_and_prepare()

    with _quiet():
        main_writes(f"bmrl-suite-{spec.name}", write)
        if not made:  # another process: made after process 0 wrote the suite, it finds it stored
            made.append(_builder(spec, data_dir))
            made[0].download_and_prepare()
    return made[0]


def _read(spec: _Spec, data_dir) -> Any:
    """`spec`'s splits, built under `data_dir` on first use and read back with `tfds.data_source` (once
    per process)."""
    key = (os.path.abspath(data_dir), spec.name)
    if key not in _READ:
        builder = _prepare(spec, data_dir)
        records = {}
        for split in SPLITS:
            source = builder.as_data_source(split=split) if split in builder.info.splits else ()
            records[split] = sorted((source[i] for i in range(len(source))), key=lambda r: int(r["index"]))
        _READ[key] = spec.kind.from_records(records)
    return _READ[key]


def build_suite(env, sizes: dict[str, int], data_dir: str | os.PathLike) -> str:
    """Write `env`'s splits at `sizes` as array_record under `data_dir` (a no-op if there); their path."""
    return str(_prepare(_env_spec(env, sizes), data_dir).data_dir)


def read_suite(env, sizes: dict[str, int], data_dir: str | os.PathLike) -> Splits:
    """`env`'s splits at `sizes`, stored under `data_dir` on first use and read back (`_read`)."""
    return _read(_env_spec(env, sizes), data_dir)


def read_task_suite(entry: str, tasks: list[dict], sizes: dict[str, int | None] | None,
                    data_dir: str | os.PathLike) -> TaskSplits:
    """`task_splits(tasks, sizes)` of env `entry`, stored under `data_dir` on first use and read back
    (`_read`); `duplicates` is the caller's to count (records hold the kept tasks only)."""
    return _read(_task_spec(entry, tasks, sizes), data_dir)
