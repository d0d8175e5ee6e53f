"""Python environments on the compiled model turn (`bmrl.rollout.host`): token-identical to the
compiled engine on a wrapped JAX environment, caps as data, one compile, faults confined to their row."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl import compiles
from bmrl.envs import make
from bmrl.envs.python.jax_env import JaxAsPython
from bmrl.rollout import RolloutConfig, default_format, rollout
from bmrl.rollout.host import HostConfig, host_rollout
from bmrl.sampling import SamplingConfig
from tests.rollout_helpers import steered_policy

FIELDS = (
    "tokens", "length", "loss_mask", "turn_of_token", "action", "reward", "error", "invalid", "format_error",
    "oracle_action", "progress", "turn_active", "caps", "turns_used", "success",
    "first_success_turn", "terminated", "truncated", "overflow",
)
CAPS = np.array([1, 3, 6, 5, 2, 6, 6, 4], np.int32)
SEEDS = np.arange(8, dtype=np.int32) + 11


@pytest.fixture(scope="module")
def setup(tiny_tokenizer):
    env = make("corridor", tiny_tokenizer, length=4, eps=0.3)
    fmt = default_format(env)
    policy = steered_policy(env, fmt, seed=1, scale=3.0)
    cfg = RolloutConfig(max_turns=8, max_reply_tokens=6, max_len=768, sampling=SamplingConfig(temperature=1.0))
    return env, fmt, policy, cfg


def _host(setup, caps=CAPS, key=3, wrap=JaxAsPython, hcfg=None):
    env, fmt, policy, cfg = setup
    envs = [wrap(env, b) if wrap is not JaxAsPython else wrap(env) for b in range(len(caps))]
    tasks = [{"seed": int(s)} for s in SEEDS[: len(caps)]]
    key = jax.random.PRNGKey(key) if isinstance(key, int) else key  # a raw key by default
    return host_rollout(policy, envs, env.tokenizer, caps, key, cfg, fmt, tasks=tasks, hcfg=hcfg or HostConfig())


@pytest.fixture(scope="module")
def clean(setup):
    return _host(setup)


def _rows(traj, rows):
    return {f: np.asarray(getattr(traj, f))[rows] for f in FIELDS + ("logprobs",)}


def test_python_path_equals_compiled_path(setup, clean):
    """Same keys and caps: the wrapped corridor played from the host is the compiled rollout, token for token."""
    env, _, policy, cfg = setup
    ref = rollout(policy, env, {"seed": jnp.asarray(SEEDS)}, jnp.asarray(CAPS), jax.random.PRNGKey(3), cfg)
    got = clean.trajectory
    assert clean.faults == []
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-4)
    act = np.asarray(ref.action)[np.asarray(ref.turn_active)]
    assert {0, 1} <= set(act.tolist()), "the sampled policy should move both ways"
    assert np.asarray(ref.success).any() and not np.asarray(ref.success).all()


def test_caps_hold_with_one_compile(setup, clean):
    """Three cap draws, one program each for start/act/observe: caps are host data, never shapes; so
    are the keys, whatever their kind (raw as evaluation passes them, typed as training does, one per
    row), and a typed key plays what its raw data plays."""
    names = ("host_start", "host_act", "host_observe", "host_outputs")
    before = {n: compiles.counts().get(n, 0) for n in names}
    rng = np.random.default_rng(0)
    kinds = [lambda k: k, jax.random.key, lambda k: np.asarray(jax.random.split(jax.random.PRNGKey(k), 8))]
    for draw, kind in enumerate(kinds):
        caps = rng.integers(1, 9, size=8).astype(np.int32)
        traj = _host(setup, caps=caps, key=kind(10 + draw)).trajectory
        used, active = np.asarray(traj.turns_used), np.asarray(traj.turn_active)
        assert (used <= caps).all() and (active.sum(1) == used).all()
        assert not active[np.arange(8)[None, :] >= caps[:, None]].any()
        trunc = np.asarray(traj.truncated)
        assert (used[trunc] == caps[trunc]).all()
        assert (~trunc == (np.asarray(traj.success) | np.asarray(traj.terminated))).all()
    typed = _host(setup, key=jax.random.key(3)).trajectory
    assert {n: compiles.counts().get(n, 0) for n in names} == before
    for f in FIELDS + ("logprobs",):
        np.testing.assert_array_equal(np.asarray(getattr(typed, f)), np.asarray(getattr(clean.trajectory, f)), err_msg=f)


class RaiseOnThird(JaxAsPython):
    """Row 2's environment raises on its third step."""

    def __init__(self, env, row):
        super().__init__(env)
        self.row = row

    def step(self, action):
        if self.row == 2 and self._t == 2:
            self._t += 1  # the failed step still consumes its key, as any later turn of the row
            raise ZeroDivisionError("boom")
        return super().step(action)


