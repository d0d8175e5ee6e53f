"""The end-to-end files' shared fixture: the tiny study (`tests.e2e.study`), run once per session.

A file that uses it marks itself `pytestmark = pytest.mark.xdist_group(study.GROUP)`: pytest-xdist then
runs those files on one worker (tests/conftest.py groups every other file by itself), so the study runs
once, not once per worker."""

import pytest


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """(out_dir, config, stderr lines) of the tiny study, run in this process on one device. Tests may add
    files next to it, and must not change what it wrote."""
    from tests.e2e.study import run_tiny_study

    return run_tiny_study(tmp_path_factory.mktemp("tiny_study"))
