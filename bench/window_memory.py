"""Memory of long horizons: the training step and the rollout at T = 16 and 64 turns, whole history vs a window.

    python bench/window_memory.py [--config configs/corridor_long.yaml] [--turns 16 64] [--window 2]

For each turn budget T, the run of `--config` with `rollout.max_turns=T` and `rollout.max_len` the fewest
tokens that hold it: the whole history (every turn in one context: the buffer grows with T) and a history
window of H turns (`rollout.history_turns`: H + 1 turns at once, each turn its own learning sample). Each
program is compiled for the run's real shapes (the trajectory's from `jax.eval_shape` of the rollout) and
XLA's memory analysis gives what it holds at once: arguments + outputs - donated + temporaries. Printed:
one table, then the ratios T = max / T = min of each layout (the window's target: <= 1.2x). Compiles only:
nothing is run, so it takes the time of the compiles.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
from flax import nnx

from bmrl import config
from bmrl.assembly import build_run, build_tokenizer, new_policy
from bmrl.learn import optimizer_from_config
from bmrl.learn.step import init_opt_state, make_update
from bmrl.rollout import Injection, held_turns, make_rollout

MIB = 1 << 20


def footprint(compiled) -> int:
    """Bytes a compiled program holds at once (XLA's memory analysis)."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes)


def measure(path: str, turns: int, window: int | None, overrides: list[str]) -> dict:
    """Footprints (MiB) of the rollout and the update of `path` at `turns` turns, with `window` (None: whole)."""
    base = config.load(path, overrides)
    tok = build_tokenizer(base)
    probe = build_run(base, tok)
    max_len = probe.fmt.tokens_needed(held_turns(turns, window), probe.env.max_obs_len, base.rollout.max_reply_tokens)
    history = "null" if window is None else str(window)
    cfg = config.load(path, overrides + [f"rollout.max_turns={turns}", f"rollout.max_len={max_len}",
                                         f"rollout.history_turns={history}", f"budget.budgets=[{turns}]",
                                         "budget.kind=fixed", f"eval.ts=[{turns}]"])
    run = build_run(cfg, tok)
    graphdef, params = nnx.split(new_policy(cfg, tok))
    t = cfg.train
    rows = t.tasks_per_step * t.group_size
    rollout = make_rollout(graphdef, run.env, run.fmt, run.rollout)
    tasks = jax.tree.map(lambda x: jnp.zeros((rows,) + x.shape[1:], x.dtype), run.player.take(run.player.tasks("train"), list(range(1))))
    args = (params, jax.tree.map(jnp.asarray, tasks), jnp.full((rows,), turns, jnp.int32), jax.random.key(0),
            Injection.none(turns))
    traj = jax.eval_shape(rollout, *args)
    tx = optimizer_from_config(t.optim, t.steps)
    update = make_update(graphdef, tx, t, cfg.rollout.temperature)
    opt_state = init_opt_state(tx, params)
    step = update.lower(params, opt_state, None, traj, jax.random.key(0)).compile()
    return dict(turns=turns, window=window, max_len=max_len, rows=rows,
                learner_rows=rows if window is None else rows * turns,
                rollout_mib=footprint(rollout.lower(*args).compile()) / MIB, update_mib=footprint(step) / MIB)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/corridor_long.yaml")
    p.add_argument("--turns", type=int, nargs="+", default=[16, 64])
    p.add_argument("--window", type=int, default=2)
    p.add_argument("overrides", nargs="*", help="config overrides (key=value), e.g. model.hidden_size=256")
    a = p.parse_args()
    results = [measure(a.config, T, w, a.overrides) for w in (None, a.window) for T in a.turns]
    print(f"{'layout':>10} {'T':>4} {'max_len':>8} {'learner rows':>13} {'rollout MiB':>12} {'update MiB':>11}")
    for r in results:
        layout = "whole" if r["window"] is None else f"window {r['window']}"
        print(f"{layout:>10} {r['turns']:>4} {r['max_len']:>8} {r['learner_rows']:>13} {r['rollout_mib']:>12.1f} "
              f"{r['update_mib']:>11.1f}")
    lo, hi = min(a.turns), max(a.turns)
    ratios = {}
    for w in (None, a.window):
        pick = {r["turns"]: r for r in results if r["window"] == w}
        name = "whole" if w is None else f"window_{w}"
        ratios[name] = {k: pick[hi][k] / pick[lo][k] for k in ("rollout_mib", "update_mib")}
        print(f"{name}: T={hi} / T={lo}: rollout {ratios[name]['rollout_mib']:.2f}x, update {ratios[name]['update_mib']:.2f}x")
    print(json.dumps({"results": results, "ratios": ratios}))


if __name__ == "__main__":
    main()
