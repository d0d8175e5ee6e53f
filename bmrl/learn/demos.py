"""Demonstrations in tokens: eps-noisy oracle episodes laid out exactly as the rollout lays them out.

    demos = make_demos(env, fmt, tasks, key, num_turns=12, max_len=512, noise=0.25)

Each row is one conversation in the `Format`'s fragments, the same tokens `bmrl.rollout.rollout`
would produce if the policy had replied with the demonstrated actions:

    prefix  obs_open OBS_0 obs_close  ACT_0 STOP  reply_close obs_open OBS_1 obs_close  ACT_1 STOP ...

where ACT_t is the format's canonical reply carrying the action string's tokens (`env.actions`):
the action tokens themselves in the plain `action` reply format, the answer-tagged layout of
`Format.reply_tokens` in others; STOP is the format's first stop id. `loss_mask` is 1 on the ACT_t
and STOP tokens only. The episode is played with the same per-row key
derivation as the rollout (environment keys `fold_in(row_key, 0)`, step t with `fold_in(.., t + 1)`),
so a rollout given the same key and the same replies sees the same observations, slips included.

Errors, and recovery from them only in a fraction `recovery` of the demos (the base policy of the
study): the demonstrator is the oracle, except that with probability `noise` it takes a uniformly
random WRONG action (`bmrl.rollout.policies`). With `cut_after_error` a demonstration ENDS after the
first turn whose action deviated from the oracle (the wrong action is included and trained on,
nothing after it is), except in a random fraction `recovery` of the rows, which go on with the noisy
oracle from the state the mistake left (its repair, e.g. keypad's `delete`). With `recovery=0` a
policy cloned from these demos errs at about the noise rate but has never seen how to recover from
its own mistakes. Only the demonstrator's OWN wrong
actions cut a demo: an environment error that the oracle's action could not avoid (a slip, a failed
tool call) is the environment's doing, and the oracle's next action (keep walking, retry the lookup)
is its standard behaviour, so it stays in the demo. Demos also end at success, at termination (a
hole that ends the game), at the row's turn cap, and before a turn that would not fit `max_len`.

With `cut_after_error=False` the noisy episode continues after errors (a probe set of states
reached by mistakes, for decision-accuracy and recovery evaluation). `reply_start[b, t]` is the
token offset of turn t's reply, so `tokens[b, :reply_start[b, t]]` is the context the policy sees
right before it decides at turn t.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from bmrl.envs.base import INVALID, Env
from bmrl.envs.text import encode
from bmrl import compiles
from bmrl.formats import Format
from bmrl.rollout.engine import make_episode
from bmrl.rollout.policies import NoisyOracleData, Replay, ReplayPolicy
from bmrl.rollout.tokens import drop_spans
from bmrl.rollout.types import Injection, RolloutConfig, Trajectory, row_keys

__all__ = ["Demos", "check_demo_args", "demo_tokens_needed", "lay_out", "longest_reply", "make_demos", "reply_table",
           "turn_records", "windowed_rows"]

RECOVERY_STREAM = 0x5EC0  # fold_in tag of a row's key for its "goes on after a mistake" draw


@struct.dataclass
class Demos:
    """A batch of demonstrations. B = batch, L = max_len, Tm = num_turns."""

    tokens: jax.Array  # int32[B, L]: prompt, observations, replies; pad after `length`
    length: jax.Array  # int32[B]: tokens in the demo (through the last stop token)
    loss_mask: jax.Array  # float32[B, L]: 1 on reply tokens (action tokens + stop), 0 elsewhere
    turn_of_token: jax.Array  # int32[B, L]: 0-based turn of each token; -1 prompt prefix/padding
    action: jax.Array  # int32[B, Tm]: demonstrated action; INVALID (-1) where the turn is not in the demo
    oracle_action: jax.Array  # int32[B, Tm]: the oracle's action in the state before turn t
    wrong: jax.Array  # bool[B, Tm]: the action differs from the oracle's (a noise draw; in frozenlake
    #                   another move can be as short, it still counts as the demonstrator's deviation)
    error: jax.Array  # bool[B, Tm]: the environment reported an error (wrong action, slip, failed call...)
    turn_active: jax.Array  # bool[B, Tm]: turn t is part of the demo
    reply_start: jax.Array  # int32[B, Tm]: offset of turn t's first reply token; -1 where inactive
    reply_len: jax.Array  # int32[B, Tm]: reply tokens of turn t (action tokens + stop); 0 where inactive
    reply_cut: jax.Array  # int32[B, Tm]: leading tokens of turn t's reply that later contexts drop (`Format.kept_from`)
    progress: jax.Array  # float32[B, Tm + 1]: index 0 after reset, t + 1 after turn t
    caps: jax.Array  # int32[B]: the turn cap shown to (and imposed on) each row
    num_turns: jax.Array  # int32[B]: turns in the demo
    success: jax.Array  # bool[B]: the demo reaches the goal
    cut: jax.Array  # bool[B]: the demo ended at a demonstrator error (cut_after_error)
    overflow: jax.Array  # bool[B]: a turn the episode still had was dropped because it did not fit max_len


def reply_table(env: Env, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Host table of each action's reply tokens (stop excluded): (int32[A, W] padded, lengths int32[A])."""
    replies = []
    for row, n in zip(env.actions.tokens, env.actions.lengths):
        action = np.asarray(row[:n], np.int32)
        replies.append(np.asarray(fmt.reply_tokens(action), np.int32) if hasattr(fmt, "reply_tokens") else action)
    width = max(len(r) for r in replies)
    table = np.full((len(replies), width), fmt.pad_id, np.int32)
    for i, r in enumerate(replies):
        table[i, : len(r)] = r
    return table, np.asarray([len(r) for r in replies], np.int32)


