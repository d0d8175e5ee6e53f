"""LoRA vs full fine-tuning, side by side: one update step's time and peak memory, and the rollout's
decode with the adapters unmerged vs merged once per step.

    python bench/lora.py                  # ~100M-parameter decoder (bench/decode.py's "100m"), LoRA rank 16
    python bench/lora.py --quick          # a 5M model, small batch: under 2 minutes on CPU
    python bench/lora.py --remat          # decoder layers recomputed in the backward pass (train.remat)

The update is `bmrl.learn.step.make_update` (PPO, GRPO, one epoch, one minibatch, AdamW) on a synthetic
full-length batch (bench/train_step.py's): full fine-tuning steps every parameter; LoRA (rank 16 on
q/k/v/o/gate/up/down, `bmrl.model.lora`) steps the adapters with the base a frozen input. The two
compiled programs run alternately (`--steps` each), so machine load hits both alike; the median is
reported. Peak memory is the compiled program's own footprint from XLA's memory analysis: arguments
+ outputs not aliased to donated arguments + temporaries (what the step needs on the device, on any
backend); on a GPU the allocator's peak of each program run alone in order is reported beside it.

Rollout: the same greedy KV-cache decode (bench/decode.py's program) of the LoRA model with the
adapters applied in every projection (unmerged), and of the model whose kernels are merged once per
RL step (merge, then decode a plain model): decode time of each, the merge's time, and the bytes the
merged copy of the adapted kernels needs. One JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from decode import SIZES, make_programs  # bench/ siblings: the decode program and the ~100M shape
from train_step import synthetic_traj

from bmrl.model import ModelConfig, init_model, num_params
from bmrl.model.lora import LoRASpec, adapters, add_lora, merge_lora, split_lora


def footprint(compiled) -> int:
    """Bytes a compiled program holds at once: arguments + outputs (less those aliased to donated
    arguments) + temporaries, from XLA's memory analysis."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def update_programs(mcfg: ModelConfig, spec: LoRASpec, batch: int, seq: int, remat: bool = False):
    """{'full': (run, args), 'lora': (run, args)}: one compiled update each and its first arguments."""
    from bmrl.config import TrainCfg
    from bmrl.learn import make_optimizer
    from bmrl.learn.step import init_opt_state, make_update

    tcfg = TrainCfg(tasks_per_step=batch // 2, group_size=2, epochs=1, minibatches=1, remat=remat)
    tx = make_optimizer(1e-4, total_steps=1000)
    traj = synthetic_traj(batch, seq, mcfg.vocab_size)
    out = {}
    graphdef, params = nnx.split(init_model(mcfg, 0))
    update = make_update(graphdef, tx, tcfg, 1.0)
    out["full"] = (update, [params, init_opt_state(tx, params), None, traj])
    graphdef, adapters, base = split_lora(add_lora(init_model(mcfg, 0), spec))
    update = make_update(graphdef, tx, tcfg, 1.0, frozen=True)
    out["lora"] = (update, [adapters, init_opt_state(tx, adapters), base, traj])
    return out


def bench_update(mcfg, spec, batch, seq, steps, remat=False) -> dict:
    programs = update_programs(mcfg, spec, batch, seq, remat)
    res = {}
    for name, (update, args) in programs.items():
        t = time.perf_counter()
        compiled = update.lower(*args, jax.random.key(0)).compile()
        res[name] = {"compile_s": round(time.perf_counter() - t, 2), "peak_bytes": footprint(compiled),
                     "trained_bytes": nbytes(args[0]), "opt_state_bytes": nbytes(args[1]), "times": []}
        programs[name] = (compiled, args)
    gpu = jax.default_backend() != "cpu"
    for i in range(steps + 1):  # alternate: the first call of each is a warm-up
        for name, (compiled, args) in programs.items():
            if gpu and i == 0:
                jax.devices()[0].memory_stats()  # (the allocator's peak is cumulative; read after each warm-up)
            t = time.perf_counter()
            args[0], args[1], m = compiled(*args, jax.random.key(i))
            jax.block_until_ready(m)
            if i:
                res[name]["times"].append(time.perf_counter() - t)
            elif gpu:
                res[name]["allocator_peak_bytes"] = int(jax.devices()[0].memory_stats().get("peak_bytes_in_use", 0))
            res[name]["loss_finite"] = bool(np.isfinite(float(m["loss"])))
    for r in res.values():
        times = r.pop("times")
        r["step_s"], r["step_s_min"] = round(float(np.median(times)), 4), round(min(times), 4)
    return res


def bench_rollout(mcfg, spec, batch, prompt, steps, repeats) -> dict:
    """Greedy decode of the LoRA model unmerged vs merged once (the merge timed apart)."""
    model = add_lora(init_model(mcfg, 0), spec)
    graphdef, trained, base = split_lora(model)
    trained = jax.tree.map(lambda x: x + 0.01, trained)  # B nonzero: the adapters change the outputs
    lora_state = nnx.merge_state(trained, base)
    plain = merge_lora(nnx.merge(graphdef, trained, base))
    unmerged = make_programs(nnx.merge(graphdef, lora_state), batch, prompt, steps)["kv_cache"]
    merged_decode = make_programs(plain, batch, prompt, steps)["kv_cache"]
    merge = jax.jit(lambda s: nnx.state(merge_lora(nnx.merge(graphdef, s))))
    tokens = jax.random.randint(jax.random.key(1), (batch, prompt), 0, mcfg.vocab_size, jnp.int32)
    runs = {"unmerged": lambda: unmerged(lora_state, tokens), "merge": lambda: merge(lora_state),
            "merged_decode": lambda: merged_decode(merged_state, tokens)}
    merged_state = merge(lora_state)
    outs = {"unmerged": np.asarray(unmerged(lora_state, tokens)),
            "merged_decode": np.asarray(merged_decode(merged_state, tokens))}
    times = {k: [] for k in runs}
    for _ in range(repeats):  # interleaved
        for k, f in runs.items():
            t = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t)
    best = {k: min(v) for k, v in times.items()}
    kernels = sum(m.kernel[...].size * m.kernel[...].dtype.itemsize for _, _, m in adapters(model))
    return {
        "batch": batch, "prompt": prompt, "decode_steps": steps,
        "unmerged_decode_s": round(best["unmerged"], 4), "merged_decode_s": round(best["merged_decode"], 4),
        "merge_s": round(best["merge"], 4), "merged_total_s": round(best["merge"] + best["merged_decode"], 4),
        "merged_copy_bytes": int(kernels),  # a second copy of every adapted kernel while the merged model lives
        "same_greedy_tokens_fraction": float((outs["unmerged"] == outs["merged_decode"]).mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a ~10M model and a small batch (under 2 min on CPU)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=None, help="rows per update (default 8; quick 4)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per row (default 512; quick 128)")
    ap.add_argument("--steps", type=int, default=None, help="timed update steps of each (default 5; quick 3)")
    ap.add_argument("--param-dtype", default=None, help="float32 | bfloat16 (default: bfloat16 on an accelerator)")
    ap.add_argument("--remat", action="store_true", help="recompute decoder layers in the backward pass (train.remat)")
    ap.add_argument("--no-rollout", action="store_true", help="skip the unmerged / merged decode comparison")
    ap.add_argument("--rollout-batch", type=int, default=None, help="decode rows (default 32; quick 8)")
    ap.add_argument("--decode-steps", type=int, default=None, help="decode tokens per row (default 64; quick 16)")
    args = ap.parse_args()

    gpu = jax.default_backend() != "cpu"
    dtype = "bfloat16" if gpu else "float32"
    param_dtype = args.param_dtype or dtype
    if args.quick:
        base = ModelConfig.tiny(8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=2, intermediate_size=704, tie_word_embeddings=True)
        batch, seq, steps = args.batch or 4, args.seq or 128, args.steps or 3
        roll = dict(batch=8, prompt=32, steps=16, repeats=3)
    else:
        base = SIZES["100m"]
        batch, seq, steps = args.batch or 8, args.seq or 512, args.steps or 5
        roll = dict(batch=32, prompt=128, steps=64, repeats=5)
    roll.update({k: v for k, v in (("batch", args.rollout_batch), ("steps", args.decode_steps)) if v})
    import dataclasses

    mcfg = dataclasses.replace(base, dtype=dtype, param_dtype=param_dtype)
    spec = LoRASpec(rank=args.rank, alpha=2.0 * args.rank)
    upd = bench_update(mcfg, spec, batch, seq, steps, args.remat)
    rollout = None if args.no_rollout else bench_rollout(mcfg, spec, **roll)
    full, lora = upd["full"], upd["lora"]
    out = {
        "bench": "lora", "backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
        "params": num_params(init_model(mcfg, 0)), "rank": spec.rank, "targets": list(spec.targets),
        "dtype": dtype, "param_dtype": param_dtype, "batch": batch, "seq": seq, "remat": args.remat, "quick": args.quick,
        "full": full, "lora": lora,
        "memory_ratio": round(lora["peak_bytes"] / full["peak_bytes"], 3),
        "time_ratio": round(lora["step_s"] / full["step_s"], 3),
        "targets_met": {"memory_le_0.4": lora["peak_bytes"] <= 0.4 * full["peak_bytes"],
                        "time_le_0.8": lora["step_s"] <= 0.8 * full["step_s"]},
        "rollout": rollout,
    }
    print(f"update, {out['params'] / 1e6:.1f}M params, {batch} x {seq} tokens, {dtype} compute / {param_dtype} params:")
    for name in ("full", "lora"):
        r = upd[name]
        print(f"  {name:5s} step {r['step_s']:.3f} s   peak {r['peak_bytes'] / 2**30:.3f} GiB   "
              f"trained {r['trained_bytes'] / 2**20:.1f} MiB   optimizer {r['opt_state_bytes'] / 2**20:.1f} MiB")
    print(f"  LoRA / full: memory {out['memory_ratio']:.2f}x, time {out['time_ratio']:.2f}x")
    if rollout:
        print(f"rollout decode ({roll['batch']} rows x {roll['steps']} tokens): unmerged {rollout['unmerged_decode_s']:.3f} "
              f"s, merged {rollout['merged_decode_s']:.3f} s + merge {rollout['merge_s']:.3f} s "
              f"(+{rollout['merged_copy_bytes'] / 2**20:.0f} MiB for the merged kernels)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
