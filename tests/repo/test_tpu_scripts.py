"""The `tpu/` scripts (bash -n clean, usage without gcloud, the gcloud commands they would run) and the
real-model configs (load with their required override; the parameter counts their resource notes use).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from tests.paths import ROOT

SCRIPTS = ["create_vm.sh", "install.sh", "run.sh", "sweep.sh", "copy_back.sh"]
BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")
PARAMS_ENV = ("TPU_NAME", "ZONE", "ACCELERATOR_TYPE", "CONFIG", "DEST", "PROJECT", "BMRL_GIT", "JAX_SPEC")


@pytest.fixture
def env(tmp_path):
    """An environment whose only `gcloud` fails loudly, without the scripts' parameter variables."""
    fake = tmp_path / "gcloud"
    fake.write_text("#!/bin/sh\necho 'gcloud was called' >&2\nexit 99\n")
    fake.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if k not in PARAMS_ENV}
    e["PATH"] = f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"
    return e


def script(name, *args, env):
    return subprocess.run([BASH, os.path.join(ROOT, "tpu", name), *args], capture_output=True, text=True,
                          env=env, timeout=20, cwd=ROOT)


@needs_bash
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_parses_prints_usage_and_refuses_missing_parameters(name, env):
    subprocess.run([BASH, "-n", os.path.join(ROOT, "tpu", name)], check=True, timeout=10)
    for flag in ("--help", "-h"):
        res = script(name, flag, env=env)
        assert res.returncode == 0 and res.stdout.startswith("Usage: tpu/" + name), res.stderr
        assert "gcloud was called" not in res.stderr
    res = script(name, env=env)  # nothing given: usage on stderr, exit 2, before gcloud
    assert res.returncode == 2 and "missing --name" in res.stderr and "Usage:" in res.stderr
    res = script(name, "--name", "vm", "--zone", "z", "--bogus", env=env)
    assert res.returncode == 2 and "unknown argument: --bogus" in res.stderr
    assert "gcloud was called" not in res.stderr


@needs_bash
def test_run_dry_run_targets_every_worker_with_distributed_env(env):
    res = script("run.sh", "--name", "vm", "--zone", "us-east5-a", "--config", "configs/qwen2_5_0_5b_sokoban.yaml",
                 "--env", "LIBTPU_INIT_ARGS=--xla_tpu_x=1", "--dry-run", "--",
                 "model.path=~/models/Qwen2.5-0.5B-Instruct", "out_dir=runs/a b", env=env)
    assert res.returncode == 0, res.stderr
    cmd = res.stdout
    assert cmd.startswith("gcloud compute tpus tpu-vm ssh vm ") and "--worker=all" in cmd and "--zone=us-east5-a" in cmd
    # Unquote one level (what the remote shell receives) to check the command line it runs.
    unquote = 'eval "set -- $CMD"; for a; do case $a in --command=*) printf "%s" "${a#--command=}";; esac; done'
    remote = subprocess.run([BASH, "-c", unquote], env={**env, "CMD": cmd}, capture_output=True, text=True,
                            timeout=10).stdout
    assert "export BMRL_DISTRIBUTED=auto LIBTPU_INIT_ARGS=--xla_tpu_x=1;" in remote
    assert "~/bmrl-venv/bin/bmrl train --config configs/qwen2_5_0_5b_sokoban.yaml" in remote
    assert "model.path=$HOME/models/Qwen2.5-0.5B-Instruct" in remote  # ~/ means the worker's home
    assert r"out_dir=runs/a\ b" in remote and "tee ~/bmrl-logs/" in remote

    res = script("run.sh", "--name", "vm", "--zone", "z", "--command", "sweep",
                 "--config", "configs/sweep_budgets.yaml", "--no-distributed", "--detach", "--dry-run", env=env)
    assert res.returncode == 0 and "bmrl\\ sweep\\ configs/sweep_budgets.yaml" in res.stdout
    assert "BMRL_DISTRIBUTED=off" in res.stdout and "nohup" in res.stdout
    res = script("run.sh", "--name", "vm", "--zone", "z", "--config", "c.yaml", "--command", "fly", env=env)
    assert res.returncode == 2 and "unknown --command 'fly'" in res.stderr


