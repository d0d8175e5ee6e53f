"""Controls: the study's verdicts on scripted policies whose truth is known, run through the one
evaluator on the slippery corridor and on keypad, where recovery is a distinct skill (paired: same
tasks, same keys).

- Two memoryless noisy oracles that differ only in error rate: better decisions everywhere, no
  recovery skill, so F2 must never read `as_study`.
- Equal clean-state behaviour, but one repairs right after an error: F2 `as_study`.
- A policy against itself: F1 and F2 `inconclusive` (every paired difference is exactly 0).
- F3: the oracle as "BudgetMix" against noisier fixed budgets is `as_study`; a noisy "BudgetMix"
  against the oracle is `opposite`; a policy against itself is `inconclusive`.
"""


import numpy as np
import pytest

from bmrl.eval.evaluate import evaluate
from bmrl.study.findings import compare_findings, f3_intervals
from bmrl.study.verdicts import f3_verdict
from bmrl.rollout import RolloutConfig, oracle_policy
from bmrl.rollout.policies import RepairingOracle
from tests.paths import REPO

POLICIES = {
    "oracle": oracle_policy,
    "eps0.3": RepairingOracle(0.3),  # memoryless (repair = 1 - eps)
    "eps0.1": RepairingOracle(0.1),
    "eps0.2": RepairingOracle(0.2),  # memoryless: 0.8 right after an error, as in clean states
    "eps0.2_repair1": RepairingOracle(0.2, 1.0),  # the same in clean states, always right after an error
}


ENVS = {  # both slip (errors the environment reports); in keypad the right move after an error (delete)
    # is one the oracle never makes in a clean state, in the corridor it is the move before the error
    "corridor": dict(length=4, eps=0.1),
    "keypad": dict(length=4, eps=0.1),
}


@pytest.fixture(scope="module", params=sorted(ENVS))
def results(request, tiny_tokenizer):
    from bmrl.envs import make

    env = make(request.param, tiny_tokenizer, **ENVS[request.param])
    cfg = RolloutConfig(max_turns=10, max_reply_tokens=4, max_len=640)
    tasks = {"seed": np.arange(1, 65, 2, dtype=np.int32)}  # 32 tasks x 8 attempts
    return {name: evaluate(p, env, tasks, ts=[4, 6, 10], ks=[1, 4], attempts=8, rollout_cfg=cfg, key=3, bootstrap=500)
            for name, p in POLICIES.items()}


def _f(results, base, trained):
    return {k: f.to_dict() for k, f in compare_findings(results[base], results[trained], num_resamples=500).items()}


def test_fewer_errors_without_recovery_never_reads_as_recovery(results):
    f = _f(results, "eps0.3", "eps0.1")
    iv = f["F2"]["intervals"]
    assert f["F2"]["verdict"] in ("inconclusive", "opposite"), f["F2"]["sentence"]
    # Both accuracies rise by about 0.2 (0.7 -> 0.9), in clean states and right after an error alike.
    for m in ("delta_clean_accuracy", "delta_recovery_accuracy"):
        assert iv[m]["lower"] > 0.1 and iv[m]["lower"] <= 0.2 <= iv[m]["upper"], (m, iv[m])
    d = iv["recovery_minus_clean"]
    assert d["lower"] <= 0 <= d["upper"], d


def test_repair_after_errors_reads_as_recovery(results):
    f = _f(results, "eps0.2", "eps0.2_repair1")
    iv = f["F2"]["intervals"]
    assert f["F2"]["verdict"] == "as_study", f["F2"]["sentence"]
    # Same keys: both act alike up to their first error, so clean-state accuracy is exactly equal.
    assert iv["delta_clean_accuracy"]["mean"] == iv["delta_clean_accuracy"]["upper"] == 0.0
    assert iv["trained_recovery_accuracy"]["mean"] == 1.0
    assert abs(iv["base_recovery_accuracy"]["mean"] - 0.8) < 0.05
    assert iv["recovery_minus_clean"]["lower"] > 0.1
    assert f["F2"]["shared_states"]["post_error"] >= 100 and f["F2"]["shared_states"]["clean"] >= 500


@pytest.mark.parametrize("name", ["oracle", "eps0.2"])
def test_a_policy_against_itself_is_inconclusive(results, name):
    f = _f(results, name, name)
    assert f["F1"]["verdict"] == "inconclusive" and f["F2"]["verdict"] == "inconclusive"
    g = f["F1"]["intervals"]["gain_large_minus_small"]
    d = f["F2"]["intervals"]["recovery_minus_clean"]
    assert g["lower"] == g["upper"] == 0.0 and d["lower"] == d["upper"] == 0.0
    assert d["num_tasks"] >= 10  # the oracle slips too: post-error states exist, the verdict is not for lack of them


