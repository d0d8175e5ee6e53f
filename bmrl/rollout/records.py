"""Episode records, defined once: what every loop over turns writes per turn and per row.

The compiled engine (jax arrays in its loop carry), the host loop of Python environments and the
Python-driven reference loop (numpy arrays) each put what their environment returned into a `Turn`
and call `record_turn`; `goes_on` says which rows play the next turn and `Records.fields` gives the
Trajectory's record fields. So the rules (a turn's reward with its format reward, progress carried,
first success, terminated against truncated) are written here only, and a new per-turn record is a
field of `Records` and `Turn`, its line in `record_turn` and `Records.fields`, its `Trajectory` field, and
the value each loop puts in its `Turn`. B = batch, Tm = max turns.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import struct

from bmrl.envs.base import INVALID


def _xp(x: Any) -> Any:
    """numpy for the host loops' numpy records, jax.numpy for the engine's."""
    return np if isinstance(x, np.ndarray) else jnp


def _set_column(arr: Any, t: Any, value: Any) -> Any:
    """arr with column t replaced by value (a copy for numpy, an update for jax)."""
    if isinstance(arr, np.ndarray):
        out = arr.copy()
        out[:, t] = value
        return out
    return arr.at[:, t].set(value)


@struct.dataclass
class Turn:
    """What turn t gave each row, [B]; rows that did not act are ignored (`record_turn`'s `active`)."""

    action: Any  # int32: parsed action id (INVALID where the reply did not parse)
    reward: Any  # the environment's reward (the format reward is added by `record_turn`)
    format_ok: Any  # bool: the reply kept the reply format
    error: Any  # bool: the environment reported an error (a slip, a failed tool call, a fault)
    invalid: Any  # bool: the reply named no action
    injected: Any  # bool: the action was a forced wrong one (error injection)
    oracle_action: Any  # int32: the best action in the state before the turn
    progress: Any  # float: the environment's progress after the turn
    success: Any  # bool: the goal was reached at this turn
    terminated: Any  # bool: the environment ended the episode
    truncated: Any  # bool: the environment cut the episode short (Python envs; JAX envs never do)


@struct.dataclass
class Records:
    """Per-turn and per-episode records of a batch (the layout of the Trajectory's record fields)."""

    action: Any  # int32[B, Tm]: INVALID where inactive
    reward: Any  # float32[B, Tm]
    error: Any  # bool[B, Tm]
    invalid: Any  # bool[B, Tm]
    format_error: Any  # bool[B, Tm]
    injected: Any  # bool[B, Tm]
    oracle_action: Any  # int32[B, Tm]: INVALID where inactive
    turn_active: Any  # bool[B, Tm]
    progress: Any  # float32[B, Tm + 1]: index 0 after reset, t + 1 after turn t
    turns_used: Any  # int32[B]
    success: Any  # bool[B]
    first_success_turn: Any  # int32[B]: 1-based; 0 = never
    terminated: Any  # bool[B]: the environment ended the episode
    env_truncated: Any  # bool[B]: the environment cut it short
    overflow: Any  # bool[B]: stopped because the next turn would not fit the buffer

    @classmethod
    def empty(cls, batch: int, max_turns: int, progress0: Any, xp: Any = jnp) -> "Records":
        """No turn played yet; `progress0: [B]` the progress after reset; `xp`: numpy or jax.numpy."""
        none = xp.full((batch, max_turns), INVALID, xp.int32)
        false = xp.zeros((batch, max_turns), bool)
        progress = _set_column(xp.zeros((batch, max_turns + 1), xp.float32), 0, progress0)
        zeros, no = xp.zeros((batch,), xp.int32), xp.zeros((batch,), bool)
        return cls(action=none, reward=xp.zeros((batch, max_turns), xp.float32), error=false, invalid=false,
                   format_error=false, injected=false, oracle_action=none, turn_active=false, progress=progress,
                   turns_used=zeros, success=no, first_success_turn=zeros, terminated=no, env_truncated=no, overflow=no)

    def overflowed(self, rows: Any) -> "Records":
        """The records with `rows: bool[B]` marked as stopped by the buffer."""
        return self.replace(overflow=self.overflow | rows)

    def fields(self, caps: Any) -> dict[str, Any]:
        """The Trajectory's record fields: progress after the last turn carried to the end, however early
        the row finished; terminated counts a success; truncated = stopped by the cap or the environment
        without ending (not by the buffer)."""
        xp = _xp(self.action)
        last = xp.minimum(xp.arange(self.progress.shape[1])[None, :], self.turns_used[:, None])
        done = self.terminated | self.success
        return dict(
            action=self.action, reward=self.reward, error=self.error, invalid=self.invalid,
            format_error=self.format_error, injected=self.injected, oracle_action=self.oracle_action,
            progress=xp.take_along_axis(self.progress, last, axis=1), turn_active=self.turn_active, caps=caps,
            turns_used=self.turns_used, success=self.success, first_success_turn=self.first_success_turn,
            terminated=done, truncated=~done & ~self.overflow & ((self.turns_used >= caps) | self.env_truncated),
            overflow=self.overflow,
        )


def record_turn(rec: Records, t: Any, active: Any, turn: Turn, format_reward: float) -> Records:
    """Write turn t's records for the `active: bool[B]` rows; the others keep theirs (progress carried).
    A reply that breaks the format adds `format_reward` to the turn's reward, in the reward's own dtype."""
    xp = _xp(rec.action)

    def put(arr, value):
        return _set_column(arr, t, xp.where(active, value, arr[:, t]))

    reward = turn.reward + xp.where(turn.format_ok, 0.0, format_reward).astype(turn.reward.dtype)
    won = active & turn.success
    return rec.replace(
        action=put(rec.action, turn.action), reward=put(rec.reward, reward), error=put(rec.error, turn.error),
        invalid=put(rec.invalid, turn.invalid), format_error=put(rec.format_error, ~turn.format_ok),
        injected=put(rec.injected, turn.injected), oracle_action=put(rec.oracle_action, turn.oracle_action),
        turn_active=put(rec.turn_active, active),
        progress=_set_column(rec.progress, t + 1, xp.where(active, turn.progress, rec.progress[:, t])),
        turns_used=rec.turns_used + active.astype(rec.turns_used.dtype), success=rec.success | won,
        first_success_turn=xp.where(won & ~rec.success, t + 1, rec.first_success_turn).astype(rec.first_success_turn.dtype),
        terminated=rec.terminated | (active & turn.terminated), env_truncated=rec.env_truncated | (active & turn.truncated),
    )


def goes_on(t: Any, active: Any, turn: Turn, caps: Any) -> Any:
    """bool[B]: the rows that play turn t + 1 if their next observation fits: they acted at turn t, the
    episode did not end (terminated, truncated by the environment, won) and their cap allows another turn."""
    return active & ~turn.terminated & ~turn.truncated & ~turn.success & (t + 1 < caps)


__all__ = ["Records", "Turn", "goes_on", "record_turn"]
