"""`bmrl compare --config FILE --base SPEC --trained SPEC --out DIR`: the study's F1 and F2 between two policies.

Runs on a built-in JAX env or a Python one (env.kind=python: F2 reads the oracle's action from the env's
info["oracle_action"]; states without one are left out). A SPEC is a local Hugging Face model directory (config.json + weights + tokenizer),
a PEFT LoRA adapter directory (`<run>/policy_adapter`: loaded onto the base it names), a training run's
output directory holding one (`<run>/policy`), or a scripted policy `scripted:NAME[:key=value,...]`:
  scripted:oracle                          the environment's best action
  scripted:random                          a uniformly random action
  scripted:noisy_oracle:eps=E,repair=R     (JAX envs) a random wrong action with probability E in clean states; right
                                           after an error (its own, a slip) the oracle's action with
                                           probability R, else a random wrong one (R defaults to 1 - E:
                                           no memory of the error)
Both policies are evaluated on the same held-out test tasks with the same keys (the config's eval
section: ts, ks, attempts, num_tasks, mode, bootstrap); F1 and F2 get a verdict (as_study, opposite or
inconclusive) by the written rules of `bmrl.study.verdicts`. Writes report.md and summary.json (verdicts
at summary.json["findings"]["F1"|"F2"]["verdict"]) to --out (default <out_dir>/compare).
Exit status 0 on success, 2 on a bad config, SPEC or directory.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from bmrl.commands._common import ConfigExit, add_config_args, claim_out, load_config
from bmrl.rundir import RunDir

SCRIPTED = {"oracle": (), "random": (), "noisy_oracle": ("eps", "repair")}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare", help="The study's findings F1 and F2 between a base and a trained policy, with verdicts.",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p, required=True)
    p.add_argument("--base", required=True, metavar="SPEC", help="the base policy: a model directory or scripted:NAME[:k=v,...]")
    p.add_argument("--trained", required=True, metavar="SPEC", help="the trained policy, same forms as --base")
    p.add_argument("--out", default=None, help="output directory (default: <out_dir>/compare)")
    p.set_defaults(func=run)


def parse_spec(text: str) -> dict[str, Any]:
    """{"kind": "scripted", "name", "options"} or {"kind": "dir", "path"}; a clear error otherwise."""
    if not text.startswith("scripted:"):
        path = text
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")) and \
                os.path.isfile(os.path.join(path, "policy", "config.json")):
            path = os.path.join(path, "policy")  # a run's output directory
        if not any(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "adapter_config.json")):
            raise ValueError(
                f"policy {text!r} is neither a Hugging Face model directory (with config.json), a PEFT LoRA adapter "
                "directory (adapter_config.json, on its base), nor a run directory holding one in policy/, nor "
                "scripted:NAME[:key=value,...] with NAME in "
                f"{', '.join(SCRIPTED)} (e.g. scripted:noisy_oracle:eps=0.2,repair=0.9)."
            )
        return {"kind": "dir", "path": path}
    _, _, rest = text.partition(":")
    name, _, opts = rest.partition(":")
    if name not in SCRIPTED:
        raise ValueError(f"scripted policy {name!r} is unknown; choose one of {', '.join(SCRIPTED)}.")
    options: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in opts.split(","))):
        k, eq, v = item.partition("=")
        if not eq or k not in SCRIPTED[name]:
            allowed = ", ".join(SCRIPTED[name]) or "none"
            raise ValueError(f"{text!r}: option {item!r} is not key=value with a key of {name} (allowed: {allowed}).")
        try:
            options[k] = float(v)
        except ValueError:
            raise ValueError(f"{text!r}: {k}={v!r} is not a number.") from None
    if name == "noisy_oracle" and "eps" not in options:
        raise ValueError(f"{text!r}: noisy_oracle needs eps, e.g. scripted:noisy_oracle:eps=0.2 (repair defaults to 1 - eps).")
    return {"kind": "scripted", "name": name, "options": options}


def scripted_policy(spec: dict[str, Any]):
    """The engine-ready scripted policy of a parsed `scripted:` SPEC."""
    from bmrl.rollout.policies import POLICIES, RepairingOracle

    if spec["name"] == "noisy_oracle":
        return RepairingOracle(spec["options"]["eps"], spec["options"].get("repair"))
    return POLICIES[spec["name"]]


def run(args: argparse.Namespace) -> int:
    from bmrl.config import ConfigError

    cfg = load_config(args, "compare")
    try:
        return _run(args, cfg)
    except ConfigError as err:
        print(f"bmrl compare: config error: {err}", file=sys.stderr)
        raise ConfigExit(2) from None
    except (ValueError, OSError) as err:
        print(f"bmrl compare: error: {err}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, cfg) -> int:
    import jax

    from bmrl import assembly as pol
    from bmrl.eval.run import evaluate_config
    from bmrl.study.findings import compare_findings

    specs = {"base": parse_spec(args.base), "trained": parse_spec(args.trained)}
    out = RunDir(args.out or os.path.join(cfg.out_dir, "compare"))
    claim_out("compare", out.path)  # not writable: exit 2 before any work
    e = cfg.eval
    if e.bootstrap < 10:
        raise ValueError(f"compare needs intervals: eval.bootstrap must be >= 10 resamples, got {e.bootstrap}.")
    scripted = {n: scripted_policy(s) for n, s in specs.items() if s["kind"] == "scripted"}  # fail early
    loaded = {n: pol.load_policy(s["path"], cfg.model) for n, s in specs.items() if s["kind"] == "dir"}
    tokenizers = [tok for _, tok in loaded.values()]
    shared_tok = tokenizers[0] if tokenizers else pol.build_tokenizer(cfg)
    runs = {n: pol.build_run(cfg, loaded[n][1] if n in loaded else shared_tok) for n in specs}  # env, format, buffer
    if scripted and not all(r.player.replays_states for r in runs.values()):
        raise ValueError("scripted policies act on a JAX env's state; with env.kind=python compare two model "
                         "directories (F2 then reads the oracle's action from the env's info['oracle_action']).")
    results = {}
    for name, run in runs.items():
        model = loaded[name][0] if name in loaded else scripted[name]
        print(f"compare: {name} = {getattr(args, name)}: {e.num_tasks} tasks x {e.attempts} attempts, T in {list(e.ts)}",
              file=sys.stderr)
        # a scripted policy acts on the env's state, no text: no format
        results[name] = evaluate_config(cfg, run, model, jax.random.key(cfg.seed),
                                        **({} if name in loaded else {"fmt": None}))
    suites = pol.suite_summary(cfg, run)  # how the test tasks were held out, and how many repeat a training level
    findings = compare_findings(results["base"], results["trained"], num_resamples=e.bootstrap, confidence=CONFIDENCE)
    env_name = pol.player_class(cfg).compare_label(cfg)
    settings = {"config": args.config, "base": args.base, "trained": args.trained, "env": f"{env_name} {dict(cfg.env.options)}",
                "tasks": f"{e.num_tasks} held-out test tasks x {e.attempts} attempts", "T grid": list(e.ts), "mode": e.mode,
                "seed": cfg.seed, "bootstrap resamples": e.bootstrap}
    summary = {"findings": {k: f.to_dict() for k, f in findings.items()}, "policies": {n: r.summary() for n, r in results.items()},
               "settings": settings, "interval": INTERVAL, "suites": suites}
    written = out.write_json("summary.json", _no_nan(summary), default=float, allow_nan=False)
    report_path = out.write_text("report.md", report(findings, results, settings, suites))
    for f in findings.values():
        print(f.sentence())
    print(f"wrote {report_path}, {written}")
    return 0


def _no_nan(x: Any) -> Any:
    """JSON-ready: undefined numbers (NaN, e.g. no post-error state) become null."""
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_no_nan(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


CONFIDENCE = 0.95  # the level of every interval compare reports, and of the verdicts read from them
INTERVAL = (f"{100 * CONFIDENCE:g}% bootstrap interval over tasks, paired (both policies on the same tasks with the same "
            "keys)")


def report(findings: dict, results: dict, settings: dict, suites: dict | None = None) -> str:
    """report.md: settings, how the tasks were split (`bmrl.assembly.suite_summary`), the verdicts with their
    intervals and rules (`bmrl.study.findings.compare_findings`), and both policies' measures."""
    from bmrl.assembly import suite_line
    from bmrl.eval import markdown
    from bmrl.study.verdicts import STUDY

    f1, f2 = findings["F1"], findings["F2"]
    t_small, t_large = f1.facts["T_small"], f1.facts["T_large"]
    rows = [["F1", f1.verdict.verdict, f"gain at T={t_large} minus at T={t_small}",
             f1.intervals["gain_large_minus_small"].format(signed=True)],
            ["F2", f2.verdict.verdict, "dRec - dClean (post-error minus clean-state accuracy change)",
             f2.intervals["recovery_minus_clean"].format(signed=True)],
            ["F2", "", "dClean (clean-state accuracy change)", f2.intervals["delta_clean_accuracy"].format(signed=True)],
            ["F2", "", "dRec (post-error accuracy change)", f2.intervals["delta_recovery_accuracy"].format(signed=True)]]
    shared = f2.facts["shared_states"]
    ts = results["base"].ts
    head = ["policy"] + [f"P@(1,{t})" for t in ts] + ["clean-state acc", "post-error acc", "errors per turn"]
    prow = []  # each policy's own (on-policy) accuracies: F2's base_* and trained_* intervals
    for name, r in results.items():
        prow.append([name] + [f"{v:.3f}" for v in r.pass1()[0]] + [f2.intervals[f"{name}_clean_accuracy"].format(),
                                                                     f2.intervals[f"{name}_recovery_accuracy"].format(),
                                                                     f"{r.decomposition.error_rate.mean:.3f}"])
    parts = [
        "# bmrl compare", "",
        f"The findings of the study \"{STUDY}\" (F1, F2) tested between two policies. Intervals: {INTERVAL}.", "",
        markdown.key_values(settings), "", *([suite_line(suites), ""] if suites else []), "## Verdicts", "",
        markdown.table(["finding", "verdict", "statistic", f"mean [{100 * CONFIDENCE:g}% interval]"], rows), "",
        (f"F2 compares the two policies on the states both met: {shared['clean']} clean states and "
         f"{shared['post_error']} states right after a first error."), "",
        *[f"- {findings[k].sentence()}" for k in ("F1", "F2")], "", "## Rules", "",
        *[f"- {k}: {findings[k].verdict.rule}" for k in ("F1", "F2")], "", "## Policies", "",
        markdown.table(head, prow), "",
        ("Clean state: no error earlier in the attempt (on the oracle's path). Post-error state: the turn right "
         "after an error (a wrong action or one the environment reported). Accuracy: the policy's action equals "
         "the oracle's; in this table each policy's own, on the states it met (F2's changes above are on the states "
         "both met)."), "",
    ]
    return "\n".join(parts)
