"""The study's report in words and tables, read from the one result of each finding (`bmrl.study.
findings.Study`): what each finding measured, in sentences; the summary and per-seed tables;
report.md (`bmrl reproduce` writes it with the figures of `bmrl.study.figures`). Every interval is an
`Interval` formatted by itself, so a number reads the same wherever it appears."""

from __future__ import annotations

import os


from bmrl.config import Config, make_budget
from bmrl.learn.health import RULE
from bmrl.study.verdicts import UNTRAINABLE_BASE_RULE
from bmrl.eval import markdown
from bmrl.study.findings import BASE, LEVELS, Study, f2_point, without_sentence

F1_SAYS = {"as_study": "so RL's gain shrinks when the budget is tight",
           "opposite": "so here RL's gain is larger at the tight budget",
           "inconclusive": "and the two gains are not distinguishable on this run (F1's verdict says why)"}


def finding_sentences(study: Study, rep) -> list[str]:
    """What was measured for each finding, in plain sentences; each conclusion is its verdict's."""
    f1, f2, f3 = study.findings
    t_large = f1.facts["T_large"]
    s1 = (f"1. Budget dependence: RL with the generous budget ({rep.generous}) changed Pass@(1,T) over the base by "
          f"{_f1_gains(f1)}.")
    on = f2.levels
    extra = ""
    if "delta_probe_accuracy" in on:
        extra += (" On the fixed probe set of noisy-oracle states, decision accuracy changed by "
                  f"{on['delta_probe_accuracy'].format(signed=True)}.")
    if "delta_injected_success" in on:
        extra += (f" With an error forced at turns {list(rep.inject_turns)}, success at T={t_large} changed by "
                  f"{on['delta_injected_success'].format(signed=True)}.")
    s2 = (f"2. What RL changed, on each policy's own states (on-policy): single-step decision accuracy (action = "
          f"oracle) changed by {on['delta_decision_accuracy'].format(signed=True)}, recovery P(success | an error) by "
          f"{on['delta_recovery'].format(signed=True)}; these are on different states and scales, F2's verdict "
          f"compares the two on the states both policies met.{extra}")
    mp, ar, mm = f3.levels["min_pass1"], f3.levels["area"], f3.intervals
    parts = [f"against {o}: " + ", ".join(f"{m} {e.format(signed=True)}" for m, e in mm[o].items()) for o in mm]
    s3 = (f"3. BudgetMix across T: {rep.budgetmix} has min over T of Pass@(1,T) {mp[rep.budgetmix]} and area "
          f"{ar[rep.budgetmix]} (fixed generous {mp[rep.generous]} / {ar[rep.generous]}, fixed tight {mp[rep.tight]} / "
          f"{ar[rep.tight]}); BudgetMix minus each fixed budget: {'; '.join(parts)}.")
    return [s1, s2, s3] + [_advantage_sentence(name, f, rep) for name, f in study.advantage_f1.items()]


def _f1_gains(f1) -> str:
    """What F1 measured, from "changed Pass@(1,T) over the base by ..." on: the two gains, their difference and
    what its verdict says."""
    gl, gs, gd = (f1.intervals[k] for k in ("gain_large", "gain_small", "gain_large_minus_small"))
    t_large, t_small = f1.facts["T_large"], f1.facts["T_small"]
    return (f"{gl.format(signed=True)} at T={t_large} and by {gs.format(signed=True)} at T={t_small}; the gain at "
            f"T={t_large} minus the gain at T={t_small} is {gd.format(signed=True)}, {F1_SAYS[f1.verdict.verdict]}")


def _advantage_sentence(name: str, f1, rep) -> str:
    """F1's measure and rule for a variant trained with another advantage estimator (`reproduce.advantage`), then
    (in a study with dead runs) whether it holds without them."""
    return (f"Budget dependence with {rep.advantage[name]} advantages ({name}): Pass@(1,T) over the base changed by "
            f"{_f1_gains(f1)} (F1's rule: {f1.verdict.verdict}).{without_sentence(f1.facts.get('without_dead_runs'))}")


def summary_table(pooled: dict, study: Study, names: list[str], ks: tuple[int, ...], ts: tuple[int, ...]) -> tuple[str, dict]:
    """Markdown table, one row per policy, and the same numbers as a dict (the levels of `study`)."""
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
        levels = study.levels[name]
        row.update({m: levels[m].to_dict() if m in levels else None for m in LEVELS})
        cells = [name] + [f"{v:.3f}" for v in curve] + [f"{row['min_pass1']:.3f}", f"{row['area']:.3f}"]
        cells += [levels[m].format() if m in levels else "-" for m in LEVELS]
        lines.append(cells)
        table[name] = row
    return markdown.table(head, lines), table


