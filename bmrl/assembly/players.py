"""The player: the one object of a run that knows whether its env is compiled JAX or Python on the host.

    kind = player_class(cfg)                              # JaxPlayer or HostPlayer: the one branch on env.kind
    player = run.player                                   # kind(cfg, env, fmt), built by `bmrl.assembly.build_run`
    tasks = player.tasks("train")                         # a split's tasks (level seeds, or task dicts)
    rows = player.take(tasks, idx)                        # the rows of a batch: tasks[idx]
    play = player.playing(graphdef, rollout_cfg, mesh)    # compiled once
    traj, faults = play(params, rows, caps, key)          # one batch of episodes; faults: None (JAX) or a list
    demos = player.demos(rows, key, num_turns=..., ...)   # SFT demonstrations (the noisy oracle)
    evaluate(..., runner=player.evaluation_runner)        # how the evaluator plays its rows

`JaxPlayer` (`bmrl.assembly.jax_player`) plays a built-in env in one compiled loop; `HostPlayer`
(`bmrl.assembly.host_player`) plays a Python env from the host on the same compiled turn. Everything
that differs between the kinds is a method of the two: what is read before the tokenizer (`prepare`),
the tokenizer's texts, the env and its format, how reports name the env, task splits and their summary,
the split training-time evaluation reads, the buffer-fit checks and the SFT oracle's. `player_class`
is the only branch on the env kind past the config (which decides it: `bmrl.config.is_python_env`);
train, SFT, evaluation, compare and reproduce use the protocol and never ask which kind they have.
"""

from __future__ import annotations

from typing import Any

from bmrl.assembly.host_player import HostPlayer
from bmrl.assembly.jax_player import JaxPlayer
from bmrl.config import Config, is_python_env


def player_class(cfg: Config) -> type[JaxPlayer] | type[HostPlayer]:
    """The player of the run's env kind: `HostPlayer` for `env.kind=python`, else `JaxPlayer`."""
    return HostPlayer if is_python_env(cfg) else JaxPlayer


def split_tasks(cfg: Config, split: str, n: int | None = None, run: Any = None) -> Any:
    """The first n tasks of `split` ("train", "validation" or "test"): `{"seed": int32[n]}` of a JAX env
    (default n: the split's size; `run` optional: levels need no tokenizer), or the first n (default all)
    task dicts of a Python env's `run`."""
    return player_class(cfg).split(cfg, split, n, None if run is None else run.env)


def suite_summary(cfg: Config, run: Any = None) -> dict:
    """How the run's tasks were split, for reports (`bmrl.assembly.tasks.suite_line` renders it): the split
    sizes, `overlap` = how many of the `eval.num_tasks` test tasks have a level (content hash) among the
    training tasks', `disjoint_by` ("content", or "seed" for a JAX env with too few levels) and `path`
    (the stored suites' directory, or None); a Python env's also `duplicates` (its task file's repeated
    tasks, dropped)."""
    return player_class(cfg).suite_summary(cfg, None if run is None else run.env)


__all__ = ["HostPlayer", "JaxPlayer", "player_class", "split_tasks", "suite_summary"]
