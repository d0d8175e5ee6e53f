"""Advantage estimators: small pure functions in a registry selected by name.

Outcome estimators map one scalar reward per sequence to one advantage per sequence:

    fn(rewards: [B], group_size: int, **options) -> advantages: [B]

where B = tasks * group_size and the members of a task's group are contiguous
(row = task_index * group_size + member), as in the rollout's `Trajectory`. `group_size` is a
Python int (static under jit). `token_advantages` then broadcasts them onto the policy tokens.

Trajectory estimators, marked by `@trajectory_estimator`, need more than one reward per sequence
(per-turn rewards, the observations) and give one advantage per turn, which the learner gives to the
tokens sampled in that turn (`spread_to_tokens`):

    fn(traj: Trajectory, group_size: int, **options) -> advantages: [B, Tm]

`ADVANTAGES` holds both kinds under one set of names (`train.advantage`); `takes_trajectory(fn)`
tells them apart. GiGPO (`bmrl.learn.gigpo`) is one.

Process supervision (`process_advantages`) turns the environment's `progress` into per-turn
rewards, discounts them over turns and spreads each turn's return onto that turn's reply tokens.
It is combined with the outcome advantage by `combine_advantages`:

    A[b, i] = A_outcome[b] * loss_mask[b, i] + process_coef * A_process[b, i]

so process_coef = 0 is pure outcome RL, and a large process_coef with a zero outcome advantage is
pure process supervision.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from bmrl.registry import Registry

Array = jax.Array
AdvantageFn = Callable[..., Array]


def _grouped(rewards: Array, group_size: int) -> Array:
    """rewards: [B] -> [tasks, group_size], checking that B is a multiple of group_size."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be [batch], got shape {rewards.shape}.")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive Python int, got {group_size!r}.")
    if rewards.shape[0] % group_size:
        raise ValueError(
            f"batch {rewards.shape[0]} is not a multiple of group_size {group_size}: rollouts must "
            "hold tasks * group_size rows with each task's group contiguous."
        )
    return rewards.astype(jnp.float32).reshape(-1, group_size)


def group_has_signal(rewards: Array, group_size: int) -> Array:
    """rewards: [B] (task-major groups) -> bool[groups]: the groups whose rewards are not all equal, the
    only ones an outcome advantage is non-zero in (every estimator here gives a constant group exactly 0)."""
    r = _grouped(rewards, group_size)
    return jnp.any(r != r[:, :1], axis=1)


def _centred(r: Array) -> Array:
    """r: [groups, G] minus each group's mean, exactly 0 for a group of identical rewards.

    The mean is taken of the offsets from the group's first member (`r - r[:, :1]`), which are
    exactly 0 in a constant group; `mean(r)` itself is not exact in float32 under jit (XLA
    multiplies the sum by a rounded 1/G, e.g. 3 * (1/3) = 1.0000001), and GRPO divides that
    rounding error by a near-zero std. Offsets also lose less precision when rewards are large.
    """
    d = r - r[:, :1]
    return d - d.mean(axis=1, keepdims=True)


def grpo_advantages(
    rewards: Array, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> Array:
    """GRPO: (r - group mean) / (group std + eps); population std (ddof=0).

    rewards: [B] -> [B]. `normalize_std=False` keeps only the mean baseline (as in Dr. GRPO),
    which does not up-weight groups whose rewards barely differ. A group with identical rewards
    gets advantage exactly 0 (for every group size, under jit too).
    """
    r = _grouped(rewards, group_size)
    centred = _centred(r)
    if normalize_std:
        std = jnp.sqrt(jnp.mean(jnp.square(centred), axis=1, keepdims=True))
        centred = centred / (std + eps)
    return centred.reshape(-1)


def rloo_advantages(rewards: Array, group_size: int) -> Array:
    """RLOO: r minus the mean reward of the *other* members of its group.

    rewards: [B] -> [B]. Needs group_size >= 2 (there must be another member). Equal to
    G / (G - 1) * (r - group mean).
    """
    if isinstance(group_size, int) and group_size < 2:
        raise ValueError(
            f"rloo needs group_size >= 2 (a leave-one-out baseline), got {group_size}."
        )
    r = _grouped(rewards, group_size)
    d = r - r[:, :1]  # offsets from the first member: exact zeros in a constant group (see _centred)
    others = (d.sum(axis=1, keepdims=True) - d) / (group_size - 1)
    return (d - others).reshape(-1)


def reinforce_advantages(rewards: Array, group_size: int = 1) -> Array:
    """REINFORCE with a batch-mean baseline: r - mean(r over the batch). rewards: [B] -> [B]."""
    r = _grouped(rewards, group_size).reshape(1, -1)
    return _centred(r).reshape(-1)


def trajectory_estimator(fn: AdvantageFn) -> AdvantageFn:
    """Mark `fn` as a trajectory estimator: `fn(traj, group_size, **options) -> token advantages [B, L]`."""
    fn.takes_trajectory = True
    return fn


def takes_trajectory(fn: AdvantageFn) -> bool:
    """True for a trajectory estimator (`@trajectory_estimator`), False for an outcome one."""
    return bool(getattr(fn, "takes_trajectory", False))


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator", {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce": reinforce_advantages,
    "gigpo": "bmrl.learn.gigpo:gigpo_trajectory_advantages",  # a trajectory estimator (imported when asked for)
})


def get_advantage(name: str) -> AdvantageFn:
    """The advantage estimator registered under `name` (outcome or trajectory: see `takes_trajectory`)."""
    return ADVANTAGES.lookup(name)


