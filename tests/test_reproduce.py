"""`bmrl reproduce`: findings and their intervals on synthetic per-task data, stage configs, errors."""

import dataclasses
import json
import os
import re

import numpy as np
import pytest

from bmrl.cli import main
from bmrl.config import load
from bmrl.eval.bootstrap import NAN_INTERVAL, mean_interval
from bmrl.eval.streams import STREAMS
from bmrl.study.findings import BASE, F2_MEASURES, LEVELS, ON_POLICY, Finding, Study, f1_finding, f3_finding
from bmrl.study.report import finding_sentences, summary_table
from bmrl.study.verdicts import f2_verdict
from bmrl.reproduce import stage_config
from bmrl.stages import StageProgress, run_stage

KS, TS = (1, 2), (4, 8)


def _unit(rng, n, p_small, p_large, acc, rec):
    """Per-task arrays of one policy: Pass@(1,T) ~ Bernoulli rates at T=4 and T=8."""
    s = np.zeros((n, len(KS), len(TS)))
    s[:, 0, 0] = rng.random(n) < p_small
    s[:, 0, 1] = np.maximum(s[:, 0, 0], rng.random(n) < (p_large - p_small) / (1 - p_small))  # P = p_large
    s[:, 1] = np.minimum(1.0, s[:, 0] * 1.5)
    return {"surface": s, "decision_accuracy": np.clip(acc + 0.02 * rng.standard_normal(n), 0, 1),
            "recovery": np.where(rng.random(n) < 0.2, np.nan, np.clip(rec + 0.05 * rng.standard_normal(n), 0, 1))}


@pytest.fixture
def rep():
    return load(None, ["reproduce.small_t=4", "eval.ts=[4,8]", "eval.ks=[1,2]", "eval.attempts=2",
                       "rollout.max_turns=8", "budget.budgets=[8]",
                       "reproduce.variants={fixed_long: {kind: fixed, budgets: [8]}, fixed_short: {kind: fixed, budgets: [4]},"
                       " budgetmix: {kind: mix, budgets: [4, 8]}}"]).reproduce


def _study(pooled, rep, resamples):
    """The study's F1, F3, on-policy changes and levels from synthetic per-task data (no episodes, so
    F2's paired states are not measured: an undefined F2)."""
    k1 = KS.index(1)
    names = list(pooled)
    f1 = f1_finding(pooled[BASE]["surface"][:, k1, :], {n: pooled[n]["surface"][:, k1, :] for n in names if n != BASE},
                    TS, main=rep.generous, small_t=rep.small_t, num_resamples=resamples)
    gen, base = pooled[rep.generous], pooled[BASE]
    on = {out: mean_interval(gen[m] - base[m], key=STREAMS[out], num_resamples=resamples) for m, out in ON_POLICY if m in gen}
    ivs = {m: NAN_INTERVAL for m in F2_MEASURES}
    f2 = Finding(f2_verdict(NAN_INTERVAL, NAN_INTERVAL, NAN_INTERVAL), ivs, levels=on)
    f3 = f3_finding({n: pooled[n]["surface"] for n in names}, rep.budgetmix, (rep.generous, rep.tight), KS,
                    num_resamples=resamples)
    levels = {n: {m: mean_interval(pooled[n][m], key=STREAMS["level"], num_resamples=resamples) for m in LEVELS if m in pooled[n]}
              for n in names}
    return Study(f1, f2, f3, levels)


