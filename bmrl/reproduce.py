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
one level with one seed), paired for differences (the same units for both policies). Each finding is
measured once (`bmrl.study.findings`); its sentences, tables, figure and verdict read that one result
(`bmrl.study.report`, `bmrl.study.figures`).

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

from bmrl import compiles
from bmrl.config import Config, build, check_reproduce, to_dict
from bmrl.rundir import RunDir
from bmrl.study.findings import BASE, GROUPS, pool, study_findings, unit_metrics, without_dead_runs
from bmrl.study.report import dead_runs_md, finding_sentences, per_seed_table, report_md, summary_table, untrainable_bases_md
from bmrl.study.verdicts import group_signal_chance, untrainable_base

# ---- configs of the stages ------------------------------------------------------------------------


def stage_config(cfg: Config, seed: int, out_dir: str, **sections: dict) -> Config:
    """`cfg` with `seed`, `out_dir` and whole sections replaced (validated again)."""
    data = copy.deepcopy(to_dict(cfg))
    data.update(seed=seed, out_dir=out_dir)
    for name, value in sections.items():
        data[name] = {**data[name], **value}
    return build(data)


# ---- the pipeline ---------------------------------------------------------------------------------


def _evaluate_seed(cfg: Config, eval_cfg: Config, seed: int, dirs: dict[str, str], stages, results_path: str) -> None:
    """The evaluation stage of one seed: every policy, its per-seed report, results.json (the stage's
    mark); skipped when results.json exists, made with the same evaluation config."""
    from bmrl.assembly import load_policy, player_class
    from bmrl.eval.report import write_report
    from bmrl.eval.run import evaluate_policies
    from bmrl.eval.saved import load_results, save_results
    from bmrl.eval.settings import EvalSettings
    from bmrl.study.findings import compare_f2

    if load_results(results_path, to_dict(eval_cfg)) is not None:
        return stages.skip(f"seed {seed} - eval", f"done already: {results_path}")
    stages.start(f"seed {seed} - eval", "eval")
    policies = {name: load_policy(path, cfg.model) for name, path in dirs.items()}
    results = evaluate_policies(eval_cfg, policies, EvalSettings.from_config(cfg), log=stages.note)
    stages.note("writing the per-seed report")
    resamples = eval_cfg.eval.bootstrap  # this seed's F2 of every variant against the base, as `bmrl compare` has it
    write_report(eval_cfg.out_dir, results, baseline=BASE, title=f"bmrl reproduce, seed {seed}",
                 settings={"seed": seed, "env": f"{player_class(cfg).report_name(cfg)} {dict(cfg.env.options)}"},
                 f2=partial(compare_f2, num_resamples=resamples) if resamples >= 10 else None)
    save_results(results_path, results, to_dict(eval_cfg))
    stages.finish()


def not_measured(cfg: Config) -> list[str]:
    """What the study could not measure on this env, in sentences (none where the env's states replay)."""
    from bmrl.assembly import player_class

    if player_class(cfg).replays_states:
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
        train = ({"process_coef": float(rep.process[name])} if name in rep.process else {}) | (
            {"advantage": rep.advantage[name]} if name in rep.advantage else {})
        rl_cfgs[name] = stage_config(cfg, seed, os.path.join(sdir, name), model={"path": base_dir},
                                     budget=to_dict(cfg)["reproduce"]["variants"][name], data=data,
                                     **({"train": train} if train else {}))
    return sft_cfg, rl_cfgs, stage_config(cfg, seed, os.path.join(sdir, "eval"), data=data)


