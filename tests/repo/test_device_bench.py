"""bench/device.py --cpu-smoke: the accelerator benchmark's code runs end to end on a tiny model on CPU,
so bench/device.sh cannot rot between the runs that have a GPU. Checks the figures' consistency, not speed."""

import json
import os
import subprocess
import sys
from tests.paths import ROOT



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
    # decode bytes per step: the parameters + the KV-cache blocks read (2 x layers x batch x keys x kv heads x
    # head dim x 4 bytes): 8 steps after a 96-token prompt in a 192-token buffer hold 97..104 live keys, two
    # 64-key blocks, so 128 keys are read (not the 192 of the buffer)
    assert out["max_len"] == 192 and out["decode_context"] == 96
    assert out["decode_bytes_per_step"] == out["params"] * 4 + 2 * 2 * 8 * 128 * 2 * 16 * 4
    assert out["decode_block"] == 64 and {"decode_roofline_block64", "decode_roofline_block256"} <= set(out)


def test_decode_bytes_follow_the_blocks_read():
    """The roofline's KV bytes: whole blocks up to the live context, the whole buffer at block 0."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from device import kv_bytes_read, tiny

    cfg = tiny("float32")  # 2 layers, 2 kv heads, head dim 16, 4 bytes
    per_key = 2 * 2 * 2 * 16 * 4
    assert kv_bytes_read(cfg, 1, 1024, 65, 64) == 128 * per_key  # 65 live keys: two blocks of 64
    assert kv_bytes_read(cfg, 3, 1024, 64, 64) == 3 * 64 * per_key
    assert kv_bytes_read(cfg, 1, 1024, 65, 0) == 1024 * per_key  # block 0: the whole buffer
    assert kv_bytes_read(cfg, 1, 100, 10, 64) == 100 * per_key  # a buffer under two blocks is read whole
    assert kv_bytes_read(cfg, 1, 1000, 999, 256) == 1000 * per_key  # never past the buffer
    windowed = tiny("float32", "gemma2")  # layer 0 slides over 48 keys, layer 1 sees all
    assert windowed.layer_types == ("sliding_attention", "full_attention")
    per_layer_key = per_key // 2
    assert kv_bytes_read(windowed, 1, 1024, 130, 64) == (192 + 128) * per_layer_key  # blocks 1-2 / 0-2


def test_every_family_has_a_device_shape():
    """`--family`: each registered family's real shape builds (shapes only) with the parameter count of its model."""
    import jax
    from flax import nnx

    from bmrl.model import FAMILIES, Decoder

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from device import SHAPES, family_shape

    assert set(SHAPES) == set(FAMILIES)
    counts = {}
    for family in SHAPES:
        cfg = family_shape(family, "bfloat16")
        counts[family] = sum(x.size for x in jax.tree.leaves(nnx.state(nnx.eval_shape(
            lambda cfg=cfg: Decoder(cfg, rngs=nnx.Rngs(0))))))
    assert round(counts["qwen3"] / 1e6, 1) == 596.0 and round(counts["gemma3_text"] / 1e6, 1) == 999.9
    assert round(counts["gemma2"] / 1e9, 2) == 2.61 and round(counts["qwen2"] / 1e6, 1) == 494.0