def token_advantages(seq_adv: Array, loss_mask: Array) -> Array:
    """Broadcast one advantage per sequence onto its policy tokens.

    seq_adv: [B], loss_mask: [B, L] -> [B, L] (0 where loss_mask is 0).
    """
    return seq_adv.astype(jnp.float32)[:, None] * loss_mask.astype(jnp.float32)


# --------------------------------------------------------------------------- process supervision


def process_turn_rewards(
    progress: Array, turn_active: Array, outcome: Array | None = None
) -> Array:
    """Per-turn rewards from progress deltas: r[b, t] = progress[b, t+1] - progress[b, t].

    progress: [B, Tm+1] (index 0 = after reset), turn_active: [B, Tm] bool, outcome: [B] or None.
    Returns [B, Tm], zero on inactive turns. With `outcome`, the outcome reward is added at each
    sequence's last active turn (sequences with no active turn get nothing).
    """
    active = turn_active.astype(jnp.float32)
    progress = progress.astype(jnp.float32)
    if progress.shape[-1] != turn_active.shape[-1] + 1:
        raise ValueError(
            f"progress must be [B, Tm+1] for turn_active [B, Tm]; got {progress.shape} and "
            f"{turn_active.shape}."
        )
    rewards = (progress[:, 1:] - progress[:, :-1]) * active
    if outcome is not None:
        num_turns = active.shape[1]
        t = jnp.arange(num_turns)
        last = jnp.max(jnp.where(turn_active, t, -1), axis=1)  # [B], -1 if never active
        at_last = (t[None, :] == last[:, None]).astype(jnp.float32)
        rewards = rewards + at_last * outcome.astype(jnp.float32)[:, None]
    return rewards


def discounted_returns(rewards: Array, turn_active: Array, gamma: float) -> Array:
    """Returns-to-go over turns: G[t] = r[t] + gamma * G[t+1], by a reverse `lax.scan`.

    rewards: [B, Tm], turn_active: [B, Tm] -> [B, Tm], zero on inactive turns.
    """
    active = turn_active.astype(jnp.float32)

    def step(carry: Array, xs: tuple[Array, Array]) -> tuple[Array, Array]:
        r_t, a_t = xs
        g = r_t * a_t + gamma * carry
        return g, g * a_t

    init = jnp.zeros(rewards.shape[0], jnp.float32)
    _, returns = jax.lax.scan(step, init, (rewards.astype(jnp.float32).T, active.T), reverse=True)
    return returns.T


def normalize_turn_values(values: Array, turn_active: Array, eps: float = 1e-6) -> Array:
    """Whiten `values` [B, Tm] over the active turns of the whole batch; inactive turns -> 0."""
    active = turn_active.astype(jnp.float32)
    n = jnp.maximum(active.sum(), 1.0)
    mean = (values * active).sum() / n
    var = (jnp.square(values - mean) * active).sum() / n
    return (values - mean) / (jnp.sqrt(var) + eps) * active


def spread_to_tokens(turn_values: Array, turn_of_token: Array, loss_mask: Array) -> Array:
    """Give every policy token the value of its turn.

    turn_values: [B, Tm], turn_of_token: [B, L] (-1 = not a turn token), loss_mask: [B, L]
    -> [B, L]; 0 on tokens with turn -1, a turn index >= Tm, or loss_mask 0.
    """
    num_turns = turn_values.shape[1]
    valid = (turn_of_token >= 0) & (turn_of_token < num_turns)
    idx = jnp.clip(turn_of_token, 0, num_turns - 1)
    values = jnp.take_along_axis(turn_values.astype(jnp.float32), idx, axis=1)
    return jnp.where(valid, values, 0.0) * loss_mask.astype(jnp.float32)


def process_advantages(
    progress: Array,
    turn_active: Array,
    turn_of_token: Array,
    loss_mask: Array,
    *,
    gamma: float = 1.0,
    outcome: Array | None = None,
    normalize: bool = True,
) -> Array:
    """Process-supervised token advantages from the environment's progress.

    progress: [B, Tm+1], turn_active: [B, Tm], turn_of_token: [B, L], loss_mask: [B, L],
    outcome: [B] or None -> [B, L]. Per-turn progress deltas (plus `outcome` at the last turn if
    given) are discounted with `gamma` into returns-to-go, whitened over the batch's active turns
    when `normalize`, and each turn's value is given to the tokens the policy sampled in it.
    """
    values = process_turn_values(progress, turn_active, gamma=gamma, outcome=outcome, normalize=normalize)
    return spread_to_tokens(values, turn_of_token, loss_mask)


def process_turn_values(
    progress: Array, turn_active: Array, *, gamma: float = 1.0, outcome: Array | None = None, normalize: bool = True
) -> Array:
    """The per-turn values [B, Tm] `process_advantages` gives to each turn's tokens: the discounted returns
    of the progress deltas (plus `outcome` at the last turn), whitened over the batch's active turns when
    `normalize`."""
    rewards = process_turn_rewards(progress, turn_active, outcome)
    returns = discounted_returns(rewards, turn_active, gamma)
    return normalize_turn_values(returns, turn_active) if normalize else returns


def combine_advantages(
    outcome_token_adv: Array, process_token_adv: Array | None, process_coef: float
) -> Array:
    """A = outcome token advantage + process_coef * process token advantage; all [B, L]."""
    if process_token_adv is None or (isinstance(process_coef, (int, float)) and process_coef == 0):
        return outcome_token_adv
    return outcome_token_adv + process_coef * process_token_adv
