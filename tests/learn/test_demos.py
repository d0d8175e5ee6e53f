"""Demonstrations in tokens: the rollout's layout exactly, loss mask on replies only, the cut after an error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.envs import make
from bmrl.learn.demos import demo_tokens_needed, make_demos
from bmrl.rollout import RolloutConfig, default_format, rollout
from bmrl.sampling import SamplingConfig
from tests.rollout_helpers import steered_policy

ENVS = {  # options, steering scale (lower = more varied replies)
    "corridor": (dict(length=4, eps=0.3, show_budget=True), 3.0),  # slips: observations depend on the env keys
    "toolchain": (dict(k=2, num_keys=8, p_fail=0.3), 12.0),  # multi-token actions, failed tool calls
}


def _np(tree):
    return jax.tree.map(np.asarray, tree)


@pytest.mark.parametrize("name", sorted(ENVS))
def test_demo_of_rollout_actions_equals_the_rollout(name, tiny_tokenizer):
    """Replaying a rollout's actions with its key gives its tokens, masks, turns and env records."""
    options, scale = ENVS[name]
    env = make(name, tiny_tokenizer, **options)
    fmt = default_format(env)
    policy = steered_policy(env, fmt, seed=1, scale=scale)
    cfg = RolloutConfig(max_turns=6, max_reply_tokens=8, max_len=512, sampling=SamplingConfig(temperature=1.0))
    batch = 16
    tasks = {"seed": jnp.arange(batch, dtype=jnp.int32) + 7}
    caps = jnp.asarray([6, 3, 5, 6, 2, 6, 4, 6] * 2, jnp.int32)
    tr = _np(rollout(policy, env, tasks, caps, jax.random.key(5), cfg))
    valid = ~np.any(tr.turn_active & (tr.action < 0), axis=1) & ~tr.overflow
    assert valid.sum() >= 4, "the steered policy should reply with valid actions in most rows"
    actions = np.where(tr.action >= 0, tr.action, 0)
    d = _np(make_demos(env, fmt, tasks, jax.random.key(5), num_turns=6, max_len=512, noise=0.0,
                       cut_after_error=False, caps=caps, actions=actions))
    for f_demo, f_tr in [("tokens", "tokens"), ("length", "length"), ("loss_mask", "loss_mask"),
                         ("turn_of_token", "turn_of_token"), ("turn_active", "turn_active"), ("error", "error"),
                         ("progress", "progress"), ("success", "success")]:
        np.testing.assert_array_equal(getattr(d, f_demo)[valid], getattr(tr, f_tr)[valid], err_msg=f_demo)
    act = tr.turn_active[valid]
    np.testing.assert_array_equal(d.action[valid][act], tr.action[valid][act])
    np.testing.assert_array_equal(d.oracle_action[valid][act], tr.oracle_action[valid][act])
    np.testing.assert_array_equal(d.num_turns[valid], tr.turns_used[valid])
    assert tr.error[valid].any(), "slips / failed calls should occur in these rows"


@pytest.fixture(scope="module")
def corridor(tiny_tokenizer):
    env = make("corridor", tiny_tokenizer, length=5, eps=0.2)
    return env, default_format(env)


def test_layout_loss_mask_and_padding(corridor, tiny_tokenizer):
    env, fmt = corridor
    batch, turns = 32, 10
    d = _np(make_demos(env, fmt, {"seed": jnp.arange(batch, dtype=jnp.int32)}, jax.random.key(0),
                       num_turns=turns, max_len=demo_tokens_needed(env, fmt, turns), noise=0.3))
    stop, pad = fmt.stop_ids[0], fmt.pad_id
    for b in range(batch):
        n = int(d.length[b])
        # Python reconstruction from the fragments: prefix, then per turn (reply_close) obs_open OBS obs_close ACT STOP.
        expected = list(fmt.prefix)
        mask = [0] * len(expected)
        for t in range(int(d.num_turns[b])):
            start = int(d.reply_start[b, t])
            obs_end = start - len(fmt.obs_close)
            obs = d.tokens[b, len(expected) + (len(fmt.reply_close) if t else 0) + len(fmt.obs_open): obs_end]
            segs = ([fmt.reply_close] if t else []) + [fmt.obs_open, obs, fmt.obs_close]
            for s in segs:
                expected += [int(x) for x in s]
                mask += [0] * len(s)
            assert len(expected) == start
            act = tiny_tokenizer.encode(env.action_strings[d.action[b, t]], add_special_tokens=False)
            expected += act + [stop]
            mask += [1] * (len(act) + 1)
            assert int(d.reply_len[b, t]) == len(act) + 1
        assert len(expected) == n
        np.testing.assert_array_equal(d.tokens[b, :n], expected)
        np.testing.assert_array_equal(d.loss_mask[b, :n], mask)
        # Nothing beyond the length; the decoded replies are exactly the action strings.
        assert (d.tokens[b, n:] == pad).all() and (d.loss_mask[b, n:] == 0).all() and (d.turn_of_token[b, n:] == -1).all()
        replies = tiny_tokenizer.decode(d.tokens[b][d.loss_mask[b] > 0])
        assert replies == "".join(env.action_strings[a] + "<|end|>" for a in d.action[b, : d.num_turns[b]])
        # Observation text round trip: each turn's context decodes to the env's own text.
        text = tiny_tokenizer.decode(d.tokens[b, :n])
        assert text.startswith("<|bos|>" + env.instructions) and "Position" in text