def longest_reply(env: Any, fmt: Format, max_reply_tokens: int) -> int:
    """Tokens of the longest demonstrated reply, stop excluded: of a JAX env's actions in `fmt`; of a
    Python env's action strings, or (free-text actions) the most a reply may hold, max_reply_tokens - 1."""
    strings = getattr(env, "action_strings", None)
    if hasattr(env, "actions"):
        return int(reply_table(env, fmt)[1].max())
    if strings:
        return max(len(fmt.reply_tokens(encode(env.tokenizer, a))) for a in strings)
    return max_reply_tokens - 1


def demo_tokens_needed(env: Env, fmt: Format, num_turns: int) -> int:
    """Worst-case length of a `num_turns`-turn demonstration (every reply the longest one)."""
    return fmt.tokens_needed(num_turns, env.max_obs_len, int(reply_table(env, fmt)[1].max()) + 1)


def make_demos(
    env: Env,
    fmt: Format,
    tasks: Any,
    key: jax.Array,
    *,
    num_turns: int,
    max_len: int,
    noise: float,
    cut_after_error: bool = True,
    recovery: float = 0.0,
    caps: Any = None,
    actions: Any = None,
    max_reply_tokens: int | None = None,
) -> Demos:
    """Play `tasks` with the eps-noisy oracle and lay the episodes out in tokens (one jit).

    tasks: pytree with leading axis B (e.g. {"seed": int32[B]}); key: one PRNG key (split per row,
    as the rollout does) or B per-row keys. num_turns: Tm, the static number of turns played (the
    width of the per-turn arrays). caps: int32[B] per-row turn caps (default num_turns), shown to
    the agent when the env has show_budget. noise: probability of a random wrong action per turn.
    actions: optional int32[B, Tm] actions to replay instead of the noisy oracle's (e.g. to lay out
    a rollout's episodes); `noise` is then ignored and `wrong` still compares with the oracle.
    recovery: with `cut_after_error`, the probability that a row is NOT cut at its first own mistake
    but goes on (the noisy oracle takes the oracle's repair from the state the mistake left, with
    probability 1 - noise): the fraction of demonstrations that show a recovery.

    A Python env's demonstrations: `bmrl.learn.host_demos.make_host_demos` (same rules and layout; the
    run's player picks the one of its env).
    """
    check_demo_args(noise, recovery, num_turns)
    first = demo_tokens_needed(env, fmt, 1)
    if max_len < first:
        raise ValueError(
            f"max_len={max_len} cannot hold even one turn of {env.name} (up to {first} tokens: prompt "
            f"{fmt.first_chunk_len(env.max_obs_len)} + the longest reply and its stop token); raise max_len."
        )
    batch = jax.tree.leaves(tasks)[0].shape[0]
    caps = jnp.full((batch,), num_turns, jnp.int32) if caps is None else jnp.asarray(caps, jnp.int32)
    replay = actions is not None
    actions = jnp.zeros((batch, num_turns), jnp.int32) if actions is None else jnp.asarray(actions, jnp.int32)
    if actions.shape != (batch, num_turns):
        raise ValueError(f"actions must be int32[{batch}, {num_turns}], got {list(actions.shape)}.")
    if replay and bool(jnp.any((actions < 0) | (actions >= env.num_actions))):
        raise ValueError(
            f"replayed actions must be valid ids in [0, {env.num_actions}) (an INVALID reply has no action "
            "tokens); fill turns after the episode's end with any valid id."
        )
    fn = compiles.program("demos", (env, fmt, int(num_turns), int(max_len), bool(cut_after_error), replay),
                          lambda: _demo_fn(env, fmt, int(num_turns), int(max_len), bool(cut_after_error), replay))
    return fn(tasks, key, caps, jnp.float32(noise), actions, jnp.float32(recovery))


