"""Benchmark: a 10^6-attempt JSONL log to a full Pass@(K,T) surface, bmrl vs the standard library.

bmrl: `read_attempt_log` (streams records into array buffers) + jitted `pass_at_kt`.
stdlib: the usual script: load every record with json into a list of dicts, group attempts by task,
then one per-cell numpy estimator call per (task, K, T).
Each side runs in its own subprocess so its peak memory (VmHWM, resident set) is its own; the
resident size right after imports is reported too (jax costs more to import than numpy alone).
Prints one JSON line at the end.

    python bench/passkt_logs.py                       # 10^6 attempts (15,625 tasks x 64)
    python bench/passkt_logs.py --tasks 2000          # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

KS = [1, 2, 4, 8, 16, 32, 64]


def _rss_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def write_log(path: str, tasks: int, attempts: int, max_t: int) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for t in range(tasks):
            p = rng.random()
            ok = rng.random(attempts) < p
            turns = rng.integers(1, 2 * max_t, attempts)
            for a in range(attempts):
                f.write(f'{{"task_id": "task-{t}", "attempt_id": {a}, "first_success_turn": {int(turns[a]) if ok[a] else 0}}}\n')


def run_bmrl(path: str, max_t: int, out: str) -> dict:
    import numpy as np

    from bmrl.logs import read_attempt_log
    from bmrl.eval.passkt import pass_at_kt

    after_import = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    log = read_attempt_log(path)
    t1 = time.perf_counter()
    surface = pass_at_kt(log.first_success_turn, KS, range(1, max_t + 1), n_per_task=log.n_per_task)
    t2 = time.perf_counter()
    np.save(out, surface)
    return {"seconds": t2 - t0, "read_seconds": t1 - t0, "surface_seconds": t2 - t1, "rss_after_import_kib": after_import}


def run_stdlib(path: str, max_t: int, out: str) -> dict:
    import numpy as np

    from bmrl.eval.passkt import reference_pass_at_k

    after_import = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    by_task: dict[str, list[int]] = {}
    for r in records:
        by_task.setdefault(r["task_id"], []).append(r["first_success_turn"])
    t1 = time.perf_counter()
    ts = list(range(1, max_t + 1))
    surface = np.zeros((len(KS), len(ts)))
    for turns in by_task.values():
        row = np.array(turns)
        n = len(row)
        for j, t in enumerate(ts):
            c = int(np.count_nonzero((row >= 1) & (row <= t)))
            for i, k in enumerate(KS):
                surface[i, j] += reference_pass_at_k(n, c, k)
    surface /= len(by_task)
    t2 = time.perf_counter()
    np.save(out, surface)
    return {"seconds": t2 - t0, "read_seconds": t1 - t0, "surface_seconds": t2 - t1, "rss_after_import_kib": after_import}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=15625)
    p.add_argument("--attempts", type=int, default=64)
    p.add_argument("--max-t", type=int, default=32)
    p.add_argument("--child", choices=("bmrl", "stdlib"), help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        fn = run_bmrl if args.child == "bmrl" else run_stdlib
        result = fn(args.log, args.max_t, args.out)
        result["peak_rss_kib"] = _rss_kib("VmHWM")
        print(json.dumps(result))
        return

    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "attempts.jsonl")
        t0 = time.perf_counter()
        write_log(log, args.tasks, args.attempts, args.max_t)
        print(f"wrote {args.tasks * args.attempts} attempts ({os.path.getsize(log) / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
        results = {}
        for side in ("bmrl", "stdlib"):
            out = os.path.join(tmp, f"{side}.npy")
            cmd = [sys.executable, __file__, "--child", side, "--log", log, "--out", out, "--max-t", str(args.max_t)]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results[side] = json.loads(done.stdout.strip().splitlines()[-1])
            results[side]["surface"] = np.load(out)
            r = results[side]
            print(
                f"{side:6s}: {r['seconds']:.2f} s (read {r['read_seconds']:.2f} s, surface {r['surface_seconds']:.2f} s), "
                f"peak RSS {r['peak_rss_kib'] / 1024:.0f} MiB ({(r['peak_rss_kib'] - r['rss_after_import_kib']) / 1024:.0f} MiB above imports)"
            )
        diff = float(np.abs(results["bmrl"]["surface"] - results["stdlib"]["surface"]).max())
    b, s = results["bmrl"], results["stdlib"]
    print(f"speedup {s['seconds'] / b['seconds']:.1f}x, max |difference| {diff:.2e}")
    print(json.dumps({
        "bench": "passkt_logs", "attempts": args.tasks * args.attempts, "tasks": args.tasks, "ks": KS, "max_t": args.max_t,
        "bmrl_seconds": round(b["seconds"], 3), "bmrl_read_seconds": round(b["read_seconds"], 3),
        "bmrl_peak_rss_mib": round(b["peak_rss_kib"] / 1024, 1),
        "bmrl_peak_above_imports_mib": round((b["peak_rss_kib"] - b["rss_after_import_kib"]) / 1024, 1),
        "stdlib_seconds": round(s["seconds"], 3), "stdlib_read_seconds": round(s["read_seconds"], 3),
        "stdlib_peak_rss_mib": round(s["peak_rss_kib"] / 1024, 1),
        "stdlib_peak_above_imports_mib": round((s["peak_rss_kib"] - s["rss_after_import_kib"]) / 1024, 1),
        "speedup": round(s["seconds"] / b["seconds"], 2), "max_abs_diff": diff,
    }))


if __name__ == "__main__":
    main()
