"""Hugging Face checkpoints in and out: config.json + safetensors <-> `Decoder`.

transformers (v5 ships no Flax models) is used for `AutoConfig` only, from local files, never with
remote code. What differs between families (biases, HF class and key names, tensor names) is read
from their spec in `bmrl.model.families`. Files are found and opened by `bmrl.model.hf_dir`, inside
the directory only. Tensors are read with `safetensors`' flax reader (it holds bf16, numpy cannot)
and checked by name and shape against the config before any model is built, and for finiteness
after, so a bad checkpoint fails with one error listing every problem instead of a half-loaded model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from bmrl.model.config import SUPPORTED_ACTIVATIONS, ConfigError, ModelConfig
from bmrl.model.decoder import Decoder
from bmrl.model.families import get_family, supported
from bmrl.model.lora import merge_lora
from bmrl.model.hf_dir import (
    INDEX_FILE,
    SINGLE_FILE,
    CheckpointError,
    check_directory,
    checkpoint_files,
    open_safetensors,
    read_json,
)
from bmrl.model.tokenizer import END_OF_TURN, load_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")  # safetensors dtype names of weights bmrl loads


# ---------------------------------------------------------------- name mapping
def tensor_specs(cfg: ModelConfig) -> dict[str, tuple[tuple, tuple[int, ...], bool]]:
    """HF tensor name -> (NNX parameter path, HF shape, transposed). Linear weights are [out, in]
    in HF and `kernel: [in, out]` here."""
    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_dim, kv_dim = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    names = cfg.family.tensor_names
    specs: dict[str, tuple[tuple, tuple[int, ...], bool]] = {
        f"{names.embed_tokens}.weight": (("embed_tokens", "embedding"), (cfg.vocab_size, d), False),
        f"{names.norm}.weight": (("norm", "weight"), (d,), False),
    }
    if not cfg.tie_word_embeddings:
        specs[f"{names.lm_head}.weight"] = (("lm_head", "kernel"), (cfg.vocab_size, d), True)
    linears = (
        ("self_attn.q_proj", q_dim, d, cfg.attention_bias),
        ("self_attn.k_proj", kv_dim, d, cfg.attention_bias),
        ("self_attn.v_proj", kv_dim, d, cfg.attention_bias),
        ("self_attn.o_proj", d, q_dim, cfg.o_proj_bias),
        ("mlp.gate_proj", inter, d, False),
        ("mlp.up_proj", inter, d, False),
        ("mlp.down_proj", d, inter, False),
    )
    for i in range(cfg.num_hidden_layers):
        prefix = names.layer.format(i=i) + "."
        for name, d_out, d_in, bias in linears:
            path = ("layers", i, *name.split("."))
            specs[f"{prefix}{name}.weight"] = (path + ("kernel",), (d_out, d_in), True)
            if bias:
                specs[f"{prefix}{name}.bias"] = (path + ("bias",), (d_out,), False)
        norms = ["input_layernorm", "post_attention_layernorm"]
        if cfg.family.sandwich_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        for norm in norms:
            specs[f"{prefix}{norm}.weight"] = (("layers", i, norm, "weight"), (d,), False)
        if cfg.family.qk_norm:
            for norm in ("q_norm", "k_norm"):
                specs[f"{prefix}self_attn.{norm}.weight"] = (("layers", i, "self_attn", norm, "weight"), (hd,), False)
    return specs


# ---------------------------------------------------------------- config
def config_from_hf(hf_config: Any, **overrides: Any) -> ModelConfig:
    """A `ModelConfig` from a transformers config object; raises `ConfigError` on what we can't run."""
    get = lambda name, default=None: getattr(hf_config, name, default)  # noqa: E731
    model_type = get("model_type")
    family = get_family(model_type)
    if family is None:
        raise ConfigError(f"model_type {model_type!r} is not supported; supported: {supported()}.")
    problems = family.unsupported_features(get)
    rope, local_rope = _rope_parameters(get, family, problems)
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"partial_rotary_factor={rope['partial_rotary_factor']} (only full rotary is implemented)")
    hidden_act = get(family.activation_key, family.hidden_act)
    if hidden_act not in SUPPORTED_ACTIVATIONS:
        problems.append(f"{family.activation_key}={hidden_act!r} (implemented: {', '.join(SUPPORTED_ACTIVATIONS)})")
    if problems:
        raise ConfigError(f"{model_type} config uses unsupported features: " + "; ".join(problems) + ".")
    rope_theta = rope.pop("rope_theta", get("rope_theta", 10000.0))
    heads = get("num_attention_heads")
    layer_types = get("layer_types")
    sliding_window = get("sliding_window") if "sliding_window" in family.config_keys else None
    if layer_types is not None and "sliding_attention" not in layer_types:
        sliding_window = None  # a window no layer uses (Qwen3 keeps the key with the window off)
    fields = dict(
        model_type=model_type,
        vocab_size=get("vocab_size"),
        hidden_size=get("hidden_size"),
        intermediate_size=get("intermediate_size"),
        num_hidden_layers=get("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=get("num_key_value_heads") or heads,
        head_dim=get("head_dim") or (get("hidden_size") // heads if heads else None),
        rope_theta=float(rope_theta),
        rope_scaling=rope or None,
        rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(get("tie_word_embeddings", family.tie_word_embeddings)),
        attention_bias=bool(get("attention_bias", False)) if family.attention_bias is None else family.attention_bias,
        max_position_embeddings=get("max_position_embeddings", 2048),
        hidden_act=hidden_act,
        sliding_window=sliding_window,
        layer_types=tuple(layer_types) if layer_types is not None and "layer_types" in family.config_keys else None,
        rope_local_theta=None if local_rope is None else float(local_rope["rope_theta"]),
    )
    for key in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):
        if key in family.config_keys and get(key) is not None:
            fields[key] = float(get(key))
    if fields.get("query_pre_attn_scalar") == fields["head_dim"]:
        fields["query_pre_attn_scalar"] = None  # the default scale, head_dim**-0.5
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return ModelConfig(**fields)


def _rope_parameters(get: Any, family: Any, problems: list[str]) -> tuple[dict, dict | None]:
    """(the global layers' rope parameters, the sliding layers' own or None) of a transformers config;
    a family keyed by layer type (Gemma 3) must leave its local layers unscaled."""
    rope = dict(get("rope_parameters") or get("rope_scaling") or {})
    if not family.rope_per_layer_type:
        return rope, None
    local = dict(rope.get("sliding_attention") or {"rope_type": "default"})
    local.setdefault("rope_theta", get("rope_local_base_freq", 10000.0))
    if local.get("rope_type", "default") != "default":
        problems.append(f"rope_parameters['sliding_attention'] rope_type={local['rope_type']!r} (the local layers' "
                        "RoPE must be unscaled)")
    return dict(rope.get("full_attention") or {"rope_type": "default"}), local


def config_to_hf(cfg: ModelConfig, tokenizer: Any = None) -> Any:
    """The transformers config (the family's class, e.g. LlamaConfig) describing the same architecture."""
    import transformers

    rope_parameters = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
    if cfg.family.rope_per_layer_type:
        local_theta = cfg.rope_theta if cfg.rope_local_theta is None else cfg.rope_local_theta
        if cfg.rope_local_theta is None and cfg.rope_scaling is not None:
            raise ConfigError(f"{cfg.model_type} keys RoPE by layer type: with rope_scaling, set rope_local_theta "
                              "(the sliding layers' own unscaled base)")
        rope_parameters = {"full_attention": rope_parameters,
                           "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}
    elif cfg.rope_local_theta is not None and cfg.rope_local_theta != cfg.rope_theta:
        raise ConfigError(f"{cfg.model_type} has one RoPE base: rope_local_theta={cfg.rope_local_theta} has no "
                          "transformers equivalent (set it None)")
    kwargs: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,

        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters=rope_parameters,
        dtype=cfg.param_dtype,
    )
    kwargs[cfg.family.activation_key] = cfg.hidden_act
    scalar = cfg.query_pre_attn_scalar or cfg.head_dim
    extras = dict(query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,  # HF: an int
                  attn_logit_softcapping=cfg.attn_logit_softcapping,
                  final_logit_softcapping=cfg.final_logit_softcapping, sliding_window=cfg.sliding_window,
                  use_sliding_window=cfg.sliding_window is not None, max_window_layers=0,
                  layer_types=list(cfg.layer_types))
    kwargs.update({key: extras[key] for key in cfg.family.config_keys})
    problems = [f"{key}={getattr(cfg, key)}" for key in ("attn_logit_softcapping", "final_logit_softcapping")
                if getattr(cfg, key) is not None and key not in cfg.family.config_keys]
    if "sliding_attention" in cfg.layer_types and "sliding_window" not in cfg.family.config_keys:
        problems.append(f"sliding_window={cfg.sliding_window}")
    if cfg.query_pre_attn_scalar not in (None, cfg.head_dim) and "query_pre_attn_scalar" not in cfg.family.config_keys:
        problems.append(f"query_pre_attn_scalar={cfg.query_pre_attn_scalar}")
    if problems:
        raise ConfigError(f"transformers' {cfg.family.config_class} has no equivalent of {', '.join(problems)}: "
                          "export needs a family that has them (or set them None)")
    if cfg.family.attention_bias is None:  # the family reads it from config.json
        kwargs["attention_bias"] = cfg.attention_bias
    kwargs.update({key: value for key, value, _ in cfg.family.unsupported})  # the only values bmrl runs
    if tokenizer is not None:
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN) if END_OF_TURN in tokenizer.get_vocab() else None
        if end_of_turn is not None and end_of_turn not in eos:
            eos.append(end_of_turn)  # bmrl's plain format ends a reply with <|end|>: engines stop there too
        kwargs.update(
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=eos[0] if len(eos) == 1 else (eos or None),
        )
    hf_config = getattr(transformers, cfg.family.config_class)(**kwargs)
    hf_config.architectures = [cfg.family.architecture]
    return hf_config


