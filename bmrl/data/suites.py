"""Task suites: train / validation / test level seeds of a JAX env, disjoint by level content.

    splits = compute_splits(env, {"train": 4096, "validation": 64, "test": 256})   # in memory
    splits = read_suite(env, sizes, data_dir)    # the same, stored once as TFDS array_record, read back
    splits.seeds["test"], splits.hashes["test"], splits.by                         # int32[n], uint64[n]

The rule (`compute_splits`): seeds come from one stream keyed by the env name; a level's split is
decided by its content hash (`bmrl.data.content.level_hashes`): hash % 16 == 0 test, 1 validation,
else train; each split keeps the first n seeds whose level is new to it. So the splits are disjoint
by content and distinct within, and prefixes are stable (the first n of a larger draw are the same).
An env with too few distinct levels to fill a split within a bounded draw (the corridor has two)
falls back to disjoint seeds (train 4s, validation 4s+2, test 2s+1): `by == "seed"`, and its test
levels may repeat training levels (`suite_overlap` counts them).

Stored suites (`TaskSuite`, "task_suite") are one builder config per (env, the options that shape
levels, sizes, VERSION), named `<env>_<digest>`; records hold seed, index and content hash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import hashlib
import json
import os
import zlib
from typing import Any, ClassVar

import numpy as np

from bmrl.data.content import CHUNK, level_hashes

__all__ = ["SPLITS", "Splits", "TaskSuite", "build_suite", "compute_splits", "level_options", "read_suite",
           "suite_name", "suite_overlap"]

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

    def head(self, split: str, n: int) -> np.ndarray:
        """The first `n` seeds of `split`, refused past its size."""
        if split not in SPLITS:
            raise ValueError(f"Unknown split {split!r}; valid splits are {list(SPLITS)}.")
        if n > len(self.seeds[split]):
            raise ValueError(f"{n} tasks asked of split {split!r} of {len(self.seeds[split])}; raise its data size.")
        return self.seeds[split][:n]


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
            hashes = level_hashes(env, {"seed": seeds})
            for seed, h, i in zip(seeds.tolist(), hashes.tolist(), _bucket_split(hashes).tolist()):
                s = SPLITS[i]
                if len(kept[s][0]) < sizes[s] and h not in seen[s]:
                    seen[s].add(h)
                    kept[s][0].append(seed)
                    kept[s][1].append(h)
                    new += 1
        draws += DRAW
        if new == 0:  # a whole block of draws without a new level for an unfilled split: too few levels
            return _seed_splits(env, sizes)
    return Splits({s: np.asarray(kept[s][0], np.int32) for s in SPLITS},
                  {s: np.asarray(kept[s][1], np.uint64) for s in SPLITS}, "content")


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


def _builder_class():
    tfds = _tfds()

    class TaskSuite(tfds.core.GeneratorBasedBuilder):
        """The splits of one (env, level options, sizes): a builder config made per run (`suite_name`)."""

        VERSION = tfds.core.Version(VERSION)
        RELEASE_NOTES: ClassVar = {"2.0.0": "Train/validation/test disjoint by level content; records hold the hash."}
        BUILDER_CONFIGS: ClassVar = []

        def __init__(self, *, env=None, sizes=None, **kwargs):
            self.env, self.sizes = env, sizes
            super().__init__(**kwargs)

        def _info(self):
            features = {"seed": np.int32, "index": np.int32, "hash": np.uint64, "by_content": np.bool_}
            return tfds.core.DatasetInfo(builder=self, description=self.builder_config.description,
                                         features=tfds.features.FeaturesDict(features))

        def _split_generators(self, dl_manager):
            splits = compute_splits(self.env, self.sizes)
            return {s: self._generate_examples(splits, s) for s in SPLITS}

        def _generate_examples(self, splits, split):
            for i, (seed, h) in enumerate(zip(splits.seeds[split].tolist(), splits.hashes[split].tolist())):
                yield i, {"seed": seed, "index": i, "hash": h, "by_content": splits.by == "content"}

    return TaskSuite


TaskSuite = None  # the builder class, made on first use (importing TFDS costs seconds)
_READ: dict[tuple[str, str], Splits] = {}  # (data_dir, suite name) -> splits read in this process


def _builder(env, sizes: dict[str, int], data_dir):
    global TaskSuite
    if TaskSuite is None:
        TaskSuite = _builder_class()
    tfds = _tfds()
    config = tfds.core.BuilderConfig(name=suite_name(env, sizes), version=VERSION,
                                     description=f"{env.name} {level_options(env)} sizes {dict(sizes)}")
    return TaskSuite(env=env, sizes=sizes, config=config, data_dir=str(data_dir), file_format="array_record")


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


def _prepare(builder) -> None:
    with _quiet():
        builder.download_and_prepare()  # a no-op when stored already


def build_suite(env, sizes: dict[str, int], data_dir: str | os.PathLike) -> str:
    """Write `env`'s splits at `sizes` as array_record under `data_dir` (a no-op if there); their path."""
    with _quiet():
        builder = _builder(env, sizes, data_dir)
    _prepare(builder)
    return str(builder.data_dir)


def read_suite(env, sizes: dict[str, int], data_dir: str | os.PathLike) -> Splits:
    """`env`'s splits at `sizes`, built under `data_dir` on first use and read back with `tfds.data_source`
    (once per process)."""
    key = (os.path.abspath(data_dir), suite_name(env, sizes))
    if key not in _READ:
        with _quiet():
            builder = _builder(env, sizes, data_dir)
        _prepare(builder)
        seeds, hashes, by = {}, {}, "content"
        for split in SPLITS:
            source = builder.as_data_source(split=split)
            records = sorted((source[i] for i in range(len(source))), key=lambda r: int(r["index"]))
            seeds[split] = np.asarray([int(r["seed"]) for r in records], np.int32)
            hashes[split] = np.asarray([int(r["hash"]) for r in records], np.uint64)
            by = by if all(bool(r["by_content"]) for r in records) else "seed"
        _READ[key] = Splits(seeds, hashes, by)
    return _READ[key]
