"""Learner throughput: tokens/s and achieved FLOP/s of the jitted update for a ~25M-parameter decoder.

    python bench/train_step.py [--batch 8] [--seq 256] [--steps 5]

The update is `bmrl.learn.step.make_update` (PPO loss, GRPO advantages, one epoch, one minibatch) on
a synthetic full-length trajectory: a full forward, the backward and the AdamW step.

    achieved FLOP/s = 6 * params * tokens / step time          (fwd 2N + bwd 4N per token)
    attention FLOPs (reported, not counted): 6 * layers * seq * hidden * tokens (causal QK^T and AV)
    fraction = achieved FLOP/s / FLOP/s of a plain jnp.dot (float32 n x n, same process)

On a GPU the matmul reference is bfloat16 and the model runs in bfloat16. One JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def matmul_flops(n: int, dtype, reps: int = 5) -> float:
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=dtype))
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def synthetic_traj(batch: int, seq: int, vocab: int, max_turns: int = 4):
    from bmrl.rollout import Trajectory

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(4, vocab, (batch, seq)), jnp.int32)
    mask = jnp.asarray(np.arange(seq)[None, :].repeat(batch, 0) >= 16, jnp.float32)
    zb = jnp.zeros((batch, max_turns), bool)
    zi = jnp.zeros((batch, max_turns), jnp.int32)
    reward = jnp.asarray(rng.integers(0, 2, (batch, max_turns)), jnp.float32)
    return Trajectory(
        tokens=tokens, length=jnp.full((batch,), seq, jnp.int32), loss_mask=mask,
        logprobs=jnp.asarray(-rng.random((batch, seq)) * 5, jnp.float32) * mask,
        turn_of_token=jnp.zeros((batch, seq), jnp.int32), action=zi, reward=reward, error=zb, invalid=zb,
        format_error=zb, injected=zb, oracle_action=zi, progress=jnp.zeros((batch, max_turns + 1)),
        turn_active=~zb, caps=jnp.full((batch,), max_turns, jnp.int32), turns_used=jnp.full((batch,), max_turns, jnp.int32),
        success=reward[:, 0] > 0, first_success_turn=jnp.zeros((batch,), jnp.int32),
        terminated=jnp.zeros((batch,), bool), truncated=jnp.zeros((batch,), bool), overflow=jnp.zeros((batch,), bool),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--matmul", type=int, default=2048)
    args = ap.parse_args()

    from bmrl.config import TrainCfg
    from bmrl.learn import make_optimizer
    from bmrl.learn.step import init_opt_state, make_update
    from bmrl.model import ModelConfig, init_model, num_params

    gpu = jax.default_backend() != "cpu"
    dtype = "bfloat16" if gpu else "float32"
    mcfg = ModelConfig.tiny(8192, hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                            num_key_value_heads=4, intermediate_size=1408, dtype=dtype)
    model = init_model(mcfg, 0)
    n_params = num_params(model)
    graphdef, params = nnx.split(model)
    tcfg = TrainCfg(tasks_per_step=args.batch // 2, group_size=2, epochs=1, minibatches=1)
    tx = make_optimizer(1e-4, total_steps=1000)
    opt_state = init_opt_state(tx, params)
    update = make_update(graphdef, tx, tcfg, 1.0)
    traj = synthetic_traj(args.batch, args.seq, mcfg.vocab_size)
    tokens = args.batch * args.seq

    t = time.perf_counter()
    params, opt_state, m = update(params, opt_state, None, traj, jax.random.key(0))
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t
    times = []
    for i in range(args.steps):
        t = time.perf_counter()
        params, opt_state, m = update(params, opt_state, None, traj, jax.random.key(i + 1))
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    step_s = float(np.median(times))
    peak = matmul_flops(args.matmul, jnp.bfloat16 if gpu else jnp.float32)
    achieved = 6 * n_params * tokens / step_s
    attn = 6 * mcfg.num_hidden_layers * args.seq * mcfg.hidden_size * tokens / step_s
    out = {
        "bench": "train_step", "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
        "params": n_params, "batch": args.batch, "seq": args.seq, "tokens_per_step": tokens, "dtype": dtype,
        "compile_s": round(compile_s, 2), "step_s": round(step_s, 4), "step_s_min": round(min(times), 4),
        "tokens_per_s": round(tokens / step_s, 1),
        "achieved_tflops": round(achieved / 1e12, 4), "attention_tflops_extra": round(attn / 1e12, 4),
        "matmul_tflops": round(peak / 1e12, 4), "fraction_of_matmul": round(achieved / peak, 3),
        "flops_formula": "6 * params * tokens / step_s (attention not counted)",
        "loss_finite": bool(np.isfinite(float(m["loss"]))),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
