"""`bmrl.generate` against the best plain jitted extend+sample loop, side by side in one run.

Model: vocab 256, 2 layers, hidden 128, 4 q / 2 kv heads, f32 (the rollout benchmarks' tiny model).
Three programs sample `--new` tokens at temperature 1 for `--batch` rows of `--prompt`-token prompts:
- `plain_loop`: one jax.jit: prefill with `Decoder.extend(last_only=True)`, then `lax.fori_loop` of
  `bmrl.sampling.sample` (each row's key folded with the step) and a one-token `extend`, the cache
  created inside the program (no host round trips, no copies in or out).
- `generate`: `bmrl.generate.generate` on the same prompts and keys (token-identical output).
- `generate_prefix`: the same prompts after a `--prefix`-token shared prompt (prefilled once).
- `plain_loop_long_prompt`: the plain loop on prompts of prefix + prompt tokens: what the longer
  context costs a plain loop (`plain_long_over_plain`, beside `prefix_over_plain_prompt`).
Compile time is excluded (one warm-up call each); calls are interleaved and the best of `--repeats`
is kept, so machine load hits all programs alike. Tokens/s counts sampled tokens only.
Last line: JSON with `generate_over_plain` (target >= 1.2) and `prefix_over_plain_prompt` (>= 0.9).

    python bench/generate.py            # about a minute on 2 shared cores
    python bench/generate.py --quick    # fewer repeats
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl import compiles
from bmrl.generate import generate
from bmrl.model import ModelConfig, init_model
from bmrl.sampling import SamplingConfig, sample

CONFIG = ModelConfig.tiny(256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def make_plain_loop(graphdef, batch: int, prompt_len: int, steps: int, cfg: SamplingConfig):
    """The plain loop: f(state, prompts [B, P], keys [B]) -> (tokens [B, steps], logprobs [B, steps])."""

    def run(state, prompts, keys):
        model = nnx.merge(graphdef, state)
        cache = model.init_cache(batch, prompt_len + steps)
        ones = jnp.ones((batch,), jnp.int32)
        logits, cache = model.extend(prompts, ones * prompt_len, ones * 0, cache, last_only=True)
        tokens = jnp.zeros((batch, steps), jnp.int32)
        logprobs = jnp.zeros((batch, steps), jnp.float32)

        def step(i, carry):
            logits, cache, tokens, logprobs = carry
            token, logprob = sample(jax.vmap(lambda k: jax.random.fold_in(k, i))(keys), logits[:, 0], cfg)
            logits, cache = model.extend(token[:, None], ones, ones * (prompt_len + i), cache)
            return logits, cache, tokens.at[:, i].set(token), logprobs.at[:, i].set(logprob)

        # The last step's extend is wasted work a plain loop pays; the final token needs no feed.
        _, _, tokens, logprobs = jax.lax.fori_loop(0, steps, step, (logits, cache, tokens, logprobs))
        return tokens, logprobs

    return compiles.counted_jit(run, name="bench_plain_loop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--prefix", type=int, default=93)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="5 repeats")
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats

    model = init_model(CONFIG, seed=0)
    graphdef, state = nnx.split(model)
    rs = np.random.RandomState(1)
    prompts = jnp.asarray(rs.randint(0, CONFIG.vocab_size, (args.batch, args.prompt)), jnp.int32)
    prefix = rs.randint(0, CONFIG.vocab_size, args.prefix).tolist()
    keys = jax.random.split(jax.random.key(0), args.batch)
    cfg = SamplingConfig(temperature=1.0)
    plain = make_plain_loop(graphdef, args.batch, args.prompt, args.new, cfg)
    long_prompts = jnp.concatenate([jnp.broadcast_to(jnp.asarray(prefix, jnp.int32), (args.batch, args.prefix)),
                                    prompts], axis=1)
    plain_long = make_plain_loop(graphdef, args.batch, args.prefix + args.prompt, args.new, cfg)
    programs = {
        "plain_loop": lambda: plain(state, prompts, keys)[0],
        "plain_loop_long_prompt": lambda: plain_long(state, long_prompts, keys)[0],
        "generate": lambda: generate(model, prompts, max_new_tokens=args.new, key=keys, sampling=cfg).tokens,
        "generate_prefix": lambda: generate(model, prompts, max_new_tokens=args.new, key=keys, sampling=cfg,
                                            prefix=prefix).tokens,
    }
    first = {name: np.asarray(run()) for name, run in programs.items()}  # compile + warm up
    compiles.reset_counts()
    best = dict.fromkeys(programs, float("inf"))
    for _ in range(repeats):
        for name, run in programs.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            best[name] = min(best[name], time.perf_counter() - start)
    rate = {name: args.batch * args.new / s for name, s in best.items()}
    result = {
        "bench": "generate",
        "backend": jax.devices()[0].platform,
        "batch": args.batch, "prompt": args.prompt, "prefix": args.prefix, "new_tokens": args.new,
        "tokens_per_s": {k: round(v, 1) for k, v in rate.items()},
        "generate_over_plain": round(rate["generate"] / rate["plain_loop"], 3),
        "prefix_over_plain_prompt": round(rate["generate_prefix"] / rate["generate"], 3),
        # The same longer context costs the plain loop this much (its own prompt is prefix + prompt):
        # what attending to the extra keys costs the model itself.
        "plain_long_over_plain": round(rate["plain_loop_long_prompt"] / rate["plain_loop"], 3),
        "same_tokens_as_plain": bool((first["generate"] == first["plain_loop"]).all()),
        "recompiles_while_timing": sum(compiles.counts().values()),
    }
    print(f"tokens/s on {result['backend']} (shared machine: compare ratios, not absolutes)")
    for name, r in rate.items():
        print(f"  {name:<24} {r:>10.1f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
