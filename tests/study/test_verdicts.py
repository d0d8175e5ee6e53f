"""Verdicts as data: the written rules on hand-made intervals, the paired interval functions against
numbers computed by hand, the clean / post-error accuracy counts, and the repairing noisy oracle."""

import numpy as np
import pytest

from bmrl.eval.bootstrap import Interval
from bmrl.eval.decompose import Episodes
from bmrl.eval.states import paired_state_counts, state_accuracy_counts
from bmrl.study.findings import f1_finding, f2_intervals, f3_intervals
from bmrl.study.verdicts import RULES, VERDICTS, f1_verdict, f2_verdict, f3_verdict

F, T = False, True


def iv(mean, lower, upper, n=20):
    return Interval(mean, lower, upper, n)


# ---- rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("g, want", [
    (iv(0.1, 0.02, 0.2), "as_study"), (iv(-0.1, -0.2, -0.01), "opposite"), (iv(0.05, -0.01, 0.1), "inconclusive"),
    (iv(0.0, 0.0, 0.0), "inconclusive"), (iv(0.3, 0.2, 0.4, n=9), "inconclusive"),
])
def test_f1_rule(g, want):
    v = f1_verdict(g)
    assert v.verdict == want and v.verdict in VERDICTS and v.rule == RULES["F1"]
    assert v.finding == "F1" and v.intervals["gain_large_minus_small"]["mean"] == g.mean
    assert v.sentence().startswith("F1: ") and f"{g.mean:+.3f}" in v.sentence()


def test_f1_rule_reads_plain_dicts():
    assert f1_verdict({"mean": 0.1, "lower": 0.05, "upper": 0.2, "num_tasks": 30}).verdict == "as_study"
    with pytest.raises(TypeError, match="mean, lower, upper"):
        f1_verdict(0.1)
    v = f1_verdict(iv(0.1, 0.02, 0.2), t_small=5, t_large=8)
    assert "the gain at T=8 minus the gain at T=5 is +0.100 [+0.020, +0.200]" in v.sentence()


@pytest.mark.parametrize("dr, dc, d, want", [
    # recovery up, clean flat: the study's pattern
    (iv(0.2, 0.1, 0.3), iv(0.0, -0.02, 0.02), iv(0.2, 0.1, 0.3), "as_study"),
    # both up by the same amount (a memoryless policy with fewer errors): the gain is in clean decisions
    (iv(0.2, 0.15, 0.25), iv(0.2, 0.15, 0.25), iv(0.0, -0.05, 0.05), "opposite"),
    # clean up more than recovery
    (iv(0.05, 0.0, 0.1), iv(0.2, 0.15, 0.25), iv(-0.15, -0.2, -0.1), "opposite"),
    # both up, recovery more: the rule does not call it the study's pattern
    (iv(0.4, 0.3, 0.5), iv(0.15, 0.1, 0.2), iv(0.25, 0.15, 0.35), "inconclusive"),
    # nothing clear; the case: accuracy fell by 0.25 and recovery by less is not "as_study"
    (iv(0.01, -0.05, 0.07), iv(0.0, -0.05, 0.05), iv(0.01, -0.06, 0.08), "inconclusive"),
    (iv(-0.1, -0.15, -0.05), iv(-0.25, -0.3, -0.2), iv(0.15, 0.1, 0.2), "as_study"),
    (iv(0.3, 0.2, 0.4, n=5), iv(0.0, -0.1, 0.1, n=5), iv(0.3, 0.2, 0.4, n=5), "inconclusive"),
])
def test_f2_rule(dr, dc, d, want):
    v = f2_verdict(dr, dc, d)
    assert v.verdict == want, v.reason
    assert set(v.intervals) == {"delta_recovery_accuracy", "delta_clean_accuracy", "recovery_minus_clean"}


def test_f3_rule():
    """Min over T of Pass@(1,T) alone votes; the other measures are reported and cannot move the verdict (a
    run whose area is ahead of a fixed budget but whose worst T is behind it is not robust across T)."""
    up, flat, down = iv(0.1, 0.05, 0.15), iv(0.0, -0.05, 0.05), iv(-0.1, -0.15, -0.05)
    assert f3_verdict({"fixed8": {"min_pass1": up, "area": flat}, "fixed2": {"min_pass1": up, "area": down}}).verdict == "as_study"
    assert f3_verdict({"fixed8": {"min_pass1": up, "area": up}, "fixed2": {"min_pass1": flat, "area": up}}).verdict == "inconclusive"
    v = f3_verdict({"fixed8": {"min_pass1": up}, "fixed2": {"min_pass1": down, "min_pass4": up, "area": up}})
    assert v.verdict == "opposite" and "min_pass1 -0.100" in v.reason and "(decides)" in v.reason
    assert set(v.intervals) == {"fixed8/min_pass1", "fixed2/min_pass1", "fixed2/min_pass4", "fixed2/area"}
    with pytest.raises(ValueError, match="at least one fixed budget"):
        f3_verdict({})
    with pytest.raises(ValueError, match="needs K=1"):
        f3_verdict({"fixed8": {"area": up}})


# ---- intervals -----------------------------------------------------------------------------------


