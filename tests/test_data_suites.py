"""Task suites: train / validation / test disjoint by level content (or, with too few levels, by seed,
reported honestly), stable prefixes, stored once as TFDS array_record and read back the same."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bmrl.build import build_run, split_tasks, suite_line, suite_summary
from bmrl.config import build
from bmrl.data import SPLITS, compute_splits, level_hashes, read_suite, suite_overlap
from bmrl.envs import _CharTokenizer, make

SIZES = {"train": 256, "validation": 16, "test": 32}


def _cfg(tmp_path, env, **data):
    return build({"env": env, "out_dir": str(tmp_path / "run"), "eval": {"num_tasks": 8},
                  "data": {"train_size": 256, "val_size": 16, "test_size": 32, **data}})


@pytest.mark.parametrize("name, options", [("toolchain", {}), ("frozenlake", {"size": 5})])
def test_splits_are_disjoint_by_content(name, options):
    env = make(name, _CharTokenizer(), **options)
    splits = compute_splits(env, SIZES)
    assert splits.by == "content"
    for s in SPLITS:
        assert len(splits.seeds[s]) == SIZES[s] and len(np.unique(splits.hashes[s])) == SIZES[s]  # distinct within
        np.testing.assert_array_equal(level_hashes(env, {"seed": splits.seeds[s]}), splits.hashes[s])
    for a, b in (("train", "test"), ("train", "validation"), ("validation", "test")):
        assert suite_overlap(splits.hashes[a], splits.hashes[b]) == 0
    bigger = compute_splits(env, {s: 2 * n for s, n in SIZES.items()})  # prefixes are stable
    for s in SPLITS:
        np.testing.assert_array_equal(bigger.seeds[s][: SIZES[s]], splits.seeds[s])


def test_corridor_falls_back_to_seeds_and_reports_the_overlap():
    """Two distinct levels (exit left or right): no content split; disjoint seeds, overlapping levels."""
    cfg = build({"env": {"name": "corridor"}, "out_dir": "/nonexistent/run", "eval": {"num_tasks": 8},
                 "data": {"train_size": 64, "val_size": 8, "test_size": 8}})
    train, val, test = (split_tasks(cfg, s)["seed"] for s in SPLITS)
    assert (train % 2 == 0).all() and (test % 2 == 1).all() and (val % 4 == 2).all() and (train % 4 == 0).all()
    summary = suite_summary(cfg)
    assert summary == {"train": 64, "validation": 8, "test": 8, "overlap": 8, "disjoint_by": "seed", "path": None}
    assert "repeat training levels" in suite_line(summary)


def test_stored_suites_equal_the_computed_ones_and_are_built_once(tmp_path):
    cfg = _cfg(tmp_path, {"name": "toolchain", "options": {"k": 2}}, data_dir=str(tmp_path / "suites"))
    first = {s: split_tasks(cfg, s)["seed"] for s in SPLITS}
    env = make("toolchain", _CharTokenizer(), k=2)
    computed = compute_splits(env, SIZES)
    for s in SPLITS:
        np.testing.assert_array_equal(first[s], computed.seeds[s])
    (path,) = [os.path.join(r, d) for r, ds, _ in os.walk(tmp_path / "suites") for d in ds if d == "2.0.0"]
    assert "toolchain_" in path and any(f.endswith(".array_record-00000-of-00001") for f in os.listdir(path))
    assert not (tmp_path / "run").exists()  # data.data_dir honoured
    mtime = os.path.getmtime(path)
    again = read_suite(make("toolchain", _CharTokenizer(), k=2, show_budget=True), SIZES, tmp_path / "suites")
    assert os.path.getmtime(path) == mtime  # read back, not rebuilt (the budget line does not shape levels)
    for s in SPLITS:
        np.testing.assert_array_equal(again.hashes[s], computed.hashes[s])
    assert suite_summary(cfg)["path"] == str(tmp_path / "suites") and suite_summary(cfg)["overlap"] == 0


def test_without_a_data_dir_nothing_is_written_and_the_splits_are_the_same(tmp_path):
    cfg = _cfg(tmp_path, {"name": "toolchain"})
    os.makedirs(cfg.out_dir)
    stored = _cfg(tmp_path, {"name": "toolchain"}, data_dir=str(tmp_path / "suites"))
    for split in SPLITS:
        np.testing.assert_array_equal(split_tasks(cfg, split, 4)["seed"], split_tasks(stored, split, 4)["seed"])
    assert os.listdir(cfg.out_dir) == [] and os.listdir(tmp_path / "suites" / "task_suite")
    assert suite_summary(cfg)["path"] is None
    with pytest.raises(ValueError, match="valid splits are"):
        split_tasks(cfg, "held_out")


def test_python_env_overlap_counts_repeated_task_lines(tmp_path):
    """Lines a, b, c, a: even lines train (a, c), odd test (b, a): one test task repeats a training task."""
    tasks = [{"target": 1}, {"target": 2}, {"target": 3}, {"target": 1}]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    cfg = build({"env": {"kind": "python", "entry": "bmrl.envs.python.jax_env:builtin",
                         "options": {"name": "corridor", "length": 3}},
                 "data": {"tasks": str(tmp_path / "tasks.jsonl")}, "eval": {"num_tasks": 8}})
    summary = suite_summary(cfg, build_run(cfg))
    assert summary["overlap"] == 1 and summary["disjoint_by"] == "seed" and summary["test"] == 2
