"""corridor: walk to the exit of a slippery corridor; the ground truth for Pass@(K,T).

Cells 0..L. The seed puts the exit at one end and the agent at the other, so the agent has to read
its observation. A move succeeds with probability 1 - eps; otherwise the agent slips and stays where it
was (an error it sees). The optimal policy (always toward the exit) finishes within T turns with
probability P[Binomial(T, 1 - eps) >= L] (`corridor_success_prob`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from bmrl.envs.base import Env, Outcome

LEFT, RIGHT = 0, 1


@struct.dataclass
class CorridorState:
    pos: jnp.ndarray  # int32[] in 0..L
    exit: jnp.ndarray  # int32[]: 0 or L
    start: jnp.ndarray  # int32[]: L - exit


def corridor_success_prob(L: int, eps: float, T: int) -> float:
    """Chance that the optimal policy reaches the exit (L successful moves) within T turns.

    P[Binomial(T, 1 - eps) >= L] = sum_{k=L}^{T} C(T, k) (1 - eps)^k eps^(T - k).
    """
    if T < L:
        return 0.0
    p = 1.0 - eps
    return float(sum(math.comb(T, k) * p**k * eps ** (T - k) for k in range(L, T + 1)))


class Corridor(Env):
    """Slippery corridor of length L; actions `left`, `right`."""

    name = "corridor"
    OPTIONS = {"length": 8, "eps": 0.0}
    FEEDBACK = ("You slipped and did not move.\n", "You hit a wall.\n")

    def _validate(self):
        L, eps = self.options["length"], self.options["eps"]
        if not (isinstance(L, int) and 1 <= L <= 999):
            raise ValueError(f"corridor: length must be an int in 1..999, got {L!r}.")
        if not 0.0 <= float(eps) < 1.0:
            raise ValueError(f"corridor: eps (slip probability) must be in [0, 1), got {eps!r}.")
        self.L = L
        self.eps = float(eps)

    def _num_range(self):
        return self.L + 1

    def _action_strings(self):
        return ["left", "right"]

    def _instructions(self):
        return (
            f"You are in a corridor of cells 0 to {self.L}. Walk to the exit, which is at one end. "
            "Each move may slip, leaving you where you were. "
            "Actions: left (one cell down), right (one cell up). Reply with exactly one action."
        )

    def _groups(self):
        return {"position": ["Position"], "exit": [". Exit at"]}

    # ---- dynamics ---------------------------------------------------------------------------
    def _reset(self, key, task):
        exit_right = jax.random.bernoulli(jax.random.PRNGKey(task["seed"]))
        exit_ = jnp.where(exit_right, self.L, 0).astype(jnp.int32)
        start = (self.L - exit_).astype(jnp.int32)
        return CorridorState(pos=start, exit=exit_, start=start)

    def _step(self, key, state, action):
        delta = jnp.where(action == RIGHT, 1, -1)
        slipped = jax.random.bernoulli(key, self.eps)
        target = state.pos + delta
        wall = (target < 0) | (target > self.L)
        pos = jnp.where(slipped | wall, state.pos, target).astype(jnp.int32)
        success = pos == state.exit
        feedback = jnp.where(
            slipped,
            self.feedback_id(self.FEEDBACK[0]),
            jnp.where(wall, self.feedback_id(self.FEEDBACK[1]), self.fragments.id("feedback", 0)),
        )
        out = Outcome(success=success, error=slipped | wall, feedback=feedback, terminated=success)
        return state.replace(pos=pos), out

    def _progress(self, state):
        return (self.L - jnp.abs(state.exit - state.pos)) / self.L

    def oracle_action(self, state):
        return jnp.where(state.exit > state.pos, RIGHT, LEFT).astype(jnp.int32)

    def optimal_turns(self, task):
        return jnp.asarray(self.L, jnp.int32) + 0 * jnp.asarray(task["seed"], jnp.int32)

    # ---- text -------------------------------------------------------------------------------
    def _reset_layout(self):
        return ("position", "num", "exit", "num", "end")

    def _step_layout(self):
        return ("feedback", *self._reset_layout())

    def _reset_frags(self, state):
        f = self.fragments
        return jnp.stack(
            [f.id("position"), self.num_id(state.pos), f.id("exit"), self.num_id(state.exit), f.id("end")]
        )

    def _step_frags(self, state, feedback):
        return jnp.concatenate([jnp.atleast_1d(feedback), self._reset_frags(state)])
