"""Any built-in JAX environment as a Python one (text in and out), for tests and comparisons.

`JaxAsPython(env)` plays `env` (a `bmrl.envs.base.Env`) through the Python protocol: the seed handed
to `reset` is read back as the JAX key (`protocol.seed_key`), turn t steps with
`fold_in(key, t + 1)` as the compiled engine does, observations are the env's rendered text and
actions are matched against its action strings; `info["next_oracle_action"]` is the env's oracle in
the state after reset or step (what its demonstrations play). Played by `bmrl.rollout.host_rollout` with the same
keys, it gives the compiled rollout's trajectories token for token. `builtin` is its config entry:

    env: {kind: python, entry: "bmrl.envs.python.jax_env:builtin", options: {name: corridor, length: 4}}
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bmrl import compiles
from bmrl.envs.base import INVALID, Env
from bmrl.envs.python.protocol import seed_key


def _programs(env: Env):
    def build():
        def reset(key, task):
            state, obs = env.reset(key, task)
            return state, obs, env.oracle_action(state)

        def step(key, state, action):
            state, obs, reward, term, info = env.step(key, state, action)
            return state, obs, reward, term, info, env.oracle_action(state)

        return (compiles.counted_jit(reset, name="pyenv_jax_reset"),
                compiles.counted_jit(step, name="pyenv_jax_step"))

    return compiles.program("pyenv_jax", env, build)


class JaxAsPython:
    """A JAX `Env` behind `reset(*, seed, options)` / `step(action: str)`; `options` is the task dict."""

    def __init__(self, env: Env):
        if env.show_budget:
            raise ValueError(
                f"JaxAsPython({env.name}): show_budget=True needs the turn cap inside the env; build the env "
                "with show_budget=False for the Python path."
            )
        self.env = env
        self.instructions = env.instructions
        self.action_strings = env.action_strings
        self._index = {s: i for i, s in enumerate(env.action_strings)}
        self._reset, self._step = _programs(env)
        self._key = self._state = None
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self._key = seed_key(0 if seed is None else seed)
        task = {k: jnp.asarray(v) for k, v in (options or {"seed": 0}).items()}
        self._state, obs, nxt = self._reset(self._key, task)
        self._t = 0
        return self.env.render_text(jax.device_get(obs)), {"progress": float(self.env.progress(self._state)),
                                                          "next_oracle_action": self._name(nxt)}

    def _name(self, action: Any) -> str | None:
        i = int(action)
        return self.action_strings[i] if 0 <= i < len(self.action_strings) else None

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._state is None:
            raise RuntimeError("step() before reset()")
        act = self._index.get(action, INVALID)
        key = jax.random.fold_in(self._key, self._t + 1)
        self._state, obs, reward, term, info, nxt = self._step(key, self._state, jnp.int32(act))
        self._t += 1
        obs, reward, term, info, nxt = jax.device_get((obs, reward, term, info, nxt))
        return self.env.render_text(obs), float(reward), bool(term), False, {
            "success": bool(info.success), "error": bool(info.error), "invalid": bool(info.invalid),
            "oracle_action": self._name(info.oracle_action), "next_oracle_action": self._name(nxt),
            "progress": float(np.asarray(info.progress)),
        }


_BUILT: dict[str, Env] = {}


def builtin(name: str = "corridor", **options: Any) -> JaxAsPython:
    """Built-in JAX env `name` with `options` as a Python env (a config entry). Its text goes through
    a character tokenizer: only the rendered text leaves the wrapper, so the run's tokenizer decides
    the tokens, as on the compiled path. Objects of the same (name, options) share one JAX env, so
    one compiled reset and step serve a whole pool of them."""
    from bmrl.envs import _CharTokenizer, make

    memo = repr((name, sorted(options.items())))
    if memo not in _BUILT:
        _BUILT[memo] = make(name, _CharTokenizer(), **options)
    return JaxAsPython(_BUILT[memo])
