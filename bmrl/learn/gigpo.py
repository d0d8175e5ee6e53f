"""GiGPO: Group-in-Group Policy Optimization (Feng et al., arXiv 2505.10978), step-level advantages.

GiGPO keeps GRPO's critic-free group of `group_size` rollouts per task and adds a second, finer group:
the turns of the task's rollouts that act from the same *anchor state* (the same observation). Its
advantage of turn t of rollout i is

    A[i, t] = A_episode[i] + step_weight * A_step[i, t]

    A_episode[i] = R_i - mean_group(R)                  R_i: rollout i's return (sum of its turn rewards)
    A_step[i, t] = G[i, t] - mean_anchor(G)             G[i, t] = r[i, t] + gamma * G[i, t + 1]

where mean_group is over the task's `group_size` rollouts (Eq. 3 of the paper) and mean_anchor over
the active turns of the same task group whose anchor id equals that of (i, t) (Eqs. 6-7), a revisited
state included (the same anchor at several turns of one rollout). With `normalize_std` both are
divided by their group's unbiased std + eps (the paper's and verl-agent's "mean_std_norm"); the
default is mean-only ("mean_norm", verl-agent's default). A step group of one member, a task group of
one rollout and a group of identical values all give exactly 0. Inactive turns get 0.

The paper and verl-agent use gamma = 0.95 for the step returns. It is GiGPO's own option
(`train.advantage_options.gamma`), separate from `train.gamma`, which discounts the process
advantages added on top by `train.process_coef`.

verl-agent (one batch row per step) computes the episode group's mean/std over all steps of the
group's rollouts, i.e. each rollout weighted by its number of turns; here each rollout counts once,
as Eq. 3 writes it.

The anchor of turn t is a hash of the observation tokens the policy read right before turn t
(`anchor_ids_from_tokens`); `gigpo_advantages` takes any anchor ids (an environment's state key). `gigpo_trajectory_advantages` is the estimator registered as
`train.advantage=gigpo` (`bmrl.learn.advantages.ADVANTAGES`, a trajectory estimator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from bmrl.learn.advantages import _centred, _grouped, discounted_returns, spread_to_tokens, trajectory_estimator

if TYPE_CHECKING:
    from bmrl.rollout import Trajectory

Array = jax.Array

_M1, _M2 = 0x85EBCA6B, 0xC2B2AE35  # MurmurHash3's fmix32 multipliers
_GOLDEN, _SALT, _TOKEN = 0x9E3779B9, 0x7F4A7C15, 0x27D4EB2F


def _fmix32(h: Array) -> Array:
    """MurmurHash3's 32-bit finaliser (a bijection of uint32 that spreads every input bit)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(_M1)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(_M2)
    return h ^ (h >> 16)


