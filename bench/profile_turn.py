"""Profile: where does a compiled rollout turn spend its time? Per-op XLA timings on CPU, by phase.

Runs the rollout of `bench/rollout.py`'s workload (tiny steered model on the 64-cell corridor) at
16 rows x 4 turns and 256 rows x 16 turns under `jax.profiler.trace`, reads the XLA CPU runtime's
per-thunk events back (`jax.profiler.ProfileData`: one event per executed HLO op, `hlo_op` stat),
takes each op's self time (its duration less the ops nested in it: a while loop's body), and joins
it to the compiled HLO's metadata (`op_name` with the rollout's named scopes, source file and line).
Each op is grouped by phase (the innermost named scope: start, decode, sample, parse, env_step,
record, observe/prefill, compaction) and kind (what the source line is: attention, MLP, projections,
cache write, buffer write, gather/scatter, sort...). Profiling adds a few microseconds per executed
op, so small ops look bigger than they are; the untraced wall time per turn is printed beside it.

    python bench/profile_turn.py [--quick] [--top 25]
    python bench/profile_turn.py --against /work/main [--rounds 3]   # time per turn, old vs this tree

`--against PATH` times this tree and the bmrl at PATH side by side: alternate subprocesses (one per
tree and round, each its own compile, then best of `--repeats` calls), the best per tree reported,
and the trajectories of both compared bit for bit.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {"16x4": (16, 4), "256x16": (256, 16)}
OVERLAP_WARN = 1.2  # ops' self times over the untraced wall time above which the shares are flagged
PHASES = ("compact", "start", "sample", "decode", "parse", "env_step", "record", "prefill", "observe", "turn")


def _setup(root: str):
    """Import bmrl from `root`, then this tree's workload (`bench/rollout.py`: the same for both trees)."""
    sys.path.insert(0, root)
    import bmrl

    assert os.path.dirname(os.path.dirname(os.path.abspath(bmrl.__file__))) == os.path.abspath(root), bmrl.__file__
    sys.path.insert(0, ROOT)
    from bench.rollout import corridor_workload

    return corridor_workload


def _case(corridor_workload, batch: int, turns: int, compact: int = 0):
    """(run: () -> Trajectory, compiled program, its args) for `batch` rows x `turns` turns."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from bmrl.rollout import engine
    from bmrl.rollout.types import Injection

    _, env, fmt, policy, cfg = corridor_workload(turns)
    if compact:
        cfg = dataclasses.replace(cfg, compact_min_rows=compact)
    graphdef, params = nnx.split(policy)
    program = engine.make_rollout(graphdef, env, fmt, cfg)
    args = (params, {"seed": jnp.arange(batch, dtype=jnp.int32)}, jnp.full((batch,), turns, jnp.int32),
            jax.random.key(0), Injection.none(cfg.max_turns))
    return (lambda: program(*args)), program, args


# ------------------------------------------------------------------ op classification
def _kind(calls: list[tuple[str, str]], opcode: str) -> str:
    """What an op computes, from its call stack (innermost bmrl frame that names a known part)."""
    if opcode in ("while", "conditional", "call"):
        return "control (loop)"
    for file, func in calls:
        base = os.path.basename(file)
        if base == "attention.py":
            return "cache write" if func == "write_cache" else "attention"
        if base == "decoder.py" and func.startswith("MLP"):
            return "mlp"
        if base in ("decoder.py", "rope.py") and func.startswith(("Attention", "apply_rope", "inverse")):
            return "qkv/o proj + rope"
        if base == "decoder.py" and func.startswith(("Decoder.logits", "RMSNorm")):
            return "lm head + norms"
        if base == "sampling.py":
            return "sampling " + func.split(".")[-1]
        if "/envs/" in file:
            return "env"
        if base == "tokens.py":
            return {"write": "buffer write", "assemble": "chunk assembly", "take": "gather rows",
                    "select": "row select"}.get(func, "tokens " + func)
    if opcode in ("copy", "copy-start", "copy-done"):
        return "copy"
    first = next(((os.path.basename(f), fn) for f, fn in calls if "/bmrl/" in f), None)
    return f"{first[0]}:{first[1]}" if first else opcode


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\(")
_TABLE = re.compile(r'^(\d+) (?:"(.*)"|\{(.*)\})$')


def hlo_ops(hlo_text: str) -> dict[str, tuple[str, list[tuple[str, str]], str]]:
    """Instruction name -> (op_name, call stack [(file, function)] innermost first, opcode) of a
    compiled module (its FileNames / FunctionNames / FileLocations / StackFrames tables)."""
    tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
    section, out, frame_of = None, {}, {}
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            continue
        t = _TABLE.match(line) if section else None
        if t:
            tables[section][int(t.group(1))] = t.group(2) if t.group(2) is not None else t.group(3)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        op_name = re.search(r'op_name="([^"]*)"', line)
        frame = re.search(r"stack_frame_id=(\d+)", line)
        out[m.group(1)] = (op_name.group(1) if op_name else "", m.group(2))
        frame_of[m.group(1)] = int(frame.group(1)) if frame else 0

    def fields(text: str) -> dict[str, int]:
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", text)}

    def stack(frame: int) -> list[tuple[str, str]]:
        seen, calls = set(), []
        while frame and frame not in seen and frame in tables["StackFrames"]:
            seen.add(frame)
            f = fields(tables["StackFrames"][frame])
            loc = fields(tables["FileLocations"].get(f.get("file_location_id", 0), ""))
            calls.append((tables["FileNames"].get(loc.get("file_name_id", 0), ""),
                          tables["FunctionNames"].get(loc.get("function_name_id", 0), "")))
            frame = f.get("parent_frame_id", 0)
        return calls

    return {name: (op_name, stack(frame_of[name]), opcode) for name, (op_name, opcode) in out.items()}


def _phase(op_name: str) -> str:
    parts = op_name.split("/")
    for part in reversed(parts):
        if part in PHASES:
            if part == "prefill" and "observe" in parts:
                return "observe/prefill"
            if part == "prefill" and "start" in parts:
                return "start/prefill"
            return part
    return "other"


def self_times(trace_dir: str) -> collections.Counter:
    """hlo op name -> summed self time (ns) over the XLA runtime's events of one trace."""
    from jax.profiler import ProfileData

    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    data = ProfileData.from_file(path)
    total: collections.Counter = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            events = []
            for e in line.events:
                stats = dict(e.stats)
                if "hlo_op" in stats:
                    events.append((e.start_ns, e.end_ns, stats["hlo_op"]))
            events.sort(key=lambda x: (x[0], -x[1]))
            stack: list[list] = []  # [end, name, child time]
            for start, end, name in events:
                while stack and stack[-1][0] <= start:
                    top = stack.pop()
                    total[top[1]] += top[3] - top[2]
                if stack:
                    stack[-1][2] += end - start
                stack.append([end, name, 0.0, end - start])
            while stack:
                top = stack.pop()
                total[top[1]] += top[3] - top[2]
    return total


