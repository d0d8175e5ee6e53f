"""The suite's set-up: cheap XLA compiles (`tests.xla`), one persistent compile cache, the slowest files first,
shared fixtures (one tiny tokenizer per session), and the cost table printed at the end of every run."""

import os

import pytest

from tests import xla as _xla

os.environ.setdefault("MPLBACKEND", "Agg")
# JAX's rolled threefry lowering on CPU (`bmrl.sampling`): the same bits, compiled 2-3x faster; the suite is
# compile-bound. Set before bmrl is imported, and inherited by every subprocess and notebook kernel.
os.environ.setdefault("BMRL_ROLLED_THREEFRY", "1")
# Cheap compiles, and one set of flags (one compile-cache key per program) for the whole suite and every
# subprocess it starts (`tests.xla`), set before JAX starts.
_FLAGS = _xla.suite_flags()
if _FLAGS and _FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAGS}".strip()


# The slowest files first (measured on 2 cores). Note: pytest-xdist (>= 3.5) hands files out by
# their number of tests, so this order decides only among files of equal test count (keeping it with
# --no-loadscope-reorder was measured slower: the heaviest files then run side by side).
SLOW_FIRST = (
    "e2e/test_training_works.py", "e2e/test_mesh_train.py", "test_train.py", "rollout/test_engine.py",
    "e2e/test_reproduce_report.py", "test_sft.py", "test_checkpoint.py", "repo/test_notebooks.py",
    "e2e/test_faults_train.py", "e2e/test_python_env.py", "test_memory.py", "eval/test_evaluate.py",
    "distributed/test_multihost.py", "e2e/test_reproduce_python.py",
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
    from bmrl import compiles  # noqa: F401  (its listeners hear every program from here on: the cost table)
    from bmrl.compile_cache import enable

    enable()


def pytest_collection_modifyitems(config, items):
    """Run the slowest files first (stable: tests keep their order within a file)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    tests = os.path.dirname(os.path.abspath(__file__))
    items.sort(key=lambda item: rank.get(os.path.relpath(item.path, tests), len(SLOW_FIRST)))


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


# ---- The suite's cost: the slowest files with their programs, printed at the end of every run ----

COST_ROWS = int(os.environ.get("BMRL_TEST_COST_ROWS", "10"))  # files in the table (0: every file)
_reported = [None]  # `bmrl.compiles.stats()` when the previous test report was made


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test phase's report carries what this process spent on programs since the previous report
    (`bmrl.compiles.stats`: a test's subprocesses build theirs on their own and show only in its seconds).
    `user_properties` travels from an xdist worker to the controller."""
    from bmrl import compiles

    outcome = yield
    report = outcome.get_result()
    now = compiles.stats()
    spent = now - (_reported[0] or compiles.CompileStats())
    _reported[0] = now
    report.user_properties = [*report.user_properties, ("bmrl_compiles", (
        spent.compiled, spent.loaded, spent.compile_s, spent.trace_s + spent.lower_s))]


class SuiteCost:
    """Per test file, summed over report phases: seconds, tests, programs XLA compiled, programs loaded from
    the persistent cache, XLA seconds (compiles and loads) and tracing + lowering seconds."""

    COLUMNS = ("seconds", "tests", "compiled", "loaded", "xla s", "trace s")

    def __init__(self):
        self.files: dict[str, list[float]] = {}

    def add(self, report) -> None:
        row = self.files.setdefault(report.nodeid.split("::")[0], [0.0, 0, 0, 0, 0.0, 0.0])
        row[0] += report.duration
        row[1] += report.when == "call"
        for name, value in report.user_properties:
            if name == "bmrl_compiles":
                for i, v in enumerate(value):
                    row[2 + i] += v

    def table(self, rows: int = COST_ROWS) -> list[str]:
        rows = rows or len(self.files)
        total = [sum(r[i] for r in self.files.values()) for i in range(len(self.COLUMNS))]

        def line(values, name):
            return (f"{values[0]:8.1f} {values[1]:6d} {values[2]:9d} {values[3]:7d} {values[4]:8.1f} "
                    f"{values[5]:8.1f}  {name}")

        lines = [f"{'seconds':>8} {'tests':>6} {'compiled':>9} {'loaded':>7} {'xla s':>8} {'trace s':>8}  "
                 f"file (slowest {rows} of {len(self.files)})"]
        for name, values in sorted(self.files.items(), key=lambda kv: -kv[1][0])[:rows]:
            lines.append(line(values, name))
        lines.append(line(total, "all files (worker seconds)"))
        return lines


_COST = SuiteCost()


def pytest_runtest_logreport(report):
    _COST.add(report)


def pytest_terminal_summary(terminalreporter):
    """The cost table, so a test that adds programs shows up in the next run's summary."""
    if _COST.files and not hasattr(terminalreporter.config, "workerinput"):
        terminalreporter.section("suite cost (in-process programs; subprocesses count in seconds only)")
        for line in _COST.table():
            terminalreporter.write_line(line)
