"""Task suites: build as array_record into a temp dir, read back the same seeds; disjoint splits."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bmrl.data import SUITES, build_suite, load_suite, make_suite_env, split_seeds, suite_tasks
from tests.env_helpers import tiny_tokenizer


def test_suites_build_and_read_back_the_same_seeds(tmp_path):
    for name in ("corridor_easy", "toolchain_hard"):
        path = build_suite(name, tmp_path)
        assert any(f.endswith(".array_record-00000-of-00001") for f in os.listdir(path))
        assert path.endswith(os.path.join("task_suite", name, "1.0.0"))
        for split in ("train", "test"):
            seeds = suite_tasks(name, split, tmp_path)["seed"]
            np.testing.assert_array_equal(seeds, split_seeds(name, split))
            spec = SUITES[name]
            assert len(seeds) == (spec.num_train if split == "train" else spec.num_test)
            assert len(np.unique(seeds)) == len(seeds)
        assert len(load_suite(name, "test", tmp_path)) == SUITES[name].num_test


def test_test_seeds_never_appear_in_any_train_split():
    train = np.concatenate([split_seeds(n, "train") for n in SUITES])
    test = np.concatenate([split_seeds(n, "test") for n in SUITES])
    assert (train % 2 == 0).all() and (test % 2 == 1).all()
    assert not np.intersect1d(train, test).size
    np.testing.assert_array_equal(split_seeds("frozenlake_hard", "test"), split_seeds("frozenlake_hard", "test"))
    assert not np.array_equal(split_seeds("corridor_easy", "train"), split_seeds("corridor_hard", "train"))


def test_suite_env_and_errors(tmp_path):
    env = make_suite_env("frozenlake_hard", tiny_tokenizer(), show_budget=True)
    assert env.options["size"] == 6 and env.options["hole_terminates"] and env.show_budget
    with pytest.raises(ValueError, match="valid suites are"):
        split_seeds("corridor_impossible", "train")
    with pytest.raises(ValueError, match="valid splits are"):
        load_suite("corridor_easy", "validation", tmp_path)