def profile(corridor_workload, label: str, batch: int, turns: int, top: int, compact: int = 0) -> dict:
    import jax

    run, program, args = _case(corridor_workload, batch, turns, compact)
    t0 = time.perf_counter()
    jax.block_until_ready(run())
    compile_s = time.perf_counter() - t0
    wall = min(_timed(run) for _ in range(3))
    ops = hlo_ops(program.lower(*args).compile().as_text())
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        t0 = time.perf_counter()
        jax.block_until_ready(run())
        traced = time.perf_counter() - t0
        jax.profiler.stop_trace()
        times = self_times(tmp)
    by_phase: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    rows = []
    for name, ns in times.items():
        op_name, calls, opcode = ops.get(name, ("", [], name.split(".")[0]))
        phase, kind = _phase(op_name), _kind(calls, opcode)
        by_phase[phase] += ns
        by_kind[(phase, kind)] += ns
        src = next((f"{os.path.basename(f)}:{fn.split('.')[-1]}" for f, fn in calls if "/bmrl/" in f), "")
        rows.append((ns, name, phase, kind, src))
    ops_total = sum(times.values())
    print(f"\n== {label}: {batch} rows x {turns} turns: wall {wall * 1e3:.1f} ms untraced "
          f"({wall / turns * 1e3:.2f} ms per turn, {wall / (batch * turns) * 1e6:.1f} us per row-turn), "
          f"{traced * 1e3:.1f} ms traced, ops' self time {ops_total / 1e6:.1f} ms, first call (compile) {compile_s:.1f} s")
    overlap = ops_total / 1e9 / wall
    if overlap > OVERLAP_WARN:
        # Seen at 256 x 16: ops' self times 1.85x the untraced wall; prefilling every observation at half
        # its width cut the traced prefill 58% but the untraced wall 10%. Shares are then upper bounds.
        print(f"note: the ops' self times sum to {overlap:.2f}x the untraced wall (ops overlap: XNNPACK's and "
              f"the runtime's threads, tracing overhead): a share below overstates what removing it saves; "
              f"judge a change by untraced time (--against)")
    print(f"{'phase':<16}{'ms':>9}{'share':>8}")
    for phase, ns in by_phase.most_common():
        print(f"{phase:<16}{ns / 1e6:>9.2f}{ns / ops_total:>8.1%}")
    print(f"\n{'phase':<16}{'kind':<30}{'ms':>9}{'share':>8}")
    for (phase, kind), ns in by_kind.most_common(top):
        print(f"{phase:<16}{kind:<30}{ns / 1e6:>9.2f}{ns / ops_total:>8.1%}")
    print(f"\n{'op':<28}{'phase':<16}{'kind':<30}{'source':<24}{'ms':>8}")
    for ns, name, phase, kind, src in sorted(rows, reverse=True)[:top]:
        print(f"{name[:27]:<28}{phase:<16}{kind[:29]:<30}{src[:23]:<24}{ns / 1e6:>8.2f}")
    return dict(case=label, wall_ms=round(wall * 1e3, 2), ms_per_turn=round(wall / turns * 1e3, 3),
                compile_s=round(compile_s, 1), self_over_wall=round(overlap, 2),
                phases={k: round(v / 1e6, 2) for k, v in by_phase.items()})


