"""`bmrl.registry.Registry`: the one shape of every registry (envs, advantages, losses, samplers, families,
sweep commands): lazy entries, errors that list the valid names, one entry per name."""

import pytest

from bmrl import budget, envs, learn, sweep
from bmrl.model import families
from bmrl.registry import NotInstalled, Registry, UnknownName


def test_lookup_resolves_lazy_paths_and_names_the_valid_ones():
    reg = Registry("thing", {"join": "os.path:join", "len": len})
    import os.path

    assert reg.lookup("join") is os.path.join and reg["len"] is len and list(reg) == ["join", "len"]
    assert reg.get("nope") is None and "nope" not in reg  # the mapping's own get
    with pytest.raises(UnknownName, match=r"unknown thing 'nope'; valid: join, len\."):
        reg.lookup("nope")


def test_entries_are_registered_once_and_missing_modules_say_so():
    reg = Registry("thing")

    @reg.register("f")
    def f():
        return 1

    assert reg.lookup("f") is f and reg.add("f", f) is f  # the same object again: fine
    with pytest.raises(ValueError, match="thing 'f' is registered already"):
        reg.add("f", len)
    reg.add("gone", "bmrl.no_such_module:x")
    reg.add("typo", "os.path:no_such_function")
    with pytest.raises(NotInstalled, match="bmrl.no_such_module is not available"):
        reg.lookup("gone")
    with pytest.raises(NotInstalled, match="os.path has no no_such_function"):
        reg.lookup("typo")
    other = reg.copy()
    other.add("h", len)
    assert "h" in other and "h" not in reg


def test_every_registry_of_bmrl_is_one():
    """Config validation and the generated config docs read these names; none is kept by hand."""
    for reg in (envs.ENVS, learn.ADVANTAGES, learn.LOSSES, budget.SAMPLERS, families.FAMILIES, sweep.COMMANDS):
        assert isinstance(reg, Registry) and len(reg) > 1
    assert "keypad" in envs.ENVS and set(budget.SAMPLERS) >= {"fixed", "mix", "uniform"}
