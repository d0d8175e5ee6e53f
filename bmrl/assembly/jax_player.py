"""The player of a built-in JAX env: level seeds as tasks, every episode one compiled loop
(`bmrl.rollout.engine`), SFT demonstrations of the env's oracle in one jit. The protocol it shares with
`bmrl.assembly.host_player.HostPlayer` is described in `bmrl.assembly.players`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import numpy as np
from flax import nnx

from bmrl.assembly.checks import check_buffer
from bmrl.assembly.settings import run_format
from bmrl.assembly.tasks import level_seeds, level_summary
from bmrl.chat import env_format
from bmrl.config import Config, ConfigError
from bmrl.envs import _CharTokenizer, corpus, make
from bmrl.eval.evaluate import Runner, engine_runner
from bmrl.learn.demos import Demos, demo_tokens_needed, make_demos
from bmrl.parallel import shard_batch
from bmrl.rollout import Injection, make_rollout


@dataclasses.dataclass(frozen=True, eq=False)
class JaxPlayer:
    """A built-in JAX env: tasks are level seeds (`{"seed": int32[n]}`), episodes one compiled loop."""

    cfg: Any  # bmrl.config.Config: its env, data and buffer sections
    env: Any  # bmrl.envs.Env
    fmt: Any  # bmrl.formats.Format
    replays_states: ClassVar[bool] = True  # probes and error injection can replay its oracle states
    evaluates_on_mesh: ClassVar[bool] = True  # a training evaluation's tasks are placed over data x fsdp

    # ---- the kind's facts from the config alone (before, or without, a built env) ----

    @staticmethod
    def prepare(cfg: Config) -> None:
        """What must be read before the tokenizer: nothing (a Python env's entry and task file)."""
        return None

    @staticmethod
    def tokenizer_texts(cfg: Config, parts: None = None) -> list[str]:
        """The text a tiny tokenizer is trained on: the env's fragments (`bmrl.envs.corpus`)."""
        try:
            return corpus([cfg.env.name], observations=False)
        except ValueError as err:
            raise ConfigError("env.name", str(err)) from None

    @staticmethod
    def make_env(cfg: Config, tokenizer: Any, parts: None = None) -> Any:
        """The `env` section's JAX `Env` for `tokenizer` (its options and `show_budget`)."""
        options = dict(cfg.env.options)
        if cfg.env.show_budget and "max_budget" not in options and cfg.rollout.max_turns > 128:
            options["max_budget"] = cfg.rollout.max_turns  # the shown number table must reach every cap
        try:
            return make(cfg.env.name, tokenizer, **{**options, "show_budget": cfg.env.show_budget})
        except (TypeError, ValueError) as err:
            raise ConfigError("env.options", str(err)) from None

    @staticmethod
    def make_format(cfg: Config, env: Any) -> Any:
        """The run's conversation format (`bmrl.chat.env_format`: the tokenizer's chat template or the plain one)."""
        return run_format(cfg, env, env_format)

    @staticmethod
    def report_name(cfg: Config) -> str:
        """The env as the study's reports name it."""
        return cfg.env.name

    @staticmethod
    def compare_label(cfg: Config) -> str:
        """The env as a comparison names it."""
        return cfg.env.name

    @staticmethod
    def settings_line(cfg: Config) -> str:
        """The env as an evaluation report's settings state it: name and options."""
        return f"{cfg.env.name} {dict(cfg.env.options)}"

    @classmethod
    def split(cls, cfg: Config, split: str, n: int | None = None, env: Any = None) -> dict:
        """The first `n` (default: the split's size) tasks of `split`: `{"seed": int32[n]}` (`env` default:
        the config's env: levels need no tokenizer)."""
        env = cls.make_env(cfg, _CharTokenizer()) if env is None else env
        return {"seed": level_seeds(cfg, split, n, env)}

    @classmethod
    def suite_summary(cls, cfg: Config, env: Any = None) -> dict:
        """How the levels were split (`bmrl.assembly.tasks.level_summary`)."""
        return level_summary(cfg, cls.make_env(cfg, _CharTokenizer()) if env is None else env)

    # ---- the built run's ----

    @property
    def label(self) -> str:
        """The env as logs name it: name and options."""
        return f"{self.env.name} {self.env.options}"

    @property
    def options(self) -> dict:
        """The env's options (defaults included), as summaries record them."""
        return dict(self.env.options)

    def tasks(self, split: str, n: int | None = None) -> dict:
        """The first `n` (default all) tasks of `split`: `{"seed": int32[n]}`."""
        return {"seed": np.asarray(level_seeds(self.cfg, split, n, self.env))}

    def eval_split(self) -> str:
        """The split training-time evaluation reads."""
        return "validation"

    def check_fits(self, budget: Any) -> list[str]:
        """The context buffer against the caps of `budget` and eval.ts (`bmrl.assembly.checks.check_buffer`)."""
        return check_buffer(self.cfg, self.env, self.fmt, budget)

    def check_demos(self) -> None:
        """A JAX env's oracle always plays SFT demonstrations: nothing to check."""

    def count(self, tasks: dict) -> int:
        return len(tasks["seed"])

    def take(self, tasks: dict, idx: Any) -> dict:
        """Rows `tasks[idx]` (any int array of indices)."""
        return {"seed": np.asarray(np.asarray(tasks["seed"])[np.asarray(idx)], np.int32)}

    def playing(self, graphdef: nnx.GraphDef, rollout_cfg: Any, mesh: Any = None) -> Callable:
        """`play(params, rows, caps, key) -> (Trajectory, None)`: the compiled rollout, rows sharded on `mesh`."""
        rollout_fn = make_rollout(graphdef, self.env, self.fmt, rollout_cfg)
        inject = Injection.none(rollout_cfg.max_turns)

        def play(params, rows: dict, caps: Any, key: Any):
            tasks = shard_batch(jax.device_put(rows), mesh)  # device_put: jnp.asarray compiles a program per shape
            return rollout_fn(params, tasks, caps, key, inject), None

        return play

    def demo_len(self, num_turns: int, max_len: int) -> int:
        """Tokens a demonstration of `num_turns` turns needs at most (within `max_len`)."""
        return min(max_len, demo_tokens_needed(self.env, self.fmt, num_turns))

    def demos(self, rows: dict, key: Any, **kw: Any) -> Demos:
        """The noisy oracle's demonstrations of `rows` (`bmrl.learn.demos.make_demos`, one jit)."""
        return make_demos(self.env, self.fmt, jax.device_put(rows), key, **kw)

    def evaluation_runner(self, *args: Any) -> Runner:
        """The evaluator's `Runner` (`bmrl.eval.evaluate`): the compiled episode engine, model or scripted
        policies, with error injection."""
        return engine_runner(*args)


__all__ = ["JaxPlayer"]
