"""`bmrl eval --config FILE --policy DIR [--policy DIR2 ...]`: Pass@(K,T), decomposition and report.

Each policy (a local Hugging Face directory with its tokenizer, or a PEFT LoRA adapter directory on
the base it names) is evaluated on the same held-out test tasks of the config's environment (`bmrl.assembly.split_tasks(cfg, "test", eval.num_tasks)`)
with the same keys, over the grid eval.ks x eval.ts in eval.mode; then on a fixed probe set of
noisy-oracle states (decision accuracy) and again with errors injected (recovery with errors
equalised); the probes, the injection and the back-on-track window are the config's
(`bmrl.eval.settings.EvalSettings.from_config`) unless a flag says otherwise. Writes results.json, PNG
plots and report.md to --out (default <out_dir>/eval). With several policies, each is compared with the
first (or --baseline), paired over tasks; whether a difference is in decisions or in recovery is the
study's F2 with its verdict, the same finding as `bmrl compare` on the pair.
Exit status 0 on success, 2 on a bad config or arguments.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import TYPE_CHECKING

from bmrl.commands._common import add_config_args, claim_out, config_exit, load_config

if TYPE_CHECKING:
    from bmrl.eval.settings import EvalSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="Evaluate policies: Pass@(K,T) surface, decision quality, recovery, plots and a markdown report.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p, required=True)
    p.add_argument("--policy", action="append", required=True, metavar="DIR", help="HF model directory or PEFT LoRA adapter directory (repeatable)")
    p.add_argument("--names", default=None, help="comma-separated policy names (default: directory names)")
    p.add_argument("--baseline", default=None, help="name every other policy is compared with (default: the first)")
    p.add_argument("--out", default=None, help="output directory (default: <out_dir>/eval)")
    p.add_argument("--inject-turns", default=None, help="1-based turns where errors are injected, e.g. 1,3; 'none' = no "
                   "injection run (default: the config's reproduce.inject_turns)")
    p.add_argument("--inject-prob", type=float, default=None,
                   help="probability of an injected error at those turns (default: reproduce.inject_prob)")
    p.add_argument("--probe-noise", type=float, default=None,
                   help="noise of the oracle that reaches the probe states (default: reproduce.probe_noise)")
    p.add_argument("--window", type=int, default=None,
                   help="turns allowed to get back on track after an error (default: reproduce.window)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=run)


def _names(args: argparse.Namespace) -> list[str]:
    if args.names:
        names = [n.strip() for n in args.names.split(",")]
        if len(names) != len(args.policy) or len(set(names)) != len(names) or not all(names):
            raise ValueError(f"--names needs {len(args.policy)} distinct names, got {args.names!r}.")
        return names
    names = [os.path.basename(os.path.normpath(p)) or f"policy{i + 1}" for i, p in enumerate(args.policy)]
    if len(set(names)) < len(names):
        names = [f"{n}_{i + 1}" for i, n in enumerate(names)]
    return names


def _inject_turns(text: str) -> list[int]:
    """1-based turns from `1,3` or `none`."""
    if text.strip().lower() in ("none", ""):
        return []
    try:
        turns = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ValueError(f"--inject-turns: cannot read {text!r}; give 1-based turns like 1,3 or 'none'.") from None
    if turns and turns[0] < 1:
        raise ValueError(f"--inject-turns: {text!r}: turns are 1-based (1 = the first turn), or 'none'.")
    return turns


FLAGS = {"inject_turns": "--inject-turns", "inject_prob": "--inject-prob", "probe_noise": "--probe-noise",
         "window": "--window"}  # EvalSettings field -> its flag


def _settings(args: argparse.Namespace, cfg) -> EvalSettings:
    """The config's `EvalSettings` with the flags given, checked (`check_probes`, naming the flag or the
    config key each value came from)."""
    from bmrl.config import check_probes
    from bmrl.eval.settings import EvalSettings

    flags = {"inject_turns": None if args.inject_turns is None else _inject_turns(args.inject_turns),
             "inject_prob": args.inject_prob, "probe_noise": args.probe_noise, "window": args.window}
    given = {k: v for k, v in flags.items() if v is not None}
    s = EvalSettings.from_config(cfg, **given)
    check_probes(s.inject_turns, s.inject_prob, s.probe_noise, s.window, cfg.rollout.max_turns,
                 keys=tuple(flag if k in given else f"reproduce.{k}" for k, flag in FLAGS.items()))
    return s


def run(args: argparse.Namespace) -> int:
    from bmrl.config import ConfigError

    cfg = load_config(args, "eval")
    try:
        return _run(args, cfg)
    except ConfigError as err:
        raise config_exit("eval", err) from None
    except (ValueError, OSError) as err:
        print(f"bmrl eval: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, cfg) -> int:
    from bmrl import assembly as pol
    from bmrl.eval.bootstrap import Interval
    from bmrl.eval.report import write_report
    from bmrl.eval.run import evaluate_policies
    from bmrl.study.findings import compare_f2

    names = _names(args)
    if args.baseline is not None and args.baseline not in names:
        raise ValueError(f"--baseline {args.baseline!r} is not one of the policy names {names}.")
    evs = _settings(args, cfg)
    e = cfg.eval
    out = args.out or os.path.join(cfg.out_dir, "eval")
    claim_out("eval", out)  # not writable: exit 2 before any work
    policies = {name: pol.load_policy(path) for name, path in zip(names, args.policy)}  # fail early on a bad dir
    results = evaluate_policies(cfg, policies, evs)
    settings = {
        "config": args.config, "policies": ", ".join(f"{n} = {p}" for n, p in zip(names, args.policy)),
        "env": pol.player_class(cfg).settings_line(cfg), "show budget": cfg.env.show_budget,
        "sampling temperature": e.temperature, "seed": cfg.seed,
        "error injection": f"turns {list(evs.inject_turns)}, p={evs.inject_prob}" if evs.injects else "off",
    }
    # decisions or recovery: the study's F2 of each pair, the finding `bmrl compare` reads (needs intervals)
    f2 = functools.partial(compare_f2, num_resamples=e.bootstrap) if e.bootstrap >= 10 else None
    paths, summary = write_report(out, results, baseline=args.baseline, title="bmrl eval", settings=settings,
                                  plot=not args.no_plots, f2=f2)
    for name in names:
        s = summary[name]
        if "pass1_at_max_T" in s:
            p1 = s["pass1_at_max_T"]
            print(f"{name}: Pass@(1,{p1['T']}) = {Interval.of(p1).format()}")
    for label, c in summary["comparisons"].items():
        print(f"{label}: {c['F2']['sentence']}" if "F2" in c else
              f"{label}: no F2 verdict: eval.bootstrap={e.bootstrap} gives no intervals (a verdict needs >= 10 resamples)")
    if paths:
        print("wrote " + ", ".join(paths.values()))
    else:  # another process of a multi-process run: the same verdicts, nothing written here
        print(f"process 0 writes the results to {out}")
    return 0
