"""`bmrl reproduce`: the study end to end, on one machine.

For every seed of `reproduce.seeds`: an SFT base policy (noisy-oracle demonstrations that show
errors, and the repair after one in a fraction `sft.recovery` of them), then RL from that base under
each budget variant of `reproduce.variants` (a fixed generous budget, a fixed tight one, BudgetMix — same steps, same seed), then every policy
evaluated on the same held-out tasks with Pass@(K,T) in exact mode, decision accuracy (on-policy and
on a fixed probe set) and recovery (also with errors injected). Finished stages are skipped on a
rerun (SFT and RL: their summary.json; evaluation: its results.json, JSON per-seed results made
with the same config), so a killed run resumes where it stopped and a finished one re-renders its
report and figures from the saved results in seconds. Progress: `bmrl.stages` (lines on stderr).

The report states the study's three findings as measured claims, whichever way they come out:
  1. RL's gain over the base at the largest T against its gain at a small T;
  2. the change in single-step decision accuracy against the change in recovery;
  3. BudgetMix against fixed-budget RL across T: min over T of Pass@(1,T) and the area under the surface.
Intervals: a two-level percentile bootstrap (resample training seeds, then tasks within each seed;
one level with one seed), paired for differences (the same units for both policies).

A Python env (env.kind=python) runs the same stages: its SFT demonstrations play the oracle it names
(info["next_oracle_action"]), RL and evaluation run on the host loop, and F2's clean and post-error
states come from its info["oracle_action"]. The probe set and error injection replay a JAX env's
states, so they are not measured there; the report and summary.json (`not_measured`) say so.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from bmrl.config import Config, build, check_reproduce, save, to_dict
from bmrl.eval import markdown
from bmrl.eval.bootstrap import bootstrap_stat

BASE = "base"
GROUPS = "_groups"  # pooled[GROUPS][metric]: the seed of each unit (two-level bootstrap)


# ---- configs of the stages ------------------------------------------------------------------------


def stage_config(cfg: Config, seed: int, out_dir: str, **sections: dict) -> Config:
    """`cfg` with `seed`, `out_dir` and whole sections replaced (validated again)."""
    data = copy.deepcopy(to_dict(cfg))
    data.update(seed=seed, out_dir=out_dir)
    for name, value in sections.items():
        data[name] = {**data[name], **value}
    return build(data)


# ---- statistics over pooled (seed, task) units ------------------------------------------------------


def _boot(stat: Callable[..., np.ndarray], *arrays: np.ndarray, resamples: int, seed: int, confidence: float = 0.95,
          groups: np.ndarray | None = None):
    """(value, lower, upper) of `stat(*arrays)`, resampling units (axis 0 of every array) jointly;
    with `groups` (the seed of each unit) seeds first, then tasks within seed (`bmrl.eval.bootstrap`)."""
    return bootstrap_stat(stat, *arrays, groups=groups, key=seed, num_resamples=max(resamples, 10), confidence=confidence)


def _paired_mean(a: np.ndarray, b: np.ndarray, resamples: int, seed: int, groups: np.ndarray | None = None) -> dict:
    """mean(a - b) over units where both are defined, with its interval (two levels with `groups`)."""
    return _mean(np.where(np.isfinite(a) & np.isfinite(b), a - b, np.nan), resamples, seed, groups)


def _mean(a: np.ndarray, resamples: int, seed: int, groups: np.ndarray | None = None) -> dict:
    """mean(a) over units where it is defined, with its interval: with `groups` (the training seed of
    each unit) the bootstrap resamples seeds, then units within each seed."""
    ok = np.isfinite(a)
    if not ok.any():
        return {"mean": float("nan"), "lower": float("nan"), "upper": float("nan"), "units": 0}
    g = None if groups is None else np.asarray(groups)[ok]
    v, lo, hi = _boot(np.mean, a[ok], resamples=resamples, seed=seed, groups=g)
    return {"mean": float(v), "lower": float(lo), "upper": float(hi), "units": int(ok.sum())}


def _fmt(e: dict, pct: bool = False) -> str:
    if not np.isfinite(e["mean"]):
        return "n/a"
    s = 100.0 if pct else 1.0
    return f"{e['mean'] * s:+.3f} [{e['lower'] * s:+.3f}, {e['upper'] * s:+.3f}]"


def _plain(e: dict) -> str:
    return "n/a" if not np.isfinite(e["mean"]) else f"{e['mean']:.3f} [{e['lower']:.3f}, {e['upper']:.3f}]"


def _excludes_zero(e: dict) -> bool:
    return bool(np.isfinite(e["mean"]) and (e["lower"] > 0 or e["upper"] < 0))


def unit_metrics(result) -> dict[str, np.ndarray]:
    """Per-task arrays of one EvalResult or `SavedEval` (NaN where a metric is undefined for a task)."""
    from bmrl.eval.decompose import decision_accuracy_per_task, recovery_per_task
    from bmrl.eval.saved import SavedEval

    result = SavedEval.of(result)
    ep = result.episodes
    out = {
        "surface": np.asarray(result.per_task, float),  # [N, K, T]
        "decision_accuracy": decision_accuracy_per_task(ep),
        "recovery": recovery_per_task(ep)[1],
    }
    if result.probe_correct is not None:  # per probe state; the probe set depends only on the seed, so pairs match
        out["probe_accuracy_states"] = result.probe_correct
    if result.injected is not None:
        k1 = result.injected.ks.index(1) if 1 in result.injected.ks else 0
        out["injected_success"] = np.asarray(result.injected.per_task, float)[:, k1, -1]
    return out


def _pool(per_seed: list[dict[str, dict[str, np.ndarray]]], names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Units of every seed concatenated per policy and metric; `pooled[GROUPS][metric]` holds the seed
    index of each unit (the same units, tasks or probe states, for every policy of a seed)."""
    pooled: dict[str, dict[str, np.ndarray]] = {}
    for name in names:
        keys = per_seed[0][name].keys()
        pooled[name] = {k: np.concatenate([s[name][k] for s in per_seed], axis=0) for k in keys}
    first = per_seed[0][names[0]]
    pooled[GROUPS] = {k: np.concatenate([np.full(len(s[names[0]][k]), i) for i, s in enumerate(per_seed)])
                      for k in first}
    return pooled