def anchor_ids_from_tokens(
    tokens: Array, length: Array, loss_mask: Array, turn_of_token: Array, max_turns: int
) -> Array:
    """The anchor state of every turn: uint32[B, max_turns], a hash of what the policy read before it.

    tokens: int32[B, L], length: int32[B], loss_mask: [B, L], turn_of_token: int32[B, L] (as a
    `Trajectory` holds them). The rollouts tag the observation shown before turn t with t (loss_mask
    0): turn 0's is the first observation (after the prompt prefix, tagged -1, which counts for turn
    0 here), turn t > 0's is the chunk written after reply t - 1. A turn's segment is its non-sampled
    tokens (loss_mask 0) inside `length` that come before its first sampled token, so a stop token
    appended to an over-long reply (tagged with its turn, loss_mask 0) is not part of the next anchor.

    The hash is order-sensitive: each token is mixed with its rank within the segment, the mixed terms
    are summed with uint32 wraparound (segment sums) and the sum is mixed with the segment's length.
    Equal segments give equal ids; different ones collide with probability about 2^-32 (anchors are
    only compared within a task group). Ranks count the segment's earlier tokens among all member
    tokens of the row, which is the rank within the segment as long as a turn's tokens are not
    interleaved with another turn's (turn ids never decrease along a row in every rollout). A turn with
    no segment (inactive, or a trajectory without tokens) gets the id of the empty segment. Jittable.
    """
    batch, width = tokens.shape
    pos = jnp.arange(width, dtype=jnp.int32)[None, :]
    turn = jnp.maximum(turn_of_token.astype(jnp.int32), 0)  # the prompt prefix (-1) belongs to turn 0
    valid = (pos < length[:, None]) & (turn < max_turns)
    sampled = loss_mask > 0
    rows = jnp.arange(batch, dtype=jnp.int32)[:, None]
    nseg = batch * max_turns
    seg = jnp.where(valid, rows * max_turns + turn, nseg)  # [B, L]; nseg collects what no turn reads
    first = jax.ops.segment_min(jnp.where(sampled, pos, width).reshape(-1), seg.reshape(-1), nseg + 1)
    member = valid & ~sampled & (pos < first[seg])
    seg = jnp.where(member, seg, nseg).reshape(-1)
    count = jnp.cumsum(member.astype(jnp.int32), axis=1) - 1  # members before each position in its row
    start = jax.ops.segment_min(jnp.where(member, count, width).reshape(-1), seg, nseg + 1)
    rank = (count.reshape(-1) - start[seg]).astype(jnp.uint32)
    key = _fmix32(rank * jnp.uint32(_GOLDEN) + jnp.uint32(_SALT))
    term = _fmix32(key ^ (tokens.reshape(-1).astype(jnp.uint32) * jnp.uint32(_TOKEN)))
    term = jnp.where(member.reshape(-1), term, jnp.uint32(0))
    total = jax.ops.segment_sum(term, seg, nseg + 1)[:nseg]
    n = jax.ops.segment_sum(member.reshape(-1).astype(jnp.uint32), seg, nseg + 1)[:nseg]
    return _fmix32(total + n * jnp.uint32(_GOLDEN)).reshape(batch, max_turns)


def _episode_advantages(returns: Array, group_size: int, normalize_std: bool, eps: float) -> Array:
    """returns: [B] -> [B], centred in each task group (exactly 0 for a constant group or a group of
    one), divided by the group's unbiased std + eps when `normalize_std`."""
    centred = _centred(_grouped(returns, group_size))
    if normalize_std and group_size > 1:
        std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=1, keepdims=True) / (group_size - 1))
        centred = centred / (std + eps)
    return centred.reshape(-1)


def _step_advantages(values: Array, active: Array, anchors: Array, group_size: int, normalize_std: bool,
                     eps: float) -> Array:
    """values, active, anchors: [B, T] -> [B, T]: each active turn's value minus the mean of the
    active turns of its task group with the same anchor ([tasks, G*T, G*T] comparisons)."""
    batch, turns = values.shape
    n_items = group_size * turns
    v = values.reshape(-1, n_items)
    a = anchors.reshape(-1, n_items)
    on = active.reshape(-1, n_items)
    same = (a[:, :, None] == a[:, None, :]) & on[:, :, None] & on[:, None, :]  # [tasks, N, N]
    size = jnp.sum(same, axis=2).astype(jnp.float32)  # >= 1 on active items (each matches itself)
    diff = jnp.where(same, v[:, None, :] - v[:, :, None], 0.0)  # v_j - v_i over i's step group
    centred = -jnp.sum(diff, axis=2) / jnp.maximum(size, 1.0)  # v_i - mean: exactly 0 when all are equal
    if normalize_std:
        dev = jnp.where(same, diff + centred[:, :, None], 0.0)  # v_j - mean
        var = jnp.sum(jnp.square(dev), axis=2) / jnp.maximum(size - 1.0, 1.0)
        std = jnp.where(size > 1, jnp.sqrt(var), 1.0)
        centred = centred / (std + eps)
    return jnp.where(on, centred, 0.0).reshape(batch, turns)


