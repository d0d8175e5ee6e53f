"""The policy side of a run: its tokenizer (a Hugging Face directory's, or a tiny BPE trained on the
environment's text), a fresh tiny decoder, or a saved policy.

    tokenizer = build_tokenizer(cfg)            # or the one a loaded policy brings
    policy = new_policy(cfg, tokenizer)         # or: policy, tokenizer = load_policy(cfg.model.path)
    policy, tokenizer = init_policy(cfg)        # whichever the config names (model.path or a tiny one)

Every problem a user can fix in the config is a `ConfigError` naming the key.
"""

from __future__ import annotations

import os
from typing import Any

from bmrl.assembly.players import player_class
from bmrl.config import Config, ConfigError
from bmrl.formats import add_tag_tokens
from bmrl.model.config import ConfigError as ModelConfigError
from bmrl.model.config import ModelConfig
from bmrl.model.decoder import init_model
from bmrl.model.hf import TOKENIZER_FILES, CheckpointError, from_pretrained, load_config
from bmrl.model.lora import LoRASpec, add_lora, merge_lora, spec_of
from bmrl.model.peft import adapter_config, from_adapter_dir, is_adapter_dir
from bmrl.model.tokenizer import load_tokenizer, train_tiny_tokenizer


def build_tokenizer(cfg: Config, parts: tuple | None = None):
    """The run's tokenizer: the HF directory's when `model.path` is set, else a tiny byte-level BPE
    trained on the environment's own text with `model.vocab_size` entries: a JAX env's fragments
    (`bmrl.envs.corpus`); a Python env's instructions, first observations over the tasks (the first
    `CORPUS_TASKS`, reset seed = task index) and action strings.

    With `format.kind=think_answer` the tiny tokenizer also gets the think/answer tags as special
    tokens (`bmrl.formats.add_tag_tokens`): short replies, and tags that never merge with the text.
    Deterministic: the same env (and tasks), vocab size and format kind always give the same vocabulary.
    `parts`: what the player read before the tokenizer (`player_class(cfg).prepare(cfg)`), when the
    caller has it already (a Python env's entry and task file are read once per run).
    """
    if cfg.model.path is not None:
        return _hf_tokenizer(cfg.model.path)
    tokenizer = _tiny_tokenizer(cfg, parts)
    if cfg.format.kind == "think_answer":
        add_tag_tokens(tokenizer)
    return tokenizer


def _tiny_tokenizer(cfg: Config, parts: tuple | None):
    texts = player_class(cfg).tokenizer_texts(cfg, parts)
    try:
        return train_tiny_tokenizer(texts, vocab_size=cfg.model.vocab_size)
    except ValueError as err:
        raise ConfigError("model.vocab_size", str(err)) from None


def model_config(cfg: Config, tokenizer):
    """The `ModelConfig` of a tiny policy from the `model` section (vocab at least the tokenizer's)."""
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
            sliding_window=m.sliding_window,
            max_position_embeddings=max(2048, cfg.rollout.max_len),
            param_dtype=m.param_dtype,
            dtype=m.dtype,
        )
    except ModelConfigError as err:
        raise ConfigError("model", str(err)) from None


def new_policy(cfg: Config, tokenizer):
    """A freshly initialised tiny `Decoder` from the `model` section, seeded by `cfg.seed`."""
    return init_model(model_config(cfg, tokenizer), cfg.seed)


def lora_spec(cfg: Config) -> LoRASpec:
    """The `model.lora` section as a `LoRASpec` (rank 0: no adapters)."""
    return LoRASpec.of(cfg.model.lora)


def with_lora(cfg: Config, policy):
    """`policy` with fresh adapters per `model.lora` (seed `cfg.seed`; A random, B zero: the same
    outputs as the base), or unchanged at rank 0. A policy loaded from an adapter directory keeps its
    adapters (trained on) when `model.lora` asks for the same rank and targets, and is merged into a
    plain model at rank 0 (full fine-tuning from it)."""
    spec, have = lora_spec(cfg), spec_of(policy)
    if have is None:
        return add_lora(policy, spec, cfg.seed)
    if spec.rank == 0:
        return merge_lora(policy)
    if (have.rank, set(have.targets)) != (spec.rank, set(spec.targets)):
        raise ConfigError("model.lora", f"model.path holds adapters of rank {have.rank} on {list(have.targets)}, but "
                          f"model.lora asks for rank {spec.rank} on {list(spec.targets)}; set model.lora to match "
                          "(to train them on), or model.lora.rank=0 (to fine-tune the merged model).")
    return policy