# ---- findings -------------------------------------------------------------------------------------


def findings(pooled: dict, ks: tuple[int, ...], ts: tuple[int, ...], rep, resamples: int) -> dict:
    """The study's three findings, measured, with paired intervals over (seed, task) units."""
    k1 = ks.index(1)
    j_large, j_small = len(ts) - 1, ts.index(rep.small_t)
    base, gen, tight, mix = pooled[BASE], pooled[rep.generous], pooled[rep.tight], pooled[rep.budgetmix]
    g = pooled.get(GROUPS, {})
    f: dict[str, Any] = {"T_large": ts[-1], "T_small": rep.small_t}

    d_large = gen["surface"][:, k1, j_large] - base["surface"][:, k1, j_large]
    d_small = gen["surface"][:, k1, j_small] - base["surface"][:, k1, j_small]
    f["gain_large"] = _mean(d_large, resamples, 1, g.get("surface"))
    f["gain_small"] = _mean(d_small, resamples, 2, g.get("surface"))
    f["gain_large_minus_small"] = _mean(d_large - d_small, resamples, 3, g.get("surface"))

    for i, (metric, out) in enumerate((("decision_accuracy", "delta_decision_accuracy"), ("recovery", "delta_recovery"),
                                       ("probe_accuracy_states", "delta_probe_accuracy"),
                                       ("injected_success", "delta_injected_success"))):
        if metric in gen:
            f[out] = _paired_mean(gen[metric], base[metric], resamples, 4 + i, g.get(metric))

    def min_pass1(s):
        return s[:, k1, :].mean(0).min()

    def area(s):
        return s.mean()

    for name, p in ((rep.generous, gen), (rep.tight, tight), (rep.budgetmix, mix), (BASE, base)):
        v, lo, hi = _boot(min_pass1, p["surface"], resamples=resamples, seed=8, groups=g.get("surface"))
        f.setdefault("min_pass1", {})[name] = {"mean": float(v), "lower": float(lo), "upper": float(hi)}
        v, lo, hi = _boot(area, p["surface"], resamples=resamples, seed=9, groups=g.get("surface"))
        f.setdefault("area", {})[name] = {"mean": float(v), "lower": float(lo), "upper": float(hi)}
    for other in (rep.generous, rep.tight):
        o = pooled[other]
        v, lo, hi = _boot(lambda a, b: min_pass1(a) - min_pass1(b), mix["surface"], o["surface"], resamples=resamples,
                          seed=10, groups=g.get("surface"))
        f.setdefault("mix_minus", {})[other] = {"min_pass1": {"mean": float(v), "lower": float(lo), "upper": float(hi)}}
        v, lo, hi = _boot(lambda a, b: a.mean() - b.mean(), mix["surface"], o["surface"], resamples=resamples, seed=11,
                          groups=g.get("surface"))
        f["mix_minus"][other]["area"] = {"mean": float(v), "lower": float(lo), "upper": float(hi)}
    return f