def load_config(path: str | os.PathLike, **overrides: Any) -> ModelConfig:
    """Read `path/config.json` (AutoConfig, local files only, no remote code) into a `ModelConfig`."""
    path = Path(path)
    check_directory(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"{str(path)!r} has no config.json; a Hugging Face model directory needs one (and safetensors weights)."
        )
    raw = read_json(config_file, "a Hugging Face model config")
    model_type = raw.get("model_type")
    if get_family(model_type) is None:
        raise CheckpointError(f"{config_file}: model_type {model_type!r} is not supported; supported: {supported()}.")
    from transformers import AutoConfig

    try:
        hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # transformers validates too (e.g. hidden_size vs heads); name the file
        raise CheckpointError(f"{config_file} is not a valid {model_type} config: {e}") from e
    try:
        return config_from_hf(hf_config, **overrides)
    except ConfigError as e:
        raise CheckpointError(f"{config_file}: {e}") from e


# ---------------------------------------------------------------- tensors
def _group_by_file(names: list[str], files: dict[str, Path]) -> Iterator[tuple[Path, list[str]]]:
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    yield from by_file.items()


def _check_tensors(cfg: ModelConfig, files: dict[str, Path], path: Path) -> list[str]:
    """Compare names and shapes with the config; return the names to load or raise listing problems."""
    specs = tensor_specs(cfg)
    shapes: dict[str, tuple[int, ...]] = {}
    not_float = []
    for file, names in _group_by_file(list(files), files):
        with open_safetensors(file) as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise CheckpointError(f"{path / INDEX_FILE} maps {name!r} to {file.name}, which does not hold it.")
                shapes[name] = tuple(f.get_slice(name).get_shape())
                if name in specs and f.get_slice(name).get_dtype() not in _FLOAT_DTYPES:
                    not_float.append(f"{file.name}: {name} {f.get_slice(name).get_dtype()}")
    missing = [f"{n} {specs[n][1]}" for n in specs if n not in shapes]
    unexpected, misshaped = [], []
    for name, shape in shapes.items():
        if name.endswith(cfg.family.ignored_tensors):
            continue
        if name == f"{cfg.family.tensor_names.lm_head}.weight" and cfg.tie_word_embeddings:
            expected = (cfg.vocab_size, cfg.hidden_size)  # a redundant copy of the tied embedding
        elif name in specs:
            expected = specs[name][1]
        else:
            unexpected.append(f"{name} {shape}")
            continue
        if shape != expected:
            misshaped.append(f"{name}: checkpoint {shape}, config expects {expected}")
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped tensors: {'; '.join(misshaped)}")
    if not_float:
        problems.append(f"tensors that are not float ({'/'.join(_FLOAT_DTYPES)}; quantized weights are not read): "
                        + ", ".join(not_float))
    if problems:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} does not match its config.json ({cfg.model_type}, "
            f"{cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}): " + ". ".join(problems) + "."
        )
    return list(specs)