def test_findings_recover_a_known_effect(rep):
    """RL gains 0.4 at T=8 but 0.05 at T=4, through recovery (+0.4) not decisions (+0.01)."""
    rng = np.random.default_rng(0)
    n = 400
    pooled = {
        BASE: _unit(rng, n, 0.20, 0.40, 0.70, 0.30),
        "fixed_long": _unit(rng, n, 0.25, 0.80, 0.71, 0.70),
        "fixed_short": _unit(rng, n, 0.35, 0.60, 0.72, 0.40),
        "budgetmix": _unit(rng, n, 0.35, 0.80, 0.72, 0.70),
    }
    study = _study(pooled, rep, resamples=300)
    f = study.to_dict()
    assert f["gain_large"]["lower"] > 0.3 and f["gain_small"]["upper"] < 0.15
    assert f["gain_large_minus_small"]["lower"] > 0.2 and f["F1"]["verdict"] == "as_study"
    assert abs(f["delta_decision_accuracy"]["mean"] - 0.01) < 0.01
    assert abs(f["delta_recovery"]["mean"] - 0.40) < 0.03
    assert f["min_pass1"]["budgetmix"]["mean"] > f["min_pass1"]["fixed_long"]["mean"]
    assert f["mix_minus"]["fixed_long"]["area"]["lower"] > 0
    s1, s2, s3 = finding_sentences(study, rep)
    assert "shrinks when the budget is tight" in s1 and "at T=8 and by" in s1 and "at T=4;" in s1
    assert study.f1.intervals["gain_large_minus_small"].format(signed=True) in s1
    assert "on-policy" in s2 and "F2's verdict" in s2
    assert "BudgetMix" in s3 and f["mix_minus"]["fixed_long"]["area"]["mean"] > 0
    table, rows = summary_table(pooled, study, list(pooled), KS, TS)
    assert table.count("\n") == 1 + len(pooled)
    assert rows["fixed_long"]["pass1_T8"] == pytest.approx(pooled["fixed_long"]["surface"][:, 0, 1].mean())
    assert rows["fixed_long"]["decision_accuracy"] == study.levels["fixed_long"]["decision_accuracy"].to_dict()


def test_findings_say_when_there_is_no_effect(rep):
    rng = np.random.default_rng(1)
    same = _unit(rng, 200, 0.3, 0.6, 0.7, 0.5)
    pooled = {name: same for name in (BASE, "fixed_long", "fixed_short", "budgetmix")}
    study = _study(pooled, rep, resamples=200)
    f = study.to_dict()
    assert f["gain_large"]["mean"] == 0 and f["gain_small"]["mean"] == 0
    s1, s2, s3 = finding_sentences(study, rep)
    assert "not distinguishable" in s1 and study.f1.verdict.verdict == "inconclusive"


def test_stage_configs_and_skipping(tmp_path):
    cfg = load("configs/quickstart.yaml", [f"out_dir={tmp_path}"])
    rl = stage_config(cfg, 3, str(tmp_path / "rl"), model={"path": "/some/policy"},
                      budget={"kind": "mix", "budgets": [4, 8], "probs": None})
    assert rl.seed == 3 and rl.model.path == "/some/policy" and rl.budget.kind == "mix"
    assert rl.train == cfg.train and rl.eval == cfg.eval
    os.makedirs(rl.out_dir)
    with open(os.path.join(rl.out_dir, "summary.json"), "w") as f:
        json.dump({"done": 1}, f)
    calls, lines = [], []
    stages = StageProgress(1, write=lines.append)
    assert run_stage(stages, "x", "rl", lambda c: calls.append(c) or {}, rl) == {"done": 1}
    assert not calls and stages.skipped == 1 and lines[0].startswith("[stage 1/1] x - skipped (done already")


