"""From a `Config` to the objects a run needs, each library type built from its section, once.

    run = build_run(cfg)                       # tokenizer, env, format, budget, rollout configs, mesh and the
                                               # player: built once, every runtime fact checked, nothing written
    policy, tokenizer = init_policy(cfg)       # a fresh tiny decoder, or load_policy(cfg.model.path)
    tasks = run.player.tasks("test", cfg.eval.num_tasks)

Split by concern: `policy` (tokenizer, tiny decoder, saved policies), `env` (the env, its format,
rollout configs, mesh; a Python env's task file), `tasks` (train / validation / test splits and their
summary), `players` (a JAX env's and a Python env's player behind one protocol) and `run` (the `Run`
bundle). Every problem a user can fix in the config is a `ConfigError` naming the key (exit status 2
in the CLI).
"""

from __future__ import annotations

from bmrl.assembly.env import (
    SIZE_KEYS,
    env_label,
    env_line,
    env_name,
    host_config,
    make_env,
    mesh_config,
    python_parts,
    python_sizes,
    python_splits,
    replays_states,
    rollout_config,
    run_format,
)
from bmrl.assembly.players import HostPlayer, JaxPlayer
from bmrl.assembly.policy import base_dir, build_tokenizer, init_policy, load_policy, lora_spec, model_config, new_policy, with_lora
from bmrl.assembly.run import Run, build_reproduce_run, build_run, make_player
from bmrl.assembly.tasks import data_dir, eval_split, run_splits, split_tasks, suite_line, suite_sizes, suite_summary
from bmrl.assembly.checks import check_demos, check_fits, fitting_cap
from bmrl.config import make_budget  # noqa: F401 - re-exported: the budget of a run's section

__all__ = [
    "HostPlayer", "JaxPlayer", "Run", "SIZE_KEYS", "base_dir", "build_reproduce_run", "build_run", "build_tokenizer", "check_demos",
    "check_fits", "data_dir", "fitting_cap",
    "env_label", "env_line", "env_name", "eval_split", "host_config", "init_policy", "load_policy", "lora_spec", "make_env",
    "make_player", "mesh_config", "model_config", "new_policy", "with_lora", "python_parts", "python_sizes", "python_splits",
    "replays_states", "rollout_config", "run_format",
    "run_splits", "split_tasks", "suite_line", "suite_sizes", "suite_summary",
]