def test_fault_stays_in_its_row(setup, clean):
    """An exception in one row becomes its error observation; every other row is unchanged."""
    got = _host(setup, wrap=RaiseOnThird)
    assert [(f.row, f.turn, f.kind) for f in got.faults] == [(2, 2, "exception")]
    others = [0, 1, 3, 4, 5, 6, 7]
    a, b = _rows(got.trajectory, others), _rows(clean.trajectory, others)
    for f in a:
        np.testing.assert_array_equal(a[f], b[f], err_msg=f)
    t = got.trajectory
    assert bool(t.error[2, 2]) and int(t.turns_used[2]) > 3  # the row saw the error and went on
    text = setup[0].tokenizer.decode(np.asarray(t.tokens[2, : int(t.length[2])]).tolist())
    assert "tool error: ZeroDivisionError: boom" in text


class SlowOrBroken(JaxAsPython):
    """Row 1 sleeps past the timeout on its first step; row 3 returns a non-string observation."""

    def __init__(self, env, row):
        super().__init__(env)
        self.row = row

    def step(self, action):
        out = super().step(action)
        if self.row == 1 and self._t == 1:
            time.sleep(1.0)
        if self.row == 3:
            return (123,) + out[1:]
        return out


def test_timeouts_and_bad_returns_are_counted(setup, clean):
    got = _host(setup, wrap=SlowOrBroken, hcfg=HostConfig(step_timeout_s=0.3, on_fault="end"))
    kinds = {(f.row, f.turn, f.kind) for f in got.faults}
    assert (1, 0, "timeout") in kinds and (3, 0, "bad_return") in kinds and len(kinds) == 2
    t = got.trajectory
    assert np.asarray(t.turns_used)[[1, 3]].tolist() == [1, 1]  # on_fault="end" stops those rows
    assert bool(t.error[1, 0]) and bool(t.error[3, 0])
    others = [0, 2, 4, 5, 6, 7]
    a, b = _rows(t, others), _rows(clean.trajectory, others)
    for f in a:
        np.testing.assert_array_equal(a[f], b[f], err_msg=f)


def test_tool_env_from_an_entry_point_runs(setup):
    """A Python-only environment (free-form string actions, longer observations) through the same turn:
    no action list means action ids are INVALID, tool errors are the env's own, not faults."""
    from bmrl.envs.python import load_entry

    env, fmt, policy, cfg = setup
    build = load_entry("bmrl.envs.python.tools:ToolUse", {"k": 2})
    caps = np.array([2, 4, 3, 4], np.int32)
    got = host_rollout(policy, [build() for _ in caps], env.tokenizer, caps, jax.random.PRNGKey(0), cfg, fmt)
    t = got.trajectory
    assert got.faults == [] and (np.asarray(t.turns_used) == caps).all()  # nobody solves it: capped
    assert (np.asarray(t.action) == -1).all() and np.asarray(t.error)[np.asarray(t.turn_active)].all()
    text = env.tokenizer.decode(np.asarray(t.tokens[0, : int(t.length[0])]).tolist())
    assert "Task:" in text and "tool error: unknown action" in text
    assert (np.asarray(t.loss_mask).sum(1) > 0).all()


class RaiseInSecondHalf(RaiseOnThird):
    """Row 6 (in the second half, and the last of four groups, of a pipelined batch of 8) raises on its
    third step."""

    def step(self, action):
        if self.row == 6 and self._t == 2:
            self._t += 1
            raise ZeroDivisionError("boom")
        return JaxAsPython.step(self, action)


