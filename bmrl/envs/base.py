"""The environment protocol: pure, jit- and vmap-able functions over a state pytree (gymnax style).

An `Env` speaks tokens. It is built once on the host with the policy's tokenizer (fragment and action
tables, see `bmrl.envs.text`); afterwards `reset`, `step`, `parse_action`, `oracle_action` and
`optimal_turns` are pure JAX. Truncation by a turn cap is the rollout's job, not the environment's.

A subclass supplies the game and its text:
- `OPTIONS` (defaults of its static construction options), `_action_strings()`, `_instructions()`,
  `FEEDBACK` (its error/feedback lines) and `_groups()` (its fragment groups);
- `_reset(key, task) -> state`, `_step(key, state, action) -> (state, Outcome)`, `_progress(state)`,
  `oracle_action(state)`, `optimal_turns(task)`;
- `_reset_frags(state)` / `_step_frags(state, feedback)` (fragment ids; `feedback` = the ids that
  `_step` reported in `Outcome.feedback`, or the invalid-action line padded with empty fragments) and the matching
  `_reset_layout()` / `_step_layout()` (group names, used to bound the observation length).
The base class handles invalid actions (state unchanged, error shown), the optional turn budget line,
the reward and the `StepInfo`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from bmrl.envs.text import INVALID, ActionTable, Fragments, Observation, number_strings

__all__ = ["INVALID", "Env", "Observation", "Outcome", "StepInfo"]


@struct.dataclass
class StepInfo:
    """Per-step diagnostics: `oracle_action` is the best action in the state BEFORE the step."""

    error: jnp.ndarray  # bool[]: invalid action, wall bump, slip, hole, failed tool call, wrong answer
    invalid: jnp.ndarray  # bool[]: the action did not parse
    oracle_action: jnp.ndarray  # int32[]
    progress: jnp.ndarray  # float32[]: after the step; rises toward the goal, 1.0 at the goal
    success: jnp.ndarray  # bool[]: goal reached at this step


@struct.dataclass
class Outcome:
    """What a subclass's `_step` reports besides the new state."""

    success: jnp.ndarray  # bool[]
    error: jnp.ndarray  # bool[]
    feedback: jnp.ndarray  # int32[] or int32[n]: fragment ids of the feedback (`self.feedback_id(...)`)
    terminated: jnp.ndarray  # bool[]