@pytest.mark.parametrize("override, key", [
    ("reproduce.small_t=7", "reproduce.small_t"),
    ("reproduce.generous=nope", "reproduce.generous"),
    ("reproduce.variants.budgetmix.probs=[0.5,0.6]", "reproduce.variants.budgetmix.probs"),
    ("reproduce.seeds=[]", "reproduce.seeds"),
])
def test_bad_reproduce_config_exits_2_and_writes_nothing(tmp_path, capsys, override, key):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        main(["reproduce", "--config", "configs/quickstart.yaml", f"out_dir={out}", override])
    assert e.value.code == 2
    assert key in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer):
    """Scripted policies evaluated on the same 24 corridor tasks, T in {4, 5, 8}: a memoryless noisy
    oracle (the base), the same that always repairs after an error, a less noisy one, the oracle (all
    `RepairingOracle`s: one compiled program)."""
    from bmrl.envs import make
    from bmrl.eval.evaluate import evaluate
    from bmrl.rollout import RolloutConfig
    from bmrl.rollout.policies import RepairingOracle

    env = make("corridor", tiny_tokenizer, length=4, eps=0.1)
    rcfg = RolloutConfig(max_turns=8, max_reply_tokens=6, max_len=512)
    tasks = {"seed": np.arange(1, 49, 2, dtype=np.int32)}
    policies = {BASE: RepairingOracle(0.4), "fixed_long": RepairingOracle(0.4, 1.0), "fixed_short": RepairingOracle(0.2),
                "budgetmix": RepairingOracle(0.0, 1.0)}
    return {n: evaluate(p, env, tasks, ts=(4, 5, 8), ks=(1, 4), attempts=4, rollout_cfg=rcfg, key=0, bootstrap=50)
            for n, p in policies.items()}


def test_pipeline_verdicts_from_real_evaluations(rep, scripted):
    """The verdicts `reproduce` writes, from evaluations of scripted policies: a policy against itself
    is inconclusive on every finding; an oracle as "BudgetMix" beats noisy fixed budgets (F3)."""
    from bmrl.study.findings import pool, study_findings, unit_metrics
    from bmrl.study.verdicts import RULES

    noisy = scripted[BASE]
    for results, expect in (
        ({BASE: noisy, "fixed_long": noisy, "fixed_short": noisy, "budgetmix": noisy},
         {"F1": "inconclusive", "F2": "inconclusive", "F3": "inconclusive"}),
        ({BASE: noisy, "fixed_long": noisy, "fixed_short": noisy, "budgetmix": scripted["budgetmix"]}, {"F3": "as_study"}),
    ):
        pooled = pool([{n: unit_metrics(r) for n, r in results.items()}], list(results))
        v = study_findings(pooled, [results], list(results), (1, 4), (4, 5, 8), rep, resamples=200).to_dict()
        assert {k: v[k]["verdict"] for k in expect} == expect
        for k in ("F1", "F2", "F3"):  # the rule is stored with its verdict; the sentence is made from it
            assert v[k]["rule"] == RULES[k] and v[k]["sentence"].startswith(f"{k}: ")
            assert ("as the study found" in v[k]["sentence"]) == (v[k]["verdict"] == "as_study")

def test_a_variant_with_another_advantage_gets_f1s_rule_too(rep, scripted):
    """`reproduce.advantage` marks a variant trained with another estimator (GiGPO): F1's rule is applied to its own
    gains, as to the generous budget's: a policy equal to the base is inconclusive, one that recovers from its
    errors (a gain at the large T, none possible at the smallest) is as the study found; the report says which."""
    import dataclasses

    from bmrl.study.findings import f1_finding, pool, study_findings, unit_metrics

    noisy = scripted[BASE]
    results = {BASE: noisy, "fixed_long": noisy, "fixed_short": noisy, "budgetmix": scripted["fixed_long"]}
    pooled = pool([{n: unit_metrics(r) for n, r in results.items()}], list(results))
    credit = dataclasses.replace(rep, advantage={"budgetmix": "gigpo", "fixed_short": "gigpo"})
    study = study_findings(pooled, [results], list(results), (1, 4), (4, 5, 8), credit, resamples=200)
    k1 = 0
    want = f1_finding(pooled[BASE]["surface"][:, k1, :], {"budgetmix": pooled["budgetmix"]["surface"][:, k1, :]},
                      (4, 5, 8), main="budgetmix", small_t=credit.small_t, num_resamples=200)
    got = study.advantage_f1
    assert {n: f.verdict.verdict for n, f in got.items()} == {"budgetmix": "as_study", "fixed_short": "inconclusive"}
    assert got["budgetmix"].intervals == want.intervals
    assert study.to_dict()["advantage_F1"]["budgetmix"]["verdict"] == "as_study"
    sentences = finding_sentences(study, credit)
    assert len(sentences) == 5 and "with gigpo advantages (budgetmix)" in sentences[3]
    assert "F1's rule: as_study" in sentences[3] and "F1's rule: inconclusive" in sentences[4]
    assert "advantage_F1" not in study_findings(pooled, [results], list(results), (1, 4), (4, 5, 8), rep, 200).to_dict()


