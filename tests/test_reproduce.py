"""`bmrl reproduce`: findings and their intervals on synthetic per-task data, stage configs, errors."""

import json
import os

import numpy as np
import pytest

from bmrl.cli import main
from bmrl.config import load
from bmrl.eval.findings import BASE, findings
from bmrl.eval.study_report import finding_sentences, summary_table
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
    f = findings(pooled, KS, TS, rep, resamples=300)
    assert f["gain_large"]["lower"] > 0.3 and f["gain_small"]["upper"] < 0.15
    assert f["gain_large_minus_small"]["lower"] > 0.2
    assert abs(f["delta_decision_accuracy"]["mean"] - 0.01) < 0.01
    assert abs(f["delta_recovery"]["mean"] - 0.40) < 0.03
    assert f["min_pass1"]["budgetmix"]["mean"] > f["min_pass1"]["fixed_long"]["mean"]
    assert f["mix_minus"]["fixed_long"]["area"]["lower"] > 0
    s1, s2, s3 = finding_sentences(f, rep)
    assert "shrinks when the budget is tight" in s1
    assert "more in recovery than in single decisions" in s2
    assert "BudgetMix" in s3
    table, rows = summary_table(pooled, list(pooled), KS, TS, resamples=100)
    assert table.count("\n") == 1 + len(pooled)
    assert rows["fixed_long"]["pass1_T8"] == pytest.approx(pooled["fixed_long"]["surface"][:, 0, 1].mean())


def test_findings_say_when_there_is_no_effect(rep):
    rng = np.random.default_rng(1)
    same = _unit(rng, 200, 0.3, 0.6, 0.7, 0.5)
    pooled = {name: same for name in (BASE, "fixed_long", "fixed_short", "budgetmix")}
    f = findings(pooled, KS, TS, rep, resamples=200)
    assert f["gain_large"]["mean"] == 0 and f["gain_small"]["mean"] == 0
    s1, s2, s3 = finding_sentences(f, rep)
    assert "not distinguishable" in s1
    assert "neither change clearly dominates" in s2


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


def test_pipeline_verdicts_from_real_evaluations(rep, tiny_tokenizer):
    """The verdicts `reproduce` writes, from evaluations of scripted policies: a policy against itself
    is inconclusive on every finding; an oracle as "BudgetMix" beats noisy fixed budgets (F3)."""
    from bmrl.envs import make
    from bmrl.eval.evaluate import evaluate
    from bmrl.eval.findings import pool, unit_metrics, verdicts
    from bmrl.rollout import RolloutConfig, make_noisy_oracle, oracle_policy

    env = make("corridor", tiny_tokenizer, length=4, eps=0.1)
    cfg = RolloutConfig(max_turns=8, max_reply_tokens=6, max_len=512)
    tasks = {"seed": np.arange(1, 49, 2, dtype=np.int32)}

    def ev(policy):
        return evaluate(policy, env, tasks, ts=TS, ks=KS, attempts=4, rollout_cfg=cfg, key=0, bootstrap=100)

    noisy = ev(make_noisy_oracle(0.3))
    for results, expect in (
        ({BASE: noisy, "fixed_long": noisy, "fixed_short": noisy, "budgetmix": noisy},
         {"F1": "inconclusive", "F2": "inconclusive", "F3": "inconclusive"}),
        ({BASE: noisy, "fixed_long": noisy, "fixed_short": noisy, "budgetmix": ev(oracle_policy)}, {"F3": "as_study"}),
    ):
        pooled = pool([{n: unit_metrics(r) for n, r in results.items()}], list(results))
        v = verdicts([results], pooled, KS, rep, resamples=200)
        assert {k: v[k]["verdict"] for k in expect} == expect
        from bmrl.eval.verdicts import RULES

        for k in ("F1", "F2", "F3"):  # the rule is stored with its verdict; the sentence is made from it
            assert v[k]["rule"] == RULES[k] and v[k]["sentence"].startswith(f"{k}: ")
            assert ("as the study found" in v[k]["sentence"]) == (v[k]["verdict"] == "as_study")
