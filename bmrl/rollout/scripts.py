"""Scripted policies of Python environments, played by the host loop (`host_rollout(..., script=...)`).

A script acts on what the environments said, not on their state (a Python env's state is its own):

    act(t, rows, infos) -> {row: action text, or None to end that row before turn t}

where `infos[b]` is row b's latest info (reset's before turn 0, then its last step's). The host loop
plays the texts instead of decoding: with a model their replies are teacher-forced into its cache (the
tokens it would have produced), without one no model runs.

`NoisyOracleScript` is the eps-noisy oracle of `bmrl.rollout.policies` on the protocol's
`info["next_oracle_action"]` (the oracle's best action in the state the observation describes): with
probability eps a uniformly random WRONG action of the env's `action_strings`, drawn by `noisy_pick`
from the keys a compiled scripted policy uses (row key -> SCRIPT_STREAM -> fold_in(., t)), so a JAX env
wrapped as a Python one (`bmrl.envs.python.jax_env`) makes the same choices as the compiled demos.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.rollout.policies import noisy_pick
from bmrl.rollout.types import SCRIPT_STREAM, RolloutError, stream

NEXT_ORACLE = "next_oracle_action"
log = logging.getLogger(__name__)


@jax.jit
def _picks(keys: jax.Array, t: jax.Array, best: jax.Array, num_actions: jax.Array, eps: jax.Array) -> jax.Array:
    """`noisy_pick` of every row at turn t: keys [B] script keys, best int32[B] -> int32[B]."""
    step = jax.vmap(lambda k: jax.random.fold_in(k, t))(keys)
    return jax.vmap(lambda k, b: noisy_pick(k, b, num_actions, eps))(step, best)


class NoisyOracleScript:
    """The eps-noisy oracle of a Python env (module docstring), for `keys` (one row key per row).

    Records, per row and turn, the oracle's action text (`oracle[b][t]`), the action played
    (`played[b][t]`; None where the row did not act) and whether it was not the oracle's (`wrong[b, t]`). eps > 0 needs the env's finite `action_strings` (the wrong
    actions are drawn from them)."""

    def __init__(self, action_strings: Sequence[str], eps: float, keys: jax.Array, max_turns: int):
        self.actions = tuple(action_strings)
        if not 0.0 <= float(eps) <= 1.0:
            raise ValueError(f"noise must be a probability in [0, 1], got {eps}.")
        if eps > 0 and len(self.actions) < 2:
            raise ValueError(
                "a noisy oracle draws its wrong actions from the env's action_strings; this env lists "
                f"{len(self.actions)}: give the env an action_strings list, or set the noise to 0."
            )
        self.eps = float(eps)
        self.keys = stream(keys, SCRIPT_STREAM)
        batch = self.keys.shape[0]
        self.oracle: list[list[str | None]] = [[None] * max_turns for _ in range(batch)]
        self.played: list[list[str | None]] = [[None] * max_turns for _ in range(batch)]
        self.wrong = np.zeros((batch, max_turns), bool)

    def act(self, t: int, rows: Sequence[int], infos: Sequence[dict]) -> dict[int, str | None]:
        best: dict[int, str | None] = {}
        for b in rows:
            text = infos[b].get(NEXT_ORACLE)
            if not isinstance(text, str):  # a fault's info, or an env that stopped naming it: the row ends
                log.warning("row %d, turn %d: no info[%r] to act on; the demonstration ends there", b, t, NEXT_ORACLE)
                text = None
            elif self.actions and text not in self.actions:
                raise RolloutError(f"info[{NEXT_ORACLE!r}] = {text!r} is not one of the env's action_strings "
                                   f"{list(self.actions)}; the oracle must name one of them.")
            best[b] = text
        if not self.actions:  # eps = 0: the oracle itself
            out = best
        else:
            ids = np.zeros((self.keys.shape[0],), np.int32)
            for b, text in best.items():
                ids[b] = self.actions.index(text) if text is not None else 0
            picks = np.asarray(_picks(self.keys, jnp.int32(t), jnp.asarray(ids), jnp.int32(len(self.actions)),
                                      jnp.float32(self.eps)))
            out = {b: None if text is None else self.actions[int(picks[b])] for b, text in best.items()}
        for b, text in out.items():
            self.oracle[b][t], self.played[b][t] = best[b], text
            self.wrong[b, t] = text is not None and text != best[b]
        return out


__all__ = ["NEXT_ORACLE", "NoisyOracleScript"]