def per_seed_table(per_seed: list[dict], seed_results: list[dict], seeds, rep, ks, ts) -> tuple[str, list[dict]]:
    """Each training seed's own values of the three findings' measures (no intervals): a markdown table
    and the same rows as dicts. G: F1's gain at the largest T minus at `small_t` of the generous
    variant; dClean, dRec, D: F2's paired accuracy changes; F3's deciding measure, BudgetMix minus each fixed
    budget on min over T of Pass@(1,T)."""
    k1, j_small = ks.index(1), ts.index(rep.small_t)
    rows, cells = [], []
    for seed, metrics, res in zip(seeds, per_seed, seed_results):
        base, gen = metrics[BASE]["surface"][:, k1, :], metrics[rep.generous]["surface"][:, k1, :]
        gain = gen - base
        f2 = f2_point(res[BASE].episodes, res[rep.generous].episodes)
        def min_pass1(name):
            return metrics[name]["surface"][:, k1, :].mean(0).min()

        row = {"seed": int(seed), "G": float((gain[:, -1] - gain[:, j_small]).mean()),
               "delta_clean_accuracy": f2["delta_clean_accuracy"], "delta_recovery_accuracy": f2["delta_recovery_accuracy"],
               "recovery_minus_clean": f2["recovery_minus_clean"],
               **{f"min_pass1_mix_minus_{o}": float(min_pass1(rep.budgetmix) - min_pass1(o)) for o in (rep.generous, rep.tight)}}
        rows.append(row)
        cells.append([str(seed)] + [f"{v:+.3f}" for k, v in row.items() if k != "seed"])
    head = ["seed", f"F1: G (T={ts[-1]} - T={rep.small_t})", "F2: dClean", "F2: dRec", "F2: D",
            f"F3: min_T P@(1,T) mix - {rep.generous}", f"F3: min_T P@(1,T) mix - {rep.tight}"]
    return markdown.table(head, cells), rows


def base_description(cfg: Config, study: Study | None = None) -> str:
    """How the SFT base was made (and, given the study, its own clean and post-error accuracy: F2's
    on-policy levels)."""
    s = cfg.sft
    made = (f"an SFT base ({f'initialised from `{cfg.model.path}`' if cfg.model.path else 'a tiny policy trained from scratch'}) "
            f"cloned from noisy-oracle demonstrations (a random wrong action with probability {s.noise} per turn; "
            f"{1 - s.recovery:.0%} of the demonstrations end at the demonstrator's first mistake, {s.recovery:.0%} go on "
            "and show the oracle's repair)")
    if study is not None:
        c, r = study.f2.intervals["base_clean_accuracy"], study.f2.intervals["base_recovery_accuracy"]
        if c.defined and r.defined:
            made += (f"; the base's own accuracy P(action = oracle) on the states it met is {c} in clean states and "
                     f"{r} right after an error")
    return made



def dead_runs_md(runs: list[dict], total: int) -> list[str]:
    """report.md's section on dead runs: every one listed, or a line saying there were none."""
    head = ["## Runs that lost their signal", ""]
    if not runs:
        return head + [f"None of the {total} RL runs lost its signal. Rule: {RULE}", ""]
    lines = [f"- seed {r['seed']} `{r['variant']}`: " + "; ".join(f"dead since step {f['step']}: {f['reason']}"
                                                               for f in r["flags"])
             + ("" if r["still_at_end"] else " (it no longer held at the last step)") for r in runs]
    return head + [f"{len(runs)} of the {total} RL runs lost their signal; each verdict above says whether it holds "
                   f"without them. Rule: {RULE}", "", *lines, ""]


def untrainable_bases_md(bases: list[dict], seeds: int, group_size: int) -> list[str]:
    """report.md's section on SFT bases RL cannot learn from (`bmrl.reproduce.untrainable_bases`)."""
    head = ["## SFT bases RL cannot learn from", ""]
    if not bases:
        return head + [f"RL can learn from each of the {seeds} SFT bases. Rule: {UNTRAINABLE_BASE_RULE}", ""]
    lines = [f"- seed {b['seed']}: held-out Pass@(1,T) at the largest T {b['pass1']:.3f}; {b['signal_chance']:.2f} of "
             f"task groups of {group_size} are expected to carry signal" for b in bases]
    return head + [f"{len(bases)} of the {seeds} SFT bases are ones RL cannot learn from; their seeds' RL runs count as "
                   f"dead, and each verdict above says whether it holds without them. Rule: {UNTRAINABLE_BASE_RULE}",
                   "", *lines, ""]


def report_md(cfg: Config, env: str, sentences, table_md, figures, seed_reports, wall, seeds, units,
              study: Study | None = None, seeds_md: str = "", suites_md: str = "", missing: list[str] | None = None,
              dead_md: list[str] | None = None) -> str:
    """report.md of the study: setup, findings (verdict sentences, then what was measured), the runs that
    lost their signal (`dead_md`), per-seed values, the summary table, figures and links to the per-seed reports. `env`: the env as named."""
    rep = cfg.reproduce
    variants = ", ".join(f"`{n}`: {make_budget(b).describe()}"
                         + (f" + process reward (train.process_coef={rep.process[n]})" if n in rep.process else "")
                         + (f" + train.advantage={rep.advantage[n]}" if n in rep.advantage else "")
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
        f"each seed: {base_description(cfg, study)}, then {cfg.train.steps} RL steps ({cfg.train.advantage}, {cfg.train.tasks_per_step} "
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
        *(dead_md or []),
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

