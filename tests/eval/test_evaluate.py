"""The evaluation harness with a real (tiny, steered) language-model policy: one compile for the
whole grid, exact == truncate exactly when the budget is hidden, the warning when it is shown,
attempts that differ, the report and `bmrl eval` (whose F2 is `bmrl compare`'s)."""

import functools
import json
import os

import numpy as np
import pytest
import yaml

from bmrl.envs import make
from bmrl.rollout import make_noisy_oracle, oracle_policy
from bmrl.eval.evaluate import _truncate, evaluate
from bmrl.eval.bootstrap import Interval
from bmrl.eval.report import write_report
from bmrl.rollout import RolloutConfig, default_format
from bmrl.sampling import SamplingConfig
from tests.rollout_helpers import steered_policy

TS, KS, ATTEMPTS = [2, 4, 6], [1, 2], 3
TASKS = {"seed": np.arange(1, 13, 2, dtype=np.int32)}  # 6 tasks


def _cfg(max_len):
    # A max_len no other test uses, so the compile count starts from zero here.
    return RolloutConfig(max_turns=6, max_reply_tokens=5, max_len=max_len, sampling=SamplingConfig(temperature=1.0))


def test_one_compile_exact_equals_truncate_and_attempts_differ(tiny_tokenizer):
    env = make("corridor", tiny_tokenizer, length=3, eps=0.2)
    policy = steered_policy(env, default_format(env), seed=2, scale=3.0, noise=0.5)
    cfg = _cfg(509)
    exact = evaluate(policy, env, TASKS, ts=TS, ks=KS, attempts=ATTEMPTS, rollout_cfg=cfg, key=5, mode="exact", bootstrap=100)
    assert exact.compiles == 1  # 6 x 3 x 3 rows in 3 chunks of 18: one program for the whole grid
    trunc = evaluate(policy, env, TASKS, ts=TS, ks=KS, attempts=ATTEMPTS, rollout_cfg=cfg, key=5, mode="truncate", bootstrap=100)
    assert trunc.compiles == 0  # the same program and shape
    # Budget hidden + per-(task, attempt) keys: the cap-T run is the first T turns of the cap-6 run.
    np.testing.assert_array_equal(exact.first_success_turn, trunc.first_success_turn)
    np.testing.assert_array_equal(exact.surface.estimate, trunc.surface.estimate)
    np.testing.assert_array_equal(exact.episodes.action, trunc.episodes.action)
    for j, t in enumerate(TS):  # every cap-T row acted exactly as the first T turns of its cap-6 row
        np.testing.assert_array_equal(exact.grid_action[:, :, j, :t], exact.grid_action[:, :, -1, :t])
        np.testing.assert_array_equal(exact.grid_logprob[:, :, j, :t], exact.grid_logprob[:, :, -1, :t])
    assert exact.warnings == [] and exact.episodes.success.any() and not exact.episodes.success.all()
    # Attempts of one task sample differently (each attempt has its own key): with an unbiased coin
    # between left and right (the steered policy without noise), no two attempts of a task agree.
    coin = steered_policy(env, default_format(env), seed=2, scale=3.0)
    flips = evaluate(coin, env, TASKS, ts=TS, ks=KS, attempts=ATTEMPTS, rollout_cfg=cfg, key=5, bootstrap=0)
    assert flips.compiles == 0  # new parameters, same program
    acts = flips.grid_action[:, :, -1]
    assert all(len({a.tobytes() for a in acts[i]}) == ATTEMPTS for i in range(acts.shape[0]))
    # Chunking is invisible: 7-row chunks (last one padded) give the same attempts.
    both = evaluate(policy, env, TASKS, ts=TS, ks=KS, attempts=ATTEMPTS, rollout_cfg=cfg, key=5, mode="both",
                    bootstrap=100, chunk_size=7)
    np.testing.assert_array_equal(both.first_success_turn, exact.first_success_turn)
    assert both.max_abs_difference == 0.0
    # Per-task Pass@(1,T) is the share of successful attempts; the surface is monotone in K.
    np.testing.assert_allclose(exact.per_task[:, 0, :], (exact.first_success_turn > 0).mean(1))
    assert np.all(exact.surface.estimate[1] >= exact.surface.estimate[0] - 1e-12)
    assert np.all(exact.surface.lower <= exact.surface.estimate + 1e-12)


