"""Shared fixtures: one tiny tokenizer trained on every environment's text, built once per session."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


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