def test_pipelined_groups_equal_one_batch(setup, clean):
    """Four groups of 2 rows in four threads (the default for 8 rows) and two halves give bitwise the
    trajectory of one batch played in one thread, and a fault in the last group keeps its row in the
    whole batch. The group count is the largest divisor of the batch up to `groups`."""
    from bmrl.rollout.host import pipeline_groups

    assert [pipeline_groups(b, HostConfig()) for b in (8, 6, 7, 2, 1)] == [4, 3, 1, 2, 1]
    assert pipeline_groups(8, HostConfig(groups=2)) == 2 and pipeline_groups(8, HostConfig(pipeline=False)) == 1
    one = _host(setup, hcfg=HostConfig(pipeline=False))
    halves = _host(setup, hcfg=HostConfig(groups=2))
    for run in (clean, halves):
        a, b = _rows(run.trajectory, slice(None)), _rows(one.trajectory, slice(None))
        for f in a:
            np.testing.assert_array_equal(a[f], b[f], err_msg=f)
    got, ref = _host(setup, wrap=RaiseInSecondHalf), _host(setup, wrap=RaiseInSecondHalf, hcfg=HostConfig(pipeline=False))
    assert [(f.row, f.turn, f.kind) for f in got.faults] == [(f.row, f.turn, f.kind) for f in ref.faults] == [
        (6, 2, "exception")]
    a, b = _rows(got.trajectory, slice(None)), _rows(ref.trajectory, slice(None))
    for f in a:
        np.testing.assert_array_equal(a[f], b[f], err_msg=f)


@pytest.mark.parametrize("name, options", [("frozenlake", dict(size=4, eps=0.2)),
                                           ("toolchain", dict(k=2, num_keys=8, p_fail=0.3)),
                                           ("sokoban", dict(size=5, boxes=1))])
def test_every_jax_env_through_the_python_path_equals_the_compiled_one(name, options, tiny_tokenizer):
    """Each other built-in env wrapped as a Python env (the corridor is checked above, sampled): greedy,
    same keys, a cap mix: the host loop's trajectories, rewards and first-success turns are the
    compiled rollout's, token for token."""
    env = make(name, tiny_tokenizer, **options)
    fmt = default_format(env)
    policy = steered_policy(env, fmt, seed=1, scale=12.0)
    cfg = RolloutConfig(max_turns=5, max_reply_tokens=6, max_len=512, sampling=SamplingConfig(temperature=0.0))
    caps, seeds = np.array([1, 5, 3, 4], np.int32), np.arange(4, dtype=np.int32) + 100
    ref = rollout(policy, env, {"seed": jnp.asarray(seeds)}, jnp.asarray(caps), jax.random.PRNGKey(5), cfg)
    got = host_rollout(policy, [JaxAsPython(env) for _ in caps], env.tokenizer, caps, jax.random.PRNGKey(5), cfg, fmt,
                       tasks=[{"seed": int(s)} for s in seeds])
    assert got.faults == []
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(got.trajectory, f)), np.asarray(getattr(ref, f)), err_msg=f)
    assert (np.asarray(ref.action)[np.asarray(ref.turn_active)] >= 0).any()  # the policy really acts


def test_host_programs_never_copy_the_kv_cache(setup):
    """The host loop's jitted act, force (teacher forcing) and observe programs update the donated
    KV cache in place: no instruction copies or transposes a cache-sized array (as in the compiled
    rollout, `tests/rollout/test_engine.py`)."""
    from flax import nnx

    from bmrl.rollout.host import _programs
    from bmrl.rollout.model_policy import ModelPolicy
    from tests.model.test_attention import _cache_sized_copies

    env, fmt, policy, cfg = setup
    graphdef, params = nnx.split(policy)
    programs = _programs(ModelPolicy(graphdef, fmt, cfg))
    batch, width = 4, 16
    obs, obs_len = jnp.zeros((batch, width), jnp.int32), jnp.full((batch,), 3, jnp.int32)
    state = programs["start"](params, obs, obs_len, jax.random.split(jax.random.key(0), batch))
    t, rows = jnp.int32(1), jnp.ones((batch,), bool)
    reply, reply_len = jnp.zeros((batch, 2), jnp.int32), jnp.ones((batch,), jnp.int32)
    size = state.cache[0][0].size
    for name, args in (("act", (params, state, t, rows)), ("force", (params, state, reply, reply_len, t, rows)),
                       ("observe", (params, state, obs, obs_len, t, rows))):
        hlo = programs[name].lower(*args).compile().as_text()
        assert _cache_sized_copies(hlo, size) == [], name
