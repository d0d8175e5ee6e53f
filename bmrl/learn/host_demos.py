"""Demonstrations of Python environments: the noisy oracle played by the host loop, laid out as
`bmrl.learn.demos` lays out a JAX env's.

    demos = make_host_demos(python_env, fmt, tasks, key, num_turns=8, max_len=512, noise=0.25)

The demonstrator is `bmrl.rollout.scripts.NoisyOracleScript` on the env's `info["next_oracle_action"]`,
played by `bmrl.rollout.host.host_rollout` without a model (the same loop, keys and resets as a
model's rollout); each turn's reply is `Format.reply_tokens` of the action text's tokens, then the
stop id. The rules are `make_demos`': the same per-row keys (environment, script and the
RECOVERY_STREAM draw of the rows that go on after a mistake), cut after the demonstrator's first own
wrong action except in those rows, end at success, termination, the row's cap, a turn that does not
fit `max_len`; the same `Demos` layout (`lay_out`). So a JAX env wrapped as a Python one
(`bmrl.envs.python.jax_env`) gives the compiled path's demos token for token, and teacher-forcing a
demo's replies through the host rollout reproduces its tokens (tests/learn/test_host_demos.py).

Differences a Python env brings: `wrong` compares action texts with the oracle's (an env without
`action_strings` has action ids INVALID and can only be demonstrated with noise 0); a turn whose reply
and stop exceed `max_reply_tokens` (a free-text action longer than a policy may reply) ends the demo
before it, flagged as overflow; a row whose env faulted (no next oracle action) ends there.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bmrl import compiles
from bmrl.envs.python.protocol import action_index
from bmrl.envs.text import INVALID, encode
from bmrl.formats import Format
from bmrl.learn.demos import Demos, check_demo_args, goes_on_after_error, lay_out, turn_records
from bmrl.rollout.scripts import NoisyOracleScript
from bmrl.rollout.types import RolloutConfig, row_keys


def _bucket(n: int) -> int:
    """A static width >= n (a power of two, at least 8): few shapes, few compiles."""
    return max(8, 1 << max(int(n) - 1, 0).bit_length())


def _pad(rows: list[list[list[int]]], tm: int, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row and turn token lists -> (int32[B, Tm, W] padded, lengths int32[B, Tm])."""
    width = _bucket(max((len(x) for r in rows for x in r), default=1))
    out = np.full((len(rows), tm, width), pad, np.int32)
    lens = np.zeros((len(rows), tm), np.int32)
    for b, r in enumerate(rows):
        for t, x in enumerate(r[:tm]):
            out[b, t, : len(x)], lens[b, t] = x, len(x)
    return out, lens


def make_host_demos(
    env: Any,
    fmt: Format,
    tasks: Sequence[dict],
    key: jax.Array,
    *,
    num_turns: int,
    max_len: int,
    noise: float,
    cut_after_error: bool = True,
    recovery: float = 0.0,
    caps: Any = None,
    max_reply_tokens: int | None = None,
) -> Demos:
    """`make_demos` for a `bmrl.rollout.pyenv.PythonEnv` (`tasks`: B task dicts; module docstring)."""
    check_demo_args(noise, recovery, num_turns)
    tasks = list(tasks)
    batch = len(tasks)
    caps = np.full((batch,), num_turns, np.int32) if caps is None else np.clip(np.asarray(caps, np.int32), 1, num_turns)
    keys = row_keys(key, batch)
    script = NoisyOracleScript(env.action_strings, noise, keys, num_turns)
    cfg = RolloutConfig(max_turns=num_turns, max_reply_tokens=1, max_len=1)  # no model: no buffer
    out = env.play(None, fmt, cfg, tasks, caps, keys, script=script)
    traj = out.trajectory

    replies = [[list(fmt.reply_tokens(encode(env.tokenizer, a))) for a in row if a is not None] for row in script.played]
    reply, reply_len = _pad(replies, num_turns, fmt.pad_id)
    obs, obs_len = _pad(out.observations, num_turns, fmt.pad_id)
    played = np.asarray(traj.turn_active)
    long_reply = played & (reply_len + 1 > max_reply_tokens) if max_reply_tokens else np.zeros_like(played)
    fits = np.cumsum(long_reply, axis=1) == 0  # a reply the policy could not give ends the demo before it
    oracle = np.asarray([[action_index(env, a) for a in row] for row in script.oracle], np.int32)
    traj = traj.replace(turn_active=jnp.asarray(played & fits), observations=(jnp.asarray(obs), jnp.asarray(obs_len)),
                        oracle_action=jnp.asarray(np.where(played, oracle, INVALID)))
    fn = compiles.program("host_demos", (fmt, int(max_len)), lambda: _layout_fn(fmt, int(max_len)))
    demos = fn(traj, jnp.asarray(script.wrong), keys, jnp.asarray(caps), jnp.float32(recovery),
               jnp.bool_(cut_after_error), jnp.asarray(reply), jnp.asarray(reply_len))
    return demos.replace(overflow=demos.overflow | jnp.asarray(long_reply.any(1)))


def _layout_fn(fmt: Format, max_len: int):
    """The jitted layout of host-played episodes (one program per format, max_len and shapes)."""

    def run(traj, wrong, keys, caps, recovery, cut_after_error, reply, reply_len):
        cut_rows = cut_after_error & ~goes_on_after_error(keys, recovery)
        rec = turn_records(traj, cut_rows, wrong)
        return lay_out(fmt, {**rec, "reply": reply, "reply_len": reply_len}, caps, max_len)

    return compiles.counted_jit(run, name="host_demos")


__all__ = ["make_host_demos"]
