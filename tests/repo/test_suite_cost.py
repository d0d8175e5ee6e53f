"""The suite's cost table (`tests/conftest.py`): per-file seconds, tests and XLA compiles, slowest first, and a
compile listener that still hears JAX (a renamed event would show every file at 0 compiles)."""

import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp

from tests import conftest


def _report(nodeid, when, duration, compiles=(0, 0.0)):
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, user_properties=[("bmrl_compiles", compiles)])


def test_the_table_sums_phases_per_file_slowest_first():
    cost = conftest.SuiteCost()
    for r in [_report("tests/a.py::t1", "setup", 1.0, (2, 0.5)), _report("tests/a.py::t1", "call", 2.0, (3, 1.0)),
              _report("tests/a.py::t2", "call", 0.5), _report("tests/b/c.py::t", "call", 9.0, (1, 4.0))]:
        cost.add(r)
    assert cost.files == {"tests/a.py": [3.5, 2, 5, 1.5], "tests/b/c.py": [9.0, 1, 1, 4.0]}
    lines = cost.table(rows=1)
    assert "slowest 1 of 2" in lines[0] and lines[1].endswith("tests/b/c.py") and len(lines) == 3
    assert lines[-1].split()[:4] == ["12.5", "3", "6", "5.5"]  # the total covers every file, listed or not
    assert len(cost.table(rows=0)) == 4  # 0: every file


def test_the_listener_counts_a_real_compile():
    before = list(conftest._compiled)
    unique = float(time.time_ns() % 1_000_003)  # a constant in the program: no compile cache can hold it already
    jax.jit(lambda x: jnp.sin(x) * 3.25 + unique)(jnp.arange(7.0)).block_until_ready()
    assert conftest._compiled[0] > before[0] and conftest._compiled[1] > before[1]
