"""From a `Config` to the objects a run needs: tokenizer, policy, environment, rollout shapes, task splits.

    tokenizer = build_tokenizer(cfg)           # tiny BPE on the env's text, or the HF dir's tokenizer
    policy = new_policy(cfg, tokenizer)        # or: policy, tokenizer = load_policy(cfg.model.path)
    env = make_env(cfg, tokenizer)
    check_fits(cfg, env, default_format(env))  # refuses a buffer that cannot hold the smallest cap
    tasks = split_tasks(cfg, "test", cfg.eval.num_tasks)

Every problem a user can fix in the config is a `ConfigError` naming the key (exit status 2 in the
CLI), raised before anything is written.
"""

from __future__ import annotations

import os
import warnings
import zlib
from typing import Any

import numpy as np

from bmrl.config import Config, ConfigError, make_budget

SPLITS = ("train", "test")


def build_tokenizer(cfg: Config):
    """The run's tokenizer: the HF directory's when `model.path` is set, else a tiny byte-level BPE
    trained on the environment's own text (`bmrl.envs.corpus`) with `model.vocab_size` entries.

    Deterministic: the same env and vocab size always give the same vocabulary.
    """
    if cfg.model.path is not None:
        from bmrl.model.tokenizer import load_tokenizer

        _check_dir(cfg.model.path)
        return load_tokenizer(cfg.model.path)
    from bmrl.envs import corpus
    from bmrl.model.tokenizer import train_tiny_tokenizer

    try:
        texts = corpus([cfg.env.name], observations=False)
    except ValueError as err:
        raise ConfigError("env.name", str(err)) from None
    try:
        return train_tiny_tokenizer(texts, vocab_size=cfg.model.vocab_size)
    except ValueError as err:
        raise ConfigError("model.vocab_size", str(err)) from None


def model_config(cfg: Config, tokenizer):
    """The `ModelConfig` of a tiny policy from the `model` section (vocab at least the tokenizer's)."""
    from bmrl.model.config import ConfigError as ModelConfigError
    from bmrl.model.config import ModelConfig

    m = cfg.model
    try:
        return ModelConfig(
            model_type=m.model_type,
            vocab_size=max(m.vocab_size, len(tokenizer)),
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            rope_theta=m.rope_theta,
            max_position_embeddings=max(2048, cfg.rollout.max_len),
            param_dtype=m.param_dtype,
            dtype=m.dtype,
        )
    except ModelConfigError as err:
        raise ConfigError("model", str(err)) from None


def new_policy(cfg: Config, tokenizer):
    """A freshly initialised tiny `Decoder` from the `model` section, seeded by `cfg.seed`."""
    from bmrl.model.decoder import init_model

    return init_model(model_config(cfg, tokenizer), cfg.seed)


def load_policy(path: str | os.PathLike):
    """`(model, tokenizer)` from a local Hugging Face directory (`bmrl.model.from_pretrained`).

    A missing directory or one without tokenizer files fails with a message saying what to pass.
    """
    from bmrl.model.hf import from_pretrained

    _check_dir(path)
    model, tokenizer = from_pretrained(path)
    if tokenizer is None:
        raise ConfigError(
            "model.path", f"{str(path)!r} holds no tokenizer files (tokenizer.json ...); a policy needs its "
            "tokenizer: save it with bmrl.model.save_pretrained(model, tokenizer, path)."
        )
    return model, tokenizer


def _check_dir(path) -> None:
    if not os.path.isdir(path):
        raise ConfigError(
            "model.path", f"{str(path)!r} is not a directory; pass a local Hugging Face model directory "
            "(config.json + *.safetensors + tokenizer files), e.g. <out_dir>/policy written by `bmrl sft`."
        )


def make_env(cfg: Config, tokenizer):
    """The environment of the `env` section (its options and `show_budget`) for `tokenizer`."""
    from bmrl.envs import ENVS, make

    if cfg.env.name not in ENVS:
        raise ConfigError("env.name", f"{cfg.env.name!r} is not allowed; choose one of: {', '.join(sorted(ENVS))}.")
    options = dict(cfg.env.options)
    if cfg.env.show_budget and "max_budget" not in options and cfg.rollout.max_turns > 128:
        options["max_budget"] = cfg.rollout.max_turns  # the shown number table must reach every cap
    try:
        return make(cfg.env.name, tokenizer, **{**options, "show_budget": cfg.env.show_budget})
    except (TypeError, ValueError) as err:
        raise ConfigError("env.options", str(err)) from None


def rollout_config(cfg: Config, for_eval: bool = False):
    """The `RolloutConfig` of the `rollout` section; evaluation samples at `eval.temperature`."""
    from bmrl.rollout import RolloutConfig
    from bmrl.sampling import SamplingConfig

    r = cfg.rollout
    temperature = cfg.eval.temperature if for_eval else r.temperature
    return RolloutConfig(
        max_turns=r.max_turns,
        max_reply_tokens=r.max_reply_tokens,
        max_len=r.max_len,
        sampling=SamplingConfig(temperature=temperature, top_k=r.top_k, top_p=r.top_p),
    )


