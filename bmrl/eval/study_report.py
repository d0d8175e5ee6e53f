"""The study's report in words and tables: what each finding measured, in sentences; the summary and
per-seed tables; report.md (`bmrl reproduce` writes it with the figures of `bmrl.eval.figures`)."""

from __future__ import annotations

import os

import numpy as np

from bmrl.config import Config
from bmrl.eval import markdown
from bmrl.eval.findings import BASE, mean_interval


def _fmt(e: dict, pct: bool = False) -> str:
    if not np.isfinite(e["mean"]):
        return "n/a"
    s = 100.0 if pct else 1.0
    return f"{e['mean'] * s:+.3f} [{e['lower'] * s:+.3f}, {e['upper'] * s:+.3f}]"



def _plain(e: dict) -> str:
    return "n/a" if not np.isfinite(e["mean"]) else f"{e['mean']:.3f} [{e['lower']:.3f}, {e['upper']:.3f}]"



def _excludes_zero(e: dict) -> bool:
    return bool(np.isfinite(e["mean"]) and (e["lower"] > 0 or e["upper"] < 0))



def finding_sentences(f: dict, rep) -> list[str]:
    """What was measured for each finding, in plain sentences (the verdicts are `verdicts`')."""
    gl, gs, gd = f["gain_large"], f["gain_small"], f["gain_large_minus_small"]
    if _excludes_zero(gd) and gd["mean"] > 0:
        verdict = "so RL's gain shrinks when the budget is tight"
    elif _excludes_zero(gd):
        verdict = "so here RL's gain is larger at the tight budget"
    else:
        verdict = "and the two gains are not distinguishable on this run (the interval of their difference includes 0)"
    s1 = (f"1. Budget dependence: RL with the generous budget ({rep.generous}) changed Pass@(1,T) over the base by "
          f"{_fmt(gl)} at T={f['T_large']} and by {_fmt(gs)} at T={f['T_small']}; the large-T gain minus the small-T "
          f"gain is {_fmt(gd)}, {verdict}.")
    da, dr = f["delta_decision_accuracy"], f["delta_recovery"]
    extra = ""
    if "delta_probe_accuracy" in f:
        extra += f" On the fixed probe set of noisy-oracle states, decision accuracy changed by {_fmt(f['delta_probe_accuracy'])}."
    if "delta_injected_success" in f:
        extra += (f" With an error forced at turns {list(rep.inject_turns)}, success at T={f['T_large']} changed by "
                  f"{_fmt(f['delta_injected_success'])}.")
    if abs(dr["mean"]) > abs(da["mean"]) and _excludes_zero(dr):
        verdict2 = ("the gain shows more in recovery than in single decisions on these (different) scales; F2's "
                    "verdict compares them on the same states")
    elif _excludes_zero(da) and not _excludes_zero(dr):
        verdict2 = "here the gain shows in single decisions rather than in recovery"
    else:
        verdict2 = "neither change clearly dominates on this run"
    s2 = (f"2. What RL changed: single-step decision accuracy (on-policy, action = oracle) changed by {_fmt(da)}, "
          f"recovery P(success | an error) by {_fmt(dr)}; {verdict2}.{extra}")
    mp, ar, mm = f["min_pass1"], f["area"], f["mix_minus"]
    parts = []
    for other in (rep.generous, rep.tight):
        parts.append(f"against {other}: min over T of Pass@(1,T) {_fmt(mm[other]['min_pass1'])}, area {_fmt(mm[other]['area'])}")
    robust = all(mm[o]["min_pass1"]["mean"] >= 0 and mm[o]["area"]["mean"] >= 0 for o in (rep.generous, rep.tight))
    better = all(_excludes_zero(mm[o]["area"]) and mm[o]["area"]["mean"] > 0 for o in (rep.generous, rep.tight))
    verdict3 = ("BudgetMix is ahead of both fixed budgets on the area, with intervals excluding 0" if better else
                "BudgetMix is at least level with both fixed budgets on both measures" if robust else
                "BudgetMix is not ahead of both fixed budgets on this run")
    s3 = (f"3. BudgetMix across T: {rep.budgetmix} has min over T of Pass@(1,T) {_plain(mp[rep.budgetmix])} and area "
          f"{_plain(ar[rep.budgetmix])} (fixed generous {_plain(mp[rep.generous])} / {_plain(ar[rep.generous])}, fixed "
          f"tight {_plain(mp[rep.tight])} / {_plain(ar[rep.tight])}); differences {'; '.join(parts)}; {verdict3}.")
    return [s1, s2, s3]



