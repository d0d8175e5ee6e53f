"""Run health (bmrl.learn.health): the written rule that calls a run dead, on planted step sequences."""

import pytest

from bmrl.learn.health import RunHealth


def feed(h, rows, start=1):
    """rows: (success, groups_with_signal, invalid_rate) per step; returns the flags raised, by step."""
    return {s: f for s, r in enumerate(rows, start) if (f := h.observe(s, *r)) is not None}


def test_a_learning_run_is_never_flagged():
    h = RunHealth(window=3, invalid_rise=0.3)
    # quiet steps now and then (never 3 in a row), invalid rate up and down but not +0.3 for 3 steps
    rows = [(0.1, 2, 0.05), (0.0, 0, 0.2), (0.0, 0, 0.4), (0.2, 1, 0.4), (0.3, 3, 0.1), (0.0, 0, 0.36), (0.4, 2, 0.0)]
    assert feed(h, rows) == {} and not h.dead and not h.to_dict()["dead"]


def test_no_signal_for_window_steps_is_dead_from_the_streaks_first_step():
    """The seed-2 pattern of issue 39: a little success, then every group failing."""
    h = RunHealth(window=3, invalid_rise=0.3)
    rows = [(0.08, 2, 0.04), (0.08, 1, 0.1), (0.0, 0, 0.2), (0.0, 0, 0.2), (0.0, 0, 0.25), (0.0, 0, 0.3)]
    flags = feed(h, rows)
    assert list(flags) == [5] and flags[5].kind == "no_signal" and flags[5].step == 3
    assert "steps 3-5" in flags[5].reason
    d = h.to_dict()
    assert d["dead"] and d["still_at_end"] and [f["kind"] for f in d["flags"]] == ["no_signal"]


def test_invalid_actions_far_above_the_start_is_dead():
    """The seed-0 fixed_short pattern: success goes on for a while, invalid actions climb."""
    h = RunHealth(window=3, invalid_rise=0.3)
    rows = [(0.2, 3, 0.05), (0.2, 3, 0.2), (0.15, 2, 0.36), (0.1, 2, 0.61), (0.05, 1, 0.9)]
    flags = feed(h, rows)
    assert list(flags) == [5] and flags[5].kind == "invalid_actions" and flags[5].step == 3
    assert "against 0.05 at the run's first step" in flags[5].reason


def test_every_rollout_succeeding_is_saturated_not_dead():
    h = RunHealth(window=2, invalid_rise=0.3)
    assert feed(h, [(0.9, 2, 0.0), (1.0, 0, 0.0), (1.0, 0, 0.0), (1.0, 0, 0.0)]) == {}
    assert not h.dead and h.to_dict()["saturated_steps"] == 3


def test_a_flag_stays_and_the_state_survives_a_checkpoint():
    """Flagged once per kind; still_at_end says whether it still held at the last step; to_dict/from_dict
    (the checkpoint's run record) continues exactly as an uninterrupted run."""
    rows = [(0.1, 1, 0.0), (0.0, 0, 0.0), (0.0, 0, 0.0), (0.3, 2, 0.0), (0.0, 0, 0.0), (0.0, 0, 0.0), (0.0, 0, 0.0)]
    whole = RunHealth(window=2, invalid_rise=0.5)
    flags = feed(whole, rows)
    assert [(s, f.step) for s, f in flags.items()] == [(3, 2)]  # the second streak raises no second flag
    assert whole.to_dict()["still_at_end"]
    first = RunHealth(window=2, invalid_rise=0.5)
    feed(first, rows[:4])
    assert not first.to_dict()["still_at_end"]
    resumed = RunHealth.from_dict(first.to_dict(), 2, 0.5)
    feed(resumed, rows[4:], start=5)
    assert resumed.to_dict() == whole.to_dict()


def test_window_zero_is_off_and_bad_window_refused():
    h = RunHealth(window=0)
    assert feed(h, [(0.0, 0, 1.0)] * 10) == {} and not h.dead
    with pytest.raises(ValueError, match="window"):
        RunHealth(window=-1)
