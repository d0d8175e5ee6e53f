"""Task suites: versioned train/test splits of level seeds per environment and difficulty.

Each suite is a config of one tensorflow-datasets builder (`TaskSuite`, registered as "task_suite")
written as array_record files (no TensorFlow needed) and read back with `tfds.data_source`:

    path = build_suite("corridor_easy", data_dir)
    tasks = suite_tasks("corridor_easy", "test", data_dir)   # {"seed": int32[n]}
    env = make_suite_env("corridor_easy", tokenizer)          # the env with the suite's options

Train seeds are even and test seeds odd, so no test level is ever a training level of any suite.
Seeds are drawn from a generator keyed by the suite name, so a suite's version pins its splits.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

VERSION = "1.0.0"
SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class SuiteSpec:
    """One suite: an environment, its difficulty options and the split sizes."""

    env: str
    options: dict[str, Any]
    num_train: int = 4096
    num_test: int = 512
    description: str = ""


SUITES: dict[str, SuiteSpec] = {
    "corridor_easy": SuiteSpec("corridor", {"length": 4, "eps": 0.1}),
    "corridor_medium": SuiteSpec("corridor", {"length": 8, "eps": 0.2}),
    "corridor_hard": SuiteSpec("corridor", {"length": 12, "eps": 0.3}),
    "frozenlake_easy": SuiteSpec("frozenlake", {"size": 4, "p_hole": 0.15, "eps": 0.0}),
    "frozenlake_medium": SuiteSpec("frozenlake", {"size": 5, "p_hole": 0.2, "eps": 0.1}),
    "frozenlake_hard": SuiteSpec("frozenlake", {"size": 6, "p_hole": 0.25, "eps": 0.2, "hole_terminates": True}),
    "toolchain_easy": SuiteSpec("toolchain", {"k": 2, "p_fail": 0.1}),
    "toolchain_medium": SuiteSpec("toolchain", {"k": 3, "p_fail": 0.2}),
    "toolchain_hard": SuiteSpec("toolchain", {"k": 5, "p_fail": 0.3}),
    "sokoban_easy": SuiteSpec("sokoban", {"size": 5, "boxes": 1}),
    "sokoban_medium": SuiteSpec("sokoban", {"size": 6, "boxes": 1}),
    "sokoban_hard": SuiteSpec("sokoban", {"size": 7, "boxes": 2}),
}


def _spec(name: str) -> SuiteSpec:
    if name not in SUITES:
        raise ValueError(f"Unknown task suite {name!r}; valid suites are {sorted(SUITES)}.")
    return SUITES[name]


def split_seeds(name: str, split: str) -> np.ndarray:
    """The level seeds `int32[n]` of `split` of suite `name`, in index order (computed, not read)."""
    spec = _spec(name)
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits are {list(SPLITS)}.")
    n = spec.num_train if split == "train" else spec.num_test
    rng = np.random.default_rng([zlib.crc32(name.encode()), SPLITS.index(split)])
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < n:
        for s in rng.integers(0, 2**30 - 1, size=n).tolist():
            if s not in seen and len(seeds) < n:
                seen.add(s)
                seeds.append(s)
    parity = 0 if split == "train" else 1
    return (2 * np.asarray(seeds, np.int64) + parity).astype(np.int32)


class TaskSuite(tfds.core.GeneratorBasedBuilder):
    """Level seeds of every suite in `SUITES`, one builder config per suite."""

    VERSION = tfds.core.Version(VERSION)
    RELEASE_NOTES = {"1.0.0": "Initial suites: corridor, frozenlake, toolchain, sokoban (easy/medium/hard)."}
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(name=n, description=f"{s.env} {s.options}") for n, s in SUITES.items()
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        spec = SUITES[self.builder_config.name]
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"Level seeds of env {spec.env!r} with options {spec.options}.",
            features=tfds.features.FeaturesDict({"seed": np.int32, "index": np.int32}),
            metadata=tfds.core.MetadataDict(env=spec.env, options=dict(spec.options)),
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in SPLITS}

    def _generate_examples(self, split):
        for i, seed in enumerate(split_seeds(self.builder_config.name, split).tolist()):
            yield i, {"seed": seed, "index": i}


def build_suite(name: str, data_dir: str | os.PathLike) -> str:
    """Write suite `name` as array_record under `data_dir` (a no-op if already there); its path."""
    _spec(name)
    builder = TaskSuite(config=name, data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare()
    return str(builder.data_dir)


def load_suite(name: str, split: str, data_dir: str | os.PathLike):
    """The random-access `tfds.data_source` of `split` of suite `name` (built on first use)."""
    _spec(name)
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits are {list(SPLITS)}.")
    build_suite(name, data_dir)
    return tfds.data_source(f"task_suite/{name}:{VERSION}", split=split, data_dir=str(data_dir))


def suite_tasks(name: str, split: str, data_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """Tasks `{"seed": int32[n]}` of `split` of suite `name`, read back in index order."""
    source = load_suite(name, split, data_dir)
    records = [source[i] for i in range(len(source))]
    seeds = np.zeros(len(records), np.int32)
    for r in records:
        seeds[int(r["index"])] = int(r["seed"])
    return {"seed": seeds}


def make_suite_env(name: str, tokenizer, **options):
    """The environment of suite `name` with its difficulty options (plus `options`, e.g. show_budget)."""
    from bmrl.envs import make

    spec = _spec(name)
    return make(spec.env, tokenizer, **{**spec.options, **options})
