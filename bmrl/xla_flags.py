"""XLA flags bmrl sets for the platform it runs on, before JAX starts its backend.

Simulated CPU devices (`--xla_force_host_platform_device_count=N`, the way to test a mesh without an
accelerator) run their collectives as threads that meet at a rendezvous. XLA:CPU aborts the whole
process when one waits 40 s (`Termination timeout for all reduce RendezvousKey ... of 40 seconds
exceeded`): on a 2-core machine with 8 simulated devices, or with a second job on the other core, a
device thread can be starved that long while nothing is wrong. So when the flags simulate devices and
say nothing about it, bmrl raises the terminate timeout to `CPU_COLLECTIVE_TIMEOUT_S` (and the "stuck"
warning to a fifth of it). A real hang still ends, just later; a value you set yourself is kept.

Only jaxlib versions checked to know these flags get them (XLA exits on an unknown flag in XLA_FLAGS):
0.10 and 0.11 (`strings libjax_common.so` lists both, and jax accepts them).
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

CPU_COLLECTIVE_TIMEOUT_S = 600
TERMINATE_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"
WARN_FLAG = "--xla_cpu_collective_call_warn_stuck_timeout_seconds"
KNOWN_JAXLIB = ((0, 10), (0, 11))  # minor versions whose XLA parses both flags (and the suite's `tests.xla` ones)


def jaxlib_minor() -> tuple[int, int] | None:
    """(major, minor) of the installed jaxlib, read from its metadata (no import of jax)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = version("jaxlib").split(".")[:2]
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return None


def simulated_devices(flags: str) -> int:
    """The device count `flags` asks XLA:CPU to simulate (0 when it does not)."""
    found = re.findall(r"--xla_force_host_platform_device_count=(\d+)", flags)
    return int(found[-1]) if found else 0


def with_cpu_collective_timeout(flags: str, jaxlib: tuple[int, int] | None) -> str:
    """`flags` with the CPU collective timeouts added when they simulate more than one device, leave
    both timeouts unset, and `jaxlib` is a version known to parse them; else `flags` unchanged."""
    if simulated_devices(flags) < 2 or jaxlib not in KNOWN_JAXLIB:
        return flags
    extra = []
    if TERMINATE_FLAG not in flags:
        extra.append(f"{TERMINATE_FLAG}={CPU_COLLECTIVE_TIMEOUT_S}")
    if WARN_FLAG not in flags:
        extra.append(f"{WARN_FLAG}={CPU_COLLECTIVE_TIMEOUT_S // 5}")
    return " ".join([flags.strip(), *extra]).strip()


def configure(environ: MutableMapping[str, str] | None = None) -> str:
    """Set XLA_FLAGS in `environ` (default: this process's) by the module's rule; returns the value.
    Call before JAX's first computation (`bmrl.cli.main` does); later, XLA has read its flags."""
    environ = os.environ if environ is None else environ
    flags = environ.get("XLA_FLAGS", "")
    new = with_cpu_collective_timeout(flags, jaxlib_minor())
    if new != flags:
        environ["XLA_FLAGS"] = new
    return new