def base_dir(cfg: Config) -> str | None:
    """The directory of the base model a LoRA run's adapters sit on: `model.path` (an adapter directory's
    base when it is one), absolute; None for a tiny model built from scratch."""
    path = cfg.model.path
    if path is None:
        return None
    if is_adapter_dir(path):
        try:
            path = adapter_config(path)[1]
        except CheckpointError as err:
            raise ConfigError("model.path", str(err)) from None
    return os.path.abspath(path)


def init_policy(cfg: Config, tokenizer=None) -> tuple[Any, Any]:
    """(policy, tokenizer): from `cfg.model.path` (a Hugging Face directory, e.g. an SFT output), or
    a fresh tiny decoder (seed `cfg.seed`) with `tokenizer` (default: the tiny one, `build_tokenizer`);
    with `model.lora.rank > 0` the policy carries fresh adapters (`with_lora`)."""
    if cfg.model.path:
        policy, tok = load_policy(cfg.model.path, cfg.model)
    else:
        tok = build_tokenizer(cfg) if tokenizer is None else tokenizer
        policy = new_policy(cfg, tok)
    return with_lora(cfg, policy), tok


def load_policy(path: str | os.PathLike, model: Any = None):
    """`(model, tokenizer)` from a local Hugging Face directory (`bmrl.model.from_pretrained`), or from a
    PEFT adapter directory (`bmrl.model.peft`: the base it names, with its LoRA adapters).

    `model`: the config's `model` section, whose `param_dtype` and `dtype` the loaded policy takes
    (parameter storage and compute: a real model's `dtype: bfloat16` computes in bfloat16); None loads
    float32 parameters and compute.

    A missing directory or one without tokenizer files fails with a message saying what to pass.
    """
    _check_dir(path)
    try:
        dtypes = {} if model is None else {"param_dtype": model.param_dtype, "dtype": model.dtype}
        loaded, tokenizer = from_adapter_dir(path, **dtypes) if is_adapter_dir(path) else from_pretrained(path, **dtypes)
    except CheckpointError as err:
        raise ConfigError("model.path", f"{err} Fix the directory or point model.path elsewhere.") from None
    if tokenizer is None:
        raise ConfigError(
            "model.path", f"{str(path)!r} holds no tokenizer files (tokenizer.json ...); a policy needs its "
            "tokenizer: save it with bmrl.model.save_pretrained(model, tokenizer, path)."
        )
    return loaded, tokenizer


def _check_dir(path) -> None:
    if not os.path.isdir(path):
        raise ConfigError(
            "model.path", f"{str(path)!r} is not a directory; pass a local Hugging Face model directory "
            "(config.json + *.safetensors + tokenizer files), e.g. <out_dir>/policy written by `bmrl sft`."
        )


def _hf_tokenizer(path):
    """The tokenizer of HF directory `path`, once its config.json has loaded (weights are not read); an
    adapter directory's own, or its base's."""
    _check_dir(path)
    try:
        if is_adapter_dir(path):
            base = adapter_config(path)[1]  # (checked: its config.json is there)
            if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
                return _hf_tokenizer(base)
        else:
            load_config(path)
    except CheckpointError as err:
        raise ConfigError("model.path", f"{err} Fix the directory or point model.path elsewhere.") from None
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise ConfigError(
            "model.path", f"{str(path)!r} holds no tokenizer files (tokenizer.json ...); a policy needs its "
            "tokenizer: save it with bmrl.model.save_pretrained(model, tokenizer, path)."
        )
    try:
        return load_tokenizer(path)
    except Exception as err:  # transformers raises many kinds; name the directory
        raise ConfigError("model.path", f"the tokenizer in {str(path)!r} could not be loaded: {err}") from None


__all__ = ["base_dir", "build_tokenizer", "init_policy", "load_policy", "lora_spec", "model_config", "new_policy", "with_lora"]
