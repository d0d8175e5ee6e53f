"""Benchmark: the compiled multi-turn rollout against the Python-driven loop, side by side.

For a tiny model on the corridor environment (long enough that no episode ends early, so every
sequence runs every turn), for batch 64 and 256 and for 8 and 32 turns:
  - environment turns/s and tokens/s of `bmrl.rollout.rollout` (one jit, compile excluded) and of
    `bmrl.rollout.baseline.python_loop_rollout` (jitted per-turn generate, host env steps,
    context re-prefilled each turn);
  - compile time of the compiled loop;
  - t(32 turns) / t(8 turns) of the compiled loop (cost should grow about linearly in turns).
Targets on a 2-core CPU: compiled >= 10x the Python loop at batch 256 and 32 turns; t32/t8 <= 4.5.
A `think_answer` case (64-token replies: reasoning inside think tags, the action inside answer tags,
parsed in jit) runs the compiled loop at the same batch and turns, beside the plain-action case.
Ends with one JSON line of all figures.

    python bench/rollout.py [--batches 64,256] [--turns 8,32] [--repeats 2] [--skip-python] [--skip-think]
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bmrl.envs import corpus, make  # noqa: E402
from bmrl.model.tokenizer import train_tiny_tokenizer  # noqa: E402
from bmrl.rollout import RolloutConfig, default_format, rollout  # noqa: E402
from bmrl.rollout.baseline import python_loop_rollout  # noqa: E402
from bmrl.sampling import SamplingConfig  # noqa: E402
from bmrl.formats import add_tag_tokens, plain_format  # noqa: E402
from tests.chat_helpers import chain_policy  # noqa: E402
from tests.rollout_helpers import steered_policy  # noqa: E402

THINK_REPLY = 64  # tokens per think_answer reply, stop included


def think_setup(max_turns: int):
    """Corridor with a think_answer format and a policy whose every reply is exactly 64 tokens."""
    tok = train_tiny_tokenizer(corpus(["corridor"], observations=False), 384)
    add_tag_tokens(tok)
    env = make("corridor", tok, length=64, eps=0.1)
    fmt = plain_format(tok, env.instructions, "think_answer")
    acts = [list(map(int, row[:n])) for row, n in zip(env.actions.tokens, env.actions.lengths)]
    overhead = len(fmt.reply_tokens(acts[0])) - len(acts[0]) + 1  # tags, separator, stop
    used = {t for a in acts for t in a} | set(fmt.stop_ids) | {int(fmt.obs_close[-1])}
    used |= {int(t) for t in np.concatenate([fmt.think_open, fmt.think_close, fmt.answer_open, fmt.answer_close, fmt.answer_sep])}
    n_reason = THINK_REPLY - overhead - max(len(a) for a in acts)
    reasoning = [t for t in range(4, len(tok)) if t not in used][:n_reason]
    chains = [(list(map(int, fmt.reply_tokens(a, reasoning))) + [int(fmt.stop_ids[0])], 1.0) for a in acts]
    policy = chain_policy(fmt, chains, len(tok), seed=0)
    max_len = fmt.tokens_needed(max_turns, env.max_obs_len, THINK_REPLY)
    return env, fmt, policy, max_len


def _time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--turns", default="8,32")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--python-repeats", type=int, default=1)
    ap.add_argument("--skip-python", action="store_true")
    ap.add_argument("--skip-think", action="store_true", help="skip the think_answer (64-token replies) case")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    turns_list = [int(t) for t in args.turns.split(",")]

    tok = train_tiny_tokenizer(corpus(["corridor"], observations=False), 384)
    env = make("corridor", tok, length=64, eps=0.1)  # no episode can end within 32 turns
    fmt = default_format(env)
    policy = steered_policy(env, fmt, seed=0, scale=3.0)
    reply = env.max_action_len + 2
    max_turns = max(turns_list)
    max_len = fmt.tokens_needed(max_turns, env.max_obs_len, reply)
    print(f"device={jax.devices()[0].platform} env=corridor(L=64) max_len={max_len} reply_tokens={reply}")

    rows = []
    for batch in batches:
        for turns in turns_list:
            cfg = RolloutConfig(max_turns=turns, max_reply_tokens=reply, max_len=max_len,
                                sampling=SamplingConfig(temperature=1.0))
            tasks = {"seed": jnp.arange(batch, dtype=jnp.int32)}
            caps = jnp.full((batch,), turns, jnp.int32)
            key = jax.random.key(0)
            t0 = time.perf_counter()
            tr = jax.block_until_ready(rollout(policy, env, tasks, caps, key, cfg))
            first = time.perf_counter() - t0
            t_jit = _time(lambda: rollout(policy, env, tasks, caps, key, cfg), args.repeats)
            env_turns = int(np.asarray(tr.turns_used).sum())
            policy_tokens = int(np.asarray(tr.loss_mask).sum())
            context_tokens = int(np.asarray(tr.length).sum())
            row = dict(batch=batch, turns=turns, env_turns=env_turns, policy_tokens=policy_tokens,
                       context_tokens=context_tokens, compile_s=round(first - t_jit, 3), jit_s=round(t_jit, 4),
                       jit_turns_per_s=round(env_turns / t_jit, 1), jit_tokens_per_s=round(policy_tokens / t_jit, 1),
                       jit_context_tokens_per_s=round(context_tokens / t_jit, 1))
            if not args.skip_python:
                python_loop_rollout(policy, env, tasks, caps, key, cfg)  # compile its per-turn generate
                t_py = _time(lambda: python_loop_rollout(policy, env, tasks, caps, key, cfg), args.python_repeats)
                row.update(python_s=round(t_py, 4), python_turns_per_s=round(env_turns / t_py, 1),
                           python_tokens_per_s=round(policy_tokens / t_py, 1), speedup=round(t_py / t_jit, 2))
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    think_rows = []
    if not args.skip_think:
        t_env, t_fmt, t_policy, t_len = think_setup(max_turns)
        for batch in batches:
            for turns in turns_list:
                cfg = RolloutConfig(max_turns=turns, max_reply_tokens=THINK_REPLY, max_len=t_len,
                                    sampling=SamplingConfig(temperature=1.0))
                tasks = {"seed": jnp.arange(batch, dtype=jnp.int32)}
                caps = jnp.full((batch,), turns, jnp.int32)
                key = jax.random.key(0)
                tr = jax.block_until_ready(rollout(t_policy, t_env, tasks, caps, key, cfg, fmt=t_fmt))
                t_jit = _time(lambda: rollout(t_policy, t_env, tasks, caps, key, cfg, fmt=t_fmt), args.repeats)
                env_turns = int(np.asarray(tr.turns_used).sum())
                valid = float((np.asarray(tr.action)[np.asarray(tr.turn_active)] >= 0).mean())
                row = dict(batch=batch, turns=turns, reply_tokens=THINK_REPLY, env_turns=env_turns,
                           valid_action_rate=round(valid, 3), jit_s=round(t_jit, 4),
                           jit_turns_per_s=round(env_turns / t_jit, 1),
                           jit_tokens_per_s=round(float(np.asarray(tr.loss_mask).sum()) / t_jit, 1))
                think_rows.append(row)
                print("think_answer " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    summary = {"bench": "rollout", "device": jax.devices()[0].platform, "rows": rows, "think_answer_rows": think_rows}
    by = {(r["batch"], r["turns"]): r for r in rows}
    lo, hi = min(turns_list), max(turns_list)
    for batch in batches:
        if (batch, lo) in by and (batch, hi) in by and lo != hi:
            summary[f"t{hi}_over_t{lo}_batch{batch}"] = round(by[batch, hi]["jit_s"] / by[batch, lo]["jit_s"], 3)
    big = by.get((max(batches), hi), {})
    if "speedup" in big:
        summary[f"speedup_batch{max(batches)}_turns{hi}"] = big["speedup"]
    print("\n| batch | turns | jit turns/s | jit tokens/s | python turns/s | speedup | compile s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['turns']} | {r['jit_turns_per_s']} | {r['jit_tokens_per_s']} | "
              f"{r.get('python_turns_per_s', '-')} | {r.get('speedup', '-')} | {r['compile_s']} |")
    for r in think_rows:
        plain = by.get((r["batch"], r["turns"]), {})
        print(f"| {r['batch']} | {r['turns']} | think_answer ({THINK_REPLY}-token replies) {r['jit_turns_per_s']} turns/s, "
              f"{r['jit_tokens_per_s']} tokens/s vs plain {plain.get('jit_turns_per_s', '-')} turns/s |")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
