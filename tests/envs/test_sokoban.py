"""sokoban: reverse-play levels are solvable, the exact oracle solves them in optimal turns, undo,
error flags, arbitrary inputs, determinism, jit + vmap over 1024 envs, token round trips."""

from __future__ import annotations

import functools
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bmrl.envs import INVALID, make
from bmrl.envs import sokoban_core as core
from bmrl.envs.sokoban import UNDO, Sokoban
from bmrl.envs.sokoban import corpus as sokoban_corpus
from tests.tiny_tokenizer import shared_tokenizer
from tests.xla import optimised

N = 1024  # one batch size for the main env, so each of its functions compiles once


def tokenizer():
    return shared_tokenizer()


@functools.lru_cache(maxsize=None)
def env_of(**options) -> Sokoban:
    return make("sokoban", tokenizer(), **options)


def main_env() -> Sokoban:
    """The env most tests share: 6x6, two boxes, interior walls, turn budget shown."""
    return env_of(size=6, boxes=2, walls=2, show_budget=True)


# The oracle is checked on three room sizes; the 5x5 one caps the solution length.
CONFIGS = {
    "size6-boxes2-walls2-budget": dict(size=6, boxes=2, walls=2, show_budget=True),
    "size5-boxes1-max_moves5": dict(size=5, boxes=1, walls=0, max_moves=5),
    "size7-boxes2-walls3": dict(size=7, boxes=2, walls=3),
}


@functools.lru_cache(maxsize=None)
def jitted(env):
    """Batched functions of `env`, compiled once each (turns left passed when the budget is shown)."""
    budget = (lambda n, t: jnp.full((n,), t, jnp.int32)) if env.show_budget else (lambda n, t: None)
    reset, step = (jax.jit(jax.vmap(f), compiler_options=optimised()) for f in (env.reset, env.step))
    return {
        "reset": lambda keys, tasks, t=20: reset(keys, tasks, budget(len(keys), t)),
        "step": lambda keys, states, actions, t=19: step(keys, states, actions, budget(len(keys), t)),
        "oracle": jax.jit(jax.vmap(env.oracle_action), compiler_options=optimised()),
        "togo": jax.jit(jax.vmap(env.turns_to_go), compiler_options=optimised()),
    }


@functools.lru_cache(maxsize=None)
def main_batch():
    """(states, observations) of N levels of the main env."""
    env = main_env()
    return jitted(env)["reset"](keys(N), seeds(N, offset=5000))


def seeds(n, offset=0):
    return {"seed": jnp.arange(offset, offset + n, dtype=jnp.int32)}


def keys(n, seed=0):
    return jax.random.split(jax.random.PRNGKey(seed), n)


