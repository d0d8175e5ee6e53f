"""Playing episodes: one compiled engine for models, scripted policies, demonstrations and probes.

    traj = rollout(model, env, tasks, caps, key, cfg)          # a language-model policy
    traj = play(oracle_policy, env, tasks, caps, key, max_turns) # a scripted policy

Modules: `types` (RolloutConfig, Trajectory, Injection, caps and keys), `records` (the episode records
every loop over turns fills), `tokens` (buffer writes and reply parsing), `policies` (model, scripted and
replayed policies behind one interface), `engine` (the one loop over turns), `host` (Python environments
from the host), `baseline` (the Python-driven loop: benchmark baseline and oracle only).
"""

from bmrl.rollout.engine import (
    check_config,
    default_format,
    episode_program,
    make_episode,
    make_rollout,
    play,
    rollout,
)
from bmrl.rollout.model_policy import ModelPolicy
from bmrl.rollout.policies import (
    POLICIES,
    NoisyOracle,
    Replay,
    ReplayPolicy,
    ScriptedPolicy,
    make_noisy_oracle,
    noisy_oracle_policy,
    oracle_policy,
    random_policy,
)
from bmrl.rollout.tokens import parse_replies, select
from bmrl.rollout.types import (Injection, RolloutConfig, RolloutError, Trajectory, TurnSamples, check_caps, held_turns,
                                row_keys)

__all__ = [
    "POLICIES", "Injection", "ModelPolicy", "NoisyOracle", "Replay", "ReplayPolicy", "RolloutConfig", "RolloutError",
    "ScriptedPolicy", "Trajectory", "TurnSamples", "check_caps", "check_config", "default_format", "episode_program",
    "held_turns", "make_episode", "make_noisy_oracle", "make_rollout", "noisy_oracle_policy", "oracle_policy", "parse_replies",
    "play", "random_policy", "rollout", "row_keys", "select",
]