def verdicts(seed_results: list[dict], pooled: dict, ks, rep, resamples: int) -> dict[str, dict]:
    """The three verdicts (`bmrl.eval.verdicts`, written rules over intervals): F1 and F2 from the base
    and the generous-budget RL policy of every seed (paired states; seeds, then tasks), F3 from
    BudgetMix against both fixed budgets on the pooled surfaces."""
    from bmrl.eval.verdicts import compare_findings, f3_intervals, f3_verdict

    out = compare_findings([r[BASE] for r in seed_results], [r[rep.generous] for r in seed_results],
                           num_resamples=resamples)
    groups = pooled[GROUPS]["surface"] if len(seed_results) > 1 else None
    fixed = {o: pooled[o]["surface"] for o in (rep.generous, rep.tight)}
    f3 = f3_intervals(pooled[rep.budgetmix]["surface"], fixed, ks, groups=groups, num_resamples=resamples)
    v3 = f3_verdict(f3)
    out["F3"] = {**v3.to_dict(), "sentence": v3.sentence(),
                 "intervals": {b: {m: e.to_dict() for m, e in ms.items()} for b, ms in f3.items()}}
    return out


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
            row[key] = _mean(p[key], resamples, 12) if key in p else None
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


# ---- the pipeline ---------------------------------------------------------------------------------


def _evaluate_seed(cfg: Config, eval_cfg: Config, seed: int, dirs: dict[str, str], stages, results_path: str) -> None:
    """The evaluation stage of one seed: every policy, its per-seed report, results.json (the stage's
    mark); skipped when results.json exists, made with the same evaluation config."""
    from bmrl.build import load_policy
    from bmrl.eval.report import write_report
    from bmrl.eval.run import evaluate_policies
    from bmrl.eval.saved import load_results, save_results

    if load_results(results_path, to_dict(eval_cfg)) is not None:
        return stages.skip(f"seed {seed} - eval", f"done already: {results_path}")
    stages.start(f"seed {seed} - eval", "eval")
    rep = cfg.reproduce
    policies = {name: load_policy(path) for name, path in dirs.items()}
    results = evaluate_policies(eval_cfg, policies, inject_turns=[t_ - 1 for t_ in rep.inject_turns],
                                inject_prob=rep.inject_prob, probe_noise=rep.probe_noise, window=rep.window,
                                log=stages.note)
    stages.note("writing the per-seed report")
    write_report(eval_cfg.out_dir, results, baseline=BASE, title=f"bmrl reproduce, seed {seed}",
                 settings={"seed": seed, "env": f"{env_label(cfg)} {dict(cfg.env.options)}"})
    save_results(results_path, results, to_dict(eval_cfg))
    stages.finish()


def env_label(cfg: Config) -> str:
    """The environment as reports name it: a JAX env's name, a Python env's entry."""
    return cfg.env.entry if cfg.env.kind == "python" else cfg.env.name