def test_shown_budget_warns_and_exact_differs_from_truncation(tiny_tokenizer):
    env = make("corridor", tiny_tokenizer, length=3, eps=0.2, show_budget=True)
    policy = steered_policy(env, default_format(env), seed=2, scale=3.0, noise=0.5)
    with pytest.warns(UserWarning, match="truncat"):
        r = evaluate(policy, env, TASKS, ts=TS, ks=KS, attempts=ATTEMPTS, rollout_cfg=_cfg(511), key=5, mode="both", bootstrap=100)
    assert r.show_budget and any("show_budget" in w for w in r.warnings)
    # The policy reads "Turns left: N", so a cap-T run is not the first turns of the cap-6 run: the same
    # keys, but other observations and other reply probabilities (the tiny policy reacts only a little
    # to the number, so its actions and the surfaces may still coincide).
    diff = np.abs(r.grid_logprob[:, :, 1, :4] - r.grid_logprob[:, :, -1, :4])
    assert diff.max() > 1e-5, diff.max()
    np.testing.assert_allclose(r.surface_truncate.estimate[0], (_truncate(r.first_success_turn[:, :, -1], TS) > 0).mean((0, 1)), atol=1e-12)
    assert r.max_abs_difference is not None and r.to_dict()["max_abs_exact_minus_truncate"] == r.max_abs_difference


def test_bad_arguments_are_refused(tiny_tokenizer):
    env = make("corridor", tiny_tokenizer, length=3)
    cfg = _cfg(512)
    kw = dict(ks=[1], attempts=2, rollout_cfg=cfg, key=0)
    with pytest.raises(ValueError, match="max_turns=6"):
        evaluate(oracle_policy, env, TASKS, ts=[2, 7], **kw)
    with pytest.raises(ValueError, match="attempts=2"):
        evaluate(oracle_policy, env, TASKS, ts=[2], **{**kw, "ks": [1, 3]})
    with pytest.raises(ValueError, match="mode"):
        evaluate(oracle_policy, env, TASKS, ts=[2], mode="fast", **kw)
    with pytest.raises(ValueError, match="num_tasks"):
        evaluate(oracle_policy, env, {"seed": np.zeros((0,), np.int32)}, ts=[2], **kw)


def test_report_for_two_policies_holds_the_numbers(tiny_tokenizer, tmp_path):
    env = make("corridor", tiny_tokenizer, length=3, eps=0.2)
    cfg = _cfg(512)
    tasks = {"seed": np.arange(1, 33, 2, dtype=np.int32)}
    results = {
        name: evaluate(p, env, tasks, ts=[3, 5, 6], ks=[1, 2], attempts=4, rollout_cfg=cfg, key=0, bootstrap=200)
        for name, p in (("noisy", make_noisy_oracle(0.4)), ("oracle", oracle_policy))
    }
    from bmrl.study.findings import compare_f2

    paths, summary = write_report(tmp_path, results, baseline="noisy", f2=functools.partial(compare_f2, num_resamples=200))
    for kind in ("json", "report", "heatmap_oracle", "heatmap_noisy", "pass1", "difference_oracle", "decomposition"):
        assert os.path.getsize(paths[kind]) > 0, kind
    text = open(paths["report"]).read()
    for name, r in results.items():
        est, lo, hi = r.surface.cell(1, 6)
        assert f"{est:.3f} [{lo:.3f}, {hi:.3f}]" in text  # the surface table
        assert summary[name]["pass1_at_max_T"]["mean"] == pytest.approx(est)
        assert str(r.decomposition.decision_accuracy) in text
    comp = summary["comparisons"]["oracle - noisy"]
    assert comp["decision_accuracy"]["lower"] > 0  # the oracle decides better, significantly
    f2 = compare_f2(results["noisy"], results["oracle"], num_resamples=200)  # what `bmrl compare` reads
    assert comp["F2"]["verdict"] == f2.verdict.verdict and comp["F2"]["sentence"] == f2.sentence()
    assert f"oracle - noisy: {f2.sentence()}" in text and f2.verdict.rule in text
    data = json.load(open(paths["json"]))
    diff = np.array(data["comparisons"]["oracle - noisy"]["surface"]["estimate"])
    np.testing.assert_allclose(diff, results["oracle"].surface.estimate - results["noisy"].surface.estimate, atol=1e-12)
    # One policy: no comparison, still a full report.
    paths1, summary1 = write_report(tmp_path / "one", {"oracle": results["oracle"]})
    assert summary1["comparisons"] == {} and "## oracle" in open(paths1["report"]).read()
    _, plain = write_report(tmp_path / "plain", results, baseline="noisy", plot=False)  # no F2 given: no verdict
    assert "F2" not in plain["comparisons"]["oracle - noisy"]
    with pytest.raises(ValueError, match="baseline"):
        write_report(tmp_path, results, baseline="nobody")