def test_cut_after_first_wrong_action(corridor):
    env, fmt = corridor
    batch, turns, L = 256, 12, 1024
    tasks = {"seed": jnp.arange(batch, dtype=jnp.int32)}
    cut = _np(make_demos(env, fmt, tasks, jax.random.key(1), num_turns=turns, max_len=L, noise=0.3))
    full = _np(make_demos(env, fmt, tasks, jax.random.key(1), num_turns=turns, max_len=L, noise=0.3, cut_after_error=False))
    active = cut.turn_active
    # At most one wrong action per demo, and it is the last turn; a cut demo ends right there.
    assert (cut.wrong.sum(1) <= 1).all()
    last = np.maximum(cut.num_turns - 1, 0)
    rows = np.arange(batch)
    assert (cut.wrong[rows, last] == cut.cut).all() and (cut.wrong.sum(1) == cut.cut).all()
    assert cut.cut.mean() > 0.3 and (~cut.cut & ~cut.success).sum() < batch // 4
    # Slips are not the demonstrator's mistakes: env errors without a wrong action continue the demo.
    assert (cut.error & ~cut.wrong & active)[np.arange(turns)[None] < last[:, None]].any()
    # The cut demo is a prefix of the uncut one (same keys), ending after the first wrong turn.
    first_wrong = np.where(full.wrong.any(1), np.argmax(full.wrong, 1) + 1, full.num_turns)
    np.testing.assert_array_equal(cut.num_turns, np.minimum(first_wrong, full.num_turns))
    for b in range(batch):
        n = int(cut.length[b])
        np.testing.assert_array_equal(cut.tokens[b, :n], full.tokens[b, :n])
    # Uncut: the demonstrator deviates at about the noise rate (binomial, > 1000 turns).
    rate = full.wrong[full.turn_active].mean()
    assert abs(rate - 0.3) < 0.05, rate
    assert (full.oracle_action[full.turn_active] >= 0).all()


def test_recovery_fraction_goes_on_after_the_mistake(corridor):
    """`recovery`: that fraction of the demos with a mistake go on past it (identical to the uncut demo,
    same keys); the rest end at it; recovery=1 is the uncut demo, recovery=0 the cut one."""
    env, fmt = corridor
    batch, turns, L = 512, 12, 1024
    tasks = {"seed": jnp.arange(batch, dtype=jnp.int32)}
    demos = lambda **k: _np(make_demos(env, fmt, tasks, jax.random.key(1), num_turns=turns, max_len=L, noise=0.3, **k))  # noqa: E731
    full, cut = demos(cut_after_error=False), demos(recovery=0.0)
    np.testing.assert_array_equal(demos(recovery=1.0).tokens, full.tokens)
    half = demos(recovery=0.5)
    mistake = cut.cut  # rows whose demonstrator erred before the end (and that did not end right there)
    went_on = mistake & (half.num_turns > cut.num_turns)
    assert abs(went_on.sum() / mistake.sum() - 0.5) < 0.1, (went_on.sum(), mistake.sum())
    for b in range(batch):  # each row is either the cut demo or the uncut one
        ref = full if went_on[b] else cut
        n = int(ref.length[b])
        assert int(half.length[b]) == n
        np.testing.assert_array_equal(half.tokens[b, :n], ref.tokens[b, :n])
    assert not (half.cut & went_on).any() and (half.cut == (mistake & ~went_on)).all()
    with pytest.raises(ValueError, match="recovery"):
        demos(recovery=1.5)


def test_noise_free_demos_solve_and_overflow_is_flagged(corridor):
    env, fmt = corridor
    tasks = {"seed": jnp.arange(16, dtype=jnp.int32)}
    d = _np(make_demos(env, fmt, tasks, jax.random.key(2), num_turns=16, max_len=1024, noise=0.0))
    assert d.success.all() and not d.wrong.any() and not d.cut.any()
    assert (d.progress[np.arange(16), d.num_turns] == 1.0).all()
    short = demo_tokens_needed(env, fmt, 2)
    s = _np(make_demos(env, fmt, tasks, jax.random.key(2), num_turns=16, max_len=short, noise=0.0))
    assert s.overflow.all() and (s.length <= short).all() and (s.num_turns >= 2).all()
    assert (s.num_turns < d.num_turns).all() and not s.success.any()
    # The kept turns are the full demo's, token for token.
    for b in range(16):
        n = int(s.length[b])
        np.testing.assert_array_equal(s.tokens[b, :n], d.tokens[b, :n])
    with pytest.raises(ValueError, match="max_len"):
        make_demos(env, fmt, tasks, jax.random.key(2), num_turns=4, max_len=20, noise=0.0)