INTERVAL = re.compile(r"([+-]?\d+\.\d{3}) \[([+-]?\d+\.\d{3}), ([+-]?\d+\.\d{3})\]")


def test_report_reads_each_finding_once(tmp_path, scripted):
    """reproduce.small_t=5 inside the grid T in {4, 5, 8}: report.md's F1 verdict, its measured sentence,
    the per-seed table and summary.json all use T=5; every number shown with an interval has the same
    interval wherever report.md shows it; the F2 figure's bars are F2's paired accuracies. The report is
    assembled as a rerun re-renders it, here from scripted policies' evaluations (known effects)."""
    from bmrl.reproduce import _render
    from bmrl.study.findings import unit_metrics

    cfg = load("configs/quickstart.yaml", [f"out_dir={tmp_path}", "eval.ts=[4,5,8]", "eval.ks=[1,4]", "eval.attempts=4",
                                           "eval.num_tasks=24", "reproduce.small_t=5", "eval.bootstrap=200"])
    results = scripted
    s = _render(cfg, list(results), [{n: unit_metrics(r) for n, r in results.items()}],
                [{n: results[n] for n in (BASE, "fixed_long")}], (1, 4), (4, 5, 8), [], {})
    report = (tmp_path / "report.md").read_text()
    f = s["findings"]
    g = f["F1"]["intervals"]["gain_large_minus_small"]
    assert (f["F1"]["T_small"], f["T_small"], f["T_large"]) == (5, 5, 8) and f["gain_large_minus_small"] == g
    shown = f"{g['mean']:+.3f} [{g['lower']:+.3f}, {g['upper']:+.3f}]"
    assert f"the gain at T=8 minus the gain at T=5 is {shown}" in s["sentences"][0]
    assert f"at T=5; the gain at T=8 minus the gain at T=5 is {shown}" in s["details"][0]
    assert "T=4" not in s["sentences"][0] + s["details"][0] and report.count(shown) == 2
    assert s["per_seed"][0]["G"] == pytest.approx(g["mean"]) and "| F1: G (T=8 - T=5) |" in report
    assert f["mix_minus"] == f["F3"]["intervals"] and f["F3"]["verdict"] == "as_study"
    seen: dict[str, set] = {}
    for est, lo, hi in INTERVAL.findall(report):
        seen.setdefault(est, set()).add((lo, hi))
    assert len(seen) >= 20 and {e: v for e, v in seen.items() if len(v) > 1} == {}
    iv = f["F2"]["intervals"]  # the F2 figure's bars: accuracy on the shared states, differing by dClean, dRec
    for kind, d in (("clean", "delta_clean_accuracy"), ("recovery", "delta_recovery_accuracy")):
        bars = iv[f"paired_trained_{kind}_accuracy"]["mean"] - iv[f"paired_base_{kind}_accuracy"]["mean"]
        assert bars == pytest.approx(iv[d]["mean"])
    assert iv["delta_recovery_accuracy"]["lower"] > 0 and "the difference of the bars is F2's dClean" in report


