"""bmrl: JAX-native multi-turn RL for LLM agents (compiled rollouts, BudgetMix, Pass@(K,T))."""

import os as _os

# bmrl uses transformers for tokenizers and configs only and needs no PyTorch; without it,
# transformers' import prints an advice that PyTorch was not found as the first line of every run.
# Only that kind of message (advisory warnings) is silenced, and only when the user has not chosen.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
