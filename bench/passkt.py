"""Benchmark: the full Pass@(K,T) surface, jitted vs a Python loop over the per-cell numpy estimator.

2048 tasks, n = 64 attempts, T = 1..32, K = 1..64 (131,072 surface-cell evaluations per task).
The loop is what most codebases do: for every task and T count c(T), then for every K call the
standard estimator 1 - prod(1 - k / arange(n - c + 1, n + 1)). Prints one JSON line at the end.

    python bench/passkt.py                  # full loop (~20-60 s on 2 cores)
    python bench/passkt.py --loop-tasks 256 # loop over a subset; its time is scaled to all tasks
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bmrl.eval.passkt import pass_at_kt, reference_pass_at_k


def loop_surface(fst: np.ndarray, ks: list[int], ts: list[int]) -> np.ndarray:
    out = np.zeros((len(ks), len(ts)))
    n = fst.shape[1]
    for row in fst:
        for j, t in enumerate(ts):
            c = int(np.count_nonzero((row >= 1) & (row <= t)))
            for i, k in enumerate(ks):
                out[i, j] += reference_pass_at_k(n, c, k)
    return out / len(fst)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=2048)
    p.add_argument("--attempts", type=int, default=64)
    p.add_argument("--max-t", type=int, default=32)
    p.add_argument("--loop-tasks", type=int, default=None, help="tasks in the Python loop (default: all)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    rng = np.random.default_rng(0)
    n = args.attempts
    difficulty = rng.random((args.tasks, 1))
    fst = np.where(rng.random((args.tasks, n)) < difficulty, rng.integers(1, 2 * args.max_t, (args.tasks, n)), 0)
    ks, ts = list(range(1, n + 1)), list(range(1, args.max_t + 1))

    t0 = time.perf_counter()
    jitted = pass_at_kt(fst, ks, ts)
    first_call = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        jitted = pass_at_kt(fst, ks, ts)
        times.append(time.perf_counter() - t0)
    jit_s = float(np.median(times))

    loop_tasks = min(args.loop_tasks or args.tasks, args.tasks)
    t0 = time.perf_counter()
    looped = loop_surface(fst[:loop_tasks], ks, ts)
    loop_s = (time.perf_counter() - t0) * args.tasks / loop_tasks
    reference = pass_at_kt(fst[:loop_tasks], ks, ts) if loop_tasks < args.tasks else jitted
    max_abs_diff = float(np.abs(reference - looped).max())

    print(f"jitted pass_at_kt: {jit_s * 1e3:.1f} ms (first call with compile {first_call:.2f} s)")
    print(f"python loop      : {loop_s:.2f} s" + (f" (scaled from {loop_tasks} tasks)" if loop_tasks < args.tasks else ""))
    print(f"speedup {loop_s / jit_s:.0f}x, max |difference| {max_abs_diff:.2e}")
    print(json.dumps({
        "bench": "passkt_surface", "tasks": args.tasks, "attempts": n, "ks": len(ks), "ts": len(ts),
        "jit_seconds": round(jit_s, 5), "jit_first_call_seconds": round(first_call, 3),
        "loop_seconds": round(loop_s, 3), "loop_tasks": loop_tasks, "speedup": round(loop_s / jit_s, 1),
        "max_abs_diff": max_abs_diff,
    }))


if __name__ == "__main__":
    main()
