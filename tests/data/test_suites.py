"""Task suites: train / validation / test disjoint by content (a JAX env's levels, or with too few levels by
seed, reported honestly; a Python env's task file), stable prefixes, stored once as TFDS array_record and
read back the same."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bmrl.assembly import (
    build_run,
    python_splits,
    split_tasks,
    suite_line,
    suite_summary,
)
from bmrl.config import ConfigError, build
from bmrl.data import (
    SPLITS,
    compute_splits,
    level_hashes,
    read_suite,
    read_task_suite,
    suite_overlap,
    task_splits,
)
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


# A Python env's task file: 96 distinct tasks, a repeat of task 3 (keys reordered: the same content)
# and a repeat of task 10; about 1 in 16 lands in test and in validation.
TASKS = [{"target": i % 3, "id": f"task-{i}"} for i in range(96)]
REPEATED = [*TASKS[:40], {"id": "task-3", "target": 0}, *TASKS[40:], dict(TASKS[10])]


def _python_cfg(tmp_path, tasks=REPEATED, **data):
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return build({"env": {"kind": "python", "entry": "bmrl.envs.python.jax_env:builtin",
                          "options": {"name": "corridor", "length": 3}}, "out_dir": str(tmp_path / "run"),
                  "data": {"tasks": str(tmp_path / "tasks.jsonl"), **data}, "eval": {"num_tasks": 4}})


def test_python_tasks_split_by_content_with_repeats_dropped():
    """The JAX envs' rule on a task file: each task in the split of its canonical JSON's hash (% 16: 0
    test, 1 validation), distinct within, disjoint across, in file order; repeats dropped and counted;
    a longer file keeps the splits of its first lines as prefixes."""
    splits = task_splits(REPEATED)
    assert splits.duplicates == 2 and sum(splits.counts().values()) == 96 and min(splits.counts().values()) > 0
    for i, s in enumerate(SPLITS):
        np.testing.assert_array_equal(level_hashes(None, splits.tasks[s]), splits.hashes[s])
        assert len(np.unique(splits.hashes[s])) == len(splits.tasks[s])  # distinct within
        assert [t["id"] for t in splits.tasks[s]] == [t["id"] for t in TASKS if t in splits.tasks[s]]  # file order
        assert set((splits.hashes[s] % 16).tolist()) <= ({0} if s == "test" else {1} if s == "validation"
                                                         else set(range(2, 16)))
    for a, b in (("train", "test"), ("train", "validation"), ("validation", "test")):
        assert suite_overlap(splits.hashes[a], splits.hashes[b]) == 0
    assert level_hashes(None, [{"b": "é", "a": 1}])[0] == level_hashes(None, [{"a": 1, "b": "é"}])[0]
    head = task_splits(TASKS[:48])
    for s in SPLITS:
        assert splits.tasks[s][: len(head.tasks[s])] == head.tasks[s]
    cut = task_splits(REPEATED, {"test": 2, "train": 5})
    assert cut.counts() == {"train": 5, "validation": splits.counts()["validation"], "test": 2}
    assert cut.tasks["test"] == splits.tasks["test"][:2] and cut.duplicates == 2
    with pytest.raises(ValueError, match="raise its data size"):
        task_splits(REPEATED, {"test": 99})


def test_python_suite_stored_equals_in_memory(tmp_path):
    """data.data_dir: the task splits written as TFDS array_record (builder config named after the entry)
    and read back through the data source equal the in-memory ones, sizes applied; nothing else written."""
    memory = python_splits(_python_cfg(tmp_path, test_size=3), REPEATED)
    stored = python_splits(_python_cfg(tmp_path, test_size=3, data_dir=str(tmp_path / "suites")), REPEATED)
    assert memory.counts()["test"] == 3 and memory.duplicates == stored.duplicates == 2
    for s in SPLITS:
        assert stored.tasks[s] == memory.tasks[s]
        np.testing.assert_array_equal(stored.hashes[s], memory.hashes[s])
    (path,) = [os.path.join(r, d) for r, ds, _ in os.walk(tmp_path / "suites") for d in ds if d == "2.0.0"]
    assert "bmrl_envs_python_jax_env_builtin_" in path and not (tmp_path / "run").exists()
    again = read_task_suite("bmrl.envs.python.jax_env:builtin", REPEATED, {"test": 3}, tmp_path / "suites")
    assert again.tasks == stored.tasks


def test_python_task_file_too_small_is_refused_and_sizes_are_upper_bounds(tmp_path):
    """Three tasks land in no test split: data.tasks says how many went where and what to do. A size
    beyond its split keeps the whole split (a task file holds what it holds), a smaller one its head."""
    with pytest.raises(ConfigError) as err:
        python_splits(_python_cfg(tmp_path, TASKS[:3]), TASKS[:3])
    counts = task_splits(TASKS[:3]).counts()
    assert err.value.key == "data.tasks" and f"{counts['train']} train, {counts['validation']} validation, 0 test" \
        in str(err.value) and "give more distinct tasks" in str(err.value)
    full = task_splits(REPEATED)
    assert python_splits(_python_cfg(tmp_path, val_size=50), REPEATED).tasks == full.tasks
    assert python_splits(_python_cfg(tmp_path, train_size=3), REPEATED).tasks["train"] == full.tasks["train"][:3]


def test_python_env_summary_reports_content_split(tmp_path):
    """A Python env's run: three splits disjoint by task content, overlap 0, the repeats counted;
    training-time evaluation reads validation."""
    cfg = _python_cfg(tmp_path)
    run = build_run(cfg)
    counts = task_splits(REPEATED).counts()
    summary = suite_summary(cfg, run)
    assert summary == {"train": counts["train"], "validation": counts["validation"], "test": 4, "overlap": 0,
                       "disjoint_by": "content", "duplicates": 2, "path": None}
    line = suite_line(summary)
    assert "disjoint by task content (2 repeated task(s)" in line and "0 of the 4 test tasks repeat a training task" \
        in line
    assert run.player.eval_split() == "validation" and split_tasks(cfg, "test", 2, run=run) == task_splits(
        REPEATED).tasks["test"][:2]