def check_demo_args(noise: float, recovery: float, num_turns: int) -> None:
    if not 0.0 <= float(noise) <= 1.0:
        raise ValueError(f"noise must be a probability in [0, 1], got {noise}.")
    if not 0.0 <= float(recovery) <= 1.0:
        raise ValueError(f"recovery (fraction of demos that go on after a mistake) must be in [0, 1], got {recovery}.")
    if num_turns < 1:
        raise ValueError(f"num_turns must be >= 1, got {num_turns}.")


def _demo_fn(env: Env, fmt: Format, num_turns: int, max_len: int, cut_after_error: bool, replay: bool):
    """The jitted `(tasks, key, caps, noise, actions) -> Demos` for one static shape: the episode engine
    plays the noisy oracle (or the replay), then the episodes are laid out in tokens."""
    cfg = RolloutConfig(max_turns=num_turns, max_reply_tokens=1, max_len=1)
    policy = ReplayPolicy() if replay else NoisyOracleData()
    episode = make_episode(policy, env, cfg, record_obs=True, name="demo_episode")

    def run(tasks, key, caps, noise, actions, recovery):
        batch = caps.shape[0]
        keys = row_keys(key, batch)
        caps = jnp.clip(caps, 1, num_turns)
        params = Replay(actions, jnp.full((batch,), num_turns, jnp.int32), keys) if replay else noise
        traj = episode(params, tasks, caps, keys, Injection.none(num_turns))
        goes_on = goes_on_after_error(keys, recovery)
        cut_rows = jnp.logical_and(cut_after_error, ~goes_on)  # bool[B]
        rec = turn_records(traj, cut_rows)
        table, lens = (jnp.asarray(x) for x in reply_table(env, fmt))  # [A, reply width], [A]
        act = jnp.clip(rec["action"], 0, env.num_actions - 1)
        return lay_out(fmt, {**rec, "reply": table[act], "reply_len": lens[act]}, caps, max_len)

    return compiles.counted_jit(run, name="demos")


def goes_on_after_error(keys: jax.Array, recovery) -> jax.Array:
    """bool[B]: the rows (row keys [B]) whose demo goes on after the first mistake (RECOVERY_STREAM draw)."""
    return jax.vmap(lambda k: jax.random.bernoulli(jax.random.fold_in(k, RECOVERY_STREAM), recovery))(keys)


def turn_records(traj: Trajectory, cut_rows: jax.Array, wrong: jax.Array | None = None) -> dict:
    """Per-turn records of the played episodes (`traj.observations` recorded); rows with `cut_rows`
    (bool[B]) end at the demonstrator's first own wrong action (that action included). `wrong`
    (bool[B, Tm]): the demonstrator's deviations, default action != oracle_action."""
    played = traj.turn_active
    turn = jnp.arange(played.shape[1])[None, :]
    success = played & (turn + 1 == traj.first_success_turn[:, None])
    wrong = played & ((traj.action != traj.oracle_action) if wrong is None else wrong)
    wrong_before = jnp.cumsum(wrong, axis=1) - wrong
    active = played & ~(cut_rows[:, None] & (wrong_before > 0))
    obs_tokens, obs_len = traj.observations
    return dict(
        obs_tokens=obs_tokens, obs_len=obs_len, action=traj.action, oracle=traj.oracle_action,
        wrong=wrong & active, error=traj.error & active, success=success & active, active=active,
        cut=active & wrong & cut_rows[:, None] & ~success, progress=traj.progress[:, 1:],
        progress0=traj.progress[:, 0],
    )


