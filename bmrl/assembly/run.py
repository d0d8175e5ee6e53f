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

from bmrl.assembly.checks import check_batch_split
from bmrl.assembly.players import player_class
from bmrl.assembly.policy import build_tokenizer
from bmrl.assembly.settings import mesh_config, rollout_config
from bmrl.config import Config, check_reproduce, make_budget


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
    player: Any = None  # JaxPlayer or HostPlayer of env and fmt (`player_class`): how the run plays its env
    warnings: tuple[str, ...] = ()  # non-fatal problems of the context buffer (see check_fits)


def build_run(cfg: Config, tokenizer=None) -> Run:
    """Build (and so check) everything a run of `cfg` needs but the policy: the tokenizer (`tokenizer`
    if given, e.g. a loaded policy's), environment, format, budget, rollout configs and mesh.

    Every runtime fact is checked here, before a command writes anything: the model directory and its
    config.json, the format, the context buffer against every cap, the reply limit against the longest
    action in the reply format,
    the mesh against the devices. Raises ConfigError naming the key.
    """
    kind = player_class(cfg)
    parts = kind.prepare(cfg)  # a Python env's user code imported and reset once
    tokenizer = build_tokenizer(cfg, parts) if tokenizer is None else tokenizer
    env = kind.make_env(cfg, tokenizer, parts)
    player = kind(cfg, env, kind.make_format(cfg, env))
    budget = make_budget(cfg.budget)
    problems = player.check_fits(budget)
    return Run(cfg, tokenizer, env, player.fmt, budget, rollout_config(cfg), rollout_config(cfg, for_eval=True),
               mesh_config(cfg), player, tuple(problems))


def build_reproduce_run(cfg: Config) -> Run:
    """`build_run` for `bmrl reproduce`: also checks the reproduce section and every variant's budget
    against the context buffer (each RL stage's), before anything is written."""
    budgets = check_reproduce(cfg)
    run = build_run(cfg)
    run.player.check_demos()  # the SFT base plays the env's oracle (a Python env must name it)
    for budget in budgets.values():
        run.player.check_fits(budget)
    check_batch_split(cfg, run)  # its RL stages place their rows on the mesh
    return run


__all__ = ["Run", "build_reproduce_run", "build_run"]
