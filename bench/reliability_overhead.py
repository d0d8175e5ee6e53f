"""What the reliability checks cost, measured side by side in one run:

- `guard`: one AdamW step (clip + adamw + apply) on a parameter tree, jitted, with and without
  `bmrl.learn.step.keep_finite` (the fused all-finite check of loss, grad norm, new params and
  new optimizer state, and the select that skips a non-finite step).
- `checkpoint`: `Checkpointer.save` + `commit` of params + Adam state, and `restore` with its
  verification, against the content fingerprints alone (`fingerprints`, one device pass).

Best of `--repeats` timed calls after a warm-up. Prints a table, then one JSON line.

    python bench/reliability_overhead.py --params 20e6
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import optax

from bmrl.checkpoint import Checkpointer, fingerprints
from bmrl.learn import make_optimizer
from bmrl.learn import step as step_lib


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=20e6, help="parameter count (split in 8 matrices)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    n = int(a.params) // 8
    side = int(n ** 0.5)
    keys = jax.random.split(jax.random.key(0), 8)
    params = {f"w{i}": jax.random.normal(k, (side, side)) * 0.02 for i, k in enumerate(keys)}
    grads = jax.tree.map(lambda p: p * 0.1, params)
    tx = make_optimizer(1e-3, total_steps=100)
    state = step_lib.init_opt_state(tx, params)

    def step(guarded):
        def f(p, s, g):
            loss = jnp.float32(1.0)
            u, s2 = tx.update(g, s, p, loss=loss)
            p2 = optax.apply_updates(p, u)
            return step_lib.keep_finite(p, s, p2, s2, loss, optax.tree.norm(g)) if guarded else (p2, s2)
        return jax.jit(f)

    plain, guarded = step(False), step(True)
    t_plain = best(lambda: plain(params, state, grads), a.repeats)
    t_guard = best(lambda: guarded(params, state, grads), a.repeats)
    tree = {"params": params, "opt_state": state}
    t_print = best(lambda: fingerprints(tree), a.repeats)
    with tempfile.TemporaryDirectory() as d:
        ck = Checkpointer(os.path.join(d, "ck"), keep=2)
        i = [0]

        def save():
            i[0] += 1
            ck.save(i[0], tree, {"data_position": i[0]})
            ck.commit()

        t_save = best(save, a.repeats)
        t_restore = best(lambda: ck.restore(i[0], tree)[0], a.repeats)
        ck.close()
    nparams = sum(x.size for x in jax.tree.leaves(params))
    rows = {"params": nparams, "adam_step_s": t_plain, "adam_step_guarded_s": t_guard,
            "guard_ratio": t_guard / t_plain, "fingerprint_s": t_print, "save_commit_s": t_save,
            "restore_verify_s": t_restore, "fingerprint_share_of_save": t_print / t_save,
            "backend": jax.default_backend()}
    for k, v in rows.items():
        print(f"{k:28s} {v:.4g}" if isinstance(v, float) else f"{k:28s} {v}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