def reproduce(cfg: Config, *, log: Callable[[str], Any] = print, stages=None) -> dict:
    """Run the whole study for `cfg`; writes <out_dir>/report.md and summary.json; returns the summary.

    Stages already done are skipped (SFT and RL: their summary.json; evaluation: its results.json,
    made with the same config), so a rerun of a finished run only re-renders the report and figures
    from the saved results. `stages`: a `bmrl.stages.StageProgress` (default: lines on stderr)."""
    from bmrl.eval.saved import load_results
    from bmrl.sft import run_sft
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
    RunDir(out).write_config(cfg)  # process 0 alone writes (bmrl.rundir); every process reads the same files
    names = [BASE] + list(rep.variants)
    stages = stages or StageProgress(0)
    stages.plan((["sft"] + ["rl"] * len(rep.variants) + ["eval"]) * len(rep.seeds))
    old_path = os.path.join(out, "summary.json")
    old_times = {}
    if os.path.isfile(old_path):
        with open(old_path) as fh:
            old_times = json.load(fh).get("stage_times_s", {})
    per_seed, seed_reports, stage_times, seed_results = [], [], {}, []
    health: dict[tuple[int, str], dict] = {}  # (seed, variant) -> the RL run's summary "health"

    def timed(key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one stage; its time is measured when it ran, else the previous summary's."""
        t, before = time.time(), stages.index - stages.skipped
        out = fn(*args)
        ran = stages.index - stages.skipped > before
        stage_times[key] = time.time() - t if ran else old_times.get(key)
        if ran:  # the finished stage's programs leave memory (the next stage reloads its own from the disk cache)
            compiles.release()
        return out

    for seed, (sft_cfg, rl_cfgs, eval_cfg) in plan:
        timed(f"seed{seed}/sft", run_stage, stages, f"seed {seed} - SFT", "sft", partial(run_sft, log=stages.note, on_step=stages.advance), sft_cfg)
        dirs = {BASE: os.path.join(sft_cfg.out_dir, "policy")}
        for name, rl_cfg in rl_cfgs.items():
            done = timed(f"seed{seed}/{name}", run_stage, stages, f"seed {seed} - RL {name}", "rl",
                         partial(train, on_step=stages.step, evaluate=False), rl_cfg)
            health[(seed, name)] = (done or {}).get("health") or {}
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
    summary = _render(cfg, names, per_seed, seed_results, ks, ts, seed_reports, stage_times, health)
    log("\n" + summary["table_md"] + "\n")
    for s in summary["sentences"]:
        log(s)
    log(f"\nreport: {os.path.join(out, 'report.md')} (this run {(time.time() - t0) / 60:.1f} min)")
    return summary


def dead_runs(health: dict[tuple[int, str], dict]) -> list[dict]:
    """Every RL run its training flagged as dead (`bmrl.learn.health`): seed, variant, each flag (kind, first
    step, reason) and whether it still held at the run's last step."""
    return [{"seed": seed, "variant": name, "flags": h["flags"], "still_at_end": bool(h.get("still_at_end"))}
            for (seed, name), h in health.items() if h.get("dead")]


def untrainable_bases(per_seed: list[dict], seeds: list[int], ks, group_size: int) -> list[dict]:
    """The seeds whose SFT base RL cannot learn from (`bmrl.study.verdicts.UNTRAINABLE_BASE_RULE`): seed, the
    base's held-out Pass@(1,T) at the largest T and the chance a task group carries signal. Empty when the
    grid has no K=1."""
    if 1 not in ks:
        return []
    out = []
    for seed, units in zip(seeds, per_seed):
        p = float(np.nanmean(np.asarray(units[BASE]["surface"])[:, list(ks).index(1), -1]))
        if untrainable_base(p, group_size):
            out.append({"seed": int(seed), "pass1": p, "signal_chance": group_signal_chance(p, group_size)})
    return out


def _render(cfg: Config, names: list[str], per_seed: list[dict], seed_results: list[dict], ks, ts,
            seed_reports: list[str], stage_times: dict, health: dict[tuple[int, str], dict] | None = None) -> dict:
    """Findings, verdicts, table, figures, report.md and summary.json from the per-seed results; `health`:
    {(seed, variant): the RL run's summary "health"} (the dead runs each verdict is checked without)."""
    from bmrl.assembly import player_class, suite_line, suite_summary
    from bmrl.study.figures import study_figures

    rep, out = cfg.reproduce, cfg.out_dir
    pooled = pool(per_seed, names)
    resamples = max(cfg.eval.bootstrap, 200)
    study = study_findings(pooled, seed_results, names, ks, ts, rep, resamples)
    dead = dead_runs(health or {})
    weak = untrainable_bases(per_seed, rep.seeds, ks, cfg.train.group_size)
    untrainable = [(w["seed"], v) for w in weak for v in rep.variants]
    flagged = {(w["seed"], v): f"its SFT base is one RL cannot learn from (Pass@(1,{max(ts)}) {w['pass1']:.3f}: "
               f"{w['signal_chance']:.2f} of groups of {cfg.train.group_size} carry signal)"
               for w in weak for v in rep.variants}
    flagged.update({(r["seed"], r["variant"]): r["flags"][0]["reason"] for r in dead})
    study = without_dead_runs(study, flagged, rep.seeds, per_seed, seed_results, names, ks, ts, rep, resamples,
                              untrainable=untrainable)
    sentences = [f.sentence() for f in study.findings]
    details = finding_sentences(study, rep)
    table_md, table = summary_table(pooled, study, names, ks, ts)
    groups = pooled[GROUPS]["surface"] if len(per_seed) > 1 else None
    figures = study_figures(out, pooled, study, names, ks, ts, rep.generous, resamples, BASE, groups)
    seeds_md, seed_rows = per_seed_table(per_seed, seed_results, rep.seeds, rep, ks, ts)
    data_cfg = stage_config(cfg, cfg.seed, out, data={"data_dir": study_data_dir(cfg)})
    suites = suite_summary(data_cfg)  # how the test levels were held out; overlap with training levels
    wall = sum(v for v in stage_times.values() if v is not None)
    missing = not_measured(cfg)
    report = report_md(cfg, player_class(cfg).report_name(cfg), sentences + ["Measured:"] + details, table_md, figures, seed_reports, wall, len(rep.seeds),
                       pooled[BASE]["surface"].shape[0], study, seeds_md, suite_line(suites), missing,
                       dead_runs_md(dead, len(rep.seeds) * len(rep.variants))
                       + untrainable_bases_md(weak, len(rep.seeds), cfg.train.group_size))
    run_dir = RunDir(out)
    run_dir.write_text("report.md", report)
    summary = {"findings": study.to_dict(), "sentences": sentences, "details": details, "table": table, "wall_time_s": wall,
               "stage_times_s": stage_times, "seeds": list(rep.seeds), "per_seed": seed_rows,
               "units": int(pooled[BASE]["surface"].shape[0]),
               "figures": {k: os.path.relpath(v, out) for k, v in figures.paths.items()},
               "colour_scales": figures.scales, "suites": suites, "not_measured": missing, "dead_runs": dead,
               "untrainable_bases": weak}
    run_dir.write_json("summary.json", summary, default=float)
    return {**summary, "table_md": table_md}


