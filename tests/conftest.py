"""Shared fixtures: one tiny tokenizer trained on every environment's text, built once per session."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# JAX's rolled threefry lowering on CPU (`bmrl.sampling`): the same bits, compiled 2-3x faster; the suite is
# compile-bound. Set before bmrl is imported, and inherited by every subprocess and notebook kernel.
os.environ.setdefault("BMRL_ROLLED_THREEFRY", "1")


# The slowest files first (measured on 2 cores). Note: pytest-xdist (>= 3.5) hands files out by
# their number of tests, so this order decides only among files of equal test count (keeping it with
# --no-loadscope-reorder was measured slower: the heaviest files then run side by side).
SLOW_FIRST = (
    "test_training_works.py", "test_mesh_train.py", "test_train.py", "test_rollout.py", "test_reproduce_report.py",
    "test_sft.py",
    "test_checkpoint_resume.py", "test_notebooks.py", "test_faults_train.py", "test_pyenv_config.py",
    "test_memory.py", "test_eval_harness.py", "test_multihost.py", "test_reproduce_python.py",
)


def pytest_configure(config):
    """One persistent compilation cache for the whole session (`bmrl.compile_cache`): a fresh
    directory made by the controller and inherited by the xdist workers and every subprocess a test
    starts, so a program the suite compiled once (the tiny model's rollout, update, evaluation...) is
    loaded from disk by every other file and CLI run. `BMRL_COMPILE_CACHE=off pytest` runs without it."""
    import shutil
    import tempfile

    if "BMRL_COMPILE_CACHE" not in os.environ:
        os.environ["BMRL_COMPILE_CACHE"] = path = tempfile.mkdtemp(prefix="bmrl_test_xla_")
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    from bmrl.compile_cache import enable

    enable()


def pytest_collection_modifyitems(config, items):
    """Run the slowest files first (stable: tests keep their order within a file)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core, at most 4 (each worker holds its own XLA programs in memory)."""
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A byte-level BPE trained on the environments' own text (`tests.tiny_tokenizer`)."""
    from tests.tiny_tokenizer import shared_tokenizer

    return shared_tokenizer()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Every test module leaves no compiled program behind: the suite compiles hundreds of XLA
    programs in one process, and holding them all exhausted the process's memory maps (XLA aborted
    while compiling late in the run)."""
    yield
    import gc

    import jax

    from bmrl import compiles

    compiles.clear()
    jax.clear_caches()
    gc.collect()
