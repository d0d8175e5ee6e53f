"""The Python environment protocol (Gymnasium's, with text), entry points, and fault-proof stepping.

An environment is any object with

    reset(*, seed=None, options=None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)

Optional `info` keys bmrl reads: `success` (bool), `error` (bool: the step failed and the agent is
told), `invalid` (bool: the action was not understood), `oracle_action` (str: the best action in the
state before the step), `next_oracle_action` (str, in reset's info and step's: the best action in the
state the returned observation describes; `bmrl sft` and `bmrl reproduce` need it, to play the noisy
oracle's demonstrations before acting), `progress` (float in [0, 1]). An optional `action_strings`
attribute (a finite action list) lets the rollout record action ids, and the noisy oracle draw its
wrong actions (an env without it demonstrates with noise 0 only).

User code runs in a thread pool (`Stepper`): an exception, a timeout or a malformed return in one row
becomes a "tool error: ..." observation for that row (a `Fault`), and the rest of the batch goes on.
A broken entry point is refused before the run starts (`load_entry`). Seeds: the host hands row b
`reset(seed=key_seed(its environment key))`, one int below 2**64 (seed `random.Random` or
`numpy.random.default_rng` with it, not the legacy `np.random.seed`); `seed_key` reads it back.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import importlib
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FAULT_PREFIX = "tool error: "


class EntryError(ValueError):
    """An environment entry point that cannot work (import error, missing factory, wrong signature).

    `part` says what to fix: "entry" (the module or factory name) or "options" (the factory's arguments).
    """

    def __init__(self, message: str, part: str = "entry"):
        super().__init__(message)
        self.part = part


def check_env(env: Any, where: str = "the environment") -> Any:
    """Refuse an object without the protocol's `reset(*, seed, options)` and `step(action)`."""
    for name in ("reset", "step"):
        if not callable(getattr(env, name, None)):
            raise EntryError(
                f"{where} ({type(env).__name__}) has no {name}() method; a Python environment needs "
                "reset(*, seed=None, options=None) -> (str, dict) and step(action: str) -> "
                "(str, float, bool, bool, dict)."
            )
    try:
        inspect.signature(env.reset).bind(seed=0, options={})
        inspect.signature(env.step).bind("action")
    except TypeError as e:
        raise EntryError(
            f"{where} ({type(env).__name__}) has the wrong signature ({e}); define "
            "reset(self, *, seed=None, options=None) and step(self, action)."
        ) from None
    except ValueError:  # builtins without a signature: accept
        pass
    return env


def load_entry(entry: str, options: dict | None = None, search: Sequence[str] = ()) -> Callable[[], Any]:
    """`"package.module:factory"` -> a no-argument function building a new environment.

    The module is imported from the `search` directories (put first on `sys.path`, and kept there so
    the module's own imports work) and `sys.path`; the factory is called as `factory(**options)`.
    One environment is built here and checked, so a broken entry fails before the run starts.
    """
    options = dict(options or {})
    module_name, sep, attr = str(entry).partition(":")
    if not sep or not module_name or not attr:
        raise EntryError(f"env entry {entry!r} must look like 'package.module:factory'.")
    for directory in reversed([str(d) for d in search]):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise EntryError(
            f"env entry {entry!r}: importing {module_name!r} failed ({type(e).__name__}: {e}); check the "
            "module name and that its directory is on sys.path (or next to the config file)."
        ) from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise EntryError(f"env entry {entry!r}: {module_name} has no callable {attr!r}; name a factory or class.")

    def build() -> Any:
        return factory(**options)

    try:
        env = build()
    except Exception as e:
        raise EntryError(
            f"env entry {entry!r}: calling {attr}(**{options!r}) failed ({type(e).__name__}: {e}); check "
            "env options against the factory's parameters.", part="options"
        ) from e
    check_env(env, f"env entry {entry!r}")
    return build


@dataclasses.dataclass
class Fault:
    """One failure of user code: the row, the 0-based turn (-1 = reset), the kind and the message."""

    row: int
    turn: int
    kind: str  # "exception" | "timeout" | "bad_return" | "busy"
    message: str


@dataclasses.dataclass
class StepResult:
    """A checked step (or reset: reward 0, not done). `fault` is set when user code failed."""

    obs: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = dataclasses.field(default_factory=dict)
    fault: Fault | None = None


def _check_return(out: Any, is_reset: bool) -> StepResult:
    n = 2 if is_reset else 5
    if not isinstance(out, tuple) or len(out) != n:
        what = "(observation, info)" if is_reset else "(observation, reward, terminated, truncated, info)"
        raise TypeError(f"{'reset' if is_reset else 'step'} must return a tuple {what}, got {type(out).__name__}")
    obs, info = out[0], out[-1]
    if not isinstance(obs, str):
        raise TypeError(f"the observation must be a str, got {type(obs).__name__}")
    info = dict(info) if isinstance(info, dict) else {}
    if is_reset:
        return StepResult(obs, info=info)
    reward = float(out[1])
    if not math.isfinite(reward):
        raise TypeError(f"the reward must be a finite number, got {out[1]!r}")
    return StepResult(obs, reward, bool(out[2]), bool(out[3]), info)


class Stepper:
    """Runs one call per row concurrently in a thread pool, with a per-call timeout.

    A row whose call timed out keeps its running call; until it ends, that row's next calls fail as
    "busy" (its environment is never called from two threads at once).
    """

    def __init__(self, workers: int, timeout_s: float):
        if timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0, got {timeout_s}.")
        self.pool = cf.ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="bmrl-env")
        self.timeout_s = float(timeout_s)
        self.pending: dict[int, cf.Future] = {}

    def run(self, calls: dict[int, Callable[[], Any]], turn: int, is_reset: bool = False) -> dict[int, StepResult]:
        """`calls[row]()` for every row at once -> checked results (faults become error observations)."""
        out: dict[int, StepResult] = {}
        futures: dict[int, cf.Future] = {}
        for row, call in calls.items():
            busy = self.pending.get(row)
            if busy is not None and not busy.done():
                out[row] = _faulted(row, turn, "busy", "the previous call is still running")
                continue
            futures[row] = self.pool.submit(call)
        cf.wait(list(futures.values()), timeout=self.timeout_s)
        for row, fut in futures.items():
            if not fut.done():
                fut.cancel()
                self.pending[row] = fut
                out[row] = _faulted(row, turn, "timeout", f"no answer within {self.timeout_s:g} s")
                continue
            self.pending.pop(row, None)
            err = fut.exception()
            if err is not None:
                out[row] = _faulted(row, turn, "exception", f"{type(err).__name__}: {err}")
                continue
            try:
                out[row] = _check_return(fut.result(), is_reset)
            except (TypeError, ValueError) as e:
                out[row] = _faulted(row, turn, "bad_return", str(e))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _faulted(row: int, turn: int, kind: str, message: str) -> StepResult:
    fault = Fault(row, turn, kind, message)
    return StepResult(FAULT_PREFIX + message + "\n", info={"error": True}, fault=fault)


def action_index(env: Any, text: str | None) -> int:
    """Index of `text` in the env's `action_strings` (-1 if absent or the env has no finite list)."""
    strings: Sequence[str] | None = getattr(env, "action_strings", None)
    if text is None or not strings:
        return -1
    try:
        return list(strings).index(text)
    except ValueError:
        return -1


def key_seed(key: Any) -> int:
    """A PRNG key (typed or raw) as one non-negative int: its key words, low word first."""
    data = np.asarray(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
    return sum(int(w) << (32 * i) for i, w in enumerate(data.astype(np.uint32).ravel()))


def seed_key(seed: int) -> jax.Array:
    """Inverse of `key_seed` for the default key implementation (a raw uint32 key)."""
    words = jax.random.PRNGKey(0).shape[-1]
    return jnp.asarray([(int(seed) >> (32 * i)) & 0xFFFFFFFF for i in range(words)], jnp.uint32)
