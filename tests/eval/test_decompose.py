"""Decomposition metrics on hand-built episodes (numbers computed by hand in the comments)."""

import numpy as np
import pytest

from bmrl.eval.decompose import Episodes, back_on_track, decompose_episodes, decision_accuracy_per_task, recovery_per_task

F, T = False, True


def _episodes():
    """2 tasks x 2 attempts, Tm = 5 (corridor-like, progress in quarters).

    row 0 (task 0): right, LEFT (wrong), right, right; cap 4; fails.        first error turn 2
    row 1 (task 0): right x4, a slip at turn 2 (env error); cap 4; fails.    first error turn 2
    row 2 (task 1): right x4, no error; succeeds at turn 4.                  no error
    row 3 (task 1): INVALID then right x4; cap 5; succeeds at turn 5.       first error turn 1
    """
    action = np.array([[1, 0, 1, 1, -1], [1, 1, 1, 1, -1], [1, 1, 1, 1, -1], [-1, 1, 1, 1, 1]])
    oracle = np.array([[1, 1, 1, 1, -1], [1, 1, 1, 1, -1], [1, 1, 1, 1, -1], [1, 1, 1, 1, 1]])
    active = np.array([[T, T, T, T, F], [T, T, T, T, F], [T, T, T, T, F], [T, T, T, T, T]])
    error = np.array([[F, F, F, F, F], [F, T, F, F, F], [F, F, F, F, F], [T, F, F, F, F]])
    invalid = np.array([[F] * 5, [F] * 5, [F] * 5, [T, F, F, F, F]])
    progress = np.array([
        [0, .25, 0, .25, .5, .5],
        [0, .25, .25, .5, .75, .75],
        [0, .25, .5, .75, 1, 1],
        [0, 0, .25, .5, .75, 1],
    ], np.float32)
    return Episodes(
        action=action, oracle_action=oracle, error=error, invalid=invalid, injected=np.zeros((4, 5), bool),
        turn_active=active, progress=progress, success=np.array([F, F, T, T]),
        first_success_turn=np.array([0, 0, 4, 5]), caps=np.array([4, 4, 4, 5]), turns_used=np.array([4, 4, 4, 5]),
        num_tasks=2, attempts=2,
    )


def test_decision_accuracy_error_rate_and_first_errors():
    ep = _episodes()
    # task 0: 3/4 + 4/4 = 7/8 right; task 1: 4/4 + 4/5 (the invalid reply is wrong) = 8/9.
    np.testing.assert_allclose(decision_accuracy_per_task(ep), [7 / 8, 8 / 9])
    np.testing.assert_array_equal(ep.first_error_turn("any"), [2, 2, 0, 1])
    np.testing.assert_array_equal(ep.first_error_turn("decision"), [2, 0, 0, 1])  # the slip is not a decision
    np.testing.assert_array_equal(ep.first_error_turn("env"), [0, 2, 0, 0])
    d = decompose_episodes(ep, window=2, num_resamples=200)
    assert d.decision_accuracy.mean == pytest.approx((7 / 8 + 8 / 9) / 2)
    assert d.error_rate.mean == pytest.approx((2 / 8 + 1 / 9) / 2)  # errors per active turn
    # First-error histogram: task 0 both at turn 2; task 1 half none, half turn 1.
    np.testing.assert_allclose(d.first_error_hist, [0.25, 0.25, 0.5, 0, 0, 0])
    assert d.success.mean == pytest.approx(0.5)
    assert d.decision_accuracy.lower <= d.decision_accuracy.mean <= d.decision_accuracy.upper


def test_recovery_by_turn_and_pooled():
    ep = _episodes()
    by_turn, pooled = recovery_per_task(ep)
    # task 0: both errored attempts failed -> 0; task 1: its errored attempt (row 3) succeeded -> 1.
    np.testing.assert_allclose(pooled, [0.0, 1.0])
    assert by_turn[1, 0] == 1.0 and np.isnan(by_turn[0, 0])  # first error at turn 1: task 1 only
    assert by_turn[0, 1] == 0.0 and np.isnan(by_turn[1, 1])  # first error at turn 2: task 0 only
    d = decompose_episodes(ep, window=2, num_resamples=200)
    assert d.recovery.mean == pytest.approx(0.5) and d.recovery.num_tasks == 2
    assert d.recovery_by_turn[1].mean == 1.0 and d.recovery_by_turn[1].num_tasks == 1
    assert d.recovery_by_turn[2].mean == 0.0 and set(d.recovery_by_turn) == {1, 2}


def test_back_on_track_window():
    ep = _episodes()
    # window 1: row 0 after its wrong move is back at .25, not past it -> 0; row 1 (slip at .25) reaches .5
    # -> 1; row 3 (invalid at 0) reaches .25 -> 1; row 2 has no error -> undefined.
    got = back_on_track(ep, 1)
    np.testing.assert_array_equal(got[[0, 1, 3]], [0.0, 1.0, 1.0])
    assert np.isnan(got[2])
    # window 2: row 0 reaches .5 > .25 two turns after its error -> 1.
    np.testing.assert_array_equal(back_on_track(ep, 2)[[0, 1, 3]], [1.0, 1.0, 1.0])
    # window 3: row 0/1's window (turns 3..5) passes their cap 4 -> not counted.
    w3 = back_on_track(ep, 3)
    assert np.isnan(w3[0]) and np.isnan(w3[1]) and w3[3] == 1.0
    assert decompose_episodes(ep, window=1, num_resamples=200).back_on_track.mean == pytest.approx((0.5 + 1.0) / 2)
    with pytest.raises(ValueError, match="window must be >= 1"):
        back_on_track(ep, 0)


def test_injected_turns_are_not_decisions_and_bad_shapes_are_refused():
    ep = _episodes()
    injected = np.zeros((4, 5), bool)
    injected[0, 1] = True  # row 0's wrong move was forced: it is an error but not a decision
    ep2 = Episodes(**{**{n: getattr(ep, n) for n in Episodes.FIELDS}, "injected": injected}, num_tasks=2, attempts=2)
    np.testing.assert_allclose(decision_accuracy_per_task(ep2), [7 / 7, 8 / 9])  # task 0: 3/3 + 4/4
    assert ep2.first_error_turn()[0] == 2
    with pytest.raises(ValueError, match="num_tasks \\* attempts"):
        Episodes(**{n: getattr(ep, n) for n in Episodes.FIELDS}, num_tasks=3, attempts=2)
    with pytest.raises(ValueError, match="unknown"):
        ep.errors("bogus")
    # to_dict is JSON-ready.
    import json

    json.dumps(decompose_episodes(ep, num_resamples=50).to_dict())