def test_findings_over_several_seeds(results):
    """One evaluation pair per training seed: pooled tasks, intervals over seeds then tasks."""
    one = _f(results, "eps0.2", "eps0.2_repair1")
    two = compare_findings([results["eps0.2"], results["eps0.3"]], [results["eps0.2_repair1"], results["eps0.1"]],
                           num_resamples=500)
    two = {k: f.to_dict() for k, f in two.items()}
    assert two["F2"]["seeds"] == 2 and two["F2"]["intervals"]["recovery_minus_clean"]["num_tasks"] > 32
    both = _f(results, "eps0.3", "eps0.1")["F2"]["shared_states"]["post_error"] + one["F2"]["shared_states"]["post_error"]
    assert two["F2"]["shared_states"]["post_error"] == both
    with pytest.raises(ValueError, match="pairs seeds"):
        compare_findings([results["eps0.2"]], [results["eps0.1"], results["eps0.3"]])


def _f3(results, mix, fixed):
    r = results[mix]
    ivs = f3_intervals(r.per_task, {n: results[n].per_task for n in fixed}, r.ks, num_resamples=300)
    return f3_verdict(ivs)


def test_budgetmix_controls(results):
    good = _f3(results, "oracle", ["eps0.3", "eps0.1"])
    assert good.verdict == "as_study", good.reason
    bad = _f3(results, "eps0.3", ["oracle", "eps0.1"])
    assert bad.verdict == "opposite", bad.reason
    same = _f3(results, "eps0.1", ["eps0.1"])
    assert same.verdict == "inconclusive", same.reason
    assert set(same.intervals) == {"eps0.1/min_pass1", "eps0.1/min_pass4", "eps0.1/area"}


# ---- the command line ----------------------------------------------------------------------------

CONFIG = str(REPO / "configs" / "corridor_tiny.yaml")
SMALL = ["eval.num_tasks=12", "eval.attempts=4", "eval.ks=[1,4]", "eval.bootstrap=100"]


def test_compare_cli_writes_verdicts(tmp_path, capsys):
    import json

    from bmrl.cli import main

    out = tmp_path / "cmp"
    rc = main(["compare", "--config", CONFIG, "--base", "scripted:noisy_oracle:eps=0.2",
               "--trained", "scripted:noisy_oracle:eps=0.2", "--out", str(out), *SMALL])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["findings"]["F1"]["verdict"] == "inconclusive" and s["findings"]["F2"]["verdict"] == "inconclusive"
    assert s["findings"]["F2"]["intervals"]["recovery_minus_clean"]["upper"] == 0.0
    report = (out / "report.md").read_text()
    assert "| F2 | inconclusive |" in report and "What Does Multi-Turn Reinforcement Learning" in report
    assert s["suites"]["disjoint_by"] == "seed" and s["suites"]["overlap"] == 12  # the corridor: two levels
    assert "The test levels repeat training levels" in report


@pytest.mark.parametrize("spec, msg", [
    ("scripted:noisy_oracle", "needs eps"), ("scripted:noisy_oracle:eps=0.1,temp=2", "allowed: eps, repair"),
    ("scripted:greedy", "unknown"), ("scripted:noisy_oracle:eps=x", "not a number"), ("/nonexistent/dir", "neither"),
    ("scripted:noisy_oracle:eps=0.1,repair=2", "repair must be a probability"),
])
def test_compare_cli_bad_spec_exits_2(tmp_path, capsys, spec, msg):
    from bmrl.cli import main

    rc = main(["compare", "--config", CONFIG, "--base", "scripted:oracle", "--trained", spec,
               "--out", str(tmp_path), *SMALL])
    assert rc == 2 and msg in capsys.readouterr().err


def test_compare_cli_with_a_model_run_directory(tmp_path, tiny_tokenizer, capsys):
    """A run directory (its policy/ holds the model) against the oracle. The untrained model's replies do
    not parse, so no post-error state is shared: F2 is inconclusive for lack of states, stored as null."""
    import json

    from bmrl.cli import main
    from bmrl.model import ModelConfig, init_model, save_pretrained

    cfg = ModelConfig.tiny(len(tiny_tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1)
    save_pretrained(init_model(cfg, seed=0), tiny_tokenizer, tmp_path / "run" / "policy")
    out = tmp_path / "cmp"
    rc = main(["compare", "--config", CONFIG, "--base", str(tmp_path / "run"), "--trained", "scripted:oracle",
               "--out", str(out), *SMALL, "rollout.max_len=512"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    f2 = s["findings"]["F2"]
    assert f2["verdict"] == "inconclusive" and f2["shared_states"]["post_error"] == 0
    assert f2["intervals"]["recovery_minus_clean"]["mean"] is None and "only 0 task(s)" in f2["reason"]
    assert s["policies"]["trained"]["decision_accuracy"]["mean"] == 1.0
