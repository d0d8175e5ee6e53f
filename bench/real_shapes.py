"""The real-model configs at their real shapes on CPU: `bmrl train` of each for 2 steps, the memory plan beside
the process's measured peak resident memory and the planned step time beside the measured one.

    python bench/real_shapes.py                                   # all five configs, each at its depth below
    python bench/real_shapes.py --configs qwen_tools.yaml --layers 4 --max-rss-gb 12

Each config's model (`tests/real_models.py`: the published config.json values, random bfloat16 weights written
by transformers, a tokenizer of the real vocabulary with the model's special tokens and chat template) is written
by a subprocess, then `python -m bmrl train` runs in its own process, shrunk only by overrides of rows (one task's
group of 2, one minibatch), turns (1), steps (2) and buffer (`BUFFER`), with an evaluation of one task at the
start and the end, the checkpoint at step 2 and the export. The parent samples the child's resident memory (VmRSS) every 0.1 s: the peak up
to the end of step 2 (rollout and update: what the plan models) and over the whole run (the final checkpoint and
export stage host copies that an accelerator keeps outside its memory), and kills a child that passes
--max-rss-gb. A model whose planned peak x 1.25 passes --max-rss-gb runs the deepest cut that does not (same widths
and vocabulary, fewer layers; `--layers` sets one).

The plan is `bmrl.plan.plan(cfg, HARDWARE["cpu"])` of the same config and overrides (the memory `bmrl train` prints
at start, and the time model's FLOPs); measured seconds per step are step 2's `perf/step_s` (step 1 compiles).
One JSON line per config and a markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.real_models import ARCH, config_json, write_model_dir  # noqa: E402

# rollout.max_len: the prompt and one reply of each config's env and format with this tokenizer, rounded up.
BUFFER = {"qwen2_5_0_5b_sokoban.yaml": 224, "qwen3_0_6b_sokoban.yaml": 320, "qwen_tools.yaml": 640,
          "llama3_2_1b_toolchain.yaml": 384, "gemma3_1b_tools.yaml": 704}
SHRINK = ["train.steps=2", "train.tasks_per_step=1", "train.group_size=2", "train.minibatches=1",
          "budget.budgets=[1]", "rollout.max_turns=1", "eval.ts=[1]", "eval.ks=[1]", "eval.attempts=1",
          "eval.num_tasks=1", "eval.bootstrap=0", "eval.probe_states=0", "checkpoint.every=2", "data.train_size=8",
          "data.val_size=4", "data.test_size=4"]
GIB = 2**30


def overrides(name: str, model: str, out: str) -> list[str]:
    return [f"model.path={model}", f"out_dir={out}", f"rollout.max_len={BUFFER[name]}", *SHRINK]


def planned(name: str, over: list[str]) -> dict:
    """The plan of the shrunk config on this machine's CPU: peak bytes, parameters, FLOPs and seconds per step."""
    from bmrl import config as config_lib
    from bmrl import plan as plan_lib

    cfg = config_lib.load(REPO / "configs" / name, over)
    p = plan_lib.plan(cfg, plan_lib.HARDWARE["cpu"], fixes=False, config_name=name)
    t = p.time
    return dict(params=p.params, peak=p.memory.peak, state=p.memory.params + p.memory.opt_state,
                kv=p.memory.kv_cache, grads_acts=p.memory.grads + p.memory.activations, step_s=t.step_s,
                flops=t.decode_flops * t.decode_steps + t.prefill_flops + t.learner_flops)


def depth_for(name: str, max_rss: int) -> int | None:
    """The full depth (None) when its planned peak x 1.25 stays under `max_rss`, else the deepest such cut."""
    full = ARCH[name]["num_hidden_layers"]
    with tempfile.TemporaryDirectory() as d:
        for layers in range(full, 0, -1):
            (Path(d) / "config.json").write_text(json.dumps(config_json(name, layers)))
            if 1.25 * planned(name, overrides(name, d, d))["peak"] <= max_rss:
                return None if layers == full else layers
    raise SystemExit(f"{name}: even one layer is planned over {max_rss / GIB:.1f} GiB")


def rss(pid: int) -> int:
    """Resident bytes of process `pid` (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def run_one(name: str, layers: int | None, work: Path, max_rss: int) -> dict:
    model, out = work / "model", work / "run"
    cmd = [sys.executable, __file__, "--write", name, str(model)] + ([] if layers is None else ["--layers", str(layers)])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    over = overrides(name, str(model), str(out))
    plan = planned(name, over)
    log = open(work / "train.log", "w")
    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-m", "bmrl", "train", "--config", str(REPO / "configs" / name), *over,
                              "--no-progress"], stdout=log, stderr=subprocess.STDOUT)
    peak = peak_steps = 0
    metrics = out / "metrics.jsonl"
    killed = False
    while child.poll() is None:
        now = rss(child.pid)
        peak = max(peak, now)
        if now > max_rss:
            child.kill()
            killed = True
            break
        if not peak_steps and metrics.is_file() and '"step": 2, "train/' in metrics.read_text():
            peak_steps = peak  # the end of step 2: rollout and update done, before the final checkpoint and export
        time.sleep(0.1)
    child.wait()
    log.close()
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    steps = [r for r in steps if "perf/step_s" in r]
    return dict(config=name, layers=layers or ARCH[name]["num_hidden_layers"],
                full_layers=ARCH[name]["num_hidden_layers"], max_len=BUFFER[name], exit=child.returncode,
                killed_over_gb=max_rss / GIB if killed else None, wall_s=round(time.time() - t0, 1),
                rss_steps=peak_steps, rss_peak=peak, step_s=[round(r["perf/step_s"], 2) for r in steps],
                loss=[r.get("train/loss") for r in steps], plan=plan)


def table(results: list[dict]) -> str:
    rows = ["| config | layers | parameters | planned peak | measured RSS, steps | measured RSS, whole run "
            "| planned FLOP/step | planned s/step (cpu) | measured s/step |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = r["plan"]
        steps = r["rss_steps"] / GIB
        ratio = f" ({steps / (p['peak'] / GIB) - 1:+.0%})" if steps else ""
        rows.append(
            f"| {r['config']} | {r['layers']} of {r['full_layers']} | {p['params'] / 1e6:.1f}M "
            f"| {p['peak'] / GIB:.2f} GiB | {steps:.2f} GiB{ratio} | {r['rss_peak'] / GIB:.2f} GiB "
            f"| {p['flops']:.2e} | {p['step_s']:.1f} | {r['step_s'][-1] if len(r['step_s']) == 2 else 'n/a'} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(BUFFER))
    ap.add_argument("--layers", type=int, default=0, help="a cut for every config (0: the deepest that fits)")
    ap.add_argument("--max-rss-gb", type=float, default=12.0)
    ap.add_argument("--write", nargs=2, metavar=("CONFIG", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:  # the subprocess that writes one model directory
        write_model_dir(args.write[0], args.write[1], layers=args.layers or None)
        return
    results = []
    for name in args.configs:
        with tempfile.TemporaryDirectory(prefix="bmrl_real_shapes_") as work:
            max_rss = int(args.max_rss_gb * GIB)
            r = run_one(name, args.layers or depth_for(name, max_rss), Path(work), max_rss)
            if r["exit"] != 0:
                r["log_tail"] = (Path(work) / "train.log").read_text()[-2000:]
        print(json.dumps(r), flush=True)
        results.append(r)
    print(table(results))


if __name__ == "__main__":
    main()
