"""The suite's cost table (`tests/conftest.py`): per-file seconds, tests and programs, slowest first."""

from types import SimpleNamespace

from tests import conftest


def _report(nodeid, when, duration, programs=(0, 0, 0.0, 0.0)):
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, user_properties=[("bmrl_compiles", programs)])


def test_the_table_sums_phases_per_file_slowest_first():
    cost = conftest.SuiteCost()
    for r in [_report("tests/a.py::t1", "setup", 1.0, (2, 1, 0.5, 0.25)),
              _report("tests/a.py::t1", "call", 2.0, (3, 0, 1.0, 0.5)),
              _report("tests/a.py::t2", "call", 0.5), _report("tests/b/c.py::t", "call", 9.0, (1, 4, 4.0, 2.0))]:
        cost.add(r)
    assert cost.files == {"tests/a.py": [3.5, 2, 5, 1, 1.5, 0.75], "tests/b/c.py": [9.0, 1, 1, 4, 4.0, 2.0]}
    lines = cost.table(rows=1)
    assert "slowest 1 of 2" in lines[0] and lines[1].endswith("tests/b/c.py") and len(lines) == 3
    assert lines[-1].split()[:6] == ["12.5", "3", "6", "5", "5.5", "2.8"]  # the total covers every file, listed or not
    assert len(cost.table(rows=0)) == 4  # 0: every file
