"""Ground truth on the slippery corridor: the oracle's Pass@(1,T) against the closed form, error
injection (recovery) and the probe set, with scripted policies run by the harness."""

import numpy as np
import pytest

from bmrl.envs import make
from bmrl.envs.corridor import corridor_success_prob
from bmrl.rollout import make_noisy_oracle, oracle_policy
from bmrl.eval.decompose import probe_accuracy, probe_set
from bmrl.eval.evaluate import attach_injection, evaluate, injection_at
from bmrl.rollout import RolloutConfig, default_format

L, EPS = 4, 0.3


@pytest.fixture(scope="module")
def env(tiny_tokenizer):
    return make("corridor", tiny_tokenizer, length=L, eps=EPS)


def _cfg():
    return RolloutConfig(max_turns=10, max_reply_tokens=4, max_len=512)


@pytest.mark.parametrize("mode", ["exact", "truncate"])
def test_oracle_pass1_matches_closed_form(env, mode):
    tasks = {"seed": np.arange(1, 129, 2, dtype=np.int32)}  # 64 tasks x 16 attempts
    ts = [3, 4, 5, 6, 8, 10]
    r = evaluate(oracle_policy, env, tasks, ts=ts, ks=[1, 4], attempts=16, rollout_cfg=_cfg(), key=1, mode=mode, bootstrap=200)
    n = 64 * 16
    for j, t in enumerate(ts):
        p = corridor_success_prob(L, EPS, t)
        se = max(np.sqrt(p * (1 - p) / n), 1e-9)
        assert abs(r.surface.estimate[0, j] - p) <= 3 * se + 1e-12, (t, r.surface.estimate[0, j], p, se)
    assert r.surface.estimate[0, 0] == 0.0  # 3 turns can never cover 4 cells
    # K=4: independent attempts -> 1 - (1 - p)^4 up to sampling error; monotone in T.
    assert np.all(np.diff(r.surface.estimate, axis=1) >= -1e-12)
    assert r.decomposition.decision_accuracy.mean == 1.0
    assert r.compiles <= 1


def test_injected_error_at_turn_one_is_recovered_with_a_generous_cap(tiny_tokenizer):
    env = make("corridor", tiny_tokenizer, length=L, eps=0.0)  # no slips: every error is the injected one
    tasks = {"seed": np.arange(1, 33, 2, dtype=np.int32)}
    cfg = _cfg()
    ts = [4, 5, 6, 10]
    clean = evaluate(oracle_policy, env, tasks, ts=ts, ks=[1], attempts=4, rollout_cfg=cfg, key=0, bootstrap=100)
    np.testing.assert_array_equal(clean.pass1()[0], [1, 1, 1, 1])
    clean = attach_injection(clean, oracle_policy, env, tasks, turns=[1], prob=1.0, rollout_cfg=cfg, key=0)  # 1-based
    inj = clean.injected
    assert inj.episodes.injected[:, 0].all() and not inj.episodes.injected[:, 1:].any()
    # The forced wrong move at turn 1 hits the wall (the agent starts at an end): one turn lost, so the
    # oracle needs L + 1 turns. It fails at the tight cap T = L and always recovers with T >= L + 1.
    np.testing.assert_array_equal(inj.pass1()[0], [0, 1, 1, 1])
    assert inj.decomposition.recovery.mean == 1.0
    assert inj.decomposition.recovery_by_turn[1].mean == 1.0
    assert inj.decomposition.decision_accuracy.mean == 1.0  # injected turns are not the policy's decisions
    assert inj.injection == {"turns": [1], "prob": 1.0}
    s = clean.summary()["injected"]
    assert s["pass1_by_T"]["4"] == 0.0 and s["pass1_by_T"]["10"] == 1.0
    # A noisy oracle recovers less often within a tight budget than with a generous one.
    noisy = evaluate(make_noisy_oracle(0.3), env, tasks, ts=[5, 10], ks=[1], attempts=8, rollout_cfg=cfg, key=0,
                     inject=injection_at(cfg.max_turns, [1], 1.0), bootstrap=100)
    assert noisy.pass1()[0][0] < noisy.pass1()[0][1]


def test_eval_settings_count_turns_from_one():
    """One settings object from the config; turns 1-based for callers, 0-based only in the engine's mask."""
    from bmrl.config import load
    from bmrl.eval.settings import EvalSettings

    cfg = load(None, ["reproduce.inject_turns=[3,1]", "reproduce.window=4", "eval.probe_states=5"])
    assert EvalSettings.from_config(cfg) == EvalSettings(probe_states=5, inject_turns=(1, 3), window=4)
    assert not EvalSettings.from_config(cfg, inject_turns=()).injects
    assert np.flatnonzero(np.asarray(injection_at(4, [1, 3], 1.0).turns)).tolist() == [0, 2]
    with pytest.raises(ValueError, match="1-based"):
        EvalSettings(inject_turns=(0,))
    with pytest.raises(ValueError, match="1-based"):
        injection_at(4, [0], 1.0)


def test_probe_set_is_fixed_and_scores_oracle_and_noisy_oracle(env):
    tasks = {"seed": np.arange(1, 257, 2, dtype=np.int32)}
    fmt = default_format(env)
    a = probe_set(env, fmt, tasks, num_states=128, seed=3, num_turns=8, max_len=512, reserve=4)
    b = probe_set(env, fmt, tasks, num_states=128, seed=3, num_turns=8, max_len=512, reserve=4)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.turn, b.turn)
    assert len(np.unique(a.turn)) > 1  # states from several turns, not just the start
    # The context ends right after an observation (the reply comes next).
    assert np.all(a.tokens[np.arange(a.size), a.context_len - 1] == fmt.obs_close[-1])
    cfg = _cfg()
    assert probe_accuracy(oracle_policy, env, a, cfg, key=0).accuracy.mean == 1.0
    noisy = probe_accuracy(make_noisy_oracle(0.4), env, a, cfg, key=0).accuracy
    assert 0.6 - 3 * np.sqrt(0.24 / 128) <= noisy.mean <= 0.6 + 3 * np.sqrt(0.24 / 128)
    assert noisy.lower < noisy.mean < noisy.upper
