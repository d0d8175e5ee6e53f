"""`bmrl.compiles.program`: one build per static key, whatever the key's hash does."""

from __future__ import annotations

from bmrl import compiles


class _Collide:
    """A key whose hash is the same for every value (equality still tells them apart)."""

    def __init__(self, value: int):
        self.value = value

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Collide) and other.value == self.value


def test_program_builds_once_per_key_and_tells_colliding_keys_apart():
    builds = []

    def build(tag):
        return lambda: builds.append(tag) or tag

    a = compiles.program("test_program", (_Collide(1), "x"), build("a"))
    assert compiles.program("test_program", (_Collide(1), "x"), build("a again")) == "a"  # equal key: cached
    b = compiles.program("test_program", (_Collide(2), "x"), build("b"))  # same hash, different key: built
    other_name = compiles.program("other_program", (_Collide(1), "x"), build("c"))  # the name is part of the key
    assert (a, b, other_name) == ("a", "b", "c") and builds == ["a", "b", "c"]


def test_release_drops_programs_and_jax_executables_but_keeps_counts():
    """What `bmrl reproduce` calls between stages: the next use builds and compiles again (from the disk
    cache in a real run), the trace counters keep counting."""
    import jax.numpy as jnp

    builds = []
    compiles.program("test_release", 1, lambda: builds.append(1) or "p")
    f = compiles.counted_jit(lambda x: x + 1, name="test_release_jit")
    f(jnp.ones(3))
    before = compiles.counts()["test_release_jit"]
    compiles.release()
    compiles.program("test_release", 1, lambda: builds.append(2) or "p")
    f(jnp.ones(3))  # the same function and shape: traced again, since JAX's caches were cleared
    assert builds == [1, 2] and compiles.counts()["test_release_jit"] == before + 1


def test_compile_seconds_counts_compiles_not_cached_calls():
    """`compile_seconds` grows when XLA compiles a program and not when a compiled one runs again (what the
    stage ETA of `bmrl.stages` takes out of a first stage of its kind)."""
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x: jnp.tanh(x) * 3.0 - x)
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # a disk-cache hit would skip the compile
    try:
        t0 = compiles.compile_seconds()
        f(jnp.ones(7)).block_until_ready()
        t1 = compiles.compile_seconds()
        f(jnp.ones(7)).block_until_ready()
        t2 = compiles.compile_seconds()
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
    assert t1 > t0 and t2 == t1


def test_stats_tell_a_compile_from_a_cache_load(tmp_path):
    """`stats()` hears JAX's own events (a renamed event would show every test file at 0 programs in the suite's
    cost table): a new program is traced, lowered and compiled; the same program after `jax.clear_caches()`
    is traced and lowered again but loaded from the persistent cache, not compiled."""
    import time

    import jax
    import jax.numpy as jnp

    from bmrl import compile_cache

    saved = {k: getattr(jax.config, k) for k in ("jax_enable_compilation_cache", "jax_compilation_cache_dir")}
    compile_cache.enable(str(tmp_path))
    unique = float(time.time_ns() % 1_000_003)  # a constant in the program: no cache can hold it already
    x = jnp.arange(7.0).block_until_ready()
    try:
        t0 = compiles.stats()
        jax.jit(lambda x: jnp.sin(x) * 3.25 + unique)(x).block_until_ready()
        t1 = compiles.stats()
        jax.clear_caches()
        jax.jit(lambda x: jnp.sin(x) * 3.25 + unique)(x).block_until_ready()
        t2 = compiles.stats()
    finally:
        for key, value in saved.items():
            jax.config.update(key, value)
    first, second = t1 - t0, t2 - t1
    assert (first.compiled, first.loaded) == (1, 0) and first.compile_s > 0 and first.trace_s > 0 and first.lower_s > 0
    assert (second.compiled, second.loaded) == (0, 1) and second.trace_s > 0 and second.lower_s > 0
    assert compiles.compile_seconds() >= t2.compile_s
