"""bench/device.py --cpu-smoke: the accelerator benchmark's code runs end to end on a tiny model on CPU,
so bench/device.sh cannot rot between the runs that have a GPU. Checks the figures' consistency, not speed."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_device_bench_cpu_smoke():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)
    res = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "device.py"), "--cpu-smoke"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["backend"] == "cpu" and out["batch"] == 8 and out["turns"] == 2
    for key in ("copy_gbps", "matmul_tflops", "decode_tokens_per_s", "decode_roofline", "rollout_tokens_per_s",
                "train_tokens_per_s", "mfu"):
        assert out[key] > 0, key
    assert out["rollout_turns_mean"] == 2.0  # every episode ran its turns
    assert 0 < out["rollout_sampled_tokens"] <= 8 * 2 * 4
    assert out["train_loss_finite"] and out["train_compiles"] == 1
    assert "memory plan per device" in res.stdout and "MFU" in res.stdout and "roofline" in res.stdout
    # decode bytes per step: the parameters + the whole KV cache (2 x layers x batch x max_len x kv heads x head dim)
    kv = 2 * 2 * 8 * out["max_len"] * 2 * 16 * 4
    assert out["decode_bytes_per_step"] == out["params"] * 4 + kv
