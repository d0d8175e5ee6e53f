"""Imports point down: the layer order of docs/architecture.md, checked on the source (bench/layering.py)."""

from __future__ import annotations

import functools
import importlib.util
from tests.paths import REPO

ROOT = REPO
_spec = importlib.util.spec_from_file_location("layering", ROOT / "bench" / "layering.py")
layering = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layering)

# Low to high; a module may import its own layer and those below. The longest matching prefix decides.
LAYERS = [
    ("core", ["bmrl", "bmrl.compiles", "bmrl.compile_cache", "bmrl.registry", "bmrl.machines", "bmrl.sampling", "bmrl.parallel", "bmrl.distributed",
              "bmrl.metrics"]),
    ("text, envs, model, data", ["bmrl.model", "bmrl.formats", "bmrl.chat", "bmrl.generate", "bmrl.envs", "bmrl.data",
                                 "bmrl.budget"]),
    ("rollout", ["bmrl.rollout"]),
    ("learn", ["bmrl.learn"]),
    ("eval", ["bmrl.eval", "bmrl.logs"]),
    ("config", ["bmrl.config", "bmrl.memory"]),
    ("assembly, run directory", ["bmrl.assembly", "bmrl.rundir", "bmrl.checkpoint"]),
    ("runs", ["bmrl.loop", "bmrl.train", "bmrl.sft", "bmrl.eval.run", "bmrl.stages", "bmrl.sweep", "bmrl.plan"]),
    ("study", ["bmrl.reproduce", "bmrl.study", "bmrl.eval.saved"]),
    ("commands", ["bmrl.commands", "bmrl.cli", "bmrl.__main__"]),
]

# Known exceptions, each with its reason; a new upward import fails the test.
ALLOWED = {
    # learn.step's remat_layers lives in bmrl.memory, whose plan raises bmrl.config's ConfigError (memory.py is
    # the model-family side's file): move remat_layers to learn, or import ConfigError from bmrl.config.schema.
    ("bmrl.learn.step", "bmrl.memory"),
}


def layer(module: str) -> int:
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    assert found is not None, f"{module} is in no layer of tests/repo/test_layering.py: add it"
    return found


@functools.cache
def _graph() -> tuple[dict, dict]:
    """(modules, the import graph with function-level imports), read once per test session."""
    known = layering.modules()
    return known, layering.imports(known)[1]


def test_no_import_cycles():
    """No cycle among bmrl's modules, counting function-level imports (they hide a cycle, not remove it)."""
    known, full = _graph()
    assert layering.cycles(layering.acyclic(full, known)) == []


def test_imports_point_down():
    """Every import (module- or function-level) goes to the module's own layer or one below."""
    known, full = _graph()
    up = sorted(f"{m} ({LAYERS[layer(m)][0]}) -> {t} ({LAYERS[layer(t)][0]})"
                for m, targets in full.items() for t in targets
                if layer(t) > layer(m) and (m, t) not in ALLOWED
                and not (known[t].name == "__init__.py" and m.startswith(t + ".")))
    assert up == [], "imports that point up:\n" + "\n".join(up)


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert layering.cycles(graph) == [["a", "b", "c"]]


def test_the_env_kind_is_asked_in_one_place():
    """The env kind is decided once, by `bmrl.config.is_python_env` (the config checks each kind's keys and
    anchors a Python env's paths by it); below the config only `player_class` asks it: everything else that
    differs between a JAX and a Python env is a method of the two players."""
    known, _ = _graph()
    forks = [(m, line) for m, _, line in layering.forks(known)]
    assert forks == [("bmrl.config.validate", 'return cfg.env.kind == "python"')]
    askers = sorted(m for m, path in known.items() if not m.startswith("bmrl.config")
                    and "is_python_env(" in path.read_text())
    assert askers == ["bmrl.assembly.players"]
