"""frozenlake: cross an N x N slippery lake from the top-left corner to the goal at the bottom-right.

Holes are drawn from the seed; a jitted flood fill (breadth-first distances to the goal) checks that
the goal is reachable, and unreachable lakes are redrawn with a derived key, finally repaired by
clearing the top row and the right column, so every level is solvable. With probability eps a move
slips to a perpendicular direction. Falling into a hole sends the agent back to the start (an error it
can recover from) or, with `hole_terminates=True`, ends the episode. The oracle follows the shortest
path (exactly optimal when nothing slips). The map is shown once, at reset; each step shows the
position.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from bmrl.envs.base import Env, Outcome

FAR = 1 << 20  # distance of unreachable cells
DELTAS = ((0, -1), (1, 0), (0, 1), (-1, 0))  # left, down, right, up (gym order)
FROZEN, HOLE, GOAL, PLAYER = 0, 1, 2, 3


@struct.dataclass
class LakeState:
    pos: jnp.ndarray  # int32[]: row * N + col
    holes: jnp.ndarray  # bool[N*N]
    dist: jnp.ndarray  # int32[N*N]: shortest-path turns to the goal (FAR if unreachable or a hole)


def flood_distances(holes: jnp.ndarray, goal: tuple[int, int]) -> jnp.ndarray:
    """Shortest-path distances `[N, N]` to `goal` over non-hole cells (FAR where unreachable)."""
    n = holes.shape[0]
    dist = jnp.full((n, n), FAR, jnp.int32).at[goal].set(0)

    def relax(carry):
        d, _ = carry
        padded = jnp.pad(d, 1, constant_values=FAR)
        nbr = jnp.minimum(
            jnp.minimum(padded[:-2, 1:-1], padded[2:, 1:-1]),
            jnp.minimum(padded[1:-1, :-2], padded[1:-1, 2:]),
        )
        new = jnp.where(holes, FAR, jnp.minimum(d, nbr + 1))
        return new, jnp.any(new != d)

    return jax.lax.while_loop(lambda c: c[1], relax, (dist, jnp.bool_(True)))[0]


class FrozenLake(Env):
    """Slippery N x N lake; actions `left`, `down`, `right`, `up`."""

    name = "frozenlake"
    OPTIONS = {"size": 4, "p_hole": 0.2, "eps": 0.0, "hole_terminates": False, "max_redraws": 8}
    FEEDBACK = (
        "You slipped.\n",
        "You hit the edge of the lake.\n",
        "You fell into a hole and are back at the start.\n",
        "You fell into a hole.\n",
    )

    def _validate(self):
        o = self.options
        if not (isinstance(o["size"], int) and 2 <= o["size"] <= 16):
            raise ValueError(f"frozenlake: size must be an int in 2..16, got {o['size']!r}.")
        if not 0.0 <= float(o["p_hole"]) < 1.0:
            raise ValueError(f"frozenlake: p_hole must be in [0, 1), got {o['p_hole']!r}.")
        if not 0.0 <= float(o["eps"]) < 1.0:
            raise ValueError(f"frozenlake: eps (slip probability) must be in [0, 1), got {o['eps']!r}.")
        self.N = o["size"]
        self.goal = self.N * self.N - 1

    def _num_range(self):
        return self.N

    def _action_strings(self):
        return ["left", "down", "right", "up"]

    def _instructions(self):
        last = self.N - 1
        return (
            f"You cross a frozen lake of {self.N} by {self.N} cells, from the start at row 0, col 0 to "
            f"the goal G at row {last}, col {last}. Rows grow downward, columns to the right. "
            "The map marks you P, frozen ice F and holes H. The ice is slippery: a move may go sideways. "
            + (
                "Falling into a hole ends the game. "
                if self.options["hole_terminates"]
                else "Falling into a hole sends you back to the start. "
            )
            + "Actions: left, down, right, up. Reply with exactly one action."
        )

    def _groups(self):
        return {
            "map": ["Map:\n"],
            "cell": [" F", " H", " G", " P"],
            "nl": ["\n"],
            "at": ["At row"],
            "col": [", col"],
        }

    # ---- level ------------------------------------------------------------------------------
    def _draw(self, key):
        holes = jax.random.bernoulli(key, self.options["p_hole"], (self.N * self.N,))
        return holes.at[0].set(False).at[self.goal].set(False)

    def level(self, seed) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Holes `bool[N*N]` and goal distances `int32[N*N]` of the level of `seed` (always solvable)."""
        n = self.N
        key = jax.random.PRNGKey(seed)
        dist_of = lambda h: flood_distances(h.reshape(n, n), (n - 1, n - 1)).reshape(-1)

        def unsolved(c):
            tries, _, dist = c
            return (dist[0] >= FAR) & (tries <= self.options["max_redraws"])

        def redraw(c):
            tries, _, _ = c
            holes = self._draw(jax.random.fold_in(key, tries))
            return tries + 1, holes, dist_of(holes)

        holes0 = self._draw(jax.random.fold_in(key, 0))
        _, holes, dist = jax.lax.while_loop(unsolved, redraw, (jnp.int32(1), holes0, dist_of(holes0)))
        rows, cols = jnp.divmod(jnp.arange(n * n), n)
        path = (rows == 0) | (cols == n - 1)  # top row then right column: always a way through
        holes = jnp.where(dist[0] >= FAR, holes & ~path, holes)
        return holes, dist_of(holes)

    def _reset(self, key, task):
        holes, dist = self.level(task["seed"])
        return LakeState(pos=jnp.int32(0), holes=holes, dist=dist)

    # ---- dynamics ---------------------------------------------------------------------------
    def _target(self, pos, action):
        """Cell reached by moving `action` from `pos`, and whether that would leave the lake."""
        d = jnp.asarray(DELTAS, jnp.int32)[action]
        r, c = jnp.divmod(pos, self.N)
        r2, c2 = r + d[0], c + d[1]
        off = (r2 < 0) | (r2 >= self.N) | (c2 < 0) | (c2 >= self.N)
        return jnp.where(off, pos, r2 * self.N + c2).astype(jnp.int32), off

    def _step(self, key, state, action):
        k_slip, k_side = jax.random.split(key)
        slipped = jax.random.bernoulli(k_slip, self.options["eps"])
        sideways = (action + jnp.where(jax.random.bernoulli(k_side), 1, 3)) % 4
        move = jnp.where(slipped, sideways, action)
        pos, off = self._target(state.pos, move)
        hole = state.holes[pos]
        terminate_on_hole = bool(self.options["hole_terminates"])
        if not terminate_on_hole:
            pos = jnp.where(hole, 0, pos).astype(jnp.int32)
        success = (pos == self.goal) & ~hole
        fb = self.fragments.id("feedback", 0)
        fb = jnp.where(off, self.feedback_id(self.FEEDBACK[1]), fb)
        fb = jnp.where(slipped, self.feedback_id(self.FEEDBACK[0]), fb)
        fb = jnp.where(hole, self.feedback_id(self.FEEDBACK[3 if terminate_on_hole else 2]), fb)
        terminated = success | (hole & terminate_on_hole)
        out = Outcome(success=success, error=slipped | off | hole, feedback=fb, terminated=terminated)
        return state.replace(pos=pos), out

    def _progress(self, state):
        total = jnp.maximum(state.dist[0], 1)
        return jnp.clip(1.0 - state.dist[state.pos] / total, 0.0, 1.0)

    def oracle_action(self, state):
        targets, off = jax.vmap(lambda a: self._target(state.pos, a))(jnp.arange(4))
        cost = jnp.where(off, FAR, state.dist[targets])
        return jnp.argmin(cost).astype(jnp.int32)

    def optimal_turns(self, task):
        return self.level(task["seed"])[1][0]

    # ---- text -------------------------------------------------------------------------------
    def _position_layout(self):
        return ("at", "num", "col", "num", "end")

    def _reset_layout(self):
        return ("map", *(("cell",) * self.N + ("nl",)) * self.N, *self._position_layout())

    def _step_layout(self):
        return ("feedback", *self._position_layout())

    def _position_frags(self, pos):
        f = self.fragments
        r, c = jnp.divmod(pos, self.N)
        return jnp.stack([f.id("at"), self.num_id(r), f.id("col"), self.num_id(c), f.id("end")])

    def _reset_frags(self, state):
        f = self.fragments
        kind = jnp.where(state.holes, HOLE, FROZEN).at[self.goal].set(GOAL).at[state.pos].set(PLAYER)
        cells = f.id("cell", kind).reshape(self.N, self.N)
        rows = jnp.concatenate([cells, jnp.full((self.N, 1), f.id("nl"))], axis=1).reshape(-1)
        return jnp.concatenate([f.id("map")[None], rows, self._position_frags(state.pos)])

    def _step_frags(self, state, feedback):
        return jnp.concatenate([jnp.atleast_1d(feedback), self._position_frags(state.pos)])
