"""Which RL recipe keeps runs alive: re-train a finished study's RL stages under other settings, side by side.

    python bench/stability.py --study runs/reproduce_cpu --seeds 0 1 2 3 4 \
        --recipe "main=" --recipe "lr5e-4=train.optim.lr=5e-4" --recipe "ds2=train.oversample=2" \
        [--variants fixed_long fixed_short budgetmix] [--out runs/stability]

For every recipe, seed and variant: `bmrl.train.train` on that stage's saved config.yaml (its SFT base,
its budget, its seed) with the recipe's dotted overrides, in `OUT/<recipe>/seed<s>_<variant>` (a finished
run is read back, not retrained). One table row per recipe: the runs flagged dead by `bmrl.learn.health`,
the runs that end at zero rollout success, the mean rollout success of the first and last 5 steps, and
the mean Pass@(1,T) at the run's largest T over the held-out tasks at its start and end (the trainer's own
evaluation); then one line per dead run. The evidence table of docs/training_stability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def run_one(study: str, seed: int, variant: str, overrides: list[str], out: str) -> dict:
    from bmrl.config import load
    from bmrl.train import train

    path = os.path.join(out, "summary.json")
    if os.path.isfile(path):
        with open(path) as f:
            summary = json.load(f)
    else:
        cfg = load(os.path.join(study, f"seed{seed}", variant, "config.yaml"),
                   [f"out_dir={out}", "checkpoint.every=1000", "checkpoint.keep=1", *overrides])
        summary = train(cfg, progress=False)
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    success = [r["rollout/success"] for r in steps if "rollout/success" in r]
    t_max = max(summary["eval"], key=int)
    return {"seed": seed, "variant": variant, "health": summary["health"], "success": success,
            "pass1_start": summary["eval_initial"][t_max]["pass1"], "pass1_end": summary["eval"][t_max]["pass1"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", required=True, help="a finished `bmrl reproduce` out_dir (its seed*/<variant>/config.yaml)")
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--variants", nargs="+", default=["fixed_long", "fixed_short", "budgetmix"])
    ap.add_argument("--recipe", action="append", required=True,
                    help="NAME=override,override... (NAME= alone: the study's own settings)")
    ap.add_argument("--out", default="runs/stability")
    args = ap.parse_args(argv)
    from bmrl import compile_cache

    compile_cache.enable()
    rows = []
    for spec in args.recipe:
        name, _, over = spec.partition("=")
        overrides = [o for o in over.split(",") if o]
        runs = [run_one(args.study, s, v, overrides, os.path.join(args.out, name, f"seed{s}_{v}"))
                for s in args.seeds for v in args.variants]
        dead = [r for r in runs if r["health"]["dead"]]
        zero = [r for r in runs if np.mean(r["success"][-3:]) == 0]
        rows.append((name, over or "(the study's)", len(runs), dead, zero,
                     np.mean([np.mean(r["success"][:5]) for r in runs]), np.mean([np.mean(r["success"][-5:]) for r in runs]),
                     np.mean([r["pass1_start"] for r in runs]), np.mean([r["pass1_end"] for r in runs])))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print("| recipe | overrides | runs | dead | end at 0 success | rollout success, first 5 / last 5 steps "
          "| Pass@(1,T max) start -> end |")
    print("|---|---|---|---|---|---|---|")
    for name, over, n, dead, zero, s0, s1, p0, p1 in rows:
        print(f"| {name} | `{over}` | {n} | {len(dead)} | {len(zero)} | {s0:.3f} / {s1:.3f} | {p0:.3f} -> {p1:.3f} |")
    for name, _, _, dead, _, *_ in rows:
        for r in dead:
            flags = "; ".join(f"{f['kind']} since step {f['step']}" for f in r["health"]["flags"])
            print(f"- {name}: seed {r['seed']} {r['variant']}: {flags}; success by step "
                  + " ".join(f"{x:.2f}" for x in r["success"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
