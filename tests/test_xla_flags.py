"""What bmrl sets for its platform at start-up: XLA:CPU collective timeouts and a quiet transformers."""

import os
import subprocess
import sys

from bmrl import xla_flags
from bmrl.xla_flags import TERMINATE_FLAG, WARN_FLAG, with_cpu_collective_timeout
from tests.paths import ROOT



def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TRANSFORMERS_NO_ADVISORY_WARNINGS")}
    full.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_simulated_devices_get_the_long_collective_timeout():
    out = with_cpu_collective_timeout("--xla_force_host_platform_device_count=8", (0, 10))
    assert f"{TERMINATE_FLAG}=600" in out and f"{WARN_FLAG}=120" in out
    assert out.startswith("--xla_force_host_platform_device_count=8 ")


def test_flags_left_alone_without_simulated_devices_a_known_jaxlib_or_when_set():
    for flags in ("", "--xla_force_host_platform_device_count=1", "--xla_backend_optimization_level=0"):
        assert with_cpu_collective_timeout(flags, (0, 10)) == flags
    eight = "--xla_force_host_platform_device_count=8"
    assert with_cpu_collective_timeout(eight, (0, 99)) == eight  # an unknown flag would abort XLA
    assert with_cpu_collective_timeout(eight, None) == eight
    mine = f"{eight} {TERMINATE_FLAG}=30"
    out = with_cpu_collective_timeout(mine, (0, 11))
    assert f"{TERMINATE_FLAG}=30" in out and out.count(TERMINATE_FLAG) == 1 and WARN_FLAG in out


def test_configure_writes_xla_flags_that_this_jax_accepts():
    """The flags `configure` adds are ones this jaxlib parses (an unknown one aborts the process), and a
    collective over the simulated devices runs under them."""
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert xla_flags.configure(env) != "--xla_force_host_platform_device_count=2"
    code = ("import jax, jax.numpy as jnp; from jax.sharding import Mesh, NamedSharding, PartitionSpec as P;"
            "m = Mesh(jax.devices(), ('d',)); x = jax.device_put(jnp.arange(4.0), NamedSharding(m, P('d')));"
            "print(float(jax.jit(jnp.sum)(x)), len(jax.devices()))")
    done = _run(code, XLA_FLAGS=env["XLA_FLAGS"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["6.0", "2"]


def test_no_pytorch_advice_on_import():
    """bmrl needs no PyTorch: transformers' 'PyTorch was not found' advice is not printed (torch hidden)."""
    code = "import sys; sys.modules['torch'] = None; import bmrl; import transformers; print('imported')"
    done = _run(code)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-2000:]
    assert "PyTorch was not found" not in done.stderr
    shown = _run(code.replace("import bmrl; ", ""))  # the control: transformers alone does print it
    assert "PyTorch was not found" in shown.stderr