def test_planted_dead_run_is_listed_and_each_verdict_checked_without_it(tmp_path, scripted):
    """Three seeds of known effects (BudgetMix = the oracle: F3 as_study). A dead BudgetMix run planted in
    seed 2: report.md and summary.json list it; F3 holds without it (seeds 0, 1 alone agree), F1 and F2 read
    no dead run. A control where the dead run carries the verdict: BudgetMix no better than the base in seeds
    0 and 1, the oracle only in the dead seed 2: F3 changes without it (inconclusive -> opposite), and says so."""
    from bmrl.reproduce import _render
    from bmrl.study.findings import pool, study_findings, unit_metrics, without_dead_runs

    cfg = load("configs/quickstart.yaml", [f"out_dir={tmp_path}", "eval.ts=[4,5,8]", "eval.ks=[1,4]", "eval.attempts=4",
                                           "eval.num_tasks=24", "eval.bootstrap=200", "reproduce.seeds=[0,1,2]"])
    names = list(scripted)
    units = {n: unit_metrics(r) for n, r in scripted.items()}
    pair = {n: scripted[n] for n in (BASE, "fixed_long")}
    reason = "no group's rewards differed for 5 steps in a row"
    health = {(s, n): {} for s in (0, 1, 2) for n in names[1:]}
    health[(2, "budgetmix")] = {"dead": True, "still_at_end": True,
                                "flags": [{"kind": "no_signal", "step": 3, "reason": reason}]}
    s = _render(cfg, names, [units] * 3, [pair] * 3, (1, 4), (4, 5, 8), [], {}, health)
    f = s["findings"]
    assert s["dead_runs"] == [{"seed": 2, "variant": "budgetmix", "flags": health[(2, "budgetmix")]["flags"],
                               "still_at_end": True}]
    w3 = f["F3"]["without_dead_runs"]
    assert f["F3"]["verdict"] == "as_study" and w3["holds"] is True and w3["seeds_without"] == [0, 1]
    assert w3["dead_runs"] == [{"seed": 2, "variant": "budgetmix", "reason": reason}]
    assert "It holds without the dead run(s) (seed 2 budgetmix): on seeds 0, 1 alone" in s["sentences"][2]
    for k in ("F1", "F2"):
        assert f[k]["without_dead_runs"]["dead_runs"] == [] and "None of the runs it reads is dead." in f[k]["sentence"]
    report = (tmp_path / "report.md").read_text()
    assert "## Runs that lost their signal" in report and "1 of the 9 RL runs lost their signal" in report
    assert f"- seed 2 `budgetmix`: dead since step 3: {reason}" in report
    assert json.loads((tmp_path / "summary.json").read_text())["dead_runs"] == s["dead_runs"]
    assert s["untrainable_bases"] == [] and "RL can learn from each of the 3 SFT bases." in report  # the control

    # The control: the verdict rests on the dead run.
    per_seed = [{**units, "budgetmix": units[BASE]}] * 2 + [units]
    study = study_findings(pool(per_seed, names), [pair] * 3, names, (1, 4), (4, 5, 8), cfg.reproduce, 200)
    checked = without_dead_runs(study, {(2, "budgetmix"): reason}, [0, 1, 2], per_seed, [pair] * 3, names, (1, 4),
                                (4, 5, 8), cfg.reproduce, 200)
    w3 = checked.f3.facts["without_dead_runs"]
    assert (checked.f3.verdict.verdict, w3["verdict_without"], w3["holds"]) == ("inconclusive", "opposite", False)
    assert "It does not hold without the dead run(s) (seed 2 budgetmix): on seeds 0, 1 alone the verdict is opposite." \
        in checked.f3.sentence()
    every = without_dead_runs(study, {(s, "fixed_long"): reason for s in (0, 1, 2)}, [0, 1, 2], per_seed, [pair] * 3,
                              names, (1, 4), (4, 5, 8), cfg.reproduce, 200)
    assert every.f1.facts["without_dead_runs"]["holds"] is None and "rests on dead runs" in every.f1.sentence()

    # F1's rule on a `reproduce.advantage` variant is checked the same way (budgetmix read as one here): its dead
    # run named, its verdict measured again on seeds 0 and 1, as the study of those seeds gives it, and said.
    from bmrl.study.report import _advantage_sentence

    rep = dataclasses.replace(cfg.reproduce, advantage={"budgetmix": "gigpo"})
    study = study_findings(pool(per_seed, names), [pair] * 3, names, (1, 4), (4, 5, 8), rep, 200)
    checked = without_dead_runs(study, {(2, "budgetmix"): reason}, [0, 1, 2], per_seed, [pair] * 3, names, (1, 4),
                                (4, 5, 8), rep, 200)
    adv = checked.advantage_f1["budgetmix"]
    w = adv.facts["without_dead_runs"]
    assert w["dead_runs"] == [{"seed": 2, "variant": "budgetmix", "reason": reason}] and w["seeds_without"] == [0, 1]
    alone = study_findings(pool(per_seed[:2], names), [pair] * 2, names, (1, 4), (4, 5, 8), rep, 200)
    assert w["verdict_without"] == alone.advantage_f1["budgetmix"].verdict.verdict
    assert w["holds"] == (w["verdict_without"] == adv.verdict.verdict)
    assert "without the dead run(s) (seed 2 budgetmix)" in _advantage_sentence("budgetmix", adv, rep)
    assert checked.f1.facts["without_dead_runs"]["dead_runs"] == []  # the core F1 reads fixed_long only


