"""The real-model configs at their real shapes on CPU: `bmrl train` of each for 2 steps, the memory plan beside
the process's measured peak resident memory and the planned step time beside the measured one.

    python bench/real_shapes.py                                   # all five configs, each at the depth below
    python bench/real_shapes.py --configs qwen_tools.yaml --layers 4
    python bench/real_shapes.py --configs llama3_2_1b_toolchain.yaml --lora 16 --layers 4   # LoRA rank 16

Each config's model (`tests/real_models.py`: the published config.json values, random bfloat16 weights written
by transformers, a tokenizer of the real vocabulary with the model's special tokens and chat template) is written
by a subprocess, then `python -m bmrl train` runs in its own process, shrunk only by overrides of rows (one task's
group of 2, one minibatch), turns (1), steps (2) and buffer (`tests.real_models.shrink`), with an evaluation of
one task at the start and the end, the checkpoint at step 2 and the export. `--lora RANK` trains LoRA adapters of
that rank on the frozen base (`model.lora.rank`; the schema's alpha and targets: every projection), so the
checkpoint holds the adapters and the export adds the PEFT adapter directory.

The parent samples the child's resident memory (VmRSS) every 0.1 s: the peak up to the end of step 2 (rollout
and update: what the plan models) and over the whole run (the final checkpoint and export add host copies), and
stops a child that passes --kill-rss-gb. Without --layers, a model whose planned peak x 1.25 passes --max-rss-gb
runs the deepest cut that does not (same widths and vocabulary, fewer layers; one layer when none does, as for
Llama and Gemma at 12 GiB). Also recorded: the resident memory of a process that only imports Python, jax,
transformers and bmrl (the CPU process's floor, which no plan counts).

The plan is `bmrl.plan.plan(cfg, HARDWARE["cpu"])` of the same config and overrides (the memory `bmrl train` prints
at start, and the time model's FLOPs and seconds); with a cut, also the plan of the full depth. Measured seconds
per step: step 2's `perf/step_s` (step 1 compiles), and the child's CPU seconds (user + system, all threads)
between the records of steps 1 and 2, which other work on the machine does not inflate. One JSON line per config
and a markdown table at the end.
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

from tests.real_models import ARCH, BUFFER, config_json, shrink, write_model_dir  # noqa: E402

GIB = 2**30


def overrides(name: str, model: str, out: str, lora: int = 0) -> list[str]:
    return [f"model.path={model}", f"out_dir={out}", *shrink(name), *([f"model.lora.rank={lora}"] if lora else [])]


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


def plan_at(name: str, layers: int | None, lora: int = 0) -> dict:
    """`planned` of `name` at a cut of `layers` (None: the full depth), from its config.json alone."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config_json(name, layers)))
        return planned(name, overrides(name, d, d, lora))


def depth_for(name: str, max_rss: int, lora: int = 0) -> int | None:
    """The full depth (None) when its planned peak x 1.25 stays under `max_rss`, else the deepest such cut (one layer
    when none is)."""
    full = ARCH[name]["num_hidden_layers"]
    for layers in range(full, 0, -1):
        if 1.25 * plan_at(name, layers, lora)["peak"] <= max_rss:
            return None if layers == full else layers
    print(f"{name}: even one layer is planned over {max_rss / GIB / 1.25:.1f} GiB (--max-rss-gb / 1.25); running one "
          "(--kill-rss-gb still applies)", file=sys.stderr)
    return 1


def runtime_rss() -> int:
    """Peak resident bytes of a process that only imports what `bmrl train` runs on (Python, jax, transformers):
    the CPU process's floor, which no device holds."""
    code = "import resource, jax, transformers, bmrl.cli; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    return int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                              cwd=REPO).stdout.split()[-1]) * 1024


