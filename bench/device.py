"""The accelerator path, measured: decode, rollout and one train step of a Qwen2.5-0.5B-shaped policy.

    python bench/device.py               # on a GPU/TPU: Qwen2.5-0.5B shape, bfloat16, batch 256, 16 turns x 32 tokens
    python bench/device.py --family gemma3_text   # another family's real shape (SHAPES: Qwen3-0.6B, Gemma-3-1B, ...)
    python bench/device.py --cpu-smoke   # the same code on a tiny model on CPU (< 60 s; tests/repo/test_device_bench.py)

Random weights (the shape is what costs). Every figure is measured side by side in this one run:
- device references: copy bandwidth (a jitted `x + 1` over a large array: bytes read + written / time)
  and bfloat16 matmul throughput (`jnp.dot` n x n, 2 n^3 / time);
- decode: one token per sequence per step with `Decoder.extend` in a `lax.fori_loop`, after a prompt
  of half the rollout's buffer (its mean live context when it fills it), for attention blocks of the
  rollout's `attention_block` (64) and of `--blocks` keys (256). Bytes read per step = parameters +
  the KV-cache blocks attention reads (whole blocks up to the live context; all at block 0); roofline
  fraction = (bytes per step / step time) / copy bandwidth. Target >= 0.6;
- rollout: the compiled multi-turn rollout (`bmrl.rollout.make_rollout`) on the corridor environment,
  every sequence running all turns (random weights rarely stop early): generated tokens/s;
- train step: `bmrl.learn.step.make_update` (GRPO advantages, PPO loss, AdamW) on a synthetic full
  batch, with the memory options the memory plan (`bmrl.memory`) needs to fit the device (remat,
  micro-batches). Model FLOPs = tokens x (6 x params + 12 x layers x hidden x seq) (matmuls, and
  attention scores and values, forward and backward; recomputation not counted); MFU = model FLOP/s
  / measured bfloat16 matmul FLOP/s. Target >= 0.4.
Compile times are reported apart and excluded. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bmrl.model import ModelConfig, init_model, num_params  # noqa: E402

TARGET_DECODE_ROOFLINE = 0.6
TARGET_MFU = 0.4


# One real model's architecture per family (`--family`); Mistral-7B is cut to 8 of its 32 layers so the
# train step (float32 Adam states) fits one device.
SHAPES = {
    "qwen2": ("qwen2.5-0.5b", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_theta=1e6, max_position_embeddings=32768)),
    "qwen3": ("qwen3-0.6b", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                                 rope_theta=1e6, max_position_embeddings=40960)),
    "llama": ("llama-3.2-1b", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
                                   rope_theta=5e5, max_position_embeddings=131072)),
    "gemma3_text": ("gemma-3-1b", dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                                       num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                       query_pre_attn_scalar=256, sliding_window=512, rope_theta=1e6,
                                       rope_local_theta=1e4, max_position_embeddings=32768)),
    "gemma2": ("gemma-2-2b", dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                  num_attention_heads=8, num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                                  sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                  max_position_embeddings=8192)),
    "mistral": ("mistral-7b-v0.1-8-layers", dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                                 num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=8,
                                                 sliding_window=4096, max_position_embeddings=32768)),
}


def family_shape(family: str, dtype: str) -> ModelConfig:
    """The `SHAPES` architecture of `family` in `dtype`."""
    return ModelConfig(model_type=family, **SHAPES[family][1], param_dtype=dtype, dtype=dtype)


def tiny(dtype: str, family: str = "qwen2") -> ModelConfig:
    """A tiny model of `family` (Gemma 2/3, Mistral and Qwen3 with a 48-key window: the smoke's contexts pass it)."""
    window = None if family in ("qwen2", "llama") else 48
    return ModelConfig(model_type=family, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, param_dtype=dtype,
                       dtype=dtype, sliding_window=window)


def best_time(fn, *args, repeats: int = 3) -> float:
    """Best wall time of `fn(*args)` (already compiled) over `repeats` calls, blocking on the result."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def copy_bandwidth(nbytes: int) -> float:
    """Bytes/s of a jitted elementwise pass over `nbytes` of bfloat16 (read once, written once)."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda a: a + 1)
    jax.block_until_ready(f(x))
    return 2 * x.nbytes / best_time(f, x, repeats=5)


def matmul_flops(n: int, dtype=jnp.bfloat16) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (2 n^3 per call)."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=dtype))
    jax.block_until_ready(f(a, b))
    return 2 * n**3 / best_time(f, a, b, repeats=5)


def tree_bytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


# ---------------------------------------------------------------- decode
def kv_bytes_read(cfg: ModelConfig, batch: int, max_len: int, live: int, block: int) -> int:
    """KV-cache bytes one decode step reads when the longest row holds `live` tokens: attention reads
    whole blocks of `block` keys up to the live context (the whole buffer when block = 0 or the
    buffer is shorter than two blocks, as `bmrl.model.attention.attend_cache` does); a sliding-window
    layer starts at the block of its oldest visible key (every row at the same context)."""
    keys = 0
    for layer in range(cfg.num_hidden_layers):
        if block <= 0 or max_len < 2 * block:
            keys += max_len
            continue
        window = cfg.window(layer)
        first = 0 if window is None else max(live - window, 0) // block
        keys += min(max_len, -(-live // block) * block) - first * block
    return 2 * batch * keys * cfg.num_key_value_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize


def bench_decode(graphdef, params, batch: int, max_len: int, context: int, steps: int, bandwidth: float,
                 block: int) -> dict:
    """`steps` one-token decode steps per row after a `context`-token prompt, attention in blocks of
    `block` keys; the bandwidth roofline. Two programs side by side: prompt + decode, and the prompt
    alone; the decode time is their difference (the cache is made inside, so nothing is copied in)."""
    cfg = nnx.merge(graphdef, params).config
    ones = jnp.ones((batch,), jnp.int32)

    def prompt(params, tokens):
        model = nnx.merge(graphdef, params)
        logits, cache = model.extend(tokens, ones * context, ones * 0, model.init_cache(batch, max_len),
                                     last_only=True, block_size=block)
        return model, jnp.argmax(logits[:, -1], -1).astype(jnp.int32)[:, None], cache

    @jax.jit
    def prompt_only(params, tokens):
        return prompt(params, tokens)[1]

    @jax.jit
    def prompt_and_decode(params, tokens):
        model, tok, cache = prompt(params, tokens)

        def step(i, carry):
            tok, cache = carry
            logits, cache = model.extend(tok, ones, ones * (context + i), cache, block_size=block)
            return jnp.argmax(logits[:, -1], -1).astype(jnp.int32)[:, None], cache

        return jax.lax.fori_loop(0, steps, step, (tok, cache))[0]

    tokens = jnp.ones((batch, context), jnp.int32)
    t = time.perf_counter()
    jax.block_until_ready(prompt_and_decode(params, tokens))
    compile_s = time.perf_counter() - t
    jax.block_until_ready(prompt_only(params, tokens))
    total, first = best_time(prompt_and_decode, params, tokens), best_time(prompt_only, params, tokens)
    step_s = max(total - first, 1e-9) / steps
    kv = sum(kv_bytes_read(cfg, batch, max_len, context + i + 1, block) for i in range(steps)) / steps
    per_step = tree_bytes(params) + kv
    return {"decode_compile_s": round(compile_s, 2), "decode_step_ms": round(1e3 * step_s, 3),
            "decode_tokens_per_s": round(batch / step_s, 1), "decode_bytes_per_step": int(per_step),
            "decode_roofline": round(per_step / step_s / bandwidth, 3)}


# ---------------------------------------------------------------- rollout
def rollout_setup(mcfg: ModelConfig, batch: int, turns: int, reply: int):
    """(env, fmt, rollout config, tasks, caps) for `batch` corridors that run `turns` turns of `reply` tokens."""
    from bmrl import config as config_lib
    from bmrl import assembly as policy_lib
    from bmrl.rollout import default_format

    data = dict(env={"name": "corridor", "options": {"length": 64, "eps": 0.0}},
                rollout={"max_turns": turns, "max_reply_tokens": reply, "max_len": 8192},
                budget={"kind": "fixed", "budgets": [turns]}, eval={"ts": [turns], "ks": [1], "attempts": 1},
                model={"vocab_size": 384})
    cfg = config_lib.build(data)
    tok = policy_lib.build_tokenizer(cfg)
    env = policy_lib.player_class(cfg).make_env(cfg, tok)
    fmt = default_format(env)
    need = fmt.tokens_needed(turns, env.max_obs_len, reply)
    data["rollout"]["max_len"] = int(-(-need // 64) * 64)  # the smallest multiple of 64 that holds every turn
    cfg = config_lib.build(data)
    if mcfg.vocab_size < len(tok):
        raise ValueError(f"the model's vocabulary ({mcfg.vocab_size}) is smaller than the tokenizer's ({len(tok)}).")
    tasks = {"seed": jnp.arange(batch, dtype=jnp.int32) * 2}
    caps = jnp.full((batch,), turns, jnp.int32)
    return env, fmt, policy_lib.rollout_config(cfg), tasks, caps


def bench_rollout(graphdef, params, setup, mesh) -> dict:
    from bmrl.parallel import shard_batch
    from bmrl.rollout import Injection, make_rollout

    env, fmt, rcfg, tasks, caps = setup
    run = make_rollout(graphdef, env, fmt, rcfg)
    tasks, caps = shard_batch(tasks, mesh), shard_batch(caps, mesh)
    inject = Injection.none(rcfg.max_turns)
    t = time.perf_counter()
    traj = jax.block_until_ready(run(params, tasks, caps, jax.random.key(0), inject))
    compile_s = time.perf_counter() - t
    best = best_time(lambda: run(params, tasks, caps, jax.random.key(1), inject), repeats=2)
    sampled = int(np.asarray(traj.loss_mask).sum())
    return {"rollout_compile_s": round(compile_s, 2), "rollout_s": round(best, 3),
            "rollout_sampled_tokens": sampled, "rollout_tokens": int(np.asarray(traj.length).sum()),
            "rollout_turns_mean": round(float(np.asarray(traj.turns_used).mean()), 2),
            "rollout_tokens_per_s": round(sampled / best, 1)}, traj


# ---------------------------------------------------------------- train step
def bench_train_step(graphdef, params, traj, mesh, matmul: float, memory_gb: float) -> dict:
    from bmrl.config import TrainCfg
    from bmrl.learn import make_optimizer
    from bmrl.learn.step import init_opt_state, make_update
    from bmrl.memory import plan_memory
    from bmrl.parallel import param_shardings, state_shardings

    mcfg = nnx.merge(graphdef, params).config
    batch, seq = traj.tokens.shape
    tx = make_optimizer(1e-5, total_steps=100, master_f32=jnp.dtype(mcfg.param_dtype) != jnp.float32)
    plan = None
    for micro in [m for m in (1, 2, 4, 8, 16, 32, 64) if batch % m == 0]:  # the fewest micro-batches that fit
        for remat in (False, True):
            plan = plan_memory(mcfg, mesh, tx, rollout_batch=batch, max_len=seq, update_rows=batch,
                               microbatches=micro, remat=remat, device_memory_gb=memory_gb)
            if plan.fits:
                break
        if plan.fits:
            break
    print(plan.table(), flush=True)
    tcfg = TrainCfg(tasks_per_step=batch // 8 if batch % 8 == 0 else batch, group_size=8 if batch % 8 == 0 else 1,
                    epochs=1, minibatches=1, microbatches=micro, remat=remat)
    p_sh = param_shardings(params, mesh)
    params = jax.device_put(params, p_sh)
    opt_state = init_opt_state(tx, params)
    o_sh = state_shardings(opt_state, mesh)
    opt_state = jax.device_put(opt_state, o_sh)
    update = make_update(graphdef, tx, tcfg, 1.0, shardings=(p_sh, o_sh))
    t = time.perf_counter()
    params, opt_state, m = jax.block_until_ready(update(params, opt_state, None, traj, jax.random.key(0)))
    compile_s = time.perf_counter() - t
    times = []
    for i in range(2):
        t = time.perf_counter()
        params, opt_state, m = jax.block_until_ready(update(params, opt_state, None, traj, jax.random.key(i + 1)))
        times.append(time.perf_counter() - t)
    step_s = min(times)
    n = num_params(nnx.merge(graphdef, params))
    tokens = batch * seq
    flops = tokens * (6 * n + 12 * mcfg.num_hidden_layers * mcfg.num_attention_heads * mcfg.head_dim * seq)
    return {"train_compile_s": round(compile_s, 2), "train_step_s": round(step_s, 3),
            "train_tokens_per_s": round(tokens / step_s, 1), "train_microbatches": micro, "train_remat": remat,
            "train_model_tflops": round(flops / step_s / 1e12, 3), "mfu": round(flops / step_s / matmul, 3),
            "train_loss_finite": bool(np.isfinite(float(m["loss"]))), "train_compiles": update.trace_count(),
            "plan_peak_gib": round(plan.peak / 2**30, 3)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="a tiny model on CPU: the same code in < 60 s")
    ap.add_argument("--batch", type=int, default=None, help="rollout / train batch (default 256; smoke 8)")
    ap.add_argument("--turns", type=int, default=None, help="turns per episode (default 16; smoke 2)")
    ap.add_argument("--reply", type=int, default=None, help="tokens per reply (default 32; smoke 4)")
    ap.add_argument("--decode-steps", type=int, default=None, help="timed decode steps (default 64; smoke 8)")
    ap.add_argument("--decode-context", type=int, default=None, help="prompt tokens before decoding (default max_len / 2)")
    ap.add_argument("--blocks", default="256",
                    help="attention blocks (keys; 0 = the whole buffer) to time decode at besides the rollout's "
                         "(each: two more compiles; e.g. 128,256,512,0)")
    ap.add_argument("--device-memory-gb", type=float, default=0.0, help="override the device memory for the plan")
    ap.add_argument("--family", default="qwen2", choices=sorted(SHAPES),
                    help="the model family whose real shape to run (" + ", ".join(
                        f"{k}: {v[0]}" for k, v in sorted(SHAPES.items())) + "); with --cpu-smoke a tiny one")
    args = ap.parse_args(argv)
    smoke = args.cpu_smoke
    if smoke:
        jax.config.update("jax_platforms", "cpu")
    batch = args.batch or (8 if smoke else 256)
    turns = args.turns or (2 if smoke else 16)
    reply = args.reply or (4 if smoke else 32)
    steps = args.decode_steps or (8 if smoke else 64)
    dtype = "float32" if smoke else "bfloat16"
    mcfg = tiny(dtype, args.family) if smoke else family_shape(args.family, dtype)

    from bmrl.parallel import MeshConfig, make_mesh, shard_params

    mesh = make_mesh(MeshConfig(data=-1))
    device = jax.devices()[0]
    out = {"bench": "device", "backend": jax.default_backend(), "device": str(device.device_kind),
           "devices": jax.device_count(), "model": "tiny" if smoke else f"{SHAPES[args.family][0]}-shape",
           "family": args.family, "dtype": dtype,
           "batch": batch, "turns": turns, "reply_tokens": reply}
    bandwidth = copy_bandwidth((16 if smoke else 2048) * 2**20)
    matmul = matmul_flops(256 if smoke else 8192, jnp.float32 if smoke else jnp.bfloat16)
    out.update(copy_gbps=round(bandwidth / 1e9, 1), matmul_tflops=round(matmul / 1e12, 2))
    print(f"device {out['device']} x{out['devices']}: copy {out['copy_gbps']} GB/s, "
          f"{'float32' if smoke else 'bfloat16'} matmul {out['matmul_tflops']} TFLOP/s", flush=True)

    model = init_model(mcfg, 0)
    graphdef, params = nnx.split(model)
    params = shard_params(params, mesh)
    out["params"] = num_params(model)
    setup = rollout_setup(mcfg, batch, turns, reply)
    max_len = setup[2].max_len
    out["max_len"] = max_len

    context = args.decode_context or max_len // 2  # a rollout's mean live context when it fills its buffer
    out["decode_context"] = context
    block = setup[2].attention_block  # the rollout's (config rollout.attention_block)
    blocks = [block] + [b for b in (int(x) for x in args.blocks.split(",") if x.strip()) if b != block]
    for b in blocks:
        d = bench_decode(graphdef, params, batch, max_len, context, steps, bandwidth, b)
        if b == block:
            out.update(d)
        out[f"decode_roofline_block{b}"], out[f"decode_tokens_per_s_block{b}"] = d["decode_roofline"], d["decode_tokens_per_s"]
        print(f"decode, {f'blocks of {b} keys' if b else 'the whole buffer'}: {d['decode_tokens_per_s']} tokens/s, {d['decode_step_ms']} ms/step, "
              f"{d['decode_roofline']:.0%} of the copy-bandwidth roofline (target {TARGET_DECODE_ROOFLINE:.0%})",
              flush=True)
    out["decode_block"] = block
    out["decode_best_block"] = max(blocks, key=lambda b: out[f"decode_tokens_per_s_block{b}"])
    stats, traj = bench_rollout(graphdef, params, setup, mesh)
    out.update(stats)
    print(f"rollout: {out['rollout_tokens_per_s']} generated tokens/s ({out['rollout_sampled_tokens']} tokens, "
          f"{out['rollout_turns_mean']} turns per episode, {out['rollout_s']} s)", flush=True)
    del model
    out.update(bench_train_step(graphdef, params, traj, mesh, matmul, args.device_memory_gb))
    print(f"train step: {out['train_tokens_per_s']} tokens/s, {out['train_step_s']} s, MFU {out['mfu']:.0%} "
          f"(target {TARGET_MFU:.0%}; {out['train_microbatches']} micro-batches, remat {out['train_remat']})",
          flush=True)
    out["meets_decode_target"] = out["decode_roofline"] >= TARGET_DECODE_ROOFLINE
    out["meets_mfu_target"] = out["mfu"] >= TARGET_MFU
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