def test_a_base_rl_cannot_learn_from_counts_its_seeds_runs_as_dead(tmp_path, scripted):
    """Seed 1's base planted as one that never succeeds: listed under "SFT bases RL cannot learn from" (the
    written rule: fewer than half of the task groups carry signal), every RL run of seed 1 counts as dead,
    and each verdict is checked on seeds 0 and 2 alone. The scripted bases of seeds 0 and 2 are not flagged."""
    from bmrl.reproduce import _render, untrainable_bases
    from bmrl.study.findings import unit_metrics
    from bmrl.study.verdicts import group_signal_chance, untrainable_base

    assert untrainable_base(0.03, 8) and untrainable_base(0.97, 8) and not untrainable_base(0.3, 8)
    assert group_signal_chance(0.5, 2) == pytest.approx(0.5) and group_signal_chance(0.0, 8) == 0.0
    cfg = load("configs/quickstart.yaml", [f"out_dir={tmp_path}", "eval.ts=[4,5,8]", "eval.ks=[1,4]", "eval.attempts=4",
                                           "eval.num_tasks=24", "eval.bootstrap=200", "reproduce.seeds=[0,1,2]"])
    names = list(scripted)
    units = {n: unit_metrics(r) for n, r in scripted.items()}
    failing = {**units, BASE: {**units[BASE], "surface": np.zeros_like(units[BASE]["surface"])}}
    per_seed, pair = [units, failing, units], {n: scripted[n] for n in (BASE, "fixed_long")}
    g = cfg.train.group_size
    assert [b["seed"] for b in untrainable_bases(per_seed, [0, 1, 2], (1, 4), g)] == [1]
    s = _render(cfg, names, per_seed, [pair] * 3, (1, 4), (4, 5, 8), [], {}, {})
    assert s["untrainable_bases"] == [{"seed": 1, "pass1": 0.0, "signal_chance": 0.0}] and s["dead_runs"] == []
    for k, reads in (("F1", ["fixed_long"]), ("F3", ["budgetmix", "fixed_long", "fixed_short"])):
        w = s["findings"][k]["without_dead_runs"]
        assert w["seeds_without"] == [0, 2] and sorted(r["variant"] for r in w["dead_runs"]) == reads
        assert all(r["seed"] == 1 and r["untrainable_base"] for r in w["dead_runs"])
    assert "(seed 1 fixed_long (untrainable base))" in s["sentences"][0]
    report = (tmp_path / "report.md").read_text()
    assert "## SFT bases RL cannot learn from" in report and "1 of the 3 SFT bases are ones RL cannot learn from" in report
    assert f"- seed 1: held-out Pass@(1,T) at the largest T 0.000; 0.00 of task groups of {g} are expected" in report