def f1_intervals(base, trained, ts=None, **kw):
    ts = ts or list(range(1, base.shape[1] + 1))
    return f1_finding(base, {"rl": trained}, ts, main="rl", **kw).intervals


def test_f1_intervals_are_paired_differences_of_gains():
    rng = np.random.default_rng(0)
    base = rng.uniform(size=(30, 3))
    trained = base + np.array([0.0, 0.1, 0.2])  # gain 0 at the smallest T, 0.2 at the largest: exactly
    out = f1_intervals(base, trained, num_resamples=200)
    g = out["gain_large_minus_small"]
    assert g.mean == pytest.approx(0.2) and g.lower == pytest.approx(0.2) and g.upper == pytest.approx(0.2)
    assert out["gain_small"].mean == pytest.approx(0.0) and g.num_tasks == 30
    assert f1_verdict(g).verdict == "as_study"
    same = f1_intervals(base, base, num_resamples=200)["gain_large_minus_small"]
    assert (same.mean, same.lower, same.upper) == (0.0, 0.0, 0.0) and f1_verdict(same).verdict == "inconclusive"
    with pytest.raises(ValueError, match="same shape"):
        f1_intervals(base, base[:, :2], ts=[1, 2, 3])


def test_f1_at_a_small_t_inside_the_grid():
    """G is taken at the small T asked for (reproduce.small_t), not the grid's smallest; the gain curve
    (the figure) and the gains at both T are the same bootstrap, so they agree to the last digit."""
    rng = np.random.default_rng(3)
    base = rng.uniform(size=(30, 3))
    trained = base + np.array([0.3, 0.1, 0.25]) + rng.normal(0, 0.05, (30, 3))
    f = f1_finding(base, {"rl": trained, "other": base}, [4, 5, 8], main="rl", small_t=5, num_resamples=200)
    g = f.intervals["gain_large_minus_small"]
    assert f.facts == {"T_small": 5, "T_large": 8} and g.mean == pytest.approx(0.15, abs=0.03)
    est, lo, hi = f.curves["rl"]
    assert (f.intervals["gain_small"].mean, f.intervals["gain_small"].lower, f.intervals["gain_small"].upper) == (
        est[1], lo[1], hi[1])
    assert (f.intervals["gain_large"].lower, f.intervals["gain_large"].upper) == (lo[2], hi[2])
    assert "T=8 minus the gain at T=5" in f.sentence() and f.verdict.verdict == "as_study"
    np.testing.assert_array_equal(f.curves["other"][0], 0.0)
    with pytest.raises(ValueError, match="not on the grid"):
        f1_finding(base, {"rl": trained}, [4, 5, 8], main="rl", small_t=6)


def test_f1_intervals_two_level_over_seeds_is_wider():
    """Two training seeds whose gains differ: resampling seeds then tasks adds the seed-to-seed spread."""
    rng = np.random.default_rng(2)
    base = rng.uniform(size=(40, 2))
    trained = base + np.where(np.arange(40)[:, None] < 20, [0.0, 0.05], [0.0, 0.25]) + rng.normal(0, 0.02, (40, 2))
    seeds = np.repeat([0, 1], 20)
    one = f1_intervals(base, trained, num_resamples=400)["gain_large_minus_small"]
    two = f1_intervals(base, trained, groups=seeds, num_resamples=400)["gain_large_minus_small"]
    assert one.mean == pytest.approx(two.mean)
    assert (two.upper - two.lower) > 3 * (one.upper - one.lower)


def _episodes():
    """1 task x 2 attempts, Tm = 4 (oracle action 1 everywhere; action 0 is wrong).

    row 0: 1, 0 (error), 1, 1      clean: turns 1-2 (1 right of 2); post-error: turn 3 (right)
    row 1: 1, 1 + env error (slip), 0, 1 (injected)   clean: turns 1-2 (2 right); post-error: turn 3 (wrong);
           turn 4 is injected: not the policy's action
    """
    action = np.array([[1, 0, 1, 1], [1, 1, 0, 1]])
    return Episodes(
        action=action, oracle_action=np.ones((2, 4), int), error=np.array([[F, F, F, F], [F, T, F, F]]),
        invalid=np.zeros((2, 4), bool), injected=np.array([[F, F, F, F], [F, F, F, T]]),
        turn_active=np.ones((2, 4), bool), progress=np.zeros((2, 5), np.float32), success=np.array([F, F]),
        first_success_turn=np.zeros(2, int), caps=np.array([4, 4]), turns_used=np.array([4, 4]), num_tasks=1, attempts=2,
    )


def test_state_accuracy_counts_by_hand():
    c = state_accuracy_counts(_episodes())
    assert {k: int(v[0]) for k, v in c.items()} == {"clean": 4, "clean_right": 3, "post_error": 2, "post_error_right": 1}
    # decision errors only: the slip is not an error, so row 1 is clean up to its wrong turn 3
    d = state_accuracy_counts(_episodes(), "decision")
    assert {k: int(v[0]) for k, v in d.items()} == {"clean": 5, "clean_right": 3, "post_error": 1, "post_error_right": 1}