def largest_cap(cfg: Config) -> int:
    """The largest turn cap the run uses: the budget's and the evaluation grid's."""
    return max(make_budget(cfg.budget).max_cap, max(cfg.eval.ts))


def fitting_cap(cfg: Config, env, fmt, cap: int) -> int:
    """The largest cap <= `cap` whose worst-case conversation fits `rollout.max_len` (0 if none)."""
    r = cfg.rollout
    while cap > 0 and fmt.tokens_needed(cap, env.max_obs_len, r.max_reply_tokens) > r.max_len:
        cap -= 1
    return cap


def check_fits(cfg: Config, env, fmt) -> list[str]:
    """Check the context buffer against the budgets; returns (and warns) the non-fatal problems.

    Refuses (`ConfigError`) a reply limit below the longest reply plus its stop token, and a
    `rollout.max_len` that cannot hold even the smallest cap (of the budget and of eval.ts) in the
    worst case, every reply at its token limit: the rollout refuses such a batch. Warns, with the
    numbers, when the largest cap or a full SFT demonstration may not fit: such sequences stop
    early and are flagged as overflow (the worst case is rare: real replies are short).
    """
    r = cfg.rollout
    min_reply = getattr(fmt, "min_reply_tokens", lambda n: n + 1)(env.max_action_len)
    if r.max_reply_tokens < min_reply:
        raise ConfigError(
            "rollout.max_reply_tokens",
            f"{r.max_reply_tokens} cannot hold the longest action of {env.name} ({env.max_action_len} tokens) "
            f"in its reply format plus the stop token; set it >= {min_reply}.",
        )
    smallest = min(make_budget(cfg.budget).min_cap, min(cfg.eval.ts))
    need = fmt.tokens_needed(smallest, env.max_obs_len, r.max_reply_tokens)
    if need > r.max_len:
        raise ConfigError(
            "rollout.max_len",
            f"{r.max_len} cannot hold even the smallest cap: {smallest} turn(s) of {env.name} need up to {need} "
            f"tokens (prompt {fmt.first_chunk_len(env.max_obs_len)}, {r.max_reply_tokens} per reply, "
            f"{fmt.turn_chunk_len(env.max_obs_len) - 1} per observation); raise rollout.max_len to >= {need}.",
        )
    problems = []
    largest = largest_cap(cfg)
    need = fmt.tokens_needed(largest, env.max_obs_len, r.max_reply_tokens)
    if need > r.max_len:
        problems.append(
            f"rollout.max_len={r.max_len} may not hold the largest cap: {largest} turns of {env.name} need up "
            f"to {need} tokens in the worst case ({fitting_cap(cfg, env, fmt, largest)} turns always fit); "
            f"longer episodes stop early (overflow). Raise rollout.max_len to {need} to rule it out."
        )
    from bmrl.learn.demos import demo_tokens_needed

    need = demo_tokens_needed(env, fmt, cfg.sft.demo_turns)
    if need > r.max_len:
        problems.append(
            f"rollout.max_len={r.max_len} may not hold a {cfg.sft.demo_turns}-turn demonstration (up to {need} "
            "tokens); longer demos end at the last turn that fits."
        )
    for p in problems:
        warnings.warn(p, stacklevel=2)
    return problems


def split_seeds(env_name: str, split: str, n: int) -> np.ndarray:
    """`n` distinct level seeds `int32[n]` of `split` for `env_name`: train seeds are even, test odd.

    The same parity rule as `bmrl.data.suites`, so no test level is ever trained on. The seeds
    depend only on the env name and split (not on the run's seed): every run and every seed of an
    experiment evaluates the same held-out levels. Prefixes are stable: the first n of a larger
    draw are the same seeds.
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits are {list(SPLITS)}.")
    rng = np.random.default_rng([zlib.crc32(f"bmrl/{env_name}".encode()), SPLITS.index(split)])
    seeds: list[int] = []
    seen: set[int] = set()
    while len(seeds) < n:
        for s in rng.integers(0, 2**29, size=max(n, 64)).tolist():
            if s not in seen and len(seeds) < n:
                seen.add(s)
                seeds.append(s)
    parity = SPLITS.index(split)
    return (2 * np.asarray(seeds, np.int64) + parity).astype(np.int32)


def split_tasks(cfg: Config, split: str, n: int | None = None) -> dict[str, Any]:
    """Tasks `{"seed": int32[n]}` of `split` (default n: `data.train_size` / `data.test_size`)."""
    if n is None:
        n = cfg.data.train_size if split == "train" else cfg.data.test_size
    return {"seed": split_seeds(cfg.env.name, split, n)}
