"""GiGPO (`bmrl.learn.gigpo`) against a plain NumPy reference written from the paper (arXiv 2505.10978):
episode groups, anchor-state step groups, the token layout of anchors, the trainer's dispatch, the config."""

from __future__ import annotations

import functools
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl import config
from bmrl.config import ConfigError
from bmrl.config.schema import TrainCfg
from bmrl.learn import advantages as adv
from bmrl.learn.gigpo import anchor_ids_from_tokens, gigpo_advantages, gigpo_token_advantages
from bmrl.learn.step import compute_advantages
from bmrl.rollout import Trajectory

TASKS, G, T = 3, 4, 5  # one shape for every randomised case: two jitted programs (normalize_std off / on)


def reference(rewards, mask, anchors, group_size, gamma=0.95, step_weight=1.0, normalize_std=False, eps=1e-6):
    """GiGPO from the paper, in loops and dicts (float64): Eq. 3 (episode), Eqs. 5-7 (step), Eq. 8 (sum)."""
    rewards, mask, anchors = np.asarray(rewards, np.float64), np.asarray(mask, bool), np.asarray(anchors)
    batch, turns = rewards.shape

    def normalise(value, values):
        mean = sum(values) / len(values)
        if not normalize_std:
            return value - mean
        std = np.std(values, ddof=1) if len(values) > 1 else 1.0
        return (value - mean) / (std + eps)

    episode = {}
    for task in range(batch // group_size):
        rows = range(task * group_size, (task + 1) * group_size)
        returns = {b: sum(rewards[b, t] for t in range(turns) if mask[b, t]) for b in rows}
        for b in rows:
            episode[b] = normalise(returns[b], list(returns.values()))
    discounted = {}
    for b in range(batch):
        g = 0.0
        for t in reversed([t for t in range(turns) if mask[b, t]]):
            g = rewards[b, t] + gamma * g
            discounted[b, t] = g
    step_groups = defaultdict(list)  # (task, anchor) -> the discounted returns of its turns
    for (b, t), g in discounted.items():
        step_groups[b // group_size, anchors[b, t]].append(g)
    out = np.zeros((batch, turns))
    for (b, t), g in discounted.items():
        group = step_groups[b // group_size, anchors[b, t]]
        step = 0.0 if len(group) == 1 else normalise(g, group)
        out[b, t] = episode[b] + step_weight * step
    return out


@functools.cache
def _jitted():
    return jax.jit(gigpo_advantages, static_argnames=("group_size", "normalize_std"))


def jitted(rewards, active, anchors, gamma=0.95, step_weight=1.0, normalize_std=False):
    """The jitted estimator at group_size G, every option passed: one program per normalize_std."""
    return _jitted()(rewards, active, anchors, group_size=G, gamma=gamma, step_weight=step_weight,
                     normalize_std=normalize_std)


def case(seed):
    """Ragged episodes (1..T active turns, a prefix), anchors from a small alphabet (revisits within a row,
    shared across rows of a group) plus unique ones (singleton step groups), mixed float rewards."""
    rng = np.random.default_rng(seed)
    batch = TASKS * G
    active = np.arange(T)[None, :] < rng.integers(1, T + 1, size=batch)[:, None]
    rewards = np.where(active, rng.choice([0.0, 1.0, -0.5, 1 / 3, 0.7], size=(batch, T)), 0.0).astype(np.float32)
    anchors = rng.integers(0, 3, size=(batch, T))
    unique = rng.random((batch, T)) < 0.25
    anchors = np.where(unique, 100 + np.arange(batch * T).reshape(batch, T), anchors).astype(np.int32)
    return rewards, active, anchors


def close(got, want, tol=2e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def test_hand_example_and_reference_agree():
    # One task of 2 rollouts, gamma 0.5. Row 0: anchors A, B, rewards 0, 1 (return 1, discounted 0.5, 1).
    # Row 1: stays in A twice, rewards 0, 0. Episode: +-0.5. Step group A = {0.5, 0, 0}: mean 1/6;
    # B is a singleton (0). Row 0: [0.5 + 1/3, 0.5]; row 1: [-0.5 - 1/6, -0.5 - 1/6].
    r, m, a = np.array([[0.0, 1.0], [0.0, 0.0]]), np.ones((2, 2), bool), np.array([[7, 8], [7, 7]])
    want = [[0.5 + 1 / 3, 0.5], [-2 / 3, -2 / 3]]
    close(reference(r, m, a, 2, gamma=0.5), want, tol=1e-12)
    close(gigpo_advantages(jnp.asarray(r), jnp.asarray(m), jnp.asarray(a), 2, gamma=0.5), want)


@pytest.mark.parametrize("normalize_std", [False, True])
def test_matches_the_reference_eager_and_jitted(normalize_std):
    for seed, gamma, weight in ((0, 0.95, 1.0), (1, 0.5, 0.3), (2, 1.0, 2.0), (3, 0.95, 0.0)):
        rewards, active, anchors = case(seed)
        want = reference(rewards, active, anchors, G, gamma, weight, normalize_std)
        opts = dict(gamma=gamma, step_weight=weight, normalize_std=normalize_std)
        got = jitted(rewards, active, anchors, **opts)
        assert got.dtype == jnp.float32 and got.shape == (TASKS * G, T)
        close(got, want, tol=1e-4 if normalize_std else 2e-5)
        if seed == 0:
            close(gigpo_advantages(jnp.asarray(rewards), jnp.asarray(active), jnp.asarray(anchors), G, **opts),
                  want, tol=1e-4 if normalize_std else 2e-5)
        assert (np.asarray(got)[~active] == 0).all()


def test_singletons_step_weight_zero_and_constant_groups_are_exact():
    rewards, active, anchors = case(4)
    run = functools.partial(jitted, rewards, active)
    for normalize_std in (False, True):
        episode_only = np.asarray(run(anchors, step_weight=0.0, normalize_std=normalize_std))
        # step_weight 0: every active turn of a row holds the row's episode advantage.
        ep = reference(rewards, active, anchors, G, step_weight=0.0, normalize_std=normalize_std)
        close(episode_only, ep, tol=1e-4)
        assert all(len(set(row[act].tolist())) <= 1 for row, act in zip(episode_only, active))
        # All anchors distinct: every step group is a singleton, whose step part is exactly 0.
        distinct = np.arange(anchors.size, dtype=np.int32).reshape(anchors.shape)
        assert (np.asarray(run(distinct, normalize_std=normalize_std)) == episode_only).all()
        # Mean-only episode part is GRPO's mean baseline, bitwise.
        if not normalize_std:
            grpo = np.asarray(adv.grpo_advantages(jnp.asarray(rewards.sum(1)), G, normalize_std=False))
            assert (episode_only == np.where(active, grpo[:, None], 0.0)).all()
    # A task group whose rollouts are identical (same rewards, same anchors): exactly 0 everywhere, for
    # rewards whose float32 mean is not exact (1/3, 0.7), under jit; the other groups keep their values.
    same = rewards.copy(), active.copy(), anchors.copy()
    for x in same:
        x[:G] = x[0]
    same[0][:G] = np.where(same[1][:G], np.float32(1 / 3) + np.float32(0.7) * np.arange(T), 0.0)
    same[2][:G] = 50 + np.arange(T)  # no revisit inside the rows: each step group holds one turn of every row
    for normalize_std in (False, True):
        out = np.asarray(jitted(*same, normalize_std=normalize_std))
        assert (out[:G] == 0).all(), out[:G]
        close(out[G:], reference(*same, G, normalize_std=normalize_std)[G:], tol=1e-4)
    # Identical returns across the group but different paths: episode part 0, the step part still counts.
    r = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    out = gigpo_advantages(jnp.asarray(r), jnp.ones((2, 2), bool), jnp.array([[0, 1], [0, 2]]), 2, gamma=0.5)
    close(out, reference(r, np.ones((2, 2), bool), np.array([[0, 1], [0, 2]]), 2, gamma=0.5))
    assert float(out[0, 0]) == pytest.approx(0.25) and float(out[0, 1]) == 0.0


def test_group_size_must_divide_the_batch():
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        gigpo_advantages(jnp.zeros((6, 2)), jnp.ones((6, 2), bool), jnp.zeros((6, 2), jnp.int32), 4)
    with pytest.raises(ValueError, match="one \\[batch, turns\\] shape"):
        gigpo_advantages(jnp.zeros((4, 2)), jnp.ones((4, 3), bool), jnp.zeros((4, 2), jnp.int32), 2)


# --------------------------------------------------------------------------- the token layout

L, TM = 32, 3
PAD, STOP = 0, 3
PROMPT = [1, 2]


def lay_out(turns, forced_stop=(), pad=PAD, junk_tags=False):
    """A row as the rollouts write it: the prompt prefix (turn -1), then per turn t its observation
    (turn t, loss_mask 0) and its reply (turn t, loss_mask 1; a stop appended to an over-long reply at the
    turns in `forced_stop`: turn t, loss_mask 0). turns: [(observation tokens, reply tokens)]."""
    tokens, tags, mask = list(PROMPT), [-1] * len(PROMPT), [0.0] * len(PROMPT)
    for t, (obs, reply) in enumerate(turns):
        tokens += obs + reply
        tags += [t] * (len(obs) + len(reply))
        mask += [0.0] * len(obs) + [1.0] * len(reply)
        if t in forced_stop:
            tokens, tags, mask = tokens + [STOP], tags + [t], mask + [0.0]
    n = len(tokens)
    after = (L - n)
    return (tokens + [pad] * after, n, mask + [0.0] * after, tags + ([1] if junk_tags else [-1]) * after)


def batch_of(rows):
    tokens, length, mask, tags = zip(*rows)
    return (jnp.asarray(tokens, jnp.int32), jnp.asarray(length, jnp.int32), jnp.asarray(mask, jnp.float32),
            jnp.asarray(tags, jnp.int32))


def test_anchor_ids_from_tokens():
    obs0, obs1, obs2 = [10, 11, 12], [13, 14], [15, 16, 17, 18]
    rows = [
        lay_out([(obs0, [20, STOP]), (obs1, [21, STOP])]),
        lay_out([(obs0, [22, 23, 24, STOP]), (obs1, [25, STOP])]),  # other replies: obs1 lies elsewhere
        lay_out([(obs0, [20, STOP]), ([13, 19], [21, STOP])]),  # one token of obs1 changed
        lay_out([(obs0, [20, STOP]), ([14, 13], [21, STOP])]),  # obs1's tokens swapped
        lay_out([(obs0, [20, STOP]), (obs1, [21, STOP])], pad=9, junk_tags=True),  # other padding
        lay_out([(obs0, [20, 21]), (obs1, [21, STOP])], forced_stop=(0,)),  # over-long reply 0: a stop appended
        lay_out([(obs0, [20, STOP]), (obs1, [21, STOP]), (obs2, [22, STOP])]),  # a third turn
        lay_out([(obs1, [20, STOP]), (obs0, [21, STOP]), (obs1, [22, STOP])]),  # obs1 revisited at turn 2
        lay_out([([13, 14], [20, STOP]), (obs1, [STOP])]),  # obs1 after another turn 0
    ]
    ids = anchor_ids_from_tokens(*batch_of(rows), TM)
    assert ids.dtype == jnp.uint32 and ids.shape == (len(rows), TM)
    np.testing.assert_array_equal(ids, jax.jit(anchor_ids_from_tokens, static_argnums=4)(*batch_of(rows), TM))
    a = np.asarray(ids)
    assert (a[:7, 0] == a[0, 0]).all()  # the same prompt and first observation
    for same in (1, 4, 5, 6, 8):
        assert a[same, 1] == a[0, 1], same
    assert len({a[0, 1], a[2, 1], a[3, 1]}) == 3  # a one-token change, and the order, change the id
    assert a[6, 2] != a[0, 2]  # a real observation vs. an inactive turn's empty one
    assert a[7, 0] != a[0, 0] and a[7, 1] != a[0, 0]  # (the prompt is part of turn 0)
    assert a[7, 2] == a[0, 1] != a[7, 0]  # obs1 at turn 1 or 2 hashes alike; with the prompt (turn 0) not
    assert len(set(a.reshape(-1).tolist())) == 8  # nothing else collides


# --------------------------------------------------------------------------- the trainer and the config


def trajectory(rows, reward, active, progress):
    tokens, length, mask, tags = batch_of(rows)
    batch = tokens.shape[0]
    zeros_b, zeros_bt = jnp.zeros((batch,), jnp.int32), jnp.zeros((batch, TM), bool)
    return Trajectory(
        tokens=tokens, length=length, loss_mask=mask, logprobs=jnp.zeros_like(mask), turn_of_token=tags,
        action=jnp.zeros((batch, TM), jnp.int32), reward=jnp.asarray(reward, jnp.float32), error=zeros_bt,
        invalid=zeros_bt, format_error=zeros_bt, injected=zeros_bt, oracle_action=jnp.zeros((batch, TM), jnp.int32),
        progress=jnp.asarray(progress, jnp.float32), turn_active=jnp.asarray(active), caps=zeros_b + TM,
        turns_used=jnp.asarray(active).sum(1).astype(jnp.int32), success=jnp.zeros((batch,), bool),
        first_success_turn=zeros_b, terminated=jnp.zeros((batch,), bool), truncated=jnp.zeros((batch,), bool),
        overflow=jnp.zeros((batch,), bool),
    )


def test_compute_advantages_spreads_gigpo_onto_reply_tokens():
    """Two tasks of 2 rollouts, ragged, with a revisited state: the trainer's advantages are the reference's
    per-turn values on each turn's sampled tokens (0 on observations, a forced stop and padding)."""
    a, b, c, d = [10, 11], [12], [13, 14, 15], [16]
    episodes = [  # (observations, replies, rewards); observations name the anchors of the reference
        ([a, b, a], [[20, STOP], [21, 22, STOP], [20, STOP]], [0.0, 0.5, 1.0]),
        ([a, a], [[21, STOP], [20, STOP]], [0.0, 0.0]),
        ([c], [[20, STOP]], [1.0]),
        ([c, d, d], [[21, STOP], [22, STOP], [20, STOP]], [0.25, 0.0, 1.0]),
    ]
    rows = [lay_out(list(zip(obs, replies)), forced_stop=(1,) if i == 3 else ()) for i, (obs, replies, _) in
            enumerate(episodes)]
    reward, active, anchors = np.zeros((4, TM), np.float32), np.zeros((4, TM), bool), np.zeros((4, TM), object)
    for i, (obs, _, r) in enumerate(episodes):
        reward[i, : len(r)], active[i, : len(r)] = r, True
        for t, o in enumerate(obs):
            anchors[i, t] = tuple(PROMPT + o) if t == 0 else tuple(o)
    progress = np.cumsum(np.concatenate([np.zeros((4, 1)), reward], 1), 1)
    traj = trajectory(rows, reward, active, progress)
    opts = dict(gamma=0.9, step_weight=0.5, normalize_std=True)
    turn_values = reference(reward, active, anchors, 2, **opts)
    mask, tags = np.asarray(traj.loss_mask), np.asarray(traj.turn_of_token)
    want = np.where(mask > 0, np.take_along_axis(turn_values, np.clip(tags, 0, TM - 1), 1), 0.0)
    cfg = TrainCfg(advantage="gigpo", group_size=2, tasks_per_step=2, advantage_options=opts)
    with_process = TrainCfg(**{**vars(cfg), "process_coef": 0.5, "gamma": 0.8})

    def everything(tr, own_ids):
        proc = adv.process_advantages(tr.progress, tr.turn_active, tr.turn_of_token, tr.loss_mask, gamma=0.8)
        spread = (tr.reward, tr.turn_active, own_ids, tr.turn_of_token, tr.loss_mask, 2)
        return (compute_advantages(tr, cfg), compute_advantages(tr, with_process), proc,
                gigpo_token_advantages(*spread, **opts), gigpo_token_advantages(*spread, **opts | {"step_weight": 0.0}))

    # One program: the trainer's advantages, with process advantages on top, and anchor ids of one's own (all
    # distinct: no step part).
    got, got_process, proc, own, own_episode = jax.jit(everything)(traj, jnp.arange(4 * TM).reshape(4, TM))
    close(got, want, tol=1e-4)
    assert np.abs(want).sum() > 1 and (np.asarray(got)[mask == 0] == 0).all()
    close(got_process, want + 0.5 * np.asarray(proc), tol=1e-4)  # process_coef adds on top, as for every estimator
    assert np.abs(np.asarray(proc)).sum() > 0
    close(own, own_episode)
    assert not np.allclose(np.asarray(own), np.asarray(got))


def test_config_accepts_gigpo_and_checks_its_options():
    cfg = config.load(None, ["train.advantage=gigpo", "train.advantage_options.gamma=0.9",
                             "train.advantage_options.step_weight=0.5", "train.advantage_options.normalize_std=true",
                             "train.advantage_options.eps=1e-5"]).train
    assert cfg.advantage == "gigpo" and adv.takes_trajectory(adv.get_advantage("gigpo"))
    assert cfg.advantage_options == {"gamma": 0.9, "step_weight": 0.5, "normalize_std": True, "eps": 1e-5}
    with pytest.raises(ConfigError) as err:
        config.load(None, ["train.advantage=gigpo", "train.advantage_options.clip=0.2"])
    assert err.value.key == "train.advantage_options.clip"
    assert "not an option of gigpo_trajectory_advantages; its options: gamma, step_weight, normalize_std, eps" in str(
        err.value)
    for override in ("gamma=1.5", "eps=0", "step_weight=-1", "normalize_std=3", "gamma=high"):
        with pytest.raises(ConfigError) as err:
            config.load(None, ["train.advantage=gigpo", f"train.advantage_options.{override}"])
        assert err.value.key == "train.advantage_options." + override.split("=")[0]
    with pytest.raises(ConfigError, match="is not an option of gigpo"):  # the trainer passes the group size
        config.load(None, ["train.advantage=gigpo", "train.advantage_options.group_size=2"])