class Env:
    """Base class of bmrl environments; see the module docstring for what a subclass provides."""

    name: ClassVar[str] = "env"
    OPTIONS: ClassVar[dict[str, Any]] = {}
    COMMON_OPTIONS: ClassVar[dict[str, Any]] = {"show_budget": False, "max_budget": 128}
    FEEDBACK: ClassVar[tuple[str, ...]] = ()
    BUDGET_LAYOUT: ClassVar[tuple[str, ...]] = ("budget", "num", "end")

    def __init__(self, tokenizer, **options):
        valid = {**self.COMMON_OPTIONS, **self.OPTIONS}
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise TypeError(
                f"Unknown option(s) {unknown} for env {self.name!r}; valid options (defaults) are "
                + ", ".join(f"{k}={v!r}" for k, v in valid.items())
                + "."
            )
        self.options: dict[str, Any] = {**valid, **options}
        self.tokenizer = tokenizer
        self.show_budget = bool(self.options["show_budget"])
        self.max_budget = int(self.options["max_budget"])
        self._validate()
        self.action_strings: tuple[str, ...] = tuple(self._action_strings())
        self.num_actions = len(self.action_strings)
        self.actions = ActionTable(tokenizer, self.action_strings)
        self.max_action_len = self.actions.max_len
        self.instructions = self._instructions()
        self.fragments = Fragments(tokenizer, self.text_groups())
        layouts = [self._reset_layout(), self._step_layout()]
        extra = self.fragments.max_len(self.BUDGET_LAYOUT) if self.show_budget else 0
        self.max_obs_len = max(self.fragments.max_len(lay) for lay in layouts) + extra

    # ---- text -------------------------------------------------------------------------------
    def invalid_message(self) -> str:
        """The line an agent sees after an action that did not parse."""
        return f"Invalid action. Valid actions are: {self._action_summary()}.\n"

    def _action_summary(self) -> str:
        return ", ".join(self.action_strings)

    def text_groups(self) -> dict[str, list[str]]:
        """All fragment groups: feedback lines (0 = none, 1 = invalid action), numbers, budget, env's."""
        num = max(self.max_budget + 1, self._num_range())
        return {
            "feedback": ["", self.invalid_message(), *self.FEEDBACK],
            "num": number_strings(num),
            "budget": ["Turns left:"],
            "end": [".\n"],
            "none": [""],
            **self._groups(),
        }

    def feedback_id(self, message: str):
        """Fragment id of one of the env's `FEEDBACK` lines (by its text, resolved at trace time)."""
        return self.fragments.id("feedback", 2 + self.FEEDBACK.index(message))

    def num_id(self, value):
        """Fragment id of the number `value` (clipped into the number table)."""
        return self.fragments.id("num", value)

    # ---- protocol ---------------------------------------------------------------------------
    def sample_task(self, key: jax.Array) -> dict[str, jnp.ndarray]:
        """A random task: a level seed."""
        return {"seed": jax.random.randint(key, (), 0, jnp.iinfo(jnp.int32).max, dtype=jnp.int32)}

    def reset(self, key: jax.Array, task, turns_left: jnp.ndarray | None = None):
        """Build the level of `task` -> (state, first Observation)."""
        self._check_budget(turns_left)
        state = self._reset(key, task)
        return state, self._render(self._reset_frags(state), turns_left)

    def step(self, key: jax.Array, state, action: jnp.ndarray, turns_left: jnp.ndarray | None = None):
        """One turn -> (state, Observation, reward float32[], terminated bool[], StepInfo).

        An INVALID (or out-of-range) action leaves the state unchanged and shows the invalid message.
        """
        self._check_budget(turns_left)
        action = jnp.asarray(action, jnp.int32)
        invalid = (action < 0) | (action >= self.num_actions)
        oracle = self.oracle_action(state)
        new_state, out = self._step(key, state, jnp.where(invalid, 0, action))
        state = jax.tree.map(lambda old, new: jnp.where(invalid, old, new), state, new_state)
        success = out.success & ~invalid
        terminated = out.terminated & ~invalid
        fb = jnp.atleast_1d(jnp.asarray(out.feedback, jnp.int32))
        invalid_fb = jnp.full_like(fb, self.fragments.id("none")).at[0].set(self.fragments.id("feedback", 1))
        feedback = jnp.where(invalid, invalid_fb, fb)
        obs = self._render(self._step_frags(state, feedback), turns_left)
        info = StepInfo(
            error=out.error | invalid,
            invalid=invalid,
            oracle_action=oracle.astype(jnp.int32),
            progress=self._progress(state).astype(jnp.float32),
            success=success,
        )
        return state, obs, success.astype(jnp.float32), terminated, info

    def parse_action(self, tokens: jnp.ndarray, length: jnp.ndarray) -> jnp.ndarray:
        """Action id of the reply `tokens[:length]` (stop token removed), or INVALID."""
        return self.actions.parse(tokens, length)

    def progress(self, state) -> jnp.ndarray:
        """Progress toward the goal in [0, 1] (1.0 at the goal)."""
        return self._progress(state).astype(jnp.float32)

    def _check_budget(self, turns_left) -> None:
        if self.show_budget and turns_left is None:
            raise ValueError(f"{self.name}: show_budget=True needs turns_left in reset/step.")

    def _render(self, ids, turns_left) -> Observation:
        ids = jnp.asarray(ids, jnp.int32)
        if self.show_budget:
            budget = jnp.stack(
                [self.fragments.id("budget"), self.num_id(turns_left), self.fragments.id("end")]
            ).astype(jnp.int32)
            ids = jnp.concatenate([ids, budget])
        return self.fragments.assemble(ids, self.max_obs_len)

    def render_text(self, obs: Observation) -> str:
        """Decode an observation (host side, for logs and tests)."""
        n = int(obs.length)
        return self.tokenizer.decode([int(t) for t in obs.tokens[:n]])

    # ---- subclass hooks ---------------------------------------------------------------------
    def _validate(self) -> None:
        """Check option values; raise ValueError naming the option and its valid range."""

    def _num_range(self) -> int:
        return 1

    def _groups(self) -> dict[str, list[str]]:
        raise NotImplementedError

    def _action_strings(self) -> list[str]:
        raise NotImplementedError

    def _instructions(self) -> str:
        raise NotImplementedError

    def _reset(self, key, task):
        raise NotImplementedError

    def _step(self, key, state, action):
        raise NotImplementedError

    def _progress(self, state):
        raise NotImplementedError

    def _reset_layout(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _step_layout(self) -> tuple[str, ...]:
        raise NotImplementedError

    def _reset_frags(self, state):
        raise NotImplementedError

    def _step_frags(self, state, feedback):
        raise NotImplementedError

    def oracle_action(self, state) -> jnp.ndarray:
        """The best action in `state` (exact when nothing slips or fails)."""
        raise NotImplementedError

    def optimal_turns(self, task) -> jnp.ndarray:
        """Turns the oracle needs to solve `task` when nothing slips or fails."""
        raise NotImplementedError

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"
