"""keypad: type a secret code on a keypad whose keys may slip; recovery is a skill of its own.

The seed draws a code of L digits (0..digits-1): the level's content, so train and test levels can
differ in what they ask, not only in their seed. While the screen is clean the observation names the
next digit of the code, and the right move is to press it. A wrong press, or a right press that slips
(probability eps; a random other digit registers), leaves a wrong digit on the screen; the observation
then hides the next digit and says to delete it. Then `delete` is the only move that helps: presses
are refused until the wrong digit is gone. So unlike the corridor, where the move after a slip is the
move before it, the move after an error (delete) is one the oracle never makes in a clean state. Each
slip costs the oracle two turns (the slipped press and the delete); it finishes within T turns with
the probability of `keypad_success_prob`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from bmrl.envs.base import Env, Outcome

# Lines of the state after the count "Typed p of L": next digit / wrong digit shown / solved.
NEXT, WRONG, DONE = 0, 1, 2


@struct.dataclass
class KeypadState:
    code: jnp.ndarray  # int32[L]: the secret code
    typed: jnp.ndarray  # int32[]: length p of the correct prefix on the screen
    wrong: jnp.ndarray  # bool[]: a wrong digit follows the prefix on the screen
    shown: jnp.ndarray  # int32[]: that wrong digit (diagnostic only, not shown), -1 when clean


def keypad_success_prob(L: int, eps: float, T: int) -> float:
    """Chance that the oracle types the code (L right presses, none slipping) within T turns.

    Each slip costs two turns, so it succeeds iff L + 2S <= T, where S ~ NegativeBinomial(L, 1 - eps)
    counts the slips before the L-th registered press:
    sum_{s >= 0, L + 2s <= T} C(L + s - 1, s) (1 - eps)^L eps^s.
    """
    if T < L:
        return 0.0
    q = 1.0 - eps
    return float(sum(math.comb(L + s - 1, s) * q**L * eps**s for s in range((T - L) // 2 + 1)))


class Keypad(Env):
    """Type a `length`-digit code; actions `press 0` .. `press <digits-1>` and `delete`."""

    name = "keypad"
    OPTIONS = {"length": 5, "digits": 10, "eps": 0.0}
    FEEDBACK = (
        "Wrong digit.\n",
        "Your press slipped: wrong digit.\n",
        "Delete the wrong digit first.\n",
        "Nothing to delete.\n",
    )

    def _validate(self):
        L, D, eps = self.options["length"], self.options["digits"], self.options["eps"]
        if not (isinstance(L, int) and 1 <= L <= 16):
            raise ValueError(f"keypad: length (code length) must be an int in 1..16, got {L!r}.")
        if not (isinstance(D, int) and 2 <= D <= 10):
            raise ValueError(f"keypad: digits (alphabet size) must be an int in 2..10, got {D!r}.")
        if not 0.0 <= float(eps) < 1.0:
            raise ValueError(f"keypad: eps (slip probability) must be in [0, 1), got {eps!r}.")
        self.L, self.D, self.eps = L, D, float(eps)
        self.DELETE = D  # action id of `delete`; digit d is action d

    def _num_range(self):
        return max(self.L + 1, self.D)

    def _action_strings(self):
        return [f"press {d}" for d in range(self.D)] + ["delete"]

    def _action_summary(self):
        return f"press 0 to press {self.D - 1}, delete"

    def _instructions(self):
        return (
            f"Type a secret code of {self.L} digits (0 to {self.D - 1}) on a keypad. "
            "The screen shows the next digit. A press may slip and type a wrong digit; "
            "delete a wrong digit before you type on. "
            "Actions: press <digit>, delete. Reply with exactly one action."
        )

    def _groups(self):
        return {
            "typed": ["Typed"],
            "of": [" of"],
            "state": [". Next digit", ". Wrong digit to delete", ". Code accepted"],
        }

    # ---- dynamics ---------------------------------------------------------------------------
    def _reset(self, key, task):
        code = jax.random.randint(jax.random.PRNGKey(task["seed"]), (self.L,), 0, self.D, dtype=jnp.int32)
        return KeypadState(code=code, typed=jnp.int32(0), wrong=jnp.bool_(False), shown=jnp.int32(-1))

    def _step(self, key, state, action):
        k_slip, k_other = jax.random.split(key)
        p, wrong = state.typed, state.wrong
        need = self._need(state)
        is_delete = action == self.DELETE
        press = ~wrong & ~is_delete  # a press on a clean screen registers a digit
        right = press & (action == need) & (p < self.L)
        slipped = right & jax.random.bernoulli(k_slip, self.eps)
        other = (need + 1 + jax.random.randint(k_other, (), 0, self.D - 1)) % self.D  # any digit but `need`
        wrong_press = press & ~right
        blocked = wrong & ~is_delete  # a press with a wrong digit on the screen: refused
        nothing = ~wrong & is_delete  # delete on a clean screen: refused
        typed = (p + (right & ~slipped)).astype(jnp.int32)
        new_wrong = blocked | slipped | wrong_press
        shown = jnp.where(slipped, other, jnp.where(wrong_press, action, state.shown))
        shown = jnp.where(new_wrong, shown, -1).astype(jnp.int32)
        success = (typed == self.L) & ~new_wrong
        fb = self.fragments.id("feedback", 0)
        for cond, msg in zip((wrong_press, slipped, blocked, nothing), self.FEEDBACK):
            fb = jnp.where(cond, self.feedback_id(msg), fb)
        error = wrong_press | slipped | blocked | nothing
        out = Outcome(success=success, error=error, feedback=fb, terminated=success)
        return state.replace(typed=typed, wrong=new_wrong, shown=shown), out

    def _progress(self, state):
        return state.typed / self.L

    def _need(self, state):
        """The next digit of the code (the last one once all are typed)."""
        return state.code[jnp.minimum(state.typed, self.L - 1)]

    def oracle_action(self, state):
        return jnp.where(state.wrong, self.DELETE, self._need(state)).astype(jnp.int32)

    def optimal_turns(self, task):
        return jnp.asarray(self.L, jnp.int32) + 0 * jnp.asarray(task["seed"], jnp.int32)

    # ---- text -------------------------------------------------------------------------------
    def _reset_layout(self):
        return ("typed", "num", "of", "num", "state", ("num", "none"), "end")

    def _step_layout(self):
        return ("feedback", *self._reset_layout())

    def _reset_frags(self, state):
        f = self.fragments
        done = state.typed >= self.L
        line = jnp.where(state.wrong, WRONG, jnp.where(done, DONE, NEXT))
        digit = jnp.where(line == NEXT, self.num_id(self._need(state)), f.id("none"))
        return jnp.stack(
            [f.id("typed"), self.num_id(state.typed), f.id("of"), self.num_id(self.L), f.id("state", line), digit, f.id("end")]
        )

    def _step_frags(self, state, feedback):
        return jnp.concatenate([jnp.atleast_1d(feedback), self._reset_frags(state)])
