"""Token-native JAX environments for LLM agents: a registry, `make`, and a tokenizer-free text corpus.

    env = make("corridor", tokenizer, length=8, eps=0.1)
    state, obs = env.reset(key, env.sample_task(key))

Environment modules are imported lazily, on first use of their name.
"""

from __future__ import annotations

from bmrl.envs.base import INVALID, Env, Observation, Outcome, StepInfo
from bmrl.registry import Registry

__all__ = ["ENVS", "INVALID", "available_envs", "Env", "Observation", "Outcome", "StepInfo", "corpus", "env_class", "make"]

# name -> its class, imported when first asked for
ENVS: Registry[type[Env]] = Registry("environment", {
    "corridor": "bmrl.envs.corridor:Corridor",
    "frozenlake": "bmrl.envs.frozenlake:FrozenLake",
    "keypad": "bmrl.envs.keypad:Keypad",
    "sokoban": "bmrl.envs.sokoban:Sokoban",
    "toolchain": "bmrl.envs.toolchain:ToolChain",
})


def env_class(name: str) -> type[Env]:
    """The class registered under `name`; unknown names fail with the list of valid ones."""
    return ENVS.lookup(name)


def make(name: str, tokenizer, **options) -> Env:
    """Build environment `name` for `tokenizer`; unknown options fail listing the valid ones."""
    return env_class(name)(tokenizer, **options)


class _CharTokenizer:
    """One token per character; lets `corpus` build environments before any tokenizer exists."""

    pad_token_id = 0
    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(int(i)) for i in ids)


# Option sets whose texts a tokenizer should know (numbers, sizes, messages); defaults come first.
CORPUS_OPTIONS: dict[str, list[dict]] = {
    "corridor": [{"show_budget": True}, {"length": 16}],
    "frozenlake": [{"show_budget": True}, {"hole_terminates": True, "size": 8}],
    "keypad": [{"show_budget": True}, {"length": 8}],
    "sokoban": [{"show_budget": True}],
    "toolchain": [{"show_budget": True, "num_keys": 32}],
}


def _available(name: str) -> bool:
    try:
        env_class(name)
        return True
    except ValueError:
        return False


def available_envs() -> list[str]:
    """Registered environments whose modules import (all of `ENVS` in a complete install)."""
    return [n for n in ENVS if _available(n)]


def corpus(names: list[str] | None = None, observations: bool = True) -> list[str]:
    """Representative texts of environments `names` (default: all available), no tokenizer needed.

    Instructions, every observation fragment (messages, map cells, numbers...), action strings and,
    with `observations`, a few whole observation texts of each env's default options (this compiles
    each env once, a few seconds). Used to train the tiny tokenizer before any env is built; since
    fragments split at pre-tokenizer boundaries, the fragments alone already teach every merge.
    """
    if names is None:
        names = available_envs()
    texts: list[str] = []
    tok = _CharTokenizer()
    for name in names:
        cls = env_class(name)
        for i, opts in enumerate(CORPUS_OPTIONS.get(name, [{}])):
            opts = {k: v for k, v in opts.items() if k in {**cls.COMMON_OPTIONS, **cls.OPTIONS}}
            env = cls(tok, **opts)
            texts.append(env.instructions)
            texts.extend(env.action_strings)
            for group in env.text_groups().values():
                texts.extend(t for t in group if t)
            if observations and i == 0:
                texts.extend(_sample_texts(env))
    return texts


def _sample_texts(env: Env, seeds: int = 4) -> list[str]:
    """Whole observation texts of a few levels: reset, an oracle step and a wrong step (host-joined)."""
    import jax
    import jax.numpy as jnp

    def frags(seed):
        key = jax.random.PRNGKey(seed)
        state = env._reset(key, {"seed": seed})
        ids = [env._reset_frags(state)]
        for t in range(2):
            action = (env.oracle_action(state) + t) % env.num_actions
            state, out = env._step(jax.random.fold_in(key, t), state, action)
            ids.append(env._step_frags(state, jnp.atleast_1d(out.feedback)))
        return ids

    batches = jax.jit(jax.vmap(frags))(jnp.arange(seeds, dtype=jnp.int32))
    return [env.fragments.text(row) for ids in batches for row in ids.tolist()]