def summary_table(pooled: dict, names: list[str], ks: tuple[int, ...], ts: tuple[int, ...], resamples: int) -> tuple[str, dict]:
    """Markdown table, one row per policy, and the same numbers as a dict."""
    k1 = ks.index(1)
    head = ["policy"] + [f"P@(1,{t})" for t in ts] + ["min_T P@(1,T)", "area", "decision acc", "probe acc",
                                                    "P(success|error)", "success w/ injected error"]
    lines = []
    table = {}
    for name in names:
        p = pooled[name]
        curve = p["surface"][:, k1, :].mean(0)
        row = {f"pass1_T{t}": float(v) for t, v in zip(ts, curve)}
        row["min_pass1"] = float(curve.min())
        row["area"] = float(p["surface"].mean())
        for key, label in (("decision_accuracy", "decision acc"), ("probe_accuracy_states", "probe acc"),
                           ("recovery", "P(success|error)"), ("injected_success", "inj")):
            row[key] = mean_interval(p[key], resamples, 12) if key in p else None
        cells = [name] + [f"{v:.3f}" for v in curve] + [f"{row['min_pass1']:.3f}", f"{row['area']:.3f}"]
        cells += [_plain(row[k]) if row[k] else "-" for k in ("decision_accuracy", "probe_accuracy_states", "recovery", "injected_success")]
        lines.append(cells)
        table[name] = row
    return markdown.table(head, lines), table



def per_seed_table(per_seed: list[dict], seed_results: list[dict], seeds, rep, ks, ts) -> tuple[str, list[dict]]:
    """Each training seed's own values of the three findings' measures (no intervals): a markdown table
    and the same rows as dicts. G: F1's large-T minus small-T gain of the generous variant; dClean,
    dRec, D: F2's paired accuracy changes; area differences: F3's BudgetMix minus each fixed budget."""
    from bmrl.eval.verdicts import f2_point

    k1, j_small = ks.index(1), ts.index(rep.small_t)
    rows, cells = [], []
    for seed, metrics, res in zip(seeds, per_seed, seed_results):
        base, gen = metrics[BASE]["surface"][:, k1, :], metrics[rep.generous]["surface"][:, k1, :]
        gain = gen - base
        f2 = f2_point(res[BASE].episodes, res[rep.generous].episodes)
        mix_area = metrics[rep.budgetmix]["surface"].mean()
        row = {"seed": int(seed), "G": float((gain[:, -1] - gain[:, j_small]).mean()),
               "delta_clean_accuracy": f2["delta_clean_accuracy"], "delta_recovery_accuracy": f2["delta_recovery_accuracy"],
               "recovery_minus_clean": f2["recovery_minus_clean"],
               **{f"area_mix_minus_{o}": float(mix_area - metrics[o]["surface"].mean()) for o in (rep.generous, rep.tight)}}
        rows.append(row)
        cells.append([str(seed)] + [f"{v:+.3f}" for k, v in row.items() if k != "seed"])
    head = ["seed", "F1: G", "F2: dClean", "F2: dRec", "F2: D", f"F3: area mix - {rep.generous}",
            f"F3: area mix - {rep.tight}"]
    return markdown.table(head, cells), rows



def base_description(cfg: Config, f2_intervals: dict | None = None) -> str:
    """How the SFT base was made (and, given F2's intervals, its own clean and post-error accuracy)."""
    s = cfg.sft
    made = (f"an SFT base ({f'initialised from `{cfg.model.path}`' if cfg.model.path else 'a tiny policy trained from scratch'}) "
            f"cloned from noisy-oracle demonstrations (a random wrong action with probability {s.noise} per turn; "
            f"{1 - s.recovery:.0%} of the demonstrations end at the demonstrator's first mistake, {s.recovery:.0%} go on "
            "and show the oracle's repair)")
    if f2_intervals and "base_clean_accuracy" in f2_intervals:
        c, r = f2_intervals["base_clean_accuracy"], f2_intervals["base_recovery_accuracy"]
        if np.isfinite(c["mean"]) and np.isfinite(r["mean"]):
            made += (f"; the base's own accuracy P(action = oracle) is {_plain(c)} in clean states and {_plain(r)} right "
                     "after an error")
    return made



