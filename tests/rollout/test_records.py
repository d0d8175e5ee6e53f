"""The episode records every loop fills (`bmrl.rollout.records`): the same records from numpy (the host and
reference loops) and jax arrays (the compiled engine), and the rules written once, checked by hand."""

import jax.numpy as jnp
import numpy as np

from bmrl.rollout.records import Records, Turn, goes_on, record_turn

T, F = True, False


def _turn(xp, success, terminated, format_ok, truncated=(F, F, F)):
    return Turn(action=xp.asarray([2, 1, 0], xp.int32), reward=xp.asarray([0.5, 0.25, 1.0], xp.float32),
                format_ok=xp.asarray(format_ok), error=xp.asarray([F, T, F]), invalid=xp.asarray([F, F, T]),
                injected=xp.asarray([T, F, F]), oracle_action=xp.asarray([2, 2, 2], xp.int32),
                progress=xp.asarray([0.5, 0.75, 0.125], xp.float32), success=xp.asarray(success),
                terminated=xp.asarray(terminated), truncated=xp.asarray(truncated))


def _play(xp):
    """Three rows, caps 3, 1, 3: row 0 wins at turn 2 (1-based) after a broken reply; row 1 stops at its cap
    after turn 1; row 2 is cut by its environment at turn 1 (never wins), then marked as overflowing."""
    caps = xp.asarray([3, 1, 3], xp.int32)
    rec = Records.empty(3, 3, xp.asarray([0.0, 0.25, 0.0], xp.float32), xp)
    active = xp.asarray([T, T, T])
    turns = [_turn(xp, (F, F, F), (F, F, F), (F, T, T), truncated=(F, F, T)), _turn(xp, (T, T, F), (T, F, F), (T, T, T))]
    for t, turn in enumerate(turns):
        rec = record_turn(rec, t, active, turn, format_reward=-0.5)
        active = goes_on(t, active, turn, caps)
    return rec.overflowed(xp.asarray([F, F, T])), caps, active


def test_numpy_and_jax_records_are_the_same():
    (a, caps_a, active_a), (b, caps_b, active_b) = _play(np), _play(jnp)
    assert isinstance(a.action, np.ndarray) and not isinstance(b.action, np.ndarray)
    np.testing.assert_array_equal(active_a, np.asarray(active_b))
    fa, fb = a.fields(caps_a), b.fields(caps_b)
    assert list(fa) == list(fb)
    for name in fa:
        assert np.asarray(fa[name]).dtype == np.asarray(fb[name]).dtype, name
        np.testing.assert_array_equal(fa[name], np.asarray(fb[name]), err_msg=name)


def test_the_rules_by_hand():
    rec, caps, active = _play(np)
    f = rec.fields(caps)
    assert active.tolist() == [F, F, F]  # row 0 won, row 1 reached its cap, row 2 was cut after turn 1
    assert f["turns_used"].tolist() == [2, 1, 1]
    assert f["turn_active"].tolist() == [[T, T, F], [T, F, F], [T, F, F]]
    np.testing.assert_array_equal(f["reward"], np.float32([[0.0, 0.5, 0], [0.25, 0, 0], [1.0, 0, 0]]))  # 0.5 - 0.5
    assert f["format_error"][:, 0].tolist() == [T, F, F]
    assert f["action"].tolist() == [[2, 2, -1], [1, -1, -1], [0, -1, -1]]  # INVALID where the row did not act
    assert f["success"].tolist() == [T, F, F] and f["first_success_turn"].tolist() == [2, 0, 0]
    np.testing.assert_array_equal(f["progress"], np.float32([[0, .5, .5, .5], [.25, .75, .75, .75], [0, .125, .125, .125]]))
    assert f["terminated"].tolist() == [T, F, F]  # a win terminates
    assert f["truncated"].tolist() == [F, T, F]  # row 1 by its cap; row 2 by its env, but the buffer stopped it
    assert f["overflow"].tolist() == [F, F, T]