def load_model(path: str | os.PathLike, cfg: ModelConfig, *, allow_nonfinite: bool = False) -> Decoder:
    """Build a `Decoder` for `cfg` holding the safetensors weights in `path` (checked first).

    NaN or inf in any weight is refused unless `allow_nonfinite` (a diverged run's export loads
    fine and then produces garbage, so it must be asked for).
    """
    path = Path(path)
    files = checkpoint_files(path)
    names = _check_tensors(cfg, files, path)
    specs = tensor_specs(cfg)
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    expected_paths = {p for p, _ in nnx.to_flat_state(abstract_state)}
    assert expected_paths == {specs[n][0] for n in names}, "tensor_specs out of sync with Decoder"
    values: dict[tuple, jax.Array] = {}
    nonfinite: dict[str, jax.Array] = {}
    for file, group in _group_by_file(names, files):
        with open_safetensors(file) as f:
            for name in group:
                nnx_path, _, transposed = specs[name]
                tensor = f.get_tensor(name)
                values[nnx_path] = jnp.asarray(tensor.T if transposed else tensor, cfg.jnp_param_dtype)
                if not allow_nonfinite:
                    nonfinite[name] = jnp.sum(~jnp.isfinite(values[nnx_path]))
    bad = {name: int(n) for name, n in jax.device_get(nonfinite).items() if n}
    if bad:
        listed = ", ".join(f"{files[name].name}: {name} ({n} values)" for name, n in bad.items())
        raise CheckpointError(
            f"Checkpoint {str(path)!r} holds non-finite weights (NaN or inf): {listed}. The model would "
            "produce NaN; if that is what you want to inspect, pass from_pretrained(..., allow_nonfinite=True) "
            "(config key model.allow_nonfinite=true)."
        )
    return nnx.merge(graphdef, nnx.from_flat_state(values))


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: Any = None,
    param_dtype: Any = None,
    allow_nonfinite: bool = False,
) -> tuple[Decoder, Any]:
    """Load `(model, tokenizer)` from a local Hugging Face directory.

    Reads config.json (a family in `bmrl.model.families`), one or several safetensors files
    (`model.safetensors` or the shards named by `model.safetensors.index.json`, bf16 included) and
    the tokenizer when its files are present (else tokenizer is None). `param_dtype` / `dtype`
    (default float32) set storage and compute dtypes. Every file must lie inside `path` (no `..`,
    absolute names or symlinks out); pickled weights are refused; NaN/inf weights are refused
    unless `allow_nonfinite`. Never touches the network. Raises `CheckpointError` naming the file
    on any inconsistency, before a model is returned.
    """
    path = Path(path)
    cfg = load_config(path, dtype=dtype, param_dtype=param_dtype)
    model = load_model(path, cfg, allow_nonfinite=allow_nonfinite)
    tokenizer = None
    present = [name for name in TOKENIZER_FILES if (path / name).is_file()]
    if present:
        try:
            tokenizer = load_tokenizer(path)
        except Exception as e:
            raise CheckpointError(
                f"Tokenizer files in {str(path)!r} ({', '.join(present)}) could not be loaded: {e}"
            ) from e
        vocab = tokenizer.get_vocab()
        past = {t for t, i in vocab.items() if i >= cfg.vocab_size} - set(cfg.family.tokens_past_vocab)
        if len(tokenizer) > cfg.vocab_size and past:  # ids past the embedding would be clamped silently under jit
            raise CheckpointError(
                f"The tokenizer in {str(path)!r} ({', '.join(present)}) has {len(tokenizer)} tokens, more than "
                f"config.json's vocab_size={cfg.vocab_size}: save the model and tokenizer together."
            )
    return model, tokenizer