def lay_out(fmt: Format, rec: dict, caps: jax.Array, max_len: int) -> Demos:
    """Scatter the played turns into [B, max_len] token rows (one scatter per array).

    Turn t contributes the segments (reply_close if t > 0), obs_open, OBS_t, obs_close, ACT_t, STOP,
    each of a known length; offsets are a cumulative sum, so no Python loop over tokens. ACT_t is
    `rec["reply"][b, t]` (int32[B, Tm, W], its first `rec["reply_len"][b, t]` tokens).
    """
    batch, tm = rec["action"].shape
    L, pad = max_len, fmt.pad_id
    stop = int(fmt.stop_ids[0])
    frags = [np.asarray(f, np.int32) for f in (fmt.reply_close, fmt.obs_open, fmt.obs_close, np.asarray([stop]))]
    width = max([rec["obs_tokens"].shape[-1], rec["reply"].shape[-1]] + [len(f) for f in frags] + [1])

    def fixed(frag):  # a host fragment as a [B, Tm, width] segment
        row = np.full((width,), pad, np.int32)
        row[: len(frag)] = frag
        return jnp.broadcast_to(jnp.asarray(row), (batch, tm, width)), len(frag)

    def padw(x):
        return jnp.pad(x, ((0, 0), (0, 0), (0, width - x.shape[-1])), constant_values=pad)

    t_idx = jnp.arange(tm)[None, :]
    (rc, n_rc), (oo, n_oo), (oc, n_oc), (st, _) = (fixed(f) for f in frags)
    seg_tokens = jnp.stack([rc, oo, padw(rec["obs_tokens"]), oc, padw(rec["reply"]), st], axis=2)  # [B,Tm,6,W]
    seg_len = jnp.stack(
        [
            jnp.where(t_idx > 0, n_rc, 0) * jnp.ones((batch, tm), jnp.int32),
            jnp.full((batch, tm), n_oo, jnp.int32),
            rec["obs_len"].astype(jnp.int32),
            jnp.full((batch, tm), n_oc, jnp.int32),
            rec["reply_len"].astype(jnp.int32),
            jnp.ones((batch, tm), jnp.int32),
        ],
        axis=2,
    )  # [B, Tm, 6]
    is_reply = jnp.asarray([0, 0, 0, 0, 1, 1], bool)

    # Which turns are in the demo: played and fitting the buffer (the prefix comes first).
    played = rec["active"]
    turn_len = seg_len.sum(-1) * played
    end = len(fmt.prefix) + jnp.cumsum(turn_len, axis=1)  # [B, Tm] offset after turn t
    fits = end <= L
    active = played & fits
    overflow = jnp.any(played & ~fits, axis=1)
    seg_len = seg_len * active[..., None]
    flat_len = seg_len.reshape(batch, tm * 6)
    offset = len(fmt.prefix) + jnp.cumsum(flat_len, axis=1) - flat_len  # start of each segment
    length = len(fmt.prefix) + flat_len.sum(1)

    j = jnp.arange(width)[None, None, :]
    idx = jnp.where(j < flat_len[..., None], offset[..., None] + j, L)  # [B, Tm*6, W]; L = dropped
    idx = idx.reshape(batch, -1)
    rows = jnp.arange(batch)[:, None]
    tokens = jnp.full((batch, L), pad, jnp.int32)
    prefix = jnp.asarray(fmt.prefix, jnp.int32)
    tokens = tokens.at[:, : len(fmt.prefix)].set(jnp.broadcast_to(prefix, (batch, len(fmt.prefix))))
    tokens = tokens.at[rows, idx].set(seg_tokens.reshape(batch, -1), mode="drop")
    mask_vals = jnp.broadcast_to(is_reply[None, None, :, None], seg_tokens.shape).astype(jnp.float32)
    loss_mask = jnp.zeros((batch, L), jnp.float32).at[rows, idx].set(mask_vals.reshape(batch, -1), mode="drop")
    turn_vals = jnp.broadcast_to(jnp.arange(tm)[None, :, None, None], seg_tokens.shape)
    turn_of_token = jnp.full((batch, L), -1, jnp.int32).at[rows, idx].set(turn_vals.reshape(batch, -1), mode="drop")

    reply_start = offset.reshape(batch, tm, 6)[:, :, 4]
    reply_len = seg_len[:, :, 4] + seg_len[:, :, 5]
    reply_cut = jax.vmap(jax.vmap(fmt.kept_from))(rec["reply"], seg_len[:, :, 4])
    num_turns = active.sum(1).astype(jnp.int32)
    progress = jnp.concatenate(
        [rec["progress0"][:, None], jnp.where(active, rec["progress"], 0.0)], axis=1
    )
    # Carry progress forward over inactive turns (as the rollout does).
    progress = _carry_forward(progress, active)  # inactive turns repeat the last value, as in the rollout
    return Demos(
        tokens=tokens, length=length.astype(jnp.int32), loss_mask=loss_mask, turn_of_token=turn_of_token,
        action=jnp.where(active, rec["action"], INVALID), oracle_action=jnp.where(active, rec["oracle"], INVALID),
        wrong=rec["wrong"] & active, error=rec["error"] & active, turn_active=active,
        reply_start=jnp.where(active, reply_start, -1).astype(jnp.int32), reply_len=reply_len.astype(jnp.int32),
        reply_cut=jnp.broadcast_to(reply_cut, (batch, tm)).astype(jnp.int32),
        progress=progress, caps=caps, num_turns=num_turns, success=jnp.any(rec["success"] & active, axis=1),
        cut=jnp.any(rec["cut"] & active, axis=1), overflow=overflow,
    )


