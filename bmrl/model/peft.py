"""LoRA adapters as PEFT directories: adapter_config.json + adapter_model.safetensors, beside their base.

    save_adapter(model, "out/policy_adapter", base="out/base")   # `peft.PeftModel.from_pretrained` loads it
    model, tokenizer = from_adapter_dir("out/policy_adapter")    # the base it names + these adapters

Tensor names are PEFT's (`base_model.model.<layer>.self_attn.q_proj.lora_A.weight`, [rank, in]; `lora_B`
[out, rank]) and the config is a plain LoRA one (no bias, no rsLoRA/DoRA, no per-module ranks), so a
PEFT model on the base computes what the bmrl model does. `base_model_name_or_path` names the base
directory: relative to the adapter directory when it lies beside it (a run's `base/`), else absolute.
An adapter directory is untrusted input like a model directory (`bmrl.model.hf_dir`): files resolved
inside it, unsupported PEFT options refused by name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from bmrl.model.decoder import Decoder
from bmrl.model.hf import from_pretrained
from bmrl.model.hf_dir import CheckpointError, check_directory, inside, open_safetensors, read_json
from bmrl.model.lora import TARGETS, LoRASpec, add_lora, adapters, spec_of

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# PEFT options a plain LoRA leaves at these values; anything else changes what the adapter computes.
_PLAIN = {"bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None,
          "layers_to_transform": None, "layer_replication": None, "exclude_modules": None, "rank_pattern": {},
          "alpha_pattern": {}, "lora_bias": False}
_UNSET = (None, {}, [])


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """True when `path` is a directory holding a PEFT adapter_config.json."""
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def _name(model: Decoder, layer: int, proj: str, which: str) -> str:
    prefix = model.config.family.tensor_names.layer.format(i=layer)
    return f"base_model.model.{prefix}.{_MODULE[proj]}.{proj}.lora_{which}.weight"


def save_adapter(model: Decoder, path: str | os.PathLike, base: str | os.PathLike) -> Path:
    """Write the adapters of `model` (a LoRA model) as a PEFT adapter directory naming `base` (the base
    model's Hugging Face directory). Returns the directory. On a multi-process run every process calls
    it (adapters split across processes are gathered) and process 0 alone writes
    (`bmrl.distributed.main_writes`)."""
    from bmrl.distributed import main_writes, to_host

    spec = spec_of(model)
    if spec is None:
        raise ValueError("save_adapter: the model has no LoRA adapters.")
    path, base = Path(path), Path(base)
    tensors = {}
    for i, proj, m in adapters(model):
        tensors[_name(model, i, proj, "A")] = np.ascontiguousarray(np.asarray(to_host(m.lora_a[...]), np.float32).T)
        tensors[_name(model, i, proj, "B")] = np.ascontiguousarray(np.asarray(to_host(m.lora_b[...]), np.float32).T)
    beside = base.resolve().parent == path.resolve().parent
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
        "target_modules": list(spec.targets), "lora_dropout": spec.dropout, "inference_mode": True,
        "init_lora_weights": True, "base_model_name_or_path": os.path.join("..", base.name) if beside
        else str(base.resolve()), **_PLAIN,
    }

    def write() -> None:
        path.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (path / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))

    main_writes(f"bmrl-adapter-{path.name}", write, wait=False)  # as `save_pretrained`: no meeting here
    return path


def adapter_config(path: str | os.PathLike) -> tuple[LoRASpec, Path]:
    """(spec, base directory) of the PEFT adapter directory `path`; `CheckpointError` naming the file
    and the option for anything bmrl does not compute the way PEFT would."""
    path = Path(path)
    check_directory(path)
    file = path / ADAPTER_CONFIG
    raw = read_json(file, "a PEFT LoRA adapter config")
    if raw.get("peft_type") != "LORA":
        raise CheckpointError(f"{file}: peft_type {raw.get('peft_type')!r} is not supported; bmrl loads LORA adapters.")
    for key, plain in _PLAIN.items():
        value = raw.get(key, plain)
        if value != plain and not (value in _UNSET and plain in _UNSET):
            raise CheckpointError(f"{file}: {key}={raw[key]!r} is not supported; bmrl loads plain LoRA ({key}={plain!r}).")
    targets = raw.get("target_modules")
    if not isinstance(targets, list) or not targets or any(t not in TARGETS for t in targets):
        raise CheckpointError(f"{file}: target_modules={targets!r} must be a list of projections among "
                              f"{', '.join(TARGETS)}.")
    try:
        spec = LoRASpec(int(raw["r"]), float(raw["lora_alpha"]), tuple(targets), float(raw.get("lora_dropout", 0.0)))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{file}: r / lora_alpha / lora_dropout are missing or invalid ({err}).") from None
    if spec.rank == 0:
        raise CheckpointError(f"{file}: r must be >= 1.")
    name = raw.get("base_model_name_or_path")
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{file} names no base_model_name_or_path; set it to the base model's local directory.")
    base = Path(name) if os.path.isabs(name) else (path / name)
    if not (base / "config.json").is_file():
        raise CheckpointError(f"{file}: the base model {name!r} (resolved to {str(base)!r}) is not a local Hugging "
                              "Face directory; set base_model_name_or_path to the directory the adapters were trained on.")
    return spec, base


def load_adapter(model: Decoder, path: str | os.PathLike) -> Decoder:
    """`model` (the base, without adapters) with the adapters of directory `path` (returned; in place)."""
    path = Path(path)
    spec, _ = adapter_config(path)
    add_lora(model, spec)
    file = inside(path, ADAPTER_WEIGHTS, str(path))
    if not file.is_file():
        raise CheckpointError(f"{str(path)!r} has no {ADAPTER_WEIGHTS}.")
    found = list(adapters(model))
    with open_safetensors(file) as f:
        names = set(f.keys())
        want = {_name(model, i, p, w) for i, p, _ in found for w in "AB"}
        if want - names:
            missing = sorted(want - names)
            raise CheckpointError(f"{file} lacks {len(missing)} adapter tensors ({', '.join(missing[:3])} ...): "
                                  "it does not belong to this base model.")
        for i, proj, m in found:
            for which, var in (("A", m.lora_a), ("B", m.lora_b)):
                value = np.asarray(f.get_tensor(_name(model, i, proj, which)), np.float32).T
                if value.shape != var.shape:
                    raise CheckpointError(f"{file}: {_name(model, i, proj, which)} has shape {value.T.shape}, "
                                          f"expected {tuple(reversed(var.shape))} for this base model.")
                var.set_value(jnp.asarray(value))
    return model


def from_adapter_dir(path: str | os.PathLike, **load: Any) -> tuple[Decoder, Any]:
    """(model, tokenizer): the base the adapter directory names (`from_pretrained(base, **load)`) with
    its adapters; the tokenizer is the adapter directory's when it holds one, else the base's."""
    _, base = adapter_config(path)
    model, tokenizer = from_pretrained(base, **load)
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        from bmrl.model.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(path)
    return load_adapter(model, path), tokenizer


def export_policy(model: Decoder, tokenizer: Any, out_dir: str | os.PathLike, base_dir: str | None) -> dict[str, str]:
    """A run's policy: `policy/` (a Hugging Face directory, merged when `model` has adapters) and, with
    LoRA, `policy_adapter/` beside it, a PEFT adapter on `base_dir` (the base model's directory; None: a
    base built from scratch, written to `base/` here). Returns {kind: directory} of what was written."""
    from bmrl.model.hf import save_pretrained
    from bmrl.model.lora import base_model

    out = Path(out_dir)
    save_pretrained(model, tokenizer, out / "policy")
    written = {"policy": str(out / "policy")}
    if spec_of(model) is None:
        return written
    if base_dir is None:
        save_pretrained(base_model(model), tokenizer, out / "base")
        base_dir = str(out / "base")
        written["base"] = base_dir
    written["policy_adapter"] = str(save_adapter(model, out / "policy_adapter", base_dir))
    return written


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "adapter_config", "export_policy", "from_adapter_dir",
           "is_adapter_dir", "load_adapter", "save_adapter"]