def _timed(fn) -> float:
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


# ------------------------------------------------------------------ old vs new, side by side
def time_only(corridor_workload, repeats: int, out_npz: str | None) -> dict:
    """Compile each case (timed), then best of `repeats` calls; optionally save the trajectories."""
    import jax
    import numpy as np

    res = {}
    saved = {}
    for label, (batch, turns) in CASES.items():
        run, _, _ = _case(corridor_workload, batch, turns)
        t0 = time.perf_counter()
        tr = jax.block_until_ready(run())
        compile_s = time.perf_counter() - t0
        best = min(_timed(run) for _ in range(repeats))
        res[label] = dict(ms_per_turn=round(best / turns * 1e3, 3), compile_s=round(compile_s, 2))
        for k, v in jax.tree_util.tree_flatten_with_path(tr)[0]:
            saved[f"{label}{jax.tree_util.keystr(k)}"] = np.asarray(v)
    if out_npz:
        np.savez(out_npz, **saved)
    return res


def against(other: str, rounds: int, repeats: int) -> dict:
    """Alternate subprocesses of this tree and `other`; best ms per turn of each, trajectories compared."""
    import numpy as np

    best: dict = {"new": {}, "old": {}}
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for who, root in (("old", other), ("new", ROOT)):
                npz = os.path.join(tmp, f"{who}.npz")
                cmd = [sys.executable, os.path.abspath(__file__), "--time-only", "--root", root,
                       "--repeats", str(repeats), "--save", npz]
                env = dict(os.environ, PYTHONPATH=root)
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
                res = json.loads(out.strip().splitlines()[-1])
                res.pop("bmrl", None)
                print(f"round {r} {who}: {res}", flush=True)
                for label, row in res.items():
                    cur = best[who].setdefault(label, dict(row))
                    cur["ms_per_turn"] = min(cur["ms_per_turn"], row["ms_per_turn"])
                    cur["compile_s"] = min(cur["compile_s"], row["compile_s"])
                files[who] = dict(np.load(npz))
        same = sorted(files["old"]) == sorted(files["new"]) and all(
            np.array_equal(files["old"][k], files["new"][k]) for k in files["old"])
    out = {"bench": "profile_turn_against", "other": other, "rounds": rounds, "repeats": repeats,
           "trajectories_equal": bool(same), "old": best["old"], "new": best["new"],
           "speedup": {k: round(best["old"][k]["ms_per_turn"] / best["new"][k]["ms_per_turn"], 2)
                       for k in best["new"]}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the op tables only (fewer rows printed)")
    ap.add_argument("--top", type=int, default=None, help="rows per table (default 25; 12 with --quick)")
    ap.add_argument("--against", metavar="PATH", help="time this tree against the bmrl at PATH (interleaved)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--time-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.against:
        print(json.dumps(against(os.path.abspath(args.against), args.rounds, args.repeats)))
        return
    corridor_workload = _setup(args.root)
    if args.time_only:
        print(json.dumps(time_only(corridor_workload, args.repeats, args.save)))  # bmrl from --root
        return
    import jax

    print(f"device={jax.devices()[0].platform} bmrl from {os.path.dirname(__import__('bmrl').__file__)}")
    top = args.top or (12 if args.quick else 25)
    out = {"bench": "profile_turn"}
    for label, (batch, turns) in CASES.items():
        out[label] = profile(corridor_workload, label, batch, turns, top)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