def report_md(cfg: Config, env: str, sentences, table_md, figures, seed_reports, wall, seeds, units, f2_intervals=None,
              seeds_md: str = "", suites_md: str = "", missing: list[str] | None = None) -> str:
    """report.md of the study: setup, findings (verdict sentences, then what was measured), per-seed
    values, the summary table, figures and links to the per-seed reports. `env`: the env as named."""
    rep = cfg.reproduce
    variants = ", ".join(f"`{n}`: {b.kind} {b.budgets if b.kind != 'uniform' else [b.lo, b.hi]}"
                         + (f" p={b.probs}" if b.probs else "")
                         + (f" + process reward (train.process_coef={rep.process[n]})" if n in rep.process else "")
                         for n, b in rep.variants.items())
    process_note = ([f"Process supervision: variant(s) {', '.join(f'`{n}`' for n in rep.process)} add a step-level reward "
                     "from the change in the environment's progress (privileged information: the agent never sees "
                     "it, and a real task may not have it); the study's claims concern outcome-reward RL, so the "
                     "verdicts use the outcome-only variants.", ""] if rep.process else [])
    rel = {k: os.path.relpath(v, cfg.out_dir) for k, v in figures.paths.items()}
    lines = [
        "# What multi-turn RL bought: bmrl reproduce",
        "",
        'A reproduction of the three findings of "What Does Multi-Turn Reinforcement Learning Really Improve in LLM '
        'Agents?". Each verdict (as_study, opposite or inconclusive) is decided by the written rule stored with it in '
        "summary.json, from the intervals; the sentences are generated from the verdicts.",
        "",
        f"Environment `{env}` {dict(cfg.env.options)}. Seeds {list(rep.seeds)}; "
        f"each seed: {base_description(cfg, f2_intervals)}, then {cfg.train.steps} RL steps ({cfg.train.advantage}, {cfg.train.tasks_per_step} "
        f"tasks x {cfg.train.group_size} attempts) from that base under each budget: {variants}. Every policy is evaluated on "
        f"the same {cfg.eval.num_tasks} held-out tasks x {cfg.eval.attempts} attempts at T in {list(cfg.eval.ts)} with "
        f"real caps (exact mode). Intervals: 95% bootstrap intervals over seeds and tasks ({units} (seed, task) units; "
        "seeds resampled, then tasks within seed), paired for differences.",
        "",
        *([suites_md, ""] if suites_md else []),
        *process_note,
        *(["## Not measured", "", *missing, ""] if missing else []),
        "## Findings",
        "",
        *[s + "\n" for s in sentences],
        *(["## Per seed", "", "Each training seed's own values (means over its tasks, no intervals):", "", seeds_md, ""]
          if seeds_md else []),
        "## Summary",
        "",
        table_md,
        "",
        "P@(1,T): Pass@(1,T), success of one attempt within T turns. area: mean of the Pass@(K,T) surface over the grid. "
        "decision acc: P(action = oracle action) over the acted turns of on-policy attempts; probe acc: the same on a fixed "
        "set of states reached by a noisy oracle (identical for every policy). P(success|error): success rate of attempts "
        f"that made at least one error. success w/ injected error: Pass@(1,{cfg.eval.ts[-1]}) with a wrong action forced "
        f"at turns {list(rep.inject_turns)}.",
        "",
        "## Figures",
        "",
        f"![F1]({rel['f1_gain']})",
        "",
        figures.captions["f1_gain"],
        "",
        *([f"![F2]({rel['f2_states']})", "", figures.captions["f2_states"], ""] if "f2_states" in rel else []),
        f"![F3]({rel['f3_pass']})",
        "",
        figures.captions["f3_pass"],
        "",
        *[f"![{k}]({v})" for k, v in rel.items() if k.startswith("surface_")],
        "",
        figures.captions["surfaces"],
        "",
        *[f"![{k}]({v})" for k, v in rel.items() if k.startswith("diff_")],
        "",
        figures.captions["differences"],
        "",
        "## Per-seed reports",
        "",
        *[f"- [{p}]({p})" for p in seed_reports],
        "",
        f"Compute time: {wall / 60:.1f} min (the stages' wall times, in the runs that ran them). Config: `config.yaml`.",
        "",
    ]
    return "\n".join(lines)