def test_paired_state_counts_by_hand():
    a = _episodes()
    action = a.action.copy()
    action[0, 1] = 1  # b: row 0 never errs
    b = Episodes(**{n: getattr(a, n) for n in Episodes.FIELDS if n != "action"}, action=action, num_tasks=1, attempts=2)
    c = paired_state_counts(a, b)
    # shared clean: turns 1-2 of both rows (a is wrong at row 0 turn 2); shared post-error: row 1 turn 3 only
    # (row 0: only a erred). Both are wrong at row 1 turn 3.
    assert {k: int(v[0]) for k, v in c.items()} == {
        "clean": 4, "post_error": 1, "clean_right_a": 3, "clean_right_b": 4, "post_error_right_a": 0, "post_error_right_b": 0}
    oracle = a.oracle_action.copy()
    oracle[0, 0] = 0
    other = Episodes(**{n: getattr(a, n) for n in Episodes.FIELDS if n != "oracle_action"}, oracle_action=oracle,
                     num_tasks=1, attempts=2)
    with pytest.raises(ValueError, match="same tasks with the same keys"):
        paired_state_counts(a, other)


def test_f2_intervals_ratio_of_sums_and_self_pairing():
    ep = _episodes()
    one = f2_intervals(ep, ep, num_resamples=20)
    assert one["base_clean_accuracy"].mean == pytest.approx(3 / 4)
    assert one["base_recovery_accuracy"].mean == pytest.approx(1 / 2)
    for m in ("delta_clean_accuracy", "delta_recovery_accuracy", "recovery_minus_clean"):
        assert (one[m].mean, one[m].lower, one[m].upper) == (0.0, 0.0, 0.0)
    assert one["recovery_minus_clean"].num_tasks == 1
    # each policy's accuracy on the shared states: their difference is the reported change
    for kind, d in (("clean", "delta_clean_accuracy"), ("recovery", "delta_recovery_accuracy")):
        b, t = one[f"paired_base_{kind}_accuracy"], one[f"paired_trained_{kind}_accuracy"]
        assert t.mean - b.mean == pytest.approx(one[d].mean)
    assert f2_verdict(one["delta_recovery_accuracy"], one["delta_clean_accuracy"], one["recovery_minus_clean"]).verdict == "inconclusive"


def test_f3_intervals_min_over_T_and_area():
    rng = np.random.default_rng(1)
    fixed = rng.uniform(size=(12, 2, 3))  # [N, K, T], ks = (1, 4)
    mix = fixed + 0.1
    out = f3_intervals(mix, {"fixed": fixed}, ks=[1, 4], num_resamples=100)["fixed"]
    assert set(out) == {"min_pass1", "min_pass4", "area"}
    for e in out.values():
        assert e.mean == pytest.approx(0.1) and e.lower == pytest.approx(0.1) and e.upper == pytest.approx(0.1)
    assert f3_verdict({"fixed": out}).verdict == "as_study"
    with pytest.raises(ValueError, match="K=1 or K=4"):
        f3_intervals(mix, {"fixed": fixed}, ks=[2, 3])


# ---- the repairing noisy oracle ------------------------------------------------------------------


@pytest.fixture(scope="module")
def corridor(tiny_tokenizer):
    from bmrl.envs import make

    return make("corridor", tiny_tokenizer, length=4, eps=0.0)


def _play(policy, env, n=64, inject=None):
    import jax

    from bmrl.rollout import play

    return play(policy, env, {"seed": np.arange(n, dtype=np.int32)}, np.full(n, 8, np.int32), jax.random.key(0), 8,
                inject=inject)


def test_repairing_oracle_default_is_the_memoryless_noisy_oracle(corridor):
    from bmrl.rollout import make_noisy_oracle
    from bmrl.rollout.policies import RepairingOracle

    a, b = _play(RepairingOracle(0.3), corridor), _play(make_noisy_oracle(0.3), corridor)
    np.testing.assert_array_equal(np.asarray(a.action), np.asarray(b.action))
    assert RepairingOracle(0.3).repair == pytest.approx(0.7)
    with pytest.raises(ValueError, match="repair must be a probability"):
        RepairingOracle(0.1, 1.5)


def test_repairing_oracle_sees_injected_errors(corridor):
    """eps = 0: no own errors. After an error injected at turn 1 it repairs always (repair = 1) or never
    (repair = 0: a wrong action right after every error, so the errors chain to the cap)."""
    from bmrl.rollout import Injection
    from bmrl.rollout.policies import RepairingOracle

    inject = Injection.at(8, [0], 1.0)
    fix = _play(RepairingOracle(0.0, 1.0), corridor, inject=inject)
    act, orc = np.asarray(fix.action), np.asarray(fix.oracle_action)
    assert np.asarray(fix.injected)[:, 0].all()
    np.testing.assert_array_equal(act[:, 1], orc[:, 1])
    never = _play(RepairingOracle(0.0, 0.0), corridor, inject=inject)
    act, orc, live = np.asarray(never.action), np.asarray(never.oracle_action), np.asarray(never.turn_active)
    assert live.all() and (act != orc).all() and not np.asarray(never.success).any()
