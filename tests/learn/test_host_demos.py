"""Demonstrations of Python environments (`bmrl.learn.host_demos`): the wrapped corridor's demos are the
compiled path's token for token, and teacher-forcing a demo's replies through the host rollout
reproduces its tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bmrl.envs import make
from bmrl.envs.python.jax_env import JaxAsPython
from bmrl.envs.python.tools import ToolUse
from bmrl.learn.demos import make_demos
from bmrl.learn.host_demos import make_host_demos
from bmrl.rollout import RolloutConfig, default_format
from bmrl.rollout.host import HostConfig, host_rollout
from bmrl.rollout.pyenv import PythonEnv, host_format
from bmrl.rollout.scripts import NEXT_ORACLE
from bmrl.sampling import SamplingConfig
from tests.rollout_helpers import steered_policy

FIELDS = ("tokens", "length", "loss_mask", "turn_of_token", "action", "oracle_action", "wrong", "error",
          "turn_active", "reply_start", "reply_len", "progress", "caps", "num_turns", "success", "cut", "overflow")
SEEDS = np.arange(16, dtype=np.int32) + 5
TURNS, MAX_LEN = 6, 512


@pytest.fixture(scope="module")
def corridor(tiny_tokenizer):
    """The corridor (slips: observations depend on the env keys) as a JAX env and wrapped as a Python env."""
    env = make("corridor", tiny_tokenizer, length=4, eps=0.3)
    fmt = default_format(env)
    tasks = [{"seed": int(s)} for s in SEEDS]
    penv = PythonEnv.build("corridor", lambda: JaxAsPython(env), {"train": tasks, "test": tasks}, tiny_tokenizer,
                           HostConfig(workers=4), texts=[])
    return env, penv, fmt, tasks


def _np(tree):
    return jax.tree.map(np.asarray, tree)


def _both(corridor, **kw):
    env, penv, fmt, tasks = corridor
    args = dict(num_turns=TURNS, max_len=MAX_LEN, noise=0.3, recovery=0.5, **kw)
    ref = make_demos(env, fmt, {"seed": jnp.asarray(SEEDS)}, jax.random.key(3), **args)
    got = make_host_demos(penv, fmt, tasks, jax.random.key(3), **args)
    return _np(ref), _np(got)


def test_python_demos_equal_the_compiled_demos(corridor):
    """Same keys: noise draws, slips, the cut and the recovery rows, every field token for token."""
    caps = np.array([6, 2, 5, 6, 3, 6, 4, 6] * 2, np.int32)
    ref, got = _both(corridor, caps=caps)
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(got, f), getattr(ref, f), err_msg=f)
    assert ref.wrong.any() and ref.cut.any() and ref.success.any(), "noise, cuts and successes should all occur"
    went_on = ref.turn_active & (np.cumsum(ref.wrong, 1) - ref.wrong > 0)
    assert went_on.any(), "some rows should go on after their first mistake (recovery)"
    assert ref.error[~ref.wrong].any(), "slips (env errors the oracle could not avoid) stay in demos"


def test_teacher_forced_host_rollout_reproduces_a_demo(corridor):
    """Playing a demo's actions through the host rollout with a model (its replies teacher-forced), with
    the demo's key and its turns as caps, gives the demo's tokens, loss mask and turns."""
    env, penv, fmt, tasks = corridor
    d = _np(make_host_demos(penv, fmt, tasks, jax.random.key(4), num_turns=TURNS, max_len=MAX_LEN, noise=0.3,
                       recovery=0.5))
    played = [[env.action_strings[a] for a in row if a >= 0] for row in d.action]

    class Replay:
        def act(self, t, rows, infos):
            return {b: played[b][t] if t < len(played[b]) else None for b in rows}

    policy = steered_policy(env, fmt, seed=1, hidden=32)
    cfg = RolloutConfig(max_turns=TURNS, max_reply_tokens=6, max_len=MAX_LEN, sampling=SamplingConfig(temperature=1.0))
    out = host_rollout(policy, [JaxAsPython(env) for _ in tasks], env.tokenizer, d.num_turns, jax.random.key(4), cfg,
                       fmt, tasks=tasks, script=Replay())
    tr = _np(out.trajectory)
    assert out.faults == [] and not tr.overflow.any()
    np.testing.assert_array_equal(tr.length, d.length)
    for f in ("tokens", "loss_mask", "turn_of_token"):
        np.testing.assert_array_equal(getattr(tr, f)[:, :MAX_LEN], getattr(d, f), err_msg=f)
    np.testing.assert_array_equal(tr.turn_active, d.turn_active)
    np.testing.assert_array_equal(np.where(tr.turn_active, tr.action, -1), d.action)
    lp = tr.logprobs[tr.loss_mask > 0]  # the model's log-probs of the forced tokens
    assert np.isfinite(lp).all() and (lp <= 0).all() and (lp < 0).any()
    assert d.cut.any() and d.wrong.any()


def test_demo_invariants_without_action_strings(tiny_tokenizer):
    """The tool env (free-text actions): noise 0 demos are the oracle's solutions, loss on replies only;
    noise > 0 is refused (its wrong actions would be drawn from action_strings)."""
    tasks = [{"seed": 100 + i} for i in range(4)]
    penv = PythonEnv.build("tools", lambda: ToolUse(items=4, k=2), {"train": tasks, "test": tasks}, tiny_tokenizer,
                           HostConfig(workers=4))
    fmt = host_format(penv)
    d = _np(make_host_demos(penv, fmt, tasks, jax.random.key(0), num_turns=5, max_len=1024, noise=0.0, max_reply_tokens=64))
    assert d.success.all() and (d.num_turns == 4).all() and not d.wrong.any() and not d.cut.any()
    for b in range(len(tasks)):
        mask = d.loss_mask[b] > 0
        replies = [d.tokens[b, s: s + n] for s, n in zip(d.reply_start[b], d.reply_len[b]) if s >= 0]
        assert mask.sum() == sum(len(r) for r in replies)
        assert all(r[-1] == fmt.stop_ids[0] for r in replies)
        assert tiny_tokenizer.decode([int(x) for x in replies[0][:-1]]).startswith("lookup ")
    short = _np(make_host_demos(penv, fmt, tasks, jax.random.key(0), num_turns=5, max_len=1024, noise=0.0,
                           max_reply_tokens=4))
    assert short.overflow.all() and (short.num_turns < 4).all(), "a reply longer than a policy may give ends the demo"
    with pytest.raises(ValueError, match="action_strings"):
        make_host_demos(penv, fmt, tasks, jax.random.key(0), num_turns=5, max_len=1024, noise=0.25)
    assert isinstance(ToolUse().reset(seed=1)[1][NEXT_ORACLE], str)
