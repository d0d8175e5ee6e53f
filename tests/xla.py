"""XLA flags of the suite and of the subprocesses its tests start.

The suite is compile-bound: XLA:CPU compiles thousands of small programs that then run for milliseconds.
`FAST_COMPILE` trades run time for compile time: LLVM without optimisation and XLA:CPU's loop emitters instead
of its fusion emitters (test_generate.py: 16.1 s -> 5.0 s of XLA compile). Both are code generation only: the
programs compute the same operations in the same order. They are used only with the jaxlib versions checked
to parse them (XLA exits on an unknown flag; both are in jaxlib 0.10.2's and 0.11.2's libjax_common.so);
`BMRL_TEST_FAST_COMPILE=0` runs the suite with XLA's defaults.

Every process of the suite (the xdist workers and the subprocesses its tests start) runs with the same flags,
the simulated device count aside (`suite_flags`): JAX hashes XLA_FLAGS into each persistent-cache key, all but
the device count, so with one set of flags a program compiled by any process is loaded by every other.
"""

from __future__ import annotations

import os

from bmrl.xla_flags import CPU_COLLECTIVE_TIMEOUT_S, KNOWN_JAXLIB, TERMINATE_FLAG, WARN_FLAG, jaxlib_minor

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def fast_compile() -> str:
    """`FAST_COMPILE`, or "" when turned off or the installed jaxlib was not checked to know the flags."""
    if os.environ.get("BMRL_TEST_FAST_COMPILE", "1").lower() in ("0", "false", "no", "off"):
        return ""
    return FAST_COMPILE if jaxlib_minor() in KNOWN_JAXLIB else ""


def optimised() -> dict:
    """`jax.jit(..., compiler_options=optimised())`: LLVM at -O2 for one program, under the suite's `FAST_COMPILE`
    (the loop emitters kept). For the few test programs that run far longer than they compile: Sokoban's level
    generation over 1,024 rows runs in 0.8 s at -O2 and 5.5 s at -O0, for 1 s more of compile. {} when the
    suite compiles with XLA's defaults."""
    return {"xla_backend_optimization_level": 2} if fast_compile() else {}


def suite_flags() -> str:
    """XLA_FLAGS of every process the suite runs: `fast_compile()` and the CPU collective timeouts of
    `bmrl.xla_flags` (what a process simulating devices gets; harmless with one device), or "" with a jaxlib
    not checked to know them."""
    if jaxlib_minor() not in KNOWN_JAXLIB:
        return ""
    return f"{fast_compile()} {TERMINATE_FLAG}={CPU_COLLECTIVE_TIMEOUT_S} {WARN_FLAG}={CPU_COLLECTIVE_TIMEOUT_S // 5}".strip()


def cpu_devices(n: int) -> str:
    """XLA_FLAGS of a subprocess that simulates `n` CPU devices: the suite's flags. Its collectives wait for
    every device thread; on a loaded 2-core machine (the suite's other worker busy) a thread can miss XLA's
    default 40 s rendezvous deadline and the process aborts, so the deadline is raised."""
    return f"--xla_force_host_platform_device_count={n} {suite_flags()}".strip()


EIGHT_CPU_DEVICES = cpu_devices(8)