def not_measured(cfg: Config) -> list[str]:
    """What the study could not measure on this env, in sentences (empty for a JAX env)."""
    if cfg.env.kind != "python":
        return []
    return [f"Decision accuracy on a fixed probe set of noisy-oracle states (eval.probe_states, reproduce.probe_noise) "
            f"and success with an error injected (reproduce.inject_turns) were not measured: both replay a JAX env's "
            f"states, and `{cfg.env.entry}` is a Python env (env.kind=python). F2 rests on the policies' own clean "
            "and post-error states (the env's info[\"oracle_action\"])."]


def study_data_dir(cfg: Config) -> str:
    """Where the study's task suites are stored, one for every stage and seed: `data.data_dir`, default
    `<out_dir>/data`."""
    return cfg.data.data_dir or os.path.join(cfg.out_dir, "data")


def _stage_configs(cfg: Config, seed: int) -> tuple[Config, dict[str, Config], Config]:
    """The configs of one seed's stages: SFT, each RL variant (from the SFT policy), evaluation."""
    rep, sdir = cfg.reproduce, os.path.join(cfg.out_dir, f"seed{seed}")
    data = {"data_dir": study_data_dir(cfg)}
    sft_cfg = stage_config(cfg, seed, os.path.join(sdir, "sft"), data=data)
    base_dir = os.path.join(sft_cfg.out_dir, "policy")
    rl_cfgs = {}
    for name in rep.variants:
        process = {"train": {"process_coef": float(rep.process[name])}} if name in rep.process else {}
        rl_cfgs[name] = stage_config(cfg, seed, os.path.join(sdir, name), model={"path": base_dir},
                                     budget=to_dict(cfg)["reproduce"]["variants"][name], data=data, **process)
    return sft_cfg, rl_cfgs, stage_config(cfg, seed, os.path.join(sdir, "eval"), data=data)


def reproduce(cfg: Config, *, log: Callable[[str], Any] = print, stages=None) -> dict:
    """Run the whole study for `cfg`; writes <out_dir>/report.md and summary.json; returns the summary.

    Stages already done are skipped (SFT and RL: their summary.json; evaluation: its results.json,
    made with the same config), so a rerun of a finished run only re-renders the report and figures
    from the saved results. `stages`: a `bmrl.stages.StageProgress` (default: lines on stderr)."""
    from bmrl.eval.saved import load_results
    from bmrl.learn.sft import run_sft
    from bmrl.stages import StageProgress, check_stage_config, run_stage
    from bmrl.train import train

    check_reproduce(cfg)
    t0 = time.time()
    rep, out = cfg.reproduce, cfg.out_dir
    plan = [(seed, _stage_configs(cfg, seed)) for seed in rep.seeds]
    for _, (sft_cfg, rl_cfgs, _) in plan:  # a finished stage made with other settings: refused before any write
        for kind, c in [("sft", sft_cfg)] + [("rl", c) for c in rl_cfgs.values()]:
            if os.path.isfile(os.path.join(c.out_dir, "summary.json")):
                check_stage_config(c.out_dir, c, kind)
    os.makedirs(out, exist_ok=True)
    save(cfg, os.path.join(out, "config.yaml"))
    names = [BASE] + list(rep.variants)
    stages = stages or StageProgress(0)
    stages.plan((["sft"] + ["rl"] * len(rep.variants) + ["eval"]) * len(rep.seeds))
    old_path = os.path.join(out, "summary.json")
    old_times = {}
    if os.path.isfile(old_path):
        with open(old_path) as fh:
            old_times = json.load(fh).get("stage_times_s", {})
    per_seed, seed_reports, stage_times, seed_results = [], [], {}, []

    def timed(key: str, fn: Callable[..., Any], *args: Any) -> None:
        """Run one stage; its time is measured when it ran, else the previous summary's."""
        t, before = time.time(), stages.index - stages.skipped
        fn(*args)
        stage_times[key] = time.time() - t if stages.index - stages.skipped > before else old_times.get(key)

    for seed, (sft_cfg, rl_cfgs, eval_cfg) in plan:
        timed(f"seed{seed}/sft", run_stage, stages, f"seed {seed} - SFT", "sft", partial(run_sft, log=stages.note), sft_cfg)
        dirs = {BASE: os.path.join(sft_cfg.out_dir, "policy")}
        for name, rl_cfg in rl_cfgs.items():
            timed(f"seed{seed}/{name}", run_stage, stages, f"seed {seed} - RL {name}", "rl",
                  partial(train, on_step=stages.step, evaluate=False), rl_cfg)
            dirs[name] = os.path.join(rl_cfg.out_dir, "policy")
        results_path = os.path.join(eval_cfg.out_dir, "results.json")
        timed(f"seed{seed}/eval", _evaluate_seed, cfg, eval_cfg, seed, dirs, stages, results_path)
        results = load_results(results_path)  # the saved results, on every run: a rerun re-renders the same report
        seed_reports.append(os.path.relpath(os.path.join(eval_cfg.out_dir, "report.md"), out))
        per_seed.append({name: unit_metrics(r) for name, r in results.items()})
        seed_results.append({name: results[name] for name in (BASE, rep.generous)})
        ks, ts = results[BASE].ks, results[BASE].ts

    if stages.skipped == stages.total:
        stages.say(f"all {stages.total} stages done already: re-rendering report.md and figures from the saved results "
            "(nothing trained or evaluated)")
    summary = _render(cfg, names, per_seed, seed_results, ks, ts, seed_reports, stage_times)
    log("\n" + summary["table_md"] + "\n")
    for s in summary["sentences"]:
        log(s)
    log(f"\nreport: {os.path.join(out, 'report.md')} (this run {(time.time() - t0) / 60:.1f} min)")
    return summary


