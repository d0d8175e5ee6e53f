"""Runtime facts of a run, checked once its env and format are built (`bmrl.assembly.build_run`), before
anything is written: the context buffer against every cap, the reply limit against the longest action,
a Python env's oracle for SFT demonstrations. Each player (`bmrl.assembly.players`) runs the checks of
its kind; static checks of the config are `bmrl.config.validate`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from bmrl.budget import cap_range
from bmrl.config import Config, ConfigError
from bmrl.learn.demos import demo_tokens_needed
from bmrl.rollout.scripts import NEXT_ORACLE
from bmrl.rollout.types import held_turns


def fitting_cap(cfg: Config, env, fmt, cap: int) -> int:
    """The largest cap <= `cap` whose worst-case conversation fits `rollout.max_len` (0 if none)."""
    r = cfg.rollout
    while cap > 0 and _tokens_needed(cfg, env, fmt, cap) > r.max_len:
        cap -= 1
    return cap


def _tokens_needed(cfg: Config, env, fmt, cap: int) -> int:
    """The worst-case buffer of a `cap`-turn episode: the turns one context holds (`held_turns`), every reply
    at its token limit."""
    return fmt.tokens_needed(held_turns(cap, cfg.rollout.history_turns), env.max_obs_len, cfg.rollout.max_reply_tokens)


def _window(cfg: Config, cap: int) -> str:
    """How a history window shortens the context of a `cap`-turn episode, for messages ("" without one)."""
    held = held_turns(cap, cfg.rollout.history_turns)
    return "" if held == cap else f" with a history window of {cfg.rollout.history_turns} ({held} turns at once)"


def check_reply(cfg: Config, env, fmt, action: str = "action") -> None:
    """Refuse a `rollout.max_reply_tokens` that cannot hold the longest action (a Python env without
    action strings: one token) in the run's reply format (think_answer: inside its answer tags) plus
    the stop token. `action`: what the env's actions are called in the message."""
    longest = max(env.max_action_len, 1)
    need = getattr(fmt, "min_reply_tokens", lambda n: n + 1)(longest)
    have = cfg.rollout.max_reply_tokens
    if have >= need:
        return
    what = f"the longest {action} of {env.name} ({longest} tokens)"
    if not env.max_action_len:
        what = f"a one-token action of {env.name} (it lists no action strings)"
    layout, fix = "plus the stop token", f"set it >= {need}"
    if getattr(fmt, "reply_format", "action") != "action":
        tags = len(fmt.answer_open) + len(fmt.answer_close)
        layout = f"inside the {fmt.reply_format} answer tags ({tags} tokens) plus the stop token"
        fix += " plus room for the reasoning, or set format.kind=action"
    raise ConfigError("rollout.max_reply_tokens", f"{have} cannot hold {what} {layout}; {fix}.")


def check_first_turn(cfg: Config, env, fmt) -> list[str]:
    """A Python env's buffer check: its observations are known only as it runs, so the buffer must hold
    the prompt, the longest first observation of the tasks and one reply; longer episodes stop as overflow."""
    r = cfg.rollout
    check_reply(cfg, env, fmt, "action string")
    need = fmt.tokens_needed(1, env.max_obs_len, r.max_reply_tokens)
    if need > r.max_len:
        raise ConfigError("rollout.max_len", f"{r.max_len} cannot hold one turn of {env.name}: the prompt and the "
                          f"longest first observation of the tasks ({env.max_obs_len} tokens) and a reply need "
                          f"{need} tokens; raise rollout.max_len to >= {need}.")
    return []


def check_oracle(cfg: Config, env) -> None:
    """Refuse a Python env whose oracle cannot be played before acting (`bmrl sft`, `bmrl reproduce`):
    reset's info must name `next_oracle_action` (a str) on the first train task, and a noisy oracle
    (sft.noise > 0) draws its wrong actions from the env's `action_strings`. (A JAX env's always can.)"""
    entry = cfg.env.entry
    try:
        info = env.factory().reset(seed=0, options=env.split("train")[0])[1]
    except Exception as err:  # noqa: BLE001 - user code
        raise ConfigError("env.entry", f"{entry}: reset of the first train task failed ({type(err).__name__}: "
                          f"{err}); fix the environment or the task file.") from None
    if not isinstance(info, dict) or not isinstance(info.get(NEXT_ORACLE), str):
        raise ConfigError("env.entry", f"{entry} gives no info[{NEXT_ORACLE!r}] (a str) from reset: SFT "
                          "demonstrations play the env's oracle before each action, so reset's and step's info must "
                          f"name {NEXT_ORACLE!r}, the best action in the state the observation describes "
                          "(bmrl/envs/python/protocol.py); add it, or skip SFT and `bmrl train` from a policy of "
                          "your own (model.path).")
    if cfg.sft.noise > 0 and not env.action_strings:
        raise ConfigError("sft.noise", f"{cfg.sft.noise} needs the env's action_strings (the noisy oracle draws its "
                          f"wrong actions from them) and {entry} lists none; set sft.noise=0, or give the env a "
                          "finite action_strings list.")


