"""sokoban: push the boxes onto their targets in a small room, with `undo` to take back a move.

Levels come from `task["seed"]` at reset, inside jit (`bmrl.envs.sokoban_core`): random interior
walls that keep the room connected, boxes placed on targets, then reverse play (the player pulls
boxes around); the start is the hardest position reverse play reached, so every level is solvable
and none starts solved. The exact distance to the goal of every position of the level is computed
at reset and kept in the state, so the oracle is exact after any mistake: it takes the move (or the
undo) with the fewest remaining turns, and undoes out of dead positions.

Errors (the agent sees a line saying what went wrong): an invalid action, walking into a wall,
pushing a box that cannot move, `undo` with nothing to undo, and a push that makes the level
unsolvable (the last one is recoverable with `undo`).

Observation: the room as one line per row, one space-prefixed symbol per cell
(`#` wall, `_` floor, `O` target, `X` box, `*` box on target, `P` player, `+` player on target),
preceded by the feedback line of the last action. Every cell is its own pre-token for the GPT-2,
Llama-3 and Qwen2 regexes; the right wall and the newline form one fragment (" #\\n") because the
Llama-3/Qwen2 regex glues a newline to the punctuation before it.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from bmrl.envs import sokoban_core as core
from bmrl.envs.base import Env, Outcome
from bmrl.envs.text import encode

CELL_SYMBOLS = ("#", "_", "O", "X", "*", "P", "+")  # indexed by sokoban_core cell codes
ACTIONS = ("up", "down", "left", "right", "undo")
UNDO = core.UNDO


@struct.dataclass
class SokobanState:
    pos: jnp.ndarray  # int32[]: encoded position (player and boxes), see sokoban_core
    history: jnp.ndarray  # int32[undo_depth]: earlier positions, most recent first (-1 = empty)
    depth: jnp.ndarray  # int32[]: valid entries of `history`
    wall: jnp.ndarray  # bool[cells]: interior walls
    targets: jnp.ndarray  # int32[boxes]
    dist: jnp.ndarray  # int16[cells ** (1 + boxes)]: moves to the goal of every position (INF: dead)
    dist0: jnp.ndarray  # int32[]: moves to the goal from the start


class Sokoban(Env):
    """Sokoban in a `size` x `size` room (outer walls included) with 1-2 boxes and `undo`."""

    name = "sokoban"
    OPTIONS = {"size": 6, "boxes": 1, "walls": 2, "max_moves": None, "undo_depth": 32}
    FEEDBACK = (
        "You walked into a wall.\n",
        "The box cannot move there.\n",
        "Nothing to undo.\n",
        "That push made the level unsolvable.\n",
    )
    WALL_BUMP, BOX_BLOCKED, NOTHING_TO_UNDO, DEAD_PUSH = FEEDBACK

    def __init__(self, tokenizer, **options):
        super().__init__(tokenizer, **options)
        self._check_fragment_boundaries()

    def _validate(self):
        o = self.options
        for name, lo, hi in (("size", 5, 7), ("boxes", 1, 2), ("walls", 0, 12), ("undo_depth", 1, 1024)):
            if not (isinstance(o[name], int) and lo <= o[name] <= hi):
                raise ValueError(f"sokoban: {name} must be an int in {lo}..{hi}, got {o[name]!r}.")
        if o["max_moves"] is not None and not (isinstance(o["max_moves"], int) and o["max_moves"] >= 1):
            raise ValueError(f"sokoban: max_moves must be None or an int >= 1, got {o['max_moves']!r}.")
        self.geom = core.Geometry(o["size"], o["boxes"])

    # ---- text -------------------------------------------------------------------------------
    def _action_strings(self):
        return list(ACTIONS)

    def _instructions(self):
        n = self.options["boxes"]
        boxes = "the box onto the target" if n == 1 else f"all {n} boxes onto targets"
        return (
            f"Sokoban: push {boxes} in a {self.geom.size} by {self.geom.size} room. "
            "The map shows # wall, _ floor, O target, X box, * box on a target, P you, "
            "+ you on a target. Walk into a box to push it one cell, if the cell behind it is free; "
            "boxes cannot be pulled, so a box pushed into a corner is stuck. "
            "Actions: up, down, left, right (move one cell), undo (take back your last move). "
            "Reply with exactly one action."
        )

    def _groups(self):
        return {"cell": [f" {c}" for c in CELL_SYMBOLS], "eol": [" #\n"]}

    def _grid_layout(self):
        return (("cell",) * (self.geom.size - 1) + ("eol",)) * self.geom.size

    def _reset_layout(self):
        return self._grid_layout()

    def _step_layout(self):
        return ("feedback", *self._grid_layout())

    def _grid_frags(self, state):
        f = self.fragments
        codes = core.render(self.geom, state.wall, state.targets, state.pos)  # [size, size]
        ids = f.id("cell", codes).at[:, -1].set(f.id("eol"))  # the right wall is always a wall
        return ids.reshape(-1)

    def _reset_frags(self, state):
        return self._grid_frags(state)

    def _step_frags(self, state, feedback):
        return jnp.concatenate([jnp.atleast_1d(feedback), self._grid_frags(state)])

    def _check_fragment_boundaries(self):
        """Every fragment pair that can touch in an observation must split at a token boundary,
        so that assembled tokens equal the tokenization of the text (else raise, naming the pair)."""
        f = self.fragments
        cells = [f.texts[int(f.id("cell", i))] for i in range(len(CELL_SYMBOLS))]
        eol = f.texts[int(f.id("eol"))]
        feedback = [f.texts[int(f.id("feedback", i))] for i in range(f.size["feedback"])]
        after_grid = ["Turns left:", *feedback]
        pairs = [(a, b) for a in cells for b in cells + [eol]]
        pairs += [(eol, b) for b in cells + after_grid] + [(a, cells[0]) for a in feedback]
        for a, b in pairs:
            if encode(self.tokenizer, a) + encode(self.tokenizer, b) != encode(self.tokenizer, a + b):
                raise ValueError(
                    f"sokoban: the tokenizer merges across the fragments {a!r} + {b!r}, so observations "
                    "would not round-trip; use a byte-level BPE with a GPT-2/Llama-3/Qwen2-style "
                    "pre-tokenizer."
                )

    # ---- level ------------------------------------------------------------------------------
    def level(self, seed) -> core.Level:
        """The level of `seed` (walls, targets, start, distance table); jit-able."""
        o = self.options
        return core.generate(self.geom, jnp.asarray(seed, jnp.int32), wall_attempts=o["walls"],
                             max_moves=o["max_moves"])

    def _reset(self, key, task):
        lv = self.level(task["seed"])
        h = self.options["undo_depth"]
        return SokobanState(
            pos=lv.start,
            history=jnp.full((h,), -1, jnp.int32),
            depth=jnp.int32(0),
            wall=lv.wall,
            targets=lv.targets,
            dist=lv.dist,
            dist0=lv.dist[lv.start].astype(jnp.int32),
        )

    # ---- dynamics ---------------------------------------------------------------------------
    def _step(self, key, state, action):
        nbr = core.neighbors(self.geom, state.wall)
        moved, kind = core.move(self.geom, nbr, state.pos, jnp.minimum(action, 3))
        undo = action == UNDO
        can_undo = state.depth > 0
        changed = moved != state.pos
        pushed_hist = jnp.concatenate([state.pos[None], state.history[:-1]])
        popped_hist = jnp.concatenate([state.history[1:], jnp.full((1,), -1, jnp.int32)])
        pos = jnp.where(undo, jnp.where(can_undo, state.history[0], state.pos), moved)
        history = jnp.where(undo, jnp.where(can_undo, popped_hist, state.history),
                            jnp.where(changed, pushed_hist, state.history))
        depth = jnp.where(undo, jnp.maximum(state.depth - 1, 0),
                          jnp.where(changed, jnp.minimum(state.depth + 1, history.shape[0]), state.depth))
        dead_push = ~undo & (state.dist[pos] >= core.INF) & (state.dist[state.pos] < core.INF)
        wall_bump = ~undo & (kind == core.BUMP_WALL)
        box_blocked = ~undo & (kind == core.BUMP_BOX)
        empty_undo = undo & ~can_undo
        f = self.fragments
        fb = f.id("feedback", 0)
        fb = jnp.where(wall_bump, self.feedback_id(self.WALL_BUMP), fb)
        fb = jnp.where(box_blocked, self.feedback_id(self.BOX_BLOCKED), fb)
        fb = jnp.where(empty_undo, self.feedback_id(self.NOTHING_TO_UNDO), fb)
        fb = jnp.where(dead_push, self.feedback_id(self.DEAD_PUSH), fb)
        success = core.solved(self.geom, state.targets, pos)
        new = state.replace(pos=pos.astype(jnp.int32), history=history, depth=depth.astype(jnp.int32))
        out = Outcome(success=success, error=wall_bump | box_blocked | empty_undo | dead_push,
                      feedback=fb, terminated=success)
        return new, out

    def turns_to_go(self, state) -> jnp.ndarray:
        """Fewest turns to the goal from `state`, undos included (INF when no way is left)."""
        return core.value_with_undo(state.dist, state.pos, state.history, state.depth)

    def _progress(self, state):
        v = self.turns_to_go(state).astype(jnp.float32)
        return jnp.clip(1.0 - v / jnp.maximum(state.dist0, 1).astype(jnp.float32), 0.0, 1.0)

    def oracle_action(self, state):
        nbr = core.neighbors(self.geom, state.wall)
        return core.oracle(self.geom, nbr, state.dist, state.pos, state.history, state.depth)

    def optimal_turns(self, task):
        lv = self.level(task["seed"])
        return lv.dist[lv.start].astype(jnp.int32)

    # ---- host-side helpers -------------------------------------------------------------------
    def grid_text(self, state) -> str:
        """The room of an (unbatched) state as text, as the agent sees it (for logs and tests)."""
        return self.fragments.text(self._grid_frags(state).tolist())


def corpus(observations: bool = False) -> list[str]:
    """Sokoban texts for tokenizer training, no tokenizer needed: instructions of a few option sets,
    every fragment and action string and, with `observations`, whole observations of a few levels
    (this compiles the env, several seconds)."""
    from bmrl.envs import _CharTokenizer, _sample_texts

    texts: list[str] = []
    for i, opts in enumerate(({"show_budget": True}, {"size": 7, "boxes": 2, "walls": 3}, {"size": 5})):
        env = Sokoban(_CharTokenizer(), **opts)
        texts += [env.instructions, *env.action_strings]
        for group in env.text_groups().values():
            texts += [t for t in group if t]
        if observations and i < 2:
            texts += _sample_texts(env)
    return texts