def _render(cfg: Config, names: list[str], per_seed: list[dict], seed_results: list[dict], ks, ts,
            seed_reports: list[str], stage_times: dict) -> dict:
    """Findings, verdicts, table, figures, report.md and summary.json from the per-seed results."""
    from bmrl.build import suite_line, suite_summary
    from bmrl.eval.figures import study_figures

    rep, out = cfg.reproduce, cfg.out_dir
    pooled = _pool(per_seed, names)
    resamples = max(cfg.eval.bootstrap, 200)
    f = findings(pooled, ks, ts, rep, resamples)
    f.update(verdicts(seed_results, pooled, ks, rep, resamples))
    sentences = [f[k]["sentence"] for k in ("F1", "F2", "F3")]
    details = finding_sentences(f, rep)
    table_md, table = summary_table(pooled, names, ks, ts, resamples)
    groups = pooled[GROUPS]["surface"] if len(per_seed) > 1 else None
    figures = study_figures(out, pooled, names, ks, ts, f["F2"]["intervals"], rep.generous, resamples, BASE, groups)
    seeds_md, seed_rows = per_seed_table(per_seed, seed_results, rep.seeds, rep, ks, ts)
    data_cfg = stage_config(cfg, cfg.seed, out, data={"data_dir": study_data_dir(cfg)})
    suites = suite_summary(data_cfg)  # how the test levels were held out; overlap with training levels
    wall = sum(v for v in stage_times.values() if v is not None)
    missing = not_measured(cfg)
    report = _report_md(cfg, sentences + ["Measured:"] + details, table_md, figures, seed_reports, wall, len(rep.seeds),
                        pooled[BASE]["surface"].shape[0], f["F2"]["intervals"], seeds_md, suite_line(suites), missing)
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(report)
    summary = {"findings": f, "sentences": sentences, "details": details, "table": table, "wall_time_s": wall,
               "stage_times_s": stage_times, "seeds": list(rep.seeds), "per_seed": seed_rows,
               "units": int(pooled[BASE]["surface"].shape[0]),
               "figures": {k: os.path.relpath(v, out) for k, v in figures.paths.items()},
               "colour_scales": figures.scales, "suites": suites, "not_measured": missing}
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2, default=float)
    return {**summary, "table_md": table_md}


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


def _report_md(cfg: Config, sentences, table_md, figures, seed_reports, wall, seeds, units, f2_intervals=None,
               seeds_md: str = "", suites_md: str = "", missing: list[str] | None = None) -> str:
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
        f"Environment `{env_label(cfg)}` {dict(cfg.env.options)}. Seeds {list(rep.seeds)}; "
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