def row(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def rows_equal(a, b) -> np.ndarray:
    """bool[n]: batched pytrees `a` and `b` are equal row by row, every leaf."""
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    eq = [np.asarray(x == y).reshape(x.shape[0], -1).all(1) for x, y in leaves]
    return np.logical_and.reduce(eq)


def bfs_distance(geom, wall, targets, start) -> int:
    """Independent plain-Python breadth-first search: fewest moves from `start` to the goal."""
    nbr = geom.grid_neighbors()
    nbr = np.where((nbr >= 0) & ~wall[np.maximum(nbr, 0)], nbr, -1)
    c = geom.cells

    def dec(s):
        boxes = []
        for _ in range(geom.boxes):
            boxes.append(s % c)
            s //= c
        return s, boxes[::-1]

    def enc(p, boxes):
        for b in boxes:
            p = p * c + b
        return p

    seen, todo = {start: 0}, deque([start])
    while todo:
        s = todo.popleft()
        p, boxes = dec(s)
        if sorted(boxes) == sorted(targets):
            return seen[s]
        for a in range(4):
            q = nbr[p, a]
            if q < 0:
                continue
            nb = list(boxes)
            if q in nb:
                r = nbr[q, a]
                if r < 0 or r in nb:
                    continue
                nb[nb.index(q)] = r
            t = enc(q, nb)
            if t not in seen:
                seen[t] = seen[s] + 1
                todo.append(t)
    return core.INF


# ---- levels and oracle ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_oracle_solves_every_level_in_optimal_turns(name):
    env = env_of(**CONFIGS[name])
    fns = jitted(env)
    if env is main_env():
        n, (states, _) = N, main_batch()
    else:
        n = 256
        states, _ = fns["reset"](keys(n), seeds(n, offset=5000))
    opt = np.asarray(states.dist0)
    # reverse-play levels are solvable and not already solved, with non-trivial solutions
    assert (opt >= 1).all() and (opt < core.INF).all()
    assert np.median(opt) >= 5
    if env.options["max_moves"]:
        assert (opt <= env.options["max_moves"]).mean() > 0.95
    # the room stays connected and has its boxes and targets on distinct floor cells
    walls = np.asarray(states.wall)
    for i in range(0, n, n // 12):
        nbr = np.asarray(core.neighbors(env.geom, jnp.asarray(walls[i])))
        floor = np.flatnonzero(~walls[i])
        seen, todo = {floor[0]}, [floor[0]]
        while todo:
            for q in nbr[todo.pop()]:
                if q >= 0 and q not in seen:
                    seen.add(q)
                    todo.append(q)
        assert len(seen) == len(floor)
        grid = env.grid_text(row(states, i))
        assert grid.count("P") + grid.count("+") == 1
        assert grid.count("X") + grid.count("*") == env.geom.boxes
        assert grid.count("X") >= 1  # not solved
        # the distance table is exact: an independent BFS agrees at the start
        t = np.asarray(states.targets[i]).tolist()
        assert bfs_distance(env.geom, walls[i], t, int(states.pos[i])) == opt[i]
    # the oracle solves every level in exactly the optimal number of turns, without errors,
    # its progress rising every turn to 1.0 at the goal
    done = np.zeros(n, bool)
    first_success = np.zeros(n, int)
    last_progress = np.zeros(n)
    for t in range(int(opt.max()) + 2):
        states, _, reward, term, info = fns["step"](keys(n, t), states, fns["oracle"](states))
        active = ~done
        assert not np.asarray(info.error)[active].any()
        p = np.asarray(info.progress)
        assert (p[active] > last_progress[active]).all()
        assert ((p[active] == 1.0) == np.asarray(info.success)[active]).all()
        last_progress = p
        first_success[active & np.asarray(term)] = t + 1
        done |= np.asarray(term)
    assert done.all()
    np.testing.assert_array_equal(first_success, opt)


def test_optimal_turns_is_the_start_distance():
    env = main_env()
    states, _ = main_batch()
    opt = jax.jit(jax.vmap(env.optimal_turns), compiler_options=optimised())(seeds(N, offset=5000))
    np.testing.assert_array_equal(np.asarray(opt), np.asarray(states.dist0))


def test_distance_table_matches_bfs_on_random_positions():
    env = main_env()
    states, _ = main_batch()
    for i in range(4):
        wall, targets, dist = (np.asarray(x[i]) for x in (states.wall, states.targets, states.dist))
        ok = np.asarray(core.consistent(env.geom, jnp.asarray(wall), jnp.arange(env.geom.num_states)))
        for s in np.random.default_rng(i).choice(np.flatnonzero(ok), 25):
            assert bfs_distance(env.geom, wall, targets.tolist(), int(s)) == dist[s]
        assert (dist[~ok] == core.INF).all()


def _random_play(steps, seed, p_undo=0.15):
    """Random moves (and some undos) in the main batch; yields (before, action, after, obs, info...)."""
    env = main_env()
    fns = jitted(env)
    states, _ = main_batch()
    key = jax.random.PRNGKey(seed)
    for _ in range(steps):
        key, ka, ku = jax.random.split(key, 3)
        actions = jnp.where(jax.random.bernoulli(ku, p_undo, (N,)), UNDO, jax.random.randint(ka, (N,), 0, 4))
        new, obs, reward, terminated, info = fns["step"](keys(N), states, actions)
        yield states, actions, new, obs, reward, terminated, info
        states = new


def test_errors_flagged_and_undo_restores_the_exact_previous_state():
    env = main_env()
    fns = jitted(env)
    dead_pushes = undone = 0
    undo = jnp.full((N,), UNDO, jnp.int32)
    for states, actions, new, obs, reward, terminated, info in _random_play(12, seed=1):
        a = np.asarray(actions)
        pos, new_pos, depth = np.asarray(states.pos), np.asarray(new.pos), np.asarray(states.depth)
        dist = np.asarray(states.dist)
        d_old, d_new = dist[np.arange(N), pos], dist[np.arange(N), new_pos]
        move = a < UNDO
        bump = move & (pos == new_pos)
        dead = move & (d_new >= core.INF) & (d_old < core.INF)
        empty_undo = (a == UNDO) & (depth == 0)
        np.testing.assert_array_equal(np.asarray(info.error), bump | dead | empty_undo)
        assert not np.asarray(info.invalid).any()
        dead_pushes += dead.sum()
        # undo restores the exact previous state (every leaf), without an error
        back, _, _, _, binfo = fns["step"](keys(N), new, undo)
        moved = move & ~bump
        assert rows_equal(back, states)[moved].all()
        assert not np.asarray(binfo.error)[moved].any()
        undone += moved.sum()
        # a failed action leaves the state as it was
        assert rows_equal(new, states)[bump | empty_undo].all()
        p = np.asarray(info.progress)
        assert ((p >= 0) & (p <= 1)).all()
        np.testing.assert_array_equal(np.asarray(reward), np.asarray(info.success, np.float32))
        # the feedback line names the error
        for i in np.flatnonzero(dead)[:2]:
            assert env.render_text(row(obs, i)).startswith("That push made the level unsolvable.\n #")
        for i in np.flatnonzero(empty_undo)[:2]:
            assert env.render_text(row(obs, i)).startswith("Nothing to undo.\n #")
        for i in np.flatnonzero(move & bump)[:2]:
            text = env.render_text(row(obs, i))
            assert text.startswith(("You walked into a wall.\n #", "The box cannot move there.\n #"))
    assert dead_pushes > 0 and undone > 0


def test_oracle_recovers_from_any_mistake_in_turns_to_go():
    """After random play (dead positions included) the oracle, undoing where that is shorter,
    solves the level in exactly `turns_to_go` turns."""
    fns = jitted(main_env())
    *_, (_, _, states, _, _, _, _) = _random_play(10, seed=2)
    dist = np.asarray(states.dist)
    dead = dist[np.arange(N), np.asarray(states.pos)] >= core.INF
    assert dead.any()
    oracle = np.asarray(fns["oracle"](states))
    assert (oracle[dead & (np.asarray(states.depth) > 0)] == UNDO).all()
    togo = np.asarray(fns["togo"](states))
    solvable = togo < core.INF
    assert solvable.mean() > 0.9  # the undo history reaches back to a solvable position
    done = togo == 0  # random play solved these already
    turns = np.zeros(N, int)
    for t in range(int(togo[solvable].max())):
        states, _, _, term, info = fns["step"](keys(N), states, fns["oracle"](states))
        turns += ~done
        assert not np.asarray(info.error)[~done].any()
        done |= np.asarray(term)
    assert done[solvable].all()
    np.testing.assert_array_equal(turns[solvable], togo[solvable])


def test_undo_walks_back_to_the_start():
    fns = jitted(main_env())
    start, _ = main_batch()
    states = start
    for t in range(10):
        actions = jax.random.randint(jax.random.PRNGKey(t), (N,), 0, 4)
        states, *_ = fns["step"](keys(N), states, actions)
    assert np.asarray(states.depth).max() == 10
    for _ in range(10):
        states, _, _, _, info = fns["step"](keys(N), states, jnp.full((N,), UNDO, jnp.int32))
    assert rows_equal(states, start).all()
    _, _, _, _, info = fns["step"](keys(N), states, jnp.full((N,), UNDO, jnp.int32))
    assert np.asarray(info.error).all()  # nothing left to undo


# ---- arbitrary inputs, determinism, batching ------------------------------------------------------

WIDTH = 6


@functools.lru_cache(maxsize=None)
def _parse_and_step():
    env = main_env()

    def fn(state, tokens, length, action_id):
        parsed = env.parse_action(tokens, length)
        new, obs, reward, terminated, info = env.step(jax.random.PRNGKey(1), state, parsed, jnp.int32(5))
        by_id, _, _, _, info_id = env.step(jax.random.PRNGKey(1), state, action_id, jnp.int32(5))
        def same(a, b):
            leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b))
            return jnp.all(jnp.stack([jnp.all(x == y) for x, y in leaves]))

        return parsed, obs, reward, terminated, info, same(state, new), info_id, same(state, by_id)

    return env, jax.jit(fn)