def _carry_forward(progress: jax.Array, active: jax.Array) -> jax.Array:
    """progress [B, Tm + 1]: where turn t is inactive, repeat the value after the last active turn."""
    keep = jnp.concatenate([jnp.ones_like(active[:, :1]), active], axis=1)
    idx = jnp.where(keep, jnp.arange(keep.shape[1])[None, :], 0)
    idx = jax.lax.cummax(idx, axis=1)
    return jnp.take_along_axis(progress, idx, axis=1)


def windowed_rows(d: Demos, history_turns: int | None, max_len: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each demonstrated turn as its own row, laid out as a rollout whose turns see contexts of their own lays out
    its learning samples (`bmrl.rollout.types.per_turn_contexts`): the prompt (prefix and first observation), the
    last `history_turns` turns (all of them when None), each reply cut to what the history keeps of it
    (`Demos.reply_cut`) and followed by its observation, then the turn's reply, the only tokens with loss.
    Returns (tokens int32[B * Tm, max_len], length int32[B * Tm], loss_mask float32[B * Tm, max_len]); row
    b * Tm + t is turn t of demo b, empty (length 0) where the turn is not in the demo or does not fit."""
    batch, tm = d.turn_active.shape
    t = jnp.arange(tm)
    H = tm if history_turns is None else history_turns
    prompt = d.reply_start[:, :1]  # turn 0's reply follows the prompt
    oldest = jnp.take_along_axis(d.reply_start, jnp.maximum(t - H, 0)[None, :].repeat(batch, 0), axis=1)
    drop = jnp.where(t[None, :] >= H, oldest - prompt, 0)  # [B, Tm]: the turns before the window
    held = (t[None, :] >= t[:, None] - H) & (t[None, :] < t[:, None])  # [Tm (row's turn), Tm]: turns in its window
    cuts = jnp.where(held[None], d.reply_cut[:, None, :], 0)  # [B, Tm, Tm]: what each held reply loses
    start = d.reply_start - drop - cuts.sum(-1)  # where the reply lands in its row
    length = start + d.reply_len
    keep = d.turn_active & (length <= max_len)
    span_start = jnp.concatenate([jnp.broadcast_to(prompt[:, None], (batch, tm, 1)),
                                  jnp.broadcast_to(d.reply_start[:, None, :], (batch, tm, tm))], axis=2)
    span_len = jnp.concatenate([drop[..., None], cuts], axis=2)  # [B, Tm, 1 + Tm]: the window, then each cut

    def rows(x):  # [B, L] -> the row of every turn, [B * Tm, L], what its context drops removed
        per_turn = jnp.broadcast_to(x[:, None], (batch, tm) + x.shape[1:]).reshape((batch * tm,) + x.shape[1:])
        return drop_spans(per_turn, span_start.reshape(batch * tm, -1), span_len.reshape(batch * tm, -1), 0)[:, :max_len]

    pos = jnp.arange(min(max_len, d.tokens.shape[1]))[None, :]
    reply = (pos >= start.reshape(-1, 1)) & (pos < length.reshape(-1, 1)) & keep.reshape(-1, 1)
    return rows(d.tokens), jnp.where(keep, length, 0).reshape(-1).astype(jnp.int32), rows(d.loss_mask) * reply