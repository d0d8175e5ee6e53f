"""Sokoban game logic in pure JAX: reverse-play level generator and an exact distance oracle.

No text here (the token layer is `bmrl.envs.sokoban`). A room is `size x size` with outer walls;
its interior is `n x n` cells, indexed `row * n + col`. A whole game position (player cell and box
cells) is one int32, `state = ((player * C) + box_0) * C + box_1` with `C = n * n`, so every
position of a level fits in a table of `C ** (1 + boxes)` entries (15,625 for 7x7 with 2 boxes).

At reset the level's exact distance-to-goal table is computed over that whole table by backward
value iteration (a min-plus Bellman update, repeated until nothing changes); it is what makes the
oracle exact at every step, including after the agent's own mistakes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

UP, DOWN, LEFT, RIGHT, UNDO = 0, 1, 2, 3, 4
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # (drow, dcol) of up, down, left, right
OPPOSITE = np.array([DOWN, UP, RIGHT, LEFT], np.int32)
INF = 10_000  # distance of dead (unsolvable) and impossible positions; fits int16

# Outcome kinds of one move.
MOVED, PUSHED, BUMP_WALL, BUMP_BOX = 0, 1, 2, 3

# Cell codes of a rendered room.
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = range(7)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Static shape of a level family: room side (outer walls included) and number of boxes."""

    size: int = 6
    boxes: int = 2

    def __post_init__(self):
        if not 5 <= self.size <= 7:
            raise ValueError(
                f"sokoban size={self.size} is not supported; use 5, 6 or 7 (outer walls included)."
            )
        if self.boxes not in (1, 2):
            raise ValueError(f"sokoban boxes={self.boxes} is not supported; use 1 or 2.")

    @property
    def n(self) -> int:
        """Interior side."""
        return self.size - 2

    @property
    def cells(self) -> int:
        return self.n * self.n

    @property
    def num_states(self) -> int:
        return self.cells ** (1 + self.boxes)

    def grid_neighbors(self) -> np.ndarray:
        """int32[C, 4]: the interior neighbour of each cell per move, -1 at the outer wall."""
        n = self.n
        out = np.full((self.cells, 4), -1, np.int32)
        for r in range(n):
            for c in range(n):
                for a, (dr, dc) in enumerate(MOVES):
                    rr, cc = r + dr, c + dc
                    if 0 <= rr < n and 0 <= cc < n:
                        out[r * n + c, a] = rr * n + cc
        return out


@struct.dataclass
class Level:
    """One generated level: interior walls, box targets, start position and its distance table."""

    wall: jax.Array  # bool[C]
    targets: jax.Array  # int32[boxes]
    start: jax.Array  # int32[] encoded position
    dist: jax.Array  # int16[num_states], moves to the goal; INF where unsolvable or impossible


# ----------------------------------------------------------------------------------------------
# Encoding and moves


def encode(geom: Geometry, player: jax.Array, boxes: jax.Array) -> jax.Array:
    """Position index of `player` (int[...]) and `boxes` (int[..., boxes])."""
    s = player
    for i in range(geom.boxes):
        s = s * geom.cells + boxes[..., i]
    return s.astype(jnp.int32)