@settings(max_examples=60, deadline=None)
@given(
    seq=st.lists(st.integers(-3, 400), min_size=0, max_size=WIDTH),
    length=st.integers(-2, WIDTH + 2),
    action_id=st.integers(-(2**31), 2**31 - 1),
    index=st.integers(0, N - 1),
)
def test_arbitrary_tokens_and_action_ids_never_crash(seq, length, action_id, index):
    env, fn = _parse_and_step()
    state = row(main_batch()[0], index)
    tokens = jnp.asarray(seq + [0] * (WIDTH - len(seq)), jnp.int32)
    parsed, obs, reward, terminated, info, same, info_id, same_id = fn(
        state, tokens, jnp.int32(length), jnp.int32(action_id)
    )
    exact = [list(env.actions.tokens[a, : env.actions.lengths[a]]) for a in range(env.num_actions)]
    reply = seq[: max(length, 0)] if 0 <= length <= len(seq) else None
    if reply in exact:
        assert int(parsed) == exact.index(reply)
    else:
        assert int(parsed) == INVALID
        assert bool(info.invalid) and bool(info.error) and bool(same)
        assert float(reward) == 0.0 and not bool(terminated)
        valid = "Invalid action. Valid actions are: up, down, left, right, undo.\n #"
        assert env.render_text(obs).startswith(valid)
    out_of_range = not 0 <= action_id < env.num_actions
    assert bool(info_id.invalid) == out_of_range
    if out_of_range:
        assert bool(info_id.error) and bool(same_id)
    assert 0 <= int(info_id.oracle_action) < env.num_actions


