"""A run built once from its `Config`: tokenizer, env, format, budget, rollout configs, mesh, and the
player that plays its env (chosen here, once).

    run = build_run(cfg)              # every runtime fact checked, nothing written
    run.player.tasks("test", n)       # the player knows its env's tasks and how to play them

`build_run` is what a command calls before it writes anything, and what it passes down (train, SFT
and evaluation take the bundle instead of rebuilding its parts).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bmrl.assembly.env import (env_name, is_host, make_env, mesh_config, python_parts, replays_states, rollout_config,
                             run_format)
from bmrl.assembly.players import HostPlayer, JaxPlayer
from bmrl.assembly.policy import build_tokenizer
from bmrl.assembly.checks import check_demos, check_fits
from bmrl.config import Config, check_reproduce, make_budget


def make_player(cfg: Config, env: Any, fmt: Any) -> JaxPlayer | HostPlayer:
    """The player of `env` (module `bmrl.assembly.players`): the one place a run's env kind picks its path."""
    if is_host(cfg):
        return HostPlayer(env, fmt, label=env_name(cfg), options=dict(cfg.env.options), replays_states=replays_states(cfg))
    return JaxPlayer(cfg, env, fmt, label=f"{env.name} {env.options}", options=dict(env.options),
                     replays_states=replays_states(cfg))


@dataclasses.dataclass(frozen=True)
class Run:
    """What a run builds from its `Config`, once, before it writes anything; passed down to the
    trainer, SFT and evaluation so that none of them rebuilds (or re-validates) a part."""

    cfg: Config
    tokenizer: Any
    env: Any  # bmrl.envs.Env for `tokenizer`, or a bmrl.rollout.pyenv.PythonEnv (env.kind=python, tasks inside)
    fmt: Any  # the conversation format of the `format` section for env's tokenizer (run_format)
    budget: Any  # bmrl.budget.Budget of the `budget` section
    rollout: Any  # bmrl.rollout.RolloutConfig of training rollouts (rollout.temperature)
    eval_rollout: Any  # the same at eval.temperature
    mesh: Any  # bmrl.parallel.MeshConfig, checked against the devices
    player: Any = None  # JaxPlayer or HostPlayer of env and fmt (make_player): how the run plays its env
    warnings: tuple[str, ...] = ()  # non-fatal problems of the context buffer (see check_fits)


def build_run(cfg: Config, tokenizer=None) -> Run:
    """Build (and so check) everything a run of `cfg` needs but the policy: the tokenizer (`tokenizer`
    if given, e.g. a loaded policy's), environment, format, budget, rollout configs and mesh.

    Every runtime fact is checked here, before a command writes anything: the model directory and its
    config.json, the format, the context buffer against every cap, the reply limit against the longest
    action in the reply format,
    the mesh against the devices. Raises ConfigError naming the key.
    """
    parts = python_parts(cfg) if is_host(cfg) else None  # user code imported and reset once
    tokenizer = build_tokenizer(cfg, parts) if tokenizer is None else tokenizer
    env = make_env(cfg, tokenizer, parts)
    fmt = run_format(cfg, env)
    budget = make_budget(cfg.budget)
    problems = check_fits(cfg, env, fmt, budget)
    return Run(cfg, tokenizer, env, fmt, budget, rollout_config(cfg), rollout_config(cfg, for_eval=True),
               mesh_config(cfg), make_player(cfg, env, fmt), tuple(problems))


def build_reproduce_run(cfg: Config) -> Run:
    """`build_run` for `bmrl reproduce`: also checks the reproduce section and every variant's budget
    against the context buffer (each RL stage's), before anything is written."""
    budgets = check_reproduce(cfg)
    run = build_run(cfg)
    check_demos(cfg, run.env)  # the SFT base plays the env's oracle (a Python env must name it)
    for budget in budgets.values():
        check_fits(cfg, run.env, run.fmt, budget)
    return run


__all__ = ["Run", "build_reproduce_run", "build_run", "make_player"]