def decode(geom: Geometry, state: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(player int[...], boxes int[..., boxes]) of position indices `state`."""
    boxes = []
    s = state
    for _ in range(geom.boxes):
        boxes.append(s % geom.cells)
        s = s // geom.cells
    return s, jnp.stack(boxes[::-1], axis=-1)


def neighbors(geom: Geometry, wall: jax.Array) -> jax.Array:
    """int32[C, 4]: the floor neighbour of each cell per move, -1 for a wall (inner or outer)."""
    nbr = jnp.asarray(geom.grid_neighbors())
    return jnp.where((nbr >= 0) & ~wall[jnp.maximum(nbr, 0)], nbr, -1)


def move(geom: Geometry, nbr: jax.Array, state: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Apply move `action` (0..3) to position `state`; returns (new state, outcome kind).

    A blocked move (wall, or a box that cannot be pushed) leaves the position unchanged.
    Works elementwise on any matching shapes of `state` and `action`.
    """
    player, boxes = decode(geom, state)
    q = nbr[player, action]
    qi = jnp.maximum(q, 0)
    hit = boxes == q[..., None]  # [..., boxes]
    pushing = hit.any(-1)
    r = nbr[qi, action]  # where the pushed box would go
    box_free = ~(boxes == r[..., None]).any(-1)
    push_ok = (r >= 0) & box_free
    ok = (q >= 0) & (~pushing | push_ok)
    new_boxes = jnp.where(hit & ok[..., None], r[..., None], boxes)
    new_player = jnp.where(ok, q, player)
    kind = jnp.where(
        q < 0, BUMP_WALL, jnp.where(pushing, jnp.where(push_ok, PUSHED, BUMP_BOX), MOVED)
    )
    return encode(geom, new_player, new_boxes), kind.astype(jnp.int32)


def solved(geom: Geometry, targets: jax.Array, state: jax.Array) -> jax.Array:
    """bool[...]: every box of `state` is on a target."""
    _, boxes = decode(geom, state)
    return (boxes[..., :, None] == targets).any(-1).all(-1)


def consistent(geom: Geometry, wall: jax.Array, state: jax.Array) -> jax.Array:
    """bool[...]: player and boxes on distinct floor cells."""
    player, boxes = decode(geom, state)
    things = jnp.concatenate([player[..., None], boxes], axis=-1)
    on_floor = ~wall[things].any(-1)
    distinct = jnp.ones(state.shape, bool)
    for i in range(things.shape[-1]):
        for j in range(i + 1, things.shape[-1]):
            distinct &= things[..., i] != things[..., j]
    return on_floor & distinct


# ----------------------------------------------------------------------------------------------
# Exact distances


def solve(geom: Geometry, wall: jax.Array, targets: jax.Array) -> jax.Array:
    """int16[num_states]: minimum number of moves from every position to the goal (INF if none).

    Backward value iteration over the whole position table: d <- min(d, 1 + min_a d[next(s, a)]),
    from d = 0 on solved positions, until a sweep changes nothing (at most num_states sweeps).
    A move changes the position index by a constant per (direction, what moves): the player alone,
    or the player and box i. So `d[next(s, a)]` is one of a few static shifts of `d`, selected by a
    per-level table of move kinds; a sweep is one fused elementwise pass, no gathers.
    """
    nbr = neighbors(geom, wall)
    states = jnp.arange(geom.num_states, dtype=jnp.int32)
    actions = jnp.arange(4, dtype=jnp.int32)
    nxt, kind = move(geom, nbr, states[:, None], actions[None, :])  # [S, 4]
    player, boxes = decode(geom, states)
    _, new_boxes = decode(geom, nxt)
    moved_box = (new_boxes != boxes[:, None, :]).argmax(-1)  # [S, 4], meaningful where pushed
    # which shift gives d[next]: 0 = blocked, 1 = player only, 2 + i = player and box i
    which = jnp.where(nxt == states[:, None], 0, jnp.where(kind == PUSHED, 2 + moved_box, 1))
    ok = consistent(geom, wall, states)
    d0 = jnp.where(ok & solved(geom, targets, states), 0, INF).astype(jnp.int16)
    unit = [geom.cells ** (geom.boxes - i) for i in range(geom.boxes + 1)]  # player, box 0, box 1
    offsets = []
    for dr, dc in MOVES:
        step = dr * geom.n + dc
        offsets.append([step * (unit[0] + (unit[1 + i] if i >= 0 else 0)) for i in range(-1, geom.boxes)])

    margin = max(abs(o) for offs in offsets for o in offs)
    which = [which[:, a].astype(jnp.int8) for a in range(4)]

    def body(carry):
        d, _, it = carry
        padded = jnp.pad(d, margin, constant_values=INF)
        best = jnp.full_like(d, INF)
        for a in range(4):
            for j, off in enumerate(offsets[a]):
                shifted = jax.lax.slice(padded, (margin + off,), (margin + off + d.shape[0],))
                best = jnp.minimum(best, jnp.where(which[a] == 1 + j, shifted, INF))
        new = jnp.where(ok, jnp.minimum(d, jnp.minimum(best, INF - 1) + 1), INF).astype(jnp.int16)
        return new, (new != d).any(), it + 1

    def cond(carry):
        _, changed, it = carry
        return changed & (it < geom.num_states)

    d, _, _ = jax.lax.while_loop(cond, body, (d0, jnp.array(True), jnp.array(0)))
    return d


def value_with_undo(dist: jax.Array, state: jax.Array, history: jax.Array, depth: jax.Array) -> jax.Array:
    """Fewest turns to the goal when `undo` may also be used: min(dist[s], k + dist[history_k]).

    `history: int32[H]` holds earlier positions, most recent first; the first `depth` are valid.
    """
    k = jnp.arange(1, history.shape[0] + 1)
    back = jnp.where(k <= depth, k + dist[jnp.maximum(history, 0)].astype(jnp.int32), INF)
    return jnp.minimum(jnp.minimum(dist[state].astype(jnp.int32), back.min()), INF)


def oracle(geom: Geometry, nbr: jax.Array, dist: jax.Array, state: jax.Array,
           history: jax.Array, depth: jax.Array) -> jax.Array:
    """Best action (0..4): the move or undo with the fewest turns to the goal; moves win ties.

    In a dead position every move scores INF, so the oracle undoes back to a solvable one.
    """
    nxt, _ = move(geom, nbr, jnp.full((4,), state), jnp.arange(4, dtype=jnp.int32))
    moves = jnp.where(nxt != state, 1 + dist[nxt].astype(jnp.int32), 2 * INF)
    k = jnp.arange(1, history.shape[0] + 1)
    back = jnp.where(k <= depth, k + dist[jnp.maximum(history, 0)].astype(jnp.int32), 2 * INF).min()
    return jnp.argmin(jnp.concatenate([moves, back[None]])).astype(jnp.int32)


# ----------------------------------------------------------------------------------------------
# Generation


def _connected(geom: Geometry, wall: jax.Array) -> jax.Array:
    """bool[]: the floor cells form one connected region (reachability by repeated squaring of
    the floor adjacency matrix; a few small matmuls, no loop)."""
    nbr = neighbors(geom, wall)
    cells = jnp.arange(geom.cells)
    adj = ((nbr[:, :, None] == cells).any(1) | jnp.eye(geom.cells, dtype=bool)).astype(jnp.float32)
    for _ in range(int(np.ceil(np.log2(geom.cells)))):
        adj = jnp.minimum(adj @ adj, 1.0)
    first = jnp.argmin(wall)  # some floor cell
    return ((adj[first] > 0) | wall).all()


def _pull_lines(geom: Geometry, wall: jax.Array) -> jax.Array:
    """bool[C, 4]: a box on the cell can be pulled by a player stepping away in that direction."""
    nbr = neighbors(geom, wall)
    p = nbr  # the player's cell next to the box
    p2 = nbr[jnp.maximum(p, 0), jnp.arange(4)[None, :]]  # where the player steps to
    return (p >= 0) & (p2 >= 0) & ~wall[:, None]


def _uniform(bits: jax.Array) -> jax.Array:
    """float32 uniform in (0, 1) from uint32 random bits."""
    return ((bits >> 8).astype(jnp.float32) + 0.5) * (1.0 / (1 << 24))


def _gumbel(bits: jax.Array) -> jax.Array:
    """Standard Gumbel noise from uint32 random bits."""
    return -jnp.log(-jnp.log(_uniform(bits)))


def _pick(bits: jax.Array, allowed: jax.Array) -> jax.Array:
    """Uniformly random index among `allowed` (last axis) from bits of the same shape."""
    return jnp.argmax(jnp.where(allowed, _gumbel(bits), -jnp.inf), -1).astype(jnp.int32)


def random_walls(geom: Geometry, bits: jax.Array) -> jax.Array:
    """bool[C]: up to `attempts` random interior walls (`bits: uint32[attempts, C]`), each kept only
    if the floor stays connected and a box can still be pulled somewhere (so that reverse play can
    move a box off its target)."""
    min_floor = geom.boxes + 3
    if bits.shape[0] == 0:
        return jnp.zeros(geom.cells, bool)

    def add(i, wall):
        new = wall.at[_pick(bits[i], ~wall)].set(True)
        conn = _connected(geom, new)
        enough = (~new).sum() >= min_floor
        pullable = _pull_lines(geom, new).any()
        return jnp.where(conn & enough & pullable, new, wall)

    return jax.lax.fori_loop(0, bits.shape[0], add, jnp.zeros(geom.cells, bool))


def _initial_position(geom: Geometry, bits: jax.Array, wall: jax.Array):
    """Targets and a first reverse move that pulls box 0 off its target (`bits: uint32[boxes, 4C]`).

    Returns (targets int32[boxes], position with boxes on targets, forced first pull direction).
    """
    lines = _pull_lines(geom, wall)
    # box 0's target and the direction the player steps away to pull it
    flat = _pick(bits[0], lines.reshape(-1))
    t0, a = flat // 4, flat % 4
    nbr = neighbors(geom, wall)
    player = nbr[t0, a]
    beyond = nbr[player, a]
    targets = [t0]
    taken = wall.at[t0].set(True).at[player].set(True).at[beyond].set(True)
    for i in range(1, geom.boxes):
        t = _pick(bits[i, : geom.cells], ~taken)
        targets.append(t)
        taken = taken.at[t].set(True)
    targets = jnp.stack(targets).astype(jnp.int32)
    return targets, encode(geom, player, targets), a.astype(jnp.int32)


def _pull(geom: Geometry, nbr: jax.Array, layout: jax.Array, state: jax.Array, action: jax.Array,
          pull: jax.Array) -> jax.Array:
    """Reverse move of walks [M]: the player steps in `action`; if `pull`, the box behind follows.

    `nbr: int32[layouts * C * 4]` holds the flattened neighbour tables of all layouts and
    `layout: int32[M]` says which one each walk plays in (flat gathers compile fast).
    """
    player, boxes = decode(geom, state)
    base = layout * (geom.cells * 4) + player * 4
    q = nbr[base + action]
    free = (q >= 0) & ~(boxes == q[:, None]).any(-1)
    behind = nbr[base + jnp.asarray(OPPOSITE)[action]]
    follow = pull[:, None] & (boxes == behind[:, None]) & (behind >= 0)[:, None]
    new_boxes = jnp.where(free[:, None] & follow, player[:, None], boxes)
    return encode(geom, jnp.where(free, q, player), new_boxes)


def reverse_walks(geom: Geometry, bits: jax.Array, walls: jax.Array, targets: jax.Array,
                  start: jax.Array, first: jax.Array, walks: int, pull_prob: float = 0.75) -> jax.Array:
    """int32[layouts, walks * steps]: positions visited by random reverse play (pulls) from solved
    positions, `walks` walks in each of the layouts (`walls: bool[L, C]`, `targets: int32[L, boxes]`);
    `bits: uint32[steps + 1, L * walks, C]` is the randomness.

    Walk 0 of a layout starts at its `start` with the pull `first`, which moves a box off its
    target (so at least one visited position is unsolved); the others start with the boxes on the
    targets and the player on a random free cell, since a forced first pull can trap the player in
    a dead end. Every visited position is solvable by replaying its walk forwards.
    """
    n_layouts = walls.shape[0]
    m = n_layouts * walks
    steps = bits.shape[0] - 1
    layout = jnp.repeat(jnp.arange(n_layouts), walks)  # [M]
    nbr = jax.vmap(lambda w: neighbors(geom, w))(walls).reshape(-1)
    taken = walls | (jnp.arange(geom.cells) == targets[..., None]).any(-2)  # [L, C]
    player = _pick(bits[0], ~taken[layout])
    own = jnp.arange(m) % walks == 0
    s0 = jnp.where(own, start[layout], encode(geom, player, targets[layout]))
    acts = (bits[1:, :, 0] >> 30).astype(jnp.int32)  # [steps, M] in 0..3
    pulls = (bits[1:, :, 1] >> 8) < int(pull_prob * (1 << 24))
    a0 = jnp.where(own, first[layout], acts[0])
    s1 = _pull(geom, nbr, layout, s0, a0, jnp.ones((m,), bool))

    def step(s, a_pull):
        s = _pull(geom, nbr, layout, s, a_pull[0], a_pull[1])
        return s, s

    _, path = jax.lax.scan(step, s1, (acts[1:], pulls[1:]))  # [steps - 1, M]
    visited = jnp.concatenate([s1[None], path])  # [steps, M]
    return visited.reshape(steps, n_layouts, walks).transpose(1, 2, 0).reshape(n_layouts, -1)


def _displacement(geom: Geometry, targets: jax.Array, state: jax.Array) -> jax.Array:
    """int32[...]: Manhattan distance of each box to its nearest target, summed (a cheap proxy
    for how far reverse play moved the boxes)."""
    _, boxes = decode(geom, state)
    t = targets[..., None, :]  # targets: int32[..., boxes], batch dims broadcastable to state's
    dr = jnp.abs(boxes[..., :, None] // geom.n - t // geom.n)
    dc = jnp.abs(boxes[..., :, None] % geom.n - t % geom.n)
    return (dr + dc).min(-1).sum(-1)


def generate(geom: Geometry, seed: jax.Array, wall_attempts: int = 0, layouts: int = 4,
             walks: int = 8, steps: int | None = None, max_moves: int | None = None) -> Level:
    """The level of `seed`: random walls and targets, reverse play, exact distances, a start.

    `layouts` candidate rooms (walls and targets) are played in reverse; the one whose boxes moved
    farthest is kept (a target in a dead end would otherwise give one-move levels). The start is
    the hardest position its reverse play visited (so solvable, not solved) whose optimal solution
    takes at most `max_moves` moves, ties broken at random; when every visited position needs
    more, the easiest one.

    All randomness is one threefry draw of bits from the seed (sliced per use): a dozen separate
    `jax.random` calls made the vmapped generator several seconds slower to compile.
    """
    c = geom.cells
    steps = steps or 4 * c
    sizes = {
        "walls": (layouts, wall_attempts, c),
        "init": (layouts, geom.boxes, 4 * c),
        "walks": (steps + 1, layouts * walks, c),
        "pick": (layouts,),
        "start": (walks * steps,),
    }
    total = sum(int(np.prod(v)) for v in sizes.values())
    flat = jax.random.bits(jax.random.key(seed), (total,), jnp.uint32)
    bits, at = {}, 0
    for name, shape in sizes.items():
        size = int(np.prod(shape))
        bits[name] = flat[at : at + size].reshape(shape)
        at += size

    def layout(wall_bits, init_bits):
        wall = random_walls(geom, wall_bits)
        return (wall, *_initial_position(geom, init_bits, wall))

    walls, targetss, starts, firsts = jax.vmap(layout)(bits["walls"], bits["init"])
    visiteds = reverse_walks(geom, bits["walks"], walls, targetss, starts, firsts, walks)  # [L, V]
    spread = _displacement(geom, targetss[:, None, :], visiteds).max(-1)
    best = jnp.argmax(spread + _uniform(bits["pick"]))
    wall, targets, visited = walls[best], targetss[best], visiteds[best]
    dist = solve(geom, wall, targets)
    d = dist[visited].astype(jnp.float32)
    cap = INF - 1 if max_moves is None else max_moves
    score = jnp.where(d <= cap, d, -d)  # within the cap: harder is better; above it: easier is
    score = jnp.where(d >= 1, score, -2.0 * INF)  # never the solved position
    score = score + 0.5 * _uniform(bits["start"])
    return Level(wall=wall, targets=targets, start=visited[jnp.argmax(score)], dist=dist)


# ----------------------------------------------------------------------------------------------
# Rendering


def render(geom: Geometry, wall: jax.Array, targets: jax.Array, state: jax.Array) -> jax.Array:
    """int32[size, size] cell codes (WALL ... PLAYER_ON_TARGET) of the room in position `state`."""
    player, boxes = decode(geom, state)
    cells = jnp.arange(geom.cells)
    is_target = (cells[:, None] == targets).any(-1)
    is_box = (cells[:, None] == boxes).any(-1)
    code = jnp.where(wall, WALL, jnp.where(is_target, TARGET, FLOOR))
    code = jnp.where(is_box, jnp.where(is_target, BOX_ON_TARGET, BOX), code)
    code = jnp.where(cells == player, jnp.where(is_target, PLAYER_ON_TARGET, PLAYER), code)
    room = jnp.full((geom.size, geom.size), WALL, jnp.int32)
    return room.at[1:-1, 1:-1].set(code.reshape(geom.n, geom.n))