def rss(pid: int) -> int:
    """Resident bytes of process `pid` (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far, all its threads (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run_one(name: str, layers: int | None, work: Path, kill_rss: int, lora: int = 0) -> dict:
    model, out = work / "model", work / "run"
    cmd = [sys.executable, __file__, "--write", name, str(model)] + ([] if layers is None else ["--layers", str(layers)])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    over = overrides(name, str(model), str(out), lora)
    plan = planned(name, over)
    log = open(work / "train.log", "w")
    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-m", "bmrl", "train", "--config", str(REPO / "configs" / name), *over,
                              "--no-progress"], stdout=log, stderr=subprocess.STDOUT)
    peak = peak_steps = 0
    metrics = out / "metrics.jsonl"
    killed = False
    cpu_at_step = []  # the child's CPU seconds when each step's record appeared
    while child.poll() is None:
        now = rss(child.pid)
        peak = max(peak, now)
        if now > kill_rss:
            child.kill()
            killed = True
            break
        text = metrics.read_text() if metrics.is_file() else ""
        if text.count('"perf/step_s"') > len(cpu_at_step):
            cpu_at_step.append(cpu_seconds(child.pid))
        if not peak_steps and '"step": 2, "train/' in text:
            peak_steps = peak  # the end of step 2: rollout and update done, before the final checkpoint and export
        time.sleep(0.1)
    child.wait()
    log.close()
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    steps = [r for r in steps if "perf/step_s" in r]
    full = None if layers is None else plan_at(name, None, lora)
    return dict(config=name, lora_rank=lora, layers=layers or ARCH[name]["num_hidden_layers"],
                full_layers=ARCH[name]["num_hidden_layers"], max_len=BUFFER[name], exit=child.returncode,
                killed_over_gb=kill_rss / GIB if killed else None, wall_s=round(time.time() - t0, 1),
                rss_steps=peak_steps, rss_peak=peak, step_s=[round(r["perf/step_s"], 2) for r in steps],
                step2_cpu_s=round(cpu_at_step[1] - cpu_at_step[0], 1) if len(cpu_at_step) >= 2 else None,
                loss=[r.get("train/loss") for r in steps], plan=plan, runtime_rss=runtime_rss(),
                plan_full_depth=full and dict(peak=full["peak"], params=full["params"], step_s=full["step_s"]))


def table(results: list[dict]) -> str:
    rows = ["| config | layers | parameters | planned peak | measured RSS to the end of step 2 "
            "| measured RSS, whole run | planned FLOP / s per step | measured s per step (step 2: wall; CPU) |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        p = r["plan"]
        steps = r["rss_steps"] / GIB
        ratio = f" ({steps / (p['peak'] / GIB) - 1:+.0%})" if steps else ""
        lora = f" (LoRA rank {r['lora_rank']})" if r.get("lora_rank") else ""
        whole = (f"over {r['killed_over_gb']:.1f} GiB (stopped)" if r["killed_over_gb"]
                 else f"{r['rss_peak'] / GIB:.2f} GiB")
        measured = f"{r['step_s'][-1]}; {r['step2_cpu_s']}" if len(r["step_s"]) == 2 else "n/a"
        rows.append(
            f"| {r['config']}{lora} | {r['layers']} of {r['full_layers']} | {p['params'] / 1e6:.1f}M "
            f"| {p['peak'] / GIB:.2f} GiB | {steps:.2f} GiB{ratio} | {whole} | {p['flops']:.2e} / {p['step_s']:.1f} "
            f"| {measured} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(BUFFER))
    ap.add_argument("--layers", type=int, default=0, help="a cut for every config (0: the deepest that fits)")
    ap.add_argument("--max-rss-gb", type=float, default=12.0, help="pick the deepest cut planned x 1.25 under this")
    ap.add_argument("--kill-rss-gb", type=float, default=14.0, help="stop a run whose resident memory passes this")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK", help="train LoRA adapters of this rank (0: full)")
    ap.add_argument("--write", nargs=2, metavar=("CONFIG", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:  # the subprocess that writes one model directory
        write_model_dir(args.write[0], args.write[1], layers=args.layers or None)
        return
    results = []
    for name in args.configs:
        with tempfile.TemporaryDirectory(prefix="bmrl_real_shapes_") as work:
            layers = args.layers or depth_for(name, int(args.max_rss_gb * GIB), args.lora)
            r = run_one(name, layers, Path(work), int(args.kill_rss_gb * GIB), args.lora)
            if r["exit"] != 0:
                r["log_tail"] = (Path(work) / "train.log").read_text()[-2000:]
        print(json.dumps(r), flush=True)
        results.append(r)
    print(table(results))


if __name__ == "__main__":
    main()
