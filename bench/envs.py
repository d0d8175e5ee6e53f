"""Environment throughput: 4096 instances vmapped in one jitted lax.scan vs one instance stepped from Python.

    python bench/envs.py [--batch 4096] [--scan-steps 64] [--loop-steps 300]

Both sides run the same env (its noisy default-difficulty options) with a uniformly random policy
(invalid actions included), compile first and time only the steady state. Prints one line per env and
one JSON line at the end: {"env": {"batched_steps_per_s", "single_steps_per_s", "speedup"}, ...}.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp

from bmrl.envs import available_envs, corpus, make
from bmrl.model.tokenizer import train_tiny_tokenizer

OPTIONS = {
    "corridor": {"length": 8, "eps": 0.2},
    "frozenlake": {"size": 5, "p_hole": 0.2, "eps": 0.1},
    "toolchain": {"k": 3, "p_fail": 0.2},
}


def random_turn(env, key, state):
    k_a, k_s = jax.random.split(key)
    action = jax.random.randint(k_a, (), -1, env.num_actions)  # -1: an unparsed reply
    state, obs, reward, terminated, info = env.step(k_s, state, action)
    # A checksum of everything a rollout consumes keeps XLA from skipping the observation assembly.
    used = (obs.tokens.sum() + obs.length).astype(jnp.float32) + info.progress + info.error
    return state, reward + 1e-9 * used


def bench_batched(env, batch: int, steps: int) -> float:
    tasks = jax.vmap(env.sample_task)(jax.random.split(jax.random.PRNGKey(0), batch))
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(1), batch), tasks)

    @jax.jit
    def run(states, key):
        def body(states, k):
            states, r = jax.vmap(lambda kk, s: random_turn(env, kk, s))(jax.random.split(k, batch), states)
            return states, r.sum()

        return jax.lax.scan(body, states, jax.random.split(key, steps))

    jax.block_until_ready(run(states, jax.random.PRNGKey(2)))  # compile
    t = time.perf_counter()
    jax.block_until_ready(run(states, jax.random.PRNGKey(3)))
    return batch * steps / (time.perf_counter() - t)


def bench_single(env, steps: int) -> float:
    state, _ = jax.jit(env.reset)(jax.random.PRNGKey(1), env.sample_task(jax.random.PRNGKey(0)))
    turn = jax.jit(lambda k, s: random_turn(env, k, s))
    keys = list(jax.random.split(jax.random.PRNGKey(2), steps))
    jax.block_until_ready(turn(keys[0], state))  # compile
    t = time.perf_counter()
    for k in keys:
        state, r = turn(k, state)
    jax.block_until_ready(state)
    return steps / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--scan-steps", type=int, default=64)
    ap.add_argument("--loop-steps", type=int, default=300)
    ap.add_argument("--envs", default=",".join(available_envs()))
    args = ap.parse_args()
    tok = train_tiny_tokenizer(corpus(args.envs.split(","), observations=False), vocab_size=448)
    results = {}
    for name in args.envs.split(","):
        env = make(name, tok, **OPTIONS.get(name, {}))
        batched = bench_batched(env, args.batch, args.scan_steps)
        single = bench_single(env, args.loop_steps)
        results[name] = {
            "batched_steps_per_s": round(batched),
            "single_steps_per_s": round(single),
            "speedup": round(batched / single, 1),
        }
        print(f"{name:12s} vmap x{args.batch} scan: {batched:12,.0f} steps/s   python loop: {single:9,.0f} steps/s"
              f"   x{batched / single:,.0f}", flush=True)
    print(json.dumps({"backend": jax.default_backend(), "batch": args.batch, **results}))


if __name__ == "__main__":
    main()