@needs_bash
def test_create_sweep_copy_dry_runs(env):
    res = script("create_vm.sh", "--name", "vm", "--zone", "us-east5-a", "--type", "v5p-16", "--spot", "--dry-run",
                 env=env)
    assert res.stdout.split() == ["gcloud", "compute", "tpus", "tpu-vm", "create", "vm", "--zone=us-east5-a",
                                  "--accelerator-type=v5p-16", "--version=v2-alpha-tpuv5", "--spot"]
    res = script("create_vm.sh", "--name", "vm", "--zone", "z", "--type", "tpu7-9", env=env)
    assert res.returncode == 2 and "pass --version" in res.stderr

    res = script("sweep.sh", "--name", "vm", "--zone", "z", "--config", "configs/a.yaml", "--config", "configs/b.yaml",
                 "--out-root", "runs/s", "--dry-run", "--", "train.steps=3", env=env)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("gcloud")]
    assert len(lines) == 2 and "out_dir=runs/s/a\\ train.steps=3" in lines[0] and "configs/b.yaml" in lines[1]
    res = script("sweep.sh", "--name", "vm", "--zone", "z", "--sweep", "s.yaml", "--config", "a.yaml", env=env)
    assert res.returncode == 2 and "not both" in res.stderr

    res = script("copy_back.sh", "--name", "vm", "--zone", "z", "--dest", "gs://bucket/x", "--dry-run", env=env)
    assert "--worker=0" in res.stdout
    assert "gcloud\\ storage\\ rsync\\ --recursive\\ ~/bmrl/runs\\ gs://bucket/x/runs" in res.stdout
    res = script("copy_back.sh", "--name", "vm", "--zone", "z", "--dest", "out", "--worker", "x", env=env)
    assert res.returncode == 2 and "worker number" in res.stderr

    res = script("install.sh", "--name", "vm", "--zone", "z", "--dry-run", env=env)
    assert res.returncode == 0 and "tpu-vm\\ scp" not in res.stdout
    assert "gcloud compute tpus tpu-vm scp /tmp/bmrl.tgz vm:bmrl.tgz --worker=all" in res.stdout
    remote = res.stdout.replace("\\n", "\n").replace("\\ ", " ")
    assert "uv pip install --python ~/bmrl-venv/bin/python -e ~/bmrl" in remote


# ------------------------------------------------------------------ real-model configs
REAL = {
    # file: (ModelConfig of the model the file's resource notes describe, parameter count they use)
    "qwen2_5_0_5b_sokoban.yaml": (dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                       tie_word_embeddings=True), "494.0M"),
    "llama3_2_1b_toolchain.yaml": (dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                                        tie_word_embeddings=True), "1235.8M"),
    "qwen3_0_6b_sokoban.yaml": (dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                     num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                     tie_word_embeddings=True), "596.0M"),
    "gemma3_1b_tools.yaml": (dict(model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                                  num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                  sliding_window=512, rope_local_theta=10000.0), "999.9M"),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_model_config_loads_with_its_model_path(name):
    from bmrl.config import load

    cfg = load(os.path.join(ROOT, "configs", name), ["model.path=/models/x"])
    assert cfg.model.path == "/models/x" and cfg.model.dtype == "bfloat16"
    batch = cfg.train.tasks_per_step * cfg.train.group_size
    assert batch == 128 and batch % cfg.train.minibatches == 0
    text = open(os.path.join(ROOT, "configs", name)).read()
    assert re.search(r"^  path: \?\?\?", text, re.M)  # marked required in the file


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_model_config_parameter_count_matches_the_notes(name):
    """The notes' P is what bmrl's own Decoder allocates for that architecture (shapes only, no memory)."""
    import jax
    from flax import nnx

    from bmrl.model import Decoder, ModelConfig

    arch, written = REAL[name]
    cfg = ModelConfig(**arch, max_position_embeddings=4096)
    state = nnx.state(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    count = sum(x.size for x in jax.tree.leaves(state))
    assert f"{count / 1e6:.1f}M" == written
    notes = open(os.path.join(ROOT, "configs", name)).read()
    assert re.search(rf"= {re.escape(written[:-1])}M parameters", notes)


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_model_config_refuses_a_missing_model_path(name):
    from bmrl.config import ConfigError, load

    with pytest.raises(ConfigError) as err:
        load(os.path.join(ROOT, "configs", name))
    assert err.value.key == "model.path"


def test_readme_checklist_names_every_script_and_what_is_unverified():
    text = open(os.path.join(ROOT, "tpu", "README.md")).read()
    table = text.split("## Checklist: what has run on real hardware", 1)[1]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| check")]
    assert len(rows) >= 8 and all(ln.count("|") == 4 for ln in rows)
    for name in SCRIPTS:
        assert f"`{name}" in table, name
    assert "bench/device.sh" in table and "tests/e2e/test_mesh_train.py" in table


@needs_bash
def test_device_script_parses_and_prints_usage(env):
    path = os.path.join(ROOT, "bench", "device.sh")
    subprocess.run([BASH, "-n", path], check=True, timeout=10)
    res = subprocess.run([BASH, path, "--help"], capture_output=True, text=True, env=env, timeout=20)
    assert res.returncode == 0 and "bench/device.py" in res.stdout and "jax[cuda13]" in res.stdout
    res = subprocess.run([BASH, path, "--bogus"], capture_output=True, text=True, env=env, timeout=20)
    assert res.returncode == 2 and "unknown argument: --bogus" in res.stderr
