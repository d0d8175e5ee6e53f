"""The learner's pure-function core: advantages, losses, log-probs and the optimizer.

Algorithms are small pure functions in registries selected by name (`get_advantage("grpo")`,
`get_loss("ppo")`), so a config switches between them and a new one is a function plus a line.
"""

from bmrl.learn.advantages import (
    ADVANTAGES,
    combine_advantages,
    discounted_returns,
    get_advantage,
    grpo_advantages,
    normalize_turn_values,
    process_advantages,
    process_turn_rewards,
    reinforce_advantages,
    rloo_advantages,
    spread_to_tokens,
    token_advantages,
)
from bmrl.learn.logprobs import (
    chunked_token_logprobs,
    token_entropy,
    token_logprobs,
    token_logprobs_and_entropy,
)
from bmrl.learn.losses import LOSSES, aggregate, get_loss, pg_loss, ppo_loss
from bmrl.learn.optim import (
    SkipNonFiniteState,
    all_finite,
    make_optimizer,
    make_schedule,
    optimizer_from_config,
    skip_counts,
    skip_nonfinite,
)

__all__ = [
    "ADVANTAGES",
    "LOSSES",
    "SkipNonFiniteState",
    "aggregate",
    "all_finite",
    "chunked_token_logprobs",
    "combine_advantages",
    "discounted_returns",
    "get_advantage",
    "get_loss",
    "grpo_advantages",
    "make_optimizer",
    "make_schedule",
    "optimizer_from_config",
    "normalize_turn_values",
    "pg_loss",
    "ppo_loss",
    "process_advantages",
    "process_turn_rewards",
    "reinforce_advantages",
    "rloo_advantages",
    "skip_counts",
    "skip_nonfinite",
    "spread_to_tokens",
    "token_advantages",
    "token_entropy",
    "token_logprobs",
    "token_logprobs_and_entropy",
]