# ---------------------------------------------------------------- export
def save_pretrained(
    model: Decoder,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    max_shard_bytes: int | None = None,
) -> None:
    """Write config.json + safetensors (+ tokenizer files when `tokenizer` is not None) that
    `transformers.AutoModelForCausalLM.from_pretrained(path)` loads.

    Weights keep their dtype; a LoRA model is written merged (`bmrl.model.lora.merge_lora`). With `max_shard_bytes`, tensors are split over several files named by
    `model.safetensors.index.json`. Earlier model*.safetensors files in `path` are removed first.
    On a multi-process run every process calls it (weights split across processes are gathered) and
    process 0 alone writes (`bmrl.distributed.main_writes`).
    """
    from bmrl.distributed import main_writes, to_host

    model = merge_lora(model)  # LoRA: the merged weights (the adapter alone: `save_adapter`)
    cfg: ModelConfig = model.config
    state = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    tensors = {}
    for name, (nnx_path, _, transposed) in tensor_specs(cfg).items():
        value = to_host(state[nnx_path][...])
        tensors[name] = np.ascontiguousarray(value.T if transposed else value)
    path = Path(path)

    def write() -> None:  # process 0 alone: every process gathered the weights above
        path.mkdir(parents=True, exist_ok=True)
        for old in [*path.glob("model*.safetensors"), path / INDEX_FILE]:
            old.unlink(missing_ok=True)
        config_to_hf(cfg, tokenizer).save_pretrained(str(path))

        shards: list[dict[str, np.ndarray]] = [{}]
        size = 0
        for name, value in tensors.items():
            if max_shard_bytes and shards[-1] and size + value.nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][name] = value
            size += value.nbytes
        metadata = {"format": "pt"}
        if len(shards) == 1:
            save_file(shards[0], str(path / SINGLE_FILE), metadata=metadata)
        else:
            weight_map = {}
            for i, shard in enumerate(shards, 1):
                file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(path / file), metadata=metadata)
                weight_map.update({name: file for name in shard})
            index = {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())}, "weight_map": weight_map}
            (path / INDEX_FILE).write_text(json.dumps(index, indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))

    main_writes(f"bmrl-hf-{path.name}", write, wait=False)  # the caller meets the others when it needs to