def _two_policies_and_config(tiny_tokenizer, tmp_path, noise=(0.0, 0.0)):
    """Two saved steered policies (`noise` each) and the tiny config of the `bmrl eval` tests: (policy
    dirs, config path)."""
    from bmrl.model import save_pretrained

    env = make("corridor", tiny_tokenizer, length=3, eps=0.2)
    fmt = default_format(env)
    dirs = []
    for seed, n in zip((1, 2), noise):
        d = str(tmp_path / f"pol{seed}")
        save_pretrained(steered_policy(env, fmt, seed=seed, scale=3.0, noise=n), tiny_tokenizer, d)
        dirs.append(d)
    config = {
        "out_dir": str(tmp_path / "run"),
        "env": {"name": "corridor", "options": {"length": 3, "eps": 0.2}},
        "budget": {"kind": "fixed", "budgets": [4]},
        "rollout": {"max_turns": 4, "max_reply_tokens": 5, "max_len": 400},
        "eval": {"ts": [2, 4], "ks": [1, 2], "attempts": 2, "num_tasks": 4, "bootstrap": 50, "probe_states": 8},
        "sft": {"demo_turns": 4},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return dirs, path


def test_bmrl_eval_command(tiny_tokenizer, tmp_path):
    from bmrl.cli import main

    dirs, path = _two_policies_and_config(tiny_tokenizer, tmp_path)
    out = tmp_path / "eval"
    rc = main(["eval", "--config", str(path), "--policy", dirs[0], "--policy", dirs[1], "--names", "a,b", "--out", str(out)])
    assert rc == 0
    data = json.load(open(out / "results.json"))
    assert set(data["policies"]) == {"a", "b"} and "b - a" in data["comparisons"]
    assert data["comparisons"]["b - a"]["F2"]["verdict"] in ("as_study", "opposite", "inconclusive")
    assert data["policies"]["a"]["probe"]["states"] == 8
    assert data["policies"]["a"]["injected_eval"]["injection"] == {"turns": [1], "prob": 1.0}
    assert (out / "report.md").exists() and (out / "heatmap_a.png").exists()
    assert main(["eval", "--config", str(path), "--policy", dirs[0], "--names", "a,b", "--out", str(out)]) == 2


def test_eval_baseline_and_compare_read_one_f2(tiny_tokenizer, tmp_path, capsys):
    """Decisions or recovery has one answer: `bmrl eval --baseline` and `bmrl compare` on the same two
    policies print and store the same F2 finding (verdict, sentence, D = dRec - dClean interval)."""
    from bmrl.cli import main

    dirs, path = _two_policies_and_config(tiny_tokenizer, tmp_path, noise=(0.0, 0.2))  # two different policies
    assert main(["eval", "--config", str(path), "--policy", dirs[0], "--policy", dirs[1], "--names", "a,b",
                 "--baseline", "a", "--out", str(tmp_path / "eval"), "--no-plots", "--inject-turns", "none",
                 "eval.probe_states=0"]) == 0
    eval_out = capsys.readouterr().out
    assert main(["compare", "--config", str(path), "--base", dirs[0], "--trained", dirs[1],
                 "--out", str(tmp_path / "cmp")]) == 0
    compare_out = capsys.readouterr().out
    ev = json.load(open(tmp_path / "eval" / "results.json"))["comparisons"]["b - a"]["F2"]
    cmp = json.load(open(tmp_path / "cmp" / "summary.json"))["findings"]["F2"]
    assert ev["verdict"] == cmp["verdict"] and ev["rule"] == cmp["rule"]
    assert ev["sentence"] == cmp["sentence"] and cmp["sentence"] in eval_out and cmp["sentence"] in compare_out
    for stat in ("recovery_minus_clean", "delta_clean_accuracy", "delta_recovery_accuracy"):
        d_eval, d_cmp = Interval.of(ev["intervals"][stat]), Interval.of(cmp["intervals"][stat])
        np.testing.assert_array_equal([d_eval.mean, d_eval.lower, d_eval.upper, d_eval.num_tasks],
                                      [d_cmp.mean, d_cmp.lower, d_cmp.upper, d_cmp.num_tasks])
    assert ev["shared_states"] == cmp["shared_states"]
    report = (tmp_path / "eval" / "report.md").read_text()
    assert f"b - a: {cmp['sentence']}" in report and "separates" not in report  # no second rule
