"""Benchmark: Python environments on the compiled model turn (`bmrl.rollout.host`) vs the compiled path.

A tiny model (vocab 384, 2 layers, d 64) sampling at temperature 1 on the corridor (length 64: no
episode ends by itself, so the caps decide the turns). The compiled path plays the JAX corridor in one
program; the Python path plays `PyCorridor`, a plain-Python corridor with the same observation text
and actions, from the host loop (one jitted decode and one jitted prefill per turn, environments
stepped in a thread pool). Both after a warm-up call (compiles excluded), best of `--repeats`:

- python_over_compiled at batch 64 x 8 turns and 256 x 16 turns: env turns/s ratio (target >= 0.5);
- latency_hidden at batch 256 x 16: turns/s with a simulated 20 ms tool latency per step over the
  same run without latency (target >= 0.8; the steps of a turn run concurrently, and the batch plays
  as four groups in four threads so some groups' device steps overlap the others' tools,
  `HostConfig.pipeline`, `groups`); `_halves`: the same with two groups (they fall into step: both on
  the device, then both waiting); `_unpipelined`: the batch played as one; the seconds of each are
  printed beside the ratios (a faster model lowers a ratio at the same latency);
- host compiles: programs traced by the host path in the whole run (one per batch and width).

    python bench/host_rollout.py [--quick] [--repeats 2]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.rollout import corridor_workload  # noqa: E402
from bmrl import compiles  # noqa: E402
from bmrl.rollout import rollout  # noqa: E402
from bmrl.rollout.host import HostConfig, host_rollout  # noqa: E402


class PyCorridor:
    """The corridor in plain Python (bmrl.envs.corridor's text and actions), with an optional latency."""

    action_strings = ("left", "right")

    def __init__(self, length: int = 64, eps: float = 0.1, latency_s: float = 0.0):
        self.L, self.eps, self.latency_s = length, eps, latency_s

    def _text(self) -> str:
        return f"Position {self.pos}. Exit at {self.exit}.\n"

    def reset(self, *, seed=None, options=None):
        self.rng = random.Random(seed)
        self.exit = self.L if random.Random((options or {}).get("seed", 0)).random() < 0.5 else 0
        self.pos = self.L - self.exit
        return self._text(), {"progress": 0.0}

    def step(self, action: str):
        if self.latency_s:
            time.sleep(self.latency_s)
        if action not in self.action_strings:
            return "Invalid action. Valid actions are: left, right.\n" + self._text(), 0.0, False, False, {
                "error": True, "invalid": True}
        target = self.pos + (1 if action == "right" else -1)
        slipped, wall = self.rng.random() < self.eps, not 0 <= target <= self.L
        fb = "You slipped and did not move.\n" if slipped else "You hit a wall.\n" if wall else ""
        if not (slipped or wall):
            self.pos = target
        won = self.pos == self.exit
        info = {"success": won, "error": slipped or wall, "progress": (self.L - abs(self.exit - self.pos)) / self.L,
                "oracle_action": "right" if self.exit > self.pos else "left"}
        return fb + self._text(), float(won), won, False, info


def _best(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up (compile)
    jax.block_until_ready(jax.tree.leaves(out))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        jax.block_until_ready(jax.tree.leaves(out))
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one repeat (about a minute on 2 idle cores; the same sizes as the full run)")
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 2)

    tok, env, fmt, policy, cfg = corridor_workload(16)
    reply, max_len = cfg.max_reply_tokens, cfg.max_len
    check = PyCorridor()
    assert check.reset(seed=0, options={"seed": 0})[0].startswith("Position ") and len(tok.encode(check._text())) <= env.max_obs_len
    print(f"device={jax.devices()[0].platform} env=corridor(L=64) max_len={max_len} reply_tokens={reply}", flush=True)
    compiles.reset_counts()

    def compiled(batch: int, turns: int):
        tasks, caps = {"seed": jnp.arange(batch, dtype=jnp.int32)}, jnp.full((batch,), turns, jnp.int32)
        return lambda: rollout(policy, env, tasks, caps, jax.random.key(0), cfg)

    def host(batch: int, turns: int, latency_s: float = 0.0, pipeline: bool = True, groups: int = 4):
        tasks, caps = [{"seed": b} for b in range(batch)], np.full((batch,), turns, np.int32)
        hcfg = HostConfig(workers=batch, step_timeout_s=60.0, pipeline=pipeline, groups=groups)

        def go():
            envs = [PyCorridor(latency_s=latency_s) for _ in range(batch)]
            return host_rollout(policy, envs, tok, caps, jax.random.key(0), cfg, fmt, tasks=tasks, hcfg=hcfg).trajectory

        return go

    out: dict = {"bench": "host_rollout", "device": jax.devices()[0].platform}
    cases = [(64, 8), (256, 16)]
    for batch, turns in cases:
        row = {}
        for name, fn in (("compiled", compiled(batch, turns)), ("python", host(batch, turns))):
            t, tr = _best(fn, repeats)
            row[name] = float(np.asarray(tr.turns_used).sum()) / t
            print(f"{name:9s} batch={batch} turns={turns} seconds={t:.3f} env_turns={int(np.asarray(tr.turns_used).sum())} "
                  f"turns_per_s={row[name]:.1f}", flush=True)
        out[f"python_over_compiled_{batch}x{turns}"] = round(row["python"] / row["compiled"], 3)
        out[f"turns_per_s_{batch}x{turns}"] = {k: round(v, 1) for k, v in row.items()}
    batch, turns = cases[-1]
    t0, tr0 = _best(host(batch, turns), repeats)
    t1, tr1 = _best(host(batch, turns, latency_s=0.02), repeats)
    print(f"python    batch={batch} turns={turns} latency=20ms seconds={t1:.3f} (without: {t0:.3f})", flush=True)
    out[f"latency_hidden_{batch}x{turns}"] = round((float(np.asarray(tr1.turns_used).sum()) / t1)
                                                   / (float(np.asarray(tr0.turns_used).sum()) / t0), 3)
    out[f"seconds_{batch}x{turns}"] = {"latency_20ms": round(t1, 3), "no_latency": round(t0, 3)}
    # The same pair with two groups (halves) and with the batch played as one (pipeline=False).
    for label, kw in (("halves", dict(groups=2)), ("unpipelined", dict(pipeline=False))):
        u0, _ = _best(host(batch, turns, **kw), repeats)
        u1, _ = _best(host(batch, turns, latency_s=0.02, **kw), repeats)
        print(f"python    batch={batch} turns={turns} {label} latency=20ms seconds={u1:.3f} (without: {u0:.3f})",
              flush=True)
        out[f"latency_hidden_{batch}x{turns}_{label}"] = round(u0 / u1, 3)
        out[f"seconds_{batch}x{turns}_{label}"] = {"latency_20ms": round(u1, 3), "no_latency": round(u0, 3)}
    out["host_compiles"] = {k: v for k, v in compiles.counts().items() if k.startswith("host_")}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