def check_buffer(cfg: Config, env, fmt, budget) -> list[str]:
    """A JAX env's buffer check: the context buffer against the caps of `budget` and eval.ts; returns
    (and warns) the non-fatal problems.

    Refuses (`ConfigError`) a reply limit below the longest action in the run's reply format
    (`format.kind`; think_answer: inside the answer tags) plus its stop token, and a
    `rollout.max_len` that cannot hold even the smallest cap (of the budget and of eval.ts) in the
    worst case, every reply at its token limit: the rollout refuses such a batch. Warns, with the
    numbers, when the largest cap or a full SFT demonstration may not fit: such sequences stop
    early and are flagged as overflow (the worst case is rare: real replies are short).
    """
    r = cfg.rollout
    check_reply(cfg, env, fmt)
    smallest = min(cap_range(budget)[0], min(cfg.eval.ts))
    need = _tokens_needed(cfg, env, fmt, smallest)
    if need > r.max_len:
        raise ConfigError(
            "rollout.max_len",
            f"{r.max_len} cannot hold even the smallest cap: {smallest} turn(s) of {env.name}{_window(cfg, smallest)} "
            f"need up to {need} "
            f"tokens (prompt {fmt.first_chunk_len(env.max_obs_len)}, {r.max_reply_tokens} per reply, "
            f"{fmt.turn_chunk_len(env.max_obs_len) - 1} per observation); raise rollout.max_len to >= {need}.",
        )
    problems = []
    largest = max(cap_range(budget)[1], max(cfg.eval.ts))
    need = _tokens_needed(cfg, env, fmt, largest)
    if need > r.max_len:
        problems.append(
            f"rollout.max_len={r.max_len} may not hold the largest cap: {largest} turns of {env.name}"
            f"{_window(cfg, largest)} need up "
            f"to {need} tokens in the worst case ({fitting_cap(cfg, env, fmt, largest)} turns always fit); "
            f"longer episodes stop early (overflow). Raise rollout.max_len to {need} to rule it out."
        )
    need = demo_tokens_needed(env, fmt, held_turns(cfg.sft.demo_turns, r.history_turns))
    if need > r.max_len:
        problems.append(
            f"rollout.max_len={r.max_len} may not hold a {cfg.sft.demo_turns}-turn demonstration (up to {need} "
            "tokens); longer demos end at the last turn that fits."
        )
    for p in problems:
        warnings.warn(p, stacklevel=2)
    return problems


__all__ = ["check_buffer", "check_first_turn", "check_oracle", "check_reply", "fitting_cap"]


def check_batch_split(cfg: Config, run, devices: int | None = None) -> None:
    """`bmrl train` and `bmrl reproduce`: refuse rows that do not split over the mesh's batch axes (data x fsdp
    of `run.mesh` on `devices`, default every device): a training rollout's (tasks_per_step + oversample) x
    group_size rows and a JAX env's held-out tasks each training evaluation plays at once (`bmrl.train.Trainer`)
    are placed with their leading axis split over those devices."""
    import jax

    from bmrl.parallel import mesh_shape

    axes = mesh_shape(run.mesh, jax.device_count() if devices is None else devices)
    ways = axes["data"] * axes["fsdp"]
    t, player = cfg.train, run.player
    rows = (t.tasks_per_step + t.oversample) * t.group_size
    if rows % ways:
        raise ConfigError("train.tasks_per_step", f"{t.tasks_per_step} (+ oversample {t.oversample}) x group_size "
                          f"{t.group_size} = {rows} rollout rows do not split over the mesh's data x fsdp = {ways} "
                          f"devices; make the rows a multiple of {ways}, or set mesh.data / mesh.fsdp so they divide.")
    if not player.evaluates_on_mesh:  # a Python env's evaluation plays its tasks on the host
        return
    for split, tasks in sorted(evaluation_tasks(cfg, player).items()):
        n = player.count(tasks)
        if n % ways:
            raise ConfigError("eval.num_tasks", f"each training evaluation plays {n} {split} tasks at once, which do not "
                              f"split over the mesh's data x fsdp = {ways} devices; set eval.num_tasks to a multiple "
                              f"of {ways} (the {split} split permitting).")


def evaluation_tasks(cfg: Config, player: Any) -> dict[str, Any]:
    """The held-out tasks each training evaluation plays at once (`bmrl.train.Trainer`; `check_batch_split`), by
    split: the first `eval.num_tasks` (fewer where the split holds fewer) of the split training evaluates on in
    between (`player.eval_split()`) and of "test" (its first and last evaluations)."""
    out = {}
    for split in {player.eval_split(), "test"}:
        tasks = player.tasks(split, max(cfg.eval.num_tasks, 1))
        out[split] = player.take(tasks, np.arange(min(cfg.eval.num_tasks, player.count(tasks))))
    return out
