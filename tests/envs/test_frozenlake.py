"""frozenlake: solvable levels (flood fill vs a Python BFS), holes, slips and the map text."""

from __future__ import annotations

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.envs.frozenlake import FAR, flood_distances
from tests.env_helpers import env_with


def bfs(holes: np.ndarray) -> np.ndarray:
    n = holes.shape[0]
    dist = np.full((n, n), FAR)
    dist[n - 1, n - 1] = 0
    queue = deque([(n - 1, n - 1)])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0)):
            a, b = r + dr, c + dc
            if 0 <= a < n and 0 <= b < n and not holes[a, b] and dist[a, b] == FAR:
                dist[a, b] = dist[r, c] + 1
                queue.append((a, b))
    return dist


def test_flood_fill_matches_bfs_and_every_level_is_solvable():
    rng = np.random.default_rng(0)
    flood = jax.jit(lambda h: flood_distances(h, (5, 5)))
    for _ in range(20):
        holes = rng.random((6, 6)) < 0.35
        holes[5, 5] = False
        np.testing.assert_array_equal(np.asarray(flood(jnp.asarray(holes))), bfs(holes))
    # Dense holes and no redraws: the deterministic repair must still make every level solvable.
    env = env_with("frozenlake", size=5, p_hole=0.7, max_redraws=0)
    holes, dist = jax.jit(jax.vmap(env.level))(jnp.arange(200, dtype=jnp.int32))
    assert (np.asarray(dist)[:, 0] < FAR).all() and not np.asarray(holes)[:, [0, 24]].any()
    for h, d in zip(np.asarray(holes)[:20], np.asarray(dist)[:20]):
        np.testing.assert_array_equal(d.reshape(5, 5), bfs(h.reshape(5, 5)))


def _into_hole(env, seeds=range(200)):
    """A state next to a hole and the action that walks into it."""
    reset = jax.jit(env.reset)
    for seed in seeds:
        s, _ = reset(jax.random.PRNGKey(0), {"seed": jnp.int32(seed)})
        h = np.asarray(s.holes).reshape(env.N, env.N)
        if h[0, 1]:
            return s, 2  # right
        if h[1, 0]:
            return s, 1  # down
    raise AssertionError("no level with a hole next to the start")


def test_hole_sends_back_to_start_or_terminates():
    back = env_with("frozenlake", size=4, p_hole=0.4)
    s, a = _into_hole(back)
    s = s.replace(pos=jnp.int32(0))
    s2, o, r, d, info = jax.jit(back.step)(jax.random.PRNGKey(0), s, a)
    assert int(s2.pos) == 0 and bool(info.error) and not bool(d) and float(r) == 0.0
    assert back.render_text(o) == "You fell into a hole and are back at the start.\nAt row 0, col 0.\n"
    ends = env_with("frozenlake", size=4, p_hole=0.4, hole_terminates=True)
    s2, o, r, d, info = jax.jit(ends.step)(jax.random.PRNGKey(0), s, a)
    assert bool(d) and bool(info.error) and not bool(info.success) and float(info.progress) == 0.0
    assert ends.render_text(o).startswith("You fell into a hole.\n")


def test_map_text_and_slips_go_sideways():
    env = env_with("frozenlake", size=4, p_hole=0.2, eps=0.5)
    s, o = jax.jit(env.reset)(jax.random.PRNGKey(0), {"seed": jnp.int32(7)})
    lines = env.render_text(o).split("\n")
    h = np.asarray(s.holes).reshape(4, 4)
    assert lines[0] == "Map:" and lines[5] == "At row 0, col 0."
    for r in range(4):
        cells = lines[1 + r].split()
        assert cells == ["P" if (r, c) == (0, 0) else "G" if (r, c) == (3, 3) else "H" if h[r, c] else "F" for c in range(4)]
    # From (1,1) moving down: a slip goes left or right, never up or down+1.
    s = s.replace(holes=jnp.zeros_like(s.holes), pos=jnp.int32(5))
    steps = jax.jit(jax.vmap(env.step, in_axes=(0, None, None)))
    s2, _, _, _, info = steps(jax.random.split(jax.random.PRNGKey(3), 2000), s, 1)
    pos = np.asarray(s2.pos)
    assert set(pos.tolist()) == {4, 6, 9}
    assert 0.45 < np.mean(pos != 9) < 0.55 and (np.asarray(info.error) == (pos != 9)).all()