def test_every_action_string_parses_to_its_id():
    env = main_env()
    parse = jax.jit(env.parse_action)
    for a, s in enumerate(env.action_strings):
        ids = env.tokenizer.encode(s, add_special_tokens=False)
        padded = jnp.asarray(ids + [9] * (8 - len(ids)), jnp.int32)
        assert int(parse(padded, len(ids))) == a
        assert int(parse(padded, len(ids) + 1)) == INVALID


def test_reset_and_step_deterministic_and_level_from_seed_only():
    fns = jitted(main_env())
    a, oa = main_batch()
    tasks = seeds(N, offset=5000)
    b, ob = fns["reset"](keys(N, 1), tasks)  # another reset key: the same levels
    assert rows_equal((a, oa), (b, ob)).all()
    c, _ = fns["reset"](keys(N), {"seed": tasks["seed"][::-1]})
    assert (np.asarray(a.pos) != np.asarray(c.pos)).mean() > 0.5
    # A row's step depends only on its own (key, state, action): the batched step equals the unbatched one
    # row by row (no cross-row leakage, no dependence on the batch). Unbatched under jit: one program, not
    # hundreds of eager ones.
    actions = jax.random.randint(jax.random.PRNGKey(3), (N,), -1, 5)
    batched = fns["step"](keys(N, 5), a, actions)
    one_step = jax.jit(main_env().step)
    for i in (0, 17, N - 1):
        row = jax.tree.map(lambda x: x[i], a)
        single = one_step(keys(N, 5)[i], row, actions[i], jnp.int32(19))
        got = jax.tree.map(lambda x: x[i], batched)
        assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(single)))


def test_jit_vmap_1024_envs_and_observation_roundtrip():
    env = main_env()
    fns = jitted(env)
    states, obs = main_batch()
    assert obs.tokens.shape == (N, env.max_obs_len) and obs.tokens.dtype == jnp.int32
    tok = env.tokenizer
    key = jax.random.PRNGKey(4)
    first_lines = set()
    for t in range(4):
        key, ka = jax.random.split(key)
        actions = jax.random.randint(ka, (N,), -1, env.num_actions)
        states, obs, reward, terminated, info = fns["step"](keys(N, t), states, actions, 9 - t)
        assert reward.shape == (N,) and reward.dtype == jnp.float32 and terminated.dtype == jnp.bool_
        inv = np.asarray(actions) == INVALID
        np.testing.assert_array_equal(np.asarray(info.invalid), inv)
        assert np.asarray(info.error)[inv].all()
        lengths = np.asarray(obs.length)
        assert (lengths > 0).all() and (lengths <= env.max_obs_len).all()
        for i in range(0, N, 41):
            ids = np.asarray(obs.tokens[i, : lengths[i]]).tolist()
            text = tok.decode(ids)
            assert tok.encode(text, add_special_tokens=False) == ids, text
            assert (np.asarray(obs.tokens[i, lengths[i] :]) == env.fragments.pad).all()
            assert text.endswith(f" # # # # # #\nTurns left: {9 - t}.\n")
            lines = text.splitlines()
            assert len(lines) in (7, 8) and all(len(line) == 12 for line in lines[-7:-1])
            first_lines.add(lines[0] if len(lines) == 8 else "")
    assert {"", "You walked into a wall.", "Nothing to undo."} <= first_lines
    assert any(s.startswith("Invalid action.") for s in first_lines)


def test_fragment_boundaries_are_checked_against_the_tokenizer():
    class Merging:
        """A character tokenizer that merges ' X _' into one token (a pre-tokenizer would not)."""

        pad_token_id = eos_token_id = 0

        def encode(self, text, add_special_tokens=False):
            out, i = [], 0
            while i < len(text):
                if text.startswith(" X _", i):
                    out.append(1000)
                    i += 4
                else:
                    out.append(ord(text[i]))
                    i += 1
            return out

    with pytest.raises(ValueError, match=r"merges across the fragments ' X' \+ ' _'"):
        Sokoban(Merging())


def test_options_are_validated():
    tok = tokenizer()
    with pytest.raises(ValueError, match="size must be an int in 5..7"):
        make("sokoban", tok, size=9)
    with pytest.raises(ValueError, match="boxes must be an int in 1..2"):
        make("sokoban", tok, boxes=3)
    with pytest.raises(TypeError, match=r"Unknown option\(s\) \['box'\]"):
        make("sokoban", tok, box=1)


def test_corpus_holds_the_texts_an_agent_sees():
    texts = sokoban_corpus()
    joined = "".join(texts)
    for s in ("Sokoban", " #\n", " X", " P", "undo", "That push made the level unsolvable.\n"):
        assert s in joined
