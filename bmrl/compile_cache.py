"""A persistent XLA compilation cache: a program compiled once is loaded from disk afterwards.

    path = compile_cache.enable()      # the `bmrl` command line calls this before any work

A study compiles the same programs again and again: every seed's SFT, RL and evaluation stage builds
new jitted functions whose XLA programs are identical to the previous seed's, and every new process
(a rerun, a resume after a kill, a sweep's next run) starts cold. JAX's persistent cache turns each
of those compiles after the first into a file read (the tiny study: 61 s -> 21 s on a second run).

Where: `$BMRL_COMPILE_CACHE` if set (`off` disables the cache), else an explicit
`jax_compilation_cache_dir` the user already set (left alone), else `$XDG_CACHE_HOME/bmrl/xla`
(`~/.cache/bmrl/xla`). Entries go to a subdirectory named for this host's processor (architecture
and instruction-set flags), because JAX's cache key names the platform (`cpu`) but not the CPU's
features: a home directory shared by different machines must not hand one machine code compiled for
another. The cache is bounded (`$BMRL_COMPILE_CACHE_MAX_GB`, default 4; least recently used entries
are evicted) and guarded by a file lock, so parallel processes (test workers, sweep runs) share it.

A cached program is the same executable XLA would compile, so numbers do not change (tested: a
second process that loads every program gives bitwise the same results as the first, which compiled
them).
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings

ENV_DIR = "BMRL_COMPILE_CACHE"
ENV_MAX_GB = "BMRL_COMPILE_CACHE_MAX_GB"
OFF = ("off", "0", "false", "no", "none")
DEFAULT_MAX_GB = 4.0


class CompileCacheError(ValueError):
    """A cache setting that cannot work (an unwritable directory, a bad size), naming the variable."""


def host_tag() -> str:
    """`<machine>-<12 hex>`: the processor architecture and a digest of its instruction-set flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):  # x86 / arm
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        flags = platform.processor()
    digest = hashlib.blake2b(flags.encode(), digest_size=6).hexdigest()
    return f"{platform.machine() or 'unknown'}-{digest}"


def default_dir() -> str:
    """`$XDG_CACHE_HOME/bmrl/xla`, or `~/.cache/bmrl/xla`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bmrl", "xla")


def _max_bytes() -> int:
    raw = os.environ.get(ENV_MAX_GB, "")
    try:
        gb = float(raw) if raw else DEFAULT_MAX_GB
    except ValueError:
        gb = float("nan")
    if not gb > 0 or gb == float("inf"):
        raise CompileCacheError(f"{ENV_MAX_GB}={raw!r} is not a size; give a positive number of GiB (default "
                                f"{DEFAULT_MAX_GB:g}), or set {ENV_DIR}=off to disable the cache.")
    return int(gb * 2**30)


def enable(path: str | None = None) -> str | None:
    """Turn on JAX's persistent compilation cache; returns the directory used, or None when it is off.

    `path` (else `$BMRL_COMPILE_CACHE`, else the default) is the cache root; entries live in its
    `host_tag()` subdirectory. A `jax_compilation_cache_dir` set before this call (config or
    `JAX_COMPILATION_CACHE_DIR`) wins when neither `path` nor the variable is given. A directory
    named by `path` or the variable that cannot be written raises CompileCacheError; the default one
    (a read-only home) only warns, and the run goes on without the cache. Call it before the first
    compile; calling it again with the same directory is a no-op.
    """
    import jax

    raw = path if path is not None else os.environ.get(ENV_DIR)
    if raw is not None and raw.strip().lower() in OFF:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if raw is None and jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir  # the user's own choice
    directory = os.path.join(os.path.abspath(os.path.expanduser(raw or default_dir())), host_tag())
    try:
        os.makedirs(directory, exist_ok=True)
        problem = None if os.access(directory, os.W_OK) else "is not writable"
    except OSError as err:
        problem = f"cannot be created ({err.strerror})"
    if problem is not None:
        message = (f"the compilation cache directory {directory!r} {problem}; set {ENV_DIR} to a writable "
                   f"directory, or {ENV_DIR}=off.")
        if raw is not None:  # asked for by name: an error
            raise CompileCacheError(message)
        warnings.warn(message + " Running without the cache.", stacklevel=2)  # the default: go on without it
        return None
    max_bytes = _max_bytes()
    if jax.config.jax_compilation_cache_dir == directory:
        return directory
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_compilation_cache_max_size", max_bytes)  # > 0: LRU eviction under a file lock
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # small programs add up
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
