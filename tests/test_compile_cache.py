"""The persistent compilation cache (`bmrl.compile_cache`): where it lives, how it is turned off, what a
bad setting says, and that a program loaded from it computes bitwise what the fresh compile did."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bmrl import compile_cache
from tests.paths import ROOT


# Sample 12 tokens from a tiny random model (`bmrl.generate`: prefill, decode loop, sampling) and
# report the outputs with this process's compile and cache-hit events.
SCRIPT = r"""
import collections, json, jax, numpy as np
from bmrl.compile_cache import enable
path = enable()
events = collections.Counter()
jax.monitoring.register_event_listener(lambda e, **kw: events.update([e]))
from bmrl.generate import generate
from bmrl.model import ModelConfig, init_model
from bmrl.sampling import SamplingConfig
model = init_model(ModelConfig.tiny(32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1), seed=0)
out = generate(model, [[3, 4, 5], [6]], max_new_tokens=12, key=jax.random.key(7), sampling=SamplingConfig(temperature=1.0))
print("RESULT " + json.dumps({"path": path, "tokens": np.asarray(out.tokens).tolist(),
      "logprobs": np.asarray(out.logprobs).view(np.uint32).tolist(), "hits": events["/jax/compilation_cache/cache_hits"],
      "requests": events["/jax/compilation_cache/compile_requests_use_cache"]}))
"""


def run_script(env_updates: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BMRL_COMPILE_CACHE", "JAX_COMPILATION_CACHE"))}
    env.update(env_updates, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[0][len("RESULT "):])


def test_second_process_loads_every_program_and_computes_the_same_bits(tmp_path):
    first = run_script({"BMRL_COMPILE_CACHE": str(tmp_path)})
    assert first["path"] == str(tmp_path / compile_cache.host_tag())
    assert first["requests"] > 0 and first["hits"] == 0  # cold: everything compiled, and written
    assert len([f for f in os.listdir(first["path"]) if f.endswith("-cache")]) == first["requests"]
    second = run_script({"BMRL_COMPILE_CACHE": str(tmp_path)})
    assert second["hits"] == second["requests"] == first["requests"]  # warm: nothing compiled again
    assert second["tokens"] == first["tokens"] and second["logprobs"] == first["logprobs"]  # bitwise


def test_off_turns_it_off_and_enable_turns_it_back_on(monkeypatch):
    import jax

    before = jax.config.jax_compilation_cache_dir
    try:
        monkeypatch.setenv("BMRL_COMPILE_CACHE", "off")
        assert compile_cache.enable() is None and not jax.config.jax_enable_compilation_cache
    finally:
        jax.config.update("jax_enable_compilation_cache", True)  # the session's cache (tests/conftest.py)
    assert jax.config.jax_compilation_cache_dir == before


def test_where_the_cache_lives(monkeypatch, tmp_path):
    tag = compile_cache.host_tag()
    machine, digest = tag.rsplit("-", 1)
    assert machine and len(digest) == 12 and tag == compile_cache.host_tag()  # stable per host
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_dir() == str(tmp_path / "bmrl" / "xla")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.default_dir() == str(tmp_path / "home" / ".cache" / "bmrl" / "xla")


@pytest.mark.parametrize("size", ["0", "-1", "lots", "inf"])
def test_a_bad_size_names_the_variable(monkeypatch, size):
    monkeypatch.setenv("BMRL_COMPILE_CACHE_MAX_GB", size)
    with pytest.raises(compile_cache.CompileCacheError, match="BMRL_COMPILE_CACHE_MAX_GB.*positive number of GiB"):
        compile_cache._max_bytes()


def test_an_unwritable_directory_is_refused_by_the_cli_with_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = dict(os.environ, BMRL_COMPILE_CACHE=str(blocker / "cache"), JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "bmrl", "train", "--config", os.path.join(ROOT, "configs/quickstart.yaml")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "cannot be created" in proc.stderr and "BMRL_COMPILE_CACHE" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["file"]  # nothing written


def test_an_unwritable_default_only_warns(tmp_path):
    """A read-only home must not stop a run: the default directory failing warns and runs uncached."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BMRL_COMPILE_CACHE", "JAX_COMPILATION_CACHE"))}
    env.update(XDG_CACHE_HOME=str(blocker), JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = "import warnings; warnings.simplefilter('error')\nfrom bmrl.compile_cache import enable\ntry:\n    enable()\n" \
           "except UserWarning as w:\n    print('WARNED', w)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WARNED" in proc.stdout and "cannot be created" in proc.stdout and "without the cache" in proc.stdout
