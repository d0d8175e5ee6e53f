"""Batched greedy decode throughput: KV cache vs recomputing the whole sequence every step.

For each model size, two jitted programs generate the same greedy tokens from the same prompts:
- `kv_cache`: prefill the prompt with `Decoder.extend`, then one `extend` of a single token per step
  inside `lax.fori_loop`, the cache carried in the loop.
- `recompute`: a fixed [batch, prompt + steps] buffer; every step runs the full forward pass over
  the buffer (padding masked) and projects only the newest position to logits.
Compile time is excluded (one warm-up call); the best of `--repeats` timed calls is reported.

Then blocked against whole-buffer attention (`Decoder.extend(block_size=...)`): decode tokens/s of
the rollout benchmarks' model (vocab 256, 2 layers, hidden 128, 4 q / 2 kv heads) at a short and a
long live context in one long buffer, the two calls of each context interleaved.
Prints tables, then one JSON line with every figure (`blocked_over_full_short` / `_long`).

    python bench/decode.py                       # tiny + ~100M, defaults below (a few minutes)
    python bench/decode.py --quick               # tiny only, fewer steps (under 2 minutes)
    python bench/decode.py --sizes tiny --tiny-steps 256
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl.model import ModelConfig, init_model, num_params
from bmrl.model.attention import BLOCK_SIZE

SIZES = {
    "tiny": ModelConfig.tiny(512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    # ~100M parameters: 12 layers of hidden 768, GQA 12/4 heads, 32k vocabulary (tied).
    "100m": ModelConfig.tiny(
        32000,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
        tie_word_embeddings=True,
    ),
}
ATTENTION_MODEL = ModelConfig.tiny(256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def make_programs(model, batch: int, prompt_len: int, steps: int):
    """Two jitted greedy decoders `f(state, prompt[batch, prompt_len]) -> new tokens [batch, steps]`."""
    graphdef, _ = nnx.split(model)
    total = prompt_len + steps

    @jax.jit
    def kv_cache(state, prompt):
        m = nnx.merge(graphdef, state)
        cache = m.init_cache(batch, total)
        lengths = jnp.full((batch,), prompt_len, jnp.int32)
        logits, cache = m.extend(prompt, lengths, jnp.zeros((batch,), jnp.int32), cache, last_only=True)
        out = jnp.zeros((batch, steps), jnp.int32).at[:, 0].set(jnp.argmax(logits[:, 0], -1))

        def step(i, carry):
            out, cache = carry
            token = jax.lax.dynamic_slice_in_dim(out, i - 1, 1, axis=1)
            offsets = jnp.full((batch,), prompt_len + i - 1, jnp.int32)
            logits, cache = m.extend(token, jnp.ones((batch,), jnp.int32), offsets, cache)
            return out.at[:, i].set(jnp.argmax(logits[:, 0], -1)), cache

        return jax.lax.fori_loop(1, steps, step, (out, cache))[0]

    @jax.jit
    def recompute(state, prompt):
        m = nnx.merge(graphdef, state)
        buffer = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(prompt)

        def step(i, buffer):
            cur = prompt_len + i  # tokens known so far
            mask = jnp.arange(total)[None, :] < cur
            hidden = m.hidden_states(buffer, jnp.broadcast_to(mask, (batch, total)))
            last = jax.lax.dynamic_slice_in_dim(hidden, cur - 1, 1, axis=1)
            token = jnp.argmax(m.logits(last)[:, 0], -1).astype(jnp.int32)
            return jax.lax.dynamic_update_slice_in_dim(buffer, token[:, None], cur, axis=1)

        return jax.lax.fori_loop(0, steps, step, buffer)[:, prompt_len:]

    return {"kv_cache": kv_cache, "recompute": recompute}


def bench_size(name: str, cfg: ModelConfig, batch: int, prompt_len: int, steps: int, repeats: int) -> list[dict]:
    model = init_model(cfg, seed=0)
    _, state = nnx.split(model)
    prompt = jax.random.randint(jax.random.key(1), (batch, prompt_len), 0, cfg.vocab_size, jnp.int32)
    rows, outputs = [], {}
    for mode, program in make_programs(model, batch, prompt_len, steps).items():
        start = time.perf_counter()
        outputs[mode] = np.asarray(program(state, prompt))  # compile + first run
        compile_s = time.perf_counter() - start
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(program(state, prompt))
            best = min(best, time.perf_counter() - start)
        rows.append(
            dict(size=name, params=num_params(model), mode=mode, batch=batch, prompt=prompt_len, steps=steps,
                 seconds=best, tokens_per_s=batch * steps / best, first_call_s=compile_s)
        )
    same = bool((outputs["kv_cache"] == outputs["recompute"]).all())
    for row in rows:
        row["speedup_vs_recompute"] = rows[1]["seconds"] / row["seconds"]
        row["same_tokens"] = same
    return rows


def bench_attention(batch: int, buffer: int, contexts: tuple[int, int], steps: int, block: int, repeats: int) -> dict:
    """Decode tokens/s with blocked (`block`) and whole-buffer attention at each live context."""
    model = init_model(ATTENTION_MODEL, seed=0)
    graphdef, state = nnx.split(model)

    def make(block_size):
        @jax.jit
        def run(state, cache, start):
            m = nnx.merge(graphdef, state)
            ones = jnp.ones((batch,), jnp.int32)

            def step(i, carry):
                token, cache = carry
                logits, cache = m.extend(token, ones, ones * (start + i), cache, block_size=block_size)
                return jnp.argmax(logits, -1).astype(jnp.int32), cache

            return jax.lax.fori_loop(0, steps, step, (jnp.zeros((batch, 1), jnp.int32), cache))[0]

        return run

    # A filled cache (random keys/values): decode from `context` on reads real-looking data.
    cache = jax.tree_util.tree_map(lambda x: jax.random.normal(jax.random.key(2), x.shape, x.dtype),
                                   model.init_cache(batch, buffer))
    programs = {"blocked": make(block), "full": make(0)}
    same, best = {}, {}
    for context in contexts:
        start = jnp.int32(context)
        out = {mode: np.asarray(run(state, cache, start)) for mode, run in programs.items()}  # compile, warm
        same[context] = bool((out["blocked"] == out["full"]).all())
        for mode in programs:
            best[mode, context] = float("inf")
        for _ in range(repeats):
            for mode, run in programs.items():
                t0 = time.perf_counter()
                jax.block_until_ready(run(state, cache, start))
                best[mode, context] = min(best[mode, context], time.perf_counter() - t0)
    rate = {f"{mode}@{context}": batch * steps / s for (mode, context), s in best.items()}
    short, long = contexts
    return dict(
        batch=batch, buffer=buffer, block_size=block, steps=steps, contexts=list(contexts),
        tokens_per_s={k: round(v, 1) for k, v in rate.items()},
        same_tokens={str(c): v for c, v in same.items()},
        blocked_over_full_short=round(rate[f"blocked@{short}"] / rate[f"full@{short}"], 3),
        blocked_over_full_long=round(rate[f"blocked@{long}"] / rate[f"full@{long}"], 3),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,100m", help="comma list of: " + ", ".join(SIZES))
    parser.add_argument("--tiny-batch", type=int, default=8)
    parser.add_argument("--tiny-prompt", type=int, default=32)
    parser.add_argument("--tiny-steps", type=int, default=128)
    parser.add_argument("--big-batch", type=int, default=4)
    parser.add_argument("--big-prompt", type=int, default=32)
    parser.add_argument("--big-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--attn-batch", type=int, default=16)
    parser.add_argument("--attn-buffer", type=int, default=2048)
    parser.add_argument("--attn-contexts", default="64,1536", help="short,long live context (tokens)")
    parser.add_argument("--attn-steps", type=int, default=32)
    parser.add_argument("--attn-repeats", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--quick", action="store_true", help="tiny only, fewer steps and repeats")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.tiny_steps, args.attn_steps, args.attn_repeats = "tiny", 64, 16, 3

    rows = []
    for name in args.sizes.split(","):
        kind = "tiny" if name == "tiny" else "big"
        rows += bench_size(
            name,
            SIZES[name],
            getattr(args, f"{kind}_batch"),
            getattr(args, f"{kind}_prompt"),
            getattr(args, f"{kind}_steps"),
            args.repeats,
        )

    header = f"{'size':<6} {'params':>8} {'mode':<10} {'batch':>5} {'prompt':>6} {'steps':>5} " \
             f"{'seconds':>8} {'tokens/s':>10} {'speedup':>8} {'compile+1st s':>13} same_tokens"
    print(f"greedy decode on {jax.devices()[0].platform} ({platform.processor() or platform.machine()}), "
          f"jax {jax.__version__}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['size']:<6} {r['params'] / 1e6:>7.1f}M {r['mode']:<10} {r['batch']:>5} {r['prompt']:>6} "
              f"{r['steps']:>5} {r['seconds']:>8.3f} {r['tokens_per_s']:>10.1f} {r['speedup_vs_recompute']:>7.2f}x "
              f"{r['first_call_s']:>13.2f} {r['same_tokens']}")
    short, long = (int(c) for c in args.attn_contexts.split(","))
    attn = bench_attention(args.attn_batch, args.attn_buffer, (short, long), args.attn_steps, args.block_size,
                           args.attn_repeats)
    print(f"\nblocked (block {attn['block_size']}) vs whole-buffer attention, decode, batch {attn['batch']}, "
          f"buffer {attn['buffer']} (shared machine: compare ratios, not absolutes)")
    for context in (short, long):
        print(f"  live context {context:>5}: blocked {attn['tokens_per_s'][f'blocked@{context}']:>9.1f} tok/s, "
              f"full {attn['tokens_per_s'][f'full@{context}']:>9.1f} tok/s, same tokens {attn['same_tokens'][str(context)]}")
    print(json.dumps({"bench": "decode", "backend": jax.devices()[0].platform, "rows": rows, "attention": attn,
                      "blocked_over_full_short": attn["blocked_over_full_short"],
                      "blocked_over_full_long": attn["blocked_over_full_long"]}))


if __name__ == "__main__":
    main()
