"""Compiled programs in one visible place: a cache keyed by static configuration, and a trace counter.

Every jitted program bmrl builds goes through here, so a run (and a test, and a benchmark) can ask
how many times each program was traced, and nothing is hidden in per-module caches keyed on object
identity.

    run = program("rollout", (graphdef, env, fmt, cfg), lambda: make_rollout(...))
    step = counted_jit(update, name="train_step", donate_argnums=(0,))
    counts()   # {"rollout": 1, "train_step": 1}

`program` builds once per `(name, key)`; the key must be hashable and equal exactly when the built
program would be the same (static shapes, environment, format, model graph). `counted_jit` wraps
`jax.jit` so that every trace (= every compile of a new input shape or static argument) adds one to
`counts()[name]`. `stats()` is what this process spent building programs, read from JAX's own
events (every program included: bmrl's and any other `jax.jit`): programs XLA compiled, programs
loaded from the persistent compile cache, and the seconds of tracing, lowering and compiling.
`compile_seconds()` is its XLA part alone.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import jax

T = TypeVar("T")

_LOCK = threading.Lock()
_PROGRAMS: "collections.OrderedDict[_Key, Any]" = collections.OrderedDict()
_COUNTS: collections.Counter[str] = collections.Counter()
MAX_PROGRAMS = 64  # least recently used programs beyond this are dropped (their compiles are kept in counts)
# JAX's events (jax/_src/dispatch.py, compiler.py). The backend event times every program's compile or cache
# load; a cache hit also records the hit event.
_BACKEND_EVENT = "/jax/core/compile/backend_compile_duration"
_DURATION_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
                    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
                    _BACKEND_EVENT: "compile_s"}
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class _Key:
    """A program's cache key, hashed once: a model graph takes about 0.5 ms to hash, and a lookup
    hashed it three times (1-2 ms of every `bmrl.rollout.rollout` call)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: Hashable):
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self._hash == other._hash and self.value == other.value


def program(name: str, key: Hashable, build: Callable[[], T]) -> T:
    """The program `name` for static configuration `key`, built by `build()` on first use."""
    full = _Key((name, key))
    with _LOCK:
        if full in _PROGRAMS:
            _PROGRAMS.move_to_end(full)
            return _PROGRAMS[full]
    built = build()
    with _LOCK:
        built = _PROGRAMS.setdefault(full, built)
        _PROGRAMS.move_to_end(full)
        while len(_PROGRAMS) > MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    return built


def counted_jit(fun: Callable, *, name: str, **jit_kwargs: Any) -> Callable:
    """`jax.jit(fun, **jit_kwargs)` whose every trace adds one to `counts()[name]`.

    The returned callable also has `trace_count()` (its own traces), `lower` and `name`.
    """
    own = [0]

    @functools.wraps(fun)
    def traced(*args, **kwargs):
        own[0] += 1
        with _LOCK:
            _COUNTS[name] += 1
        return fun(*args, **kwargs)

    jitted = jax.jit(traced, **jit_kwargs)

    @functools.wraps(fun)
    def call(*args, **kwargs):
        return jitted(*args, **kwargs)

    call.trace_count = lambda: own[0]  # type: ignore[attr-defined]
    call.lower = jitted.lower  # type: ignore[attr-defined]
    call.name = name  # type: ignore[attr-defined]
    return call


def counts() -> dict[str, int]:
    """Traces (compiles) per program name since the process started (or the last `reset_counts`)."""
    with _LOCK:
        return dict(_COUNTS)


@dataclasses.dataclass(frozen=True)
class CompileStats:
    """What a process spent turning Python functions into XLA executables. The difference of two readings
    (`later - earlier`) is what the work between them cost."""

    compiled: int = 0  # programs XLA compiled (not in the persistent cache, or the cache off)
    loaded: int = 0  # programs loaded from the persistent compile cache
    trace_s: float = 0.0  # Python tracing into jaxprs
    lower_s: float = 0.0  # jaxprs lowered to StableHLO
    compile_s: float = 0.0  # XLA compiles, and the cache loads (each a small fraction of its compile)

    def __sub__(self, other: "CompileStats") -> "CompileStats":
        return CompileStats(*(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)))


_STATS = {f.name: f.default for f in dataclasses.fields(CompileStats)}
_BACKEND_CALLS = [0]  # compiles and cache loads together: compiled = calls - loaded


def _on_duration(event: str, seconds: float, **_: Any) -> None:
    field = _DURATION_EVENTS.get(event)
    if field is not None:
        with _LOCK:
            _STATS[field] += seconds
            _BACKEND_CALLS[0] += event == _BACKEND_EVENT


def _on_event(event: str, **_: Any) -> None:
    if event == _CACHE_HIT_EVENT:
        with _LOCK:
            _STATS["loaded"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def stats() -> CompileStats:
    """Programs compiled and loaded, and the seconds spent, in this process since bmrl was imported."""
    with _LOCK:
        return CompileStats(**{**_STATS, "compiled": _BACKEND_CALLS[0] - _STATS["loaded"]})


def compile_seconds() -> float:
    """Seconds XLA spent compiling (or loading from the persistent cache) in this process since bmrl was
    imported: the difference between two readings is what a stretch of work paid for its programs, a
    cached program only its load."""
    return stats().compile_s


def reset_counts() -> None:
    """Zero the counters (the cached programs stay: a later call of one compiled shape adds nothing)."""
    with _LOCK:
        _COUNTS.clear()


def clear() -> None:
    """Drop every cached program and zero the counters (tests that need a cold start)."""
    with _LOCK:
        _PROGRAMS.clear()
        _COUNTS.clear()


def release() -> None:
    """Drop every cached program and JAX's in-memory compiled executables (the counters stay): what a job
    of many stages (`bmrl reproduce`) calls between stages, so the programs of a finished stage do not pile
    up in memory. A later stage loads the same programs from the persistent compile cache
    (`bmrl.compile_cache`), bitwise the same."""
    import gc

    with _LOCK:
        _PROGRAMS.clear()
    jax.clear_caches()
    gc.collect()