def gigpo_advantages(
    turn_rewards: Array,
    turn_mask: Array,
    anchor_ids: Array,
    group_size: int,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> Array:
    """GiGPO's per-turn advantages: float32[B, T], episode + step_weight * step on active turns, 0 elsewhere.

    turn_rewards: [B, T], turn_mask: bool[B, T] (the turns each rollout acted), anchor_ids: [B, T]
    (any integer ids; equal = the same anchor state); rows task-major, `group_size` (a Python int,
    static under jit) contiguous rows per task. Step returns are discounted with `gamma` over each
    row's turns. The anchor grouping compares every pair of turns of a task group: booleans and
    float32 temporaries of tasks * (group_size * T)^2 elements (8 tasks of 8 rollouts x 16 turns: 131k;
    64 x 16 x 50: 41M, ~160 MB each), no Python loop over the data. Jittable.
    """
    if turn_rewards.ndim != 2 or turn_rewards.shape != turn_mask.shape or turn_rewards.shape != anchor_ids.shape:
        raise ValueError(f"turn_rewards, turn_mask and anchor_ids must share one [batch, turns] shape; got "
                         f"{turn_rewards.shape}, {turn_mask.shape} and {anchor_ids.shape}.")
    active = turn_mask.astype(bool)
    rewards = jnp.where(active, turn_rewards.astype(jnp.float32), 0.0)
    episode = _episode_advantages(rewards.sum(axis=1), group_size, normalize_std, eps)
    returns = discounted_returns(rewards, active, gamma)
    step = _step_advantages(returns, active, anchor_ids, group_size, normalize_std, eps)
    return jnp.where(active, episode[:, None] + step_weight * step, 0.0).astype(jnp.float32)


def gigpo_token_advantages(
    turn_rewards: Array, turn_mask: Array, anchor_ids: Array, turn_of_token: Array, loss_mask: Array,
    group_size: int, **options,
) -> Array:
    """`gigpo_advantages` (its keyword `options`) given to the tokens the policy sampled in each turn:
    turn_of_token, loss_mask: [B, L] -> float32[B, L] (`spread_to_tokens`)."""
    values = gigpo_advantages(turn_rewards, turn_mask, anchor_ids, group_size, **options)
    return spread_to_tokens(values, turn_of_token, loss_mask)


@trajectory_estimator
def gigpo_trajectory_advantages(
    traj: Trajectory,
    group_size: int,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> Array:
    """`train.advantage=gigpo`: turn advantages [B, Tm] of a `Trajectory` (`traj.reward` per turn,
    `traj.turn_active`), anchors from its tokens (`trajectory_anchor_ids`)."""
    return gigpo_advantages(traj.reward, traj.turn_active, trajectory_anchor_ids(traj), group_size, gamma=gamma,
                            step_weight=step_weight, normalize_std=normalize_std, eps=eps)


def trajectory_anchor_ids(traj: Trajectory) -> Array:
    """uint32[B, Tm]: the anchor of each turn of `traj`, from its buffer (`anchor_ids_from_tokens`), or with a
    history window from each turn's own sample (turn t's anchor from the context of turn t)."""
    Tm = traj.turn_active.shape[1]
    samples = traj.turn_samples
    if samples is None:
        return anchor_ids_from_tokens(traj.tokens, traj.length, traj.loss_mask, traj.turn_of_token, Tm)
    rows = samples.rows()
    ids = anchor_ids_from_tokens(rows.tokens, rows.length, rows.loss_mask, rows.turn_of_token, Tm)
    t = jnp.arange(Tm)
    return ids.reshape(-1, Tm, Tm)[:, t, t]


__all__ = ["anchor_ids_from_tokens", "gigpo_advantages", "gigpo_token_advantages", "gigpo_trajectory_advantages",
           "trajectory_anchor_ids"]
