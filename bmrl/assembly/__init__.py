"""From a `Config` to the objects a run needs, each library type built from its section, once.

    run = build_run(cfg)                       # tokenizer, env, format, budget, rollout configs, mesh and the
                                               # player: built once, every runtime fact checked, nothing written
    policy, tokenizer = init_policy(cfg)       # a fresh tiny decoder, or load_policy(cfg.model.path)
    tasks = run.player.tasks("test", cfg.eval.num_tasks)

Split by concern: `players` (the one branch on the env kind: `player_class`), `jax_player` and
`host_player` (everything that differs between a built-in JAX env and a Python env), `python_env` (a
Python env's entry, task file and host settings), `tasks` (a JAX env's level splits), `checks` (the
runtime checks each player runs), `settings` (rollout configs, mesh, format errors), `policy`
(tokenizer, tiny decoder, saved policies), `learner` (what trains and what stays frozen, RL and SFT
alike) and `run` (the `Run` bundle). Every problem a user can fix in the config is a `ConfigError`
naming the key (exit status 2 in the CLI).
"""

from __future__ import annotations

from bmrl.assembly.checks import fitting_cap
from bmrl.assembly.players import HostPlayer, JaxPlayer, player_class, split_tasks, suite_summary
from bmrl.assembly.policy import base_dir, build_tokenizer, init_policy, load_policy, lora_spec, model_config, new_policy, with_lora
from bmrl.assembly.python_env import SIZE_KEYS, host_config, python_parts, python_sizes, python_splits
from bmrl.assembly.run import Run, build_reproduce_run, build_run
from bmrl.assembly.settings import mesh_config, rollout_config
from bmrl.assembly.tasks import data_dir, run_splits, suite_line, suite_sizes
from bmrl.config import make_budget  # noqa: F401 - re-exported: the budget of a run's section

__all__ = [
    "HostPlayer", "JaxPlayer", "Run", "SIZE_KEYS", "base_dir", "build_reproduce_run", "build_run", "build_tokenizer",
    "data_dir", "fitting_cap", "host_config", "init_policy", "load_policy", "lora_spec", "mesh_config", "model_config",
    "new_policy", "player_class", "python_parts", "python_sizes", "python_splits", "rollout_config", "run_splits",
    "split_tasks", "suite_line", "suite_sizes", "suite_summary", "with_lora",
]
