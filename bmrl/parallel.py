"""One mesh for everything: named axes (data, fsdp, tensor), partition rules by parameter name.

The same code runs on 1 CPU, 8 simulated CPU devices, a GPU or a TPU slice: parameters are placed
with `NamedSharding`s chosen by regex over their path (`layers/0/self_attn/q_proj/kernel`), the batch
is split along (data, fsdp), the KV cache along (data, fsdp) x kv heads over tensor.

Every parameter must match a rule (there is no catch-all): a new kind of parameter fails loudly in
`param_shardings` instead of falling through to an unintended layout. The optimizer state follows
the parameters by path (`mu/layers/0/.../kernel` matches the kernel's rule), scalars are replicated.
Jitted programs pin these layouts on their boundaries (`in_shardings`/`out_shardings`, or
`constrain_*` inside), so state keeps its layout across steps and nothing recompiles.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# (path regex, spec) pairs; the first match wins. Kernels are [in, out] (flax Linear layout).
# No catch-all: a parameter no rule names is an error (see `param_shardings`).
DEFAULT_RULES: tuple[tuple[str, P], ...] = (
    (r"embed_tokens/embedding$", P("tensor", "fsdp")),  # [vocab, hidden]; also the tied lm head
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/kernel$", P("fsdp", "tensor")),
    (r"(o_proj|down_proj)/kernel$", P("tensor", "fsdp")),
    (r"(q_proj|k_proj|v_proj)/bias$", P("tensor")),  # follows the kernel's output axis
    (r"(o_proj|down_proj|gate_proj|up_proj)/bias$", P()),  # [hidden]-sized: replicated
    (r"lm_head/kernel$", P("fsdp", "tensor")),  # untied head [hidden, vocab]
    # LoRA adapters (bmrl.model.lora): A [in, rank] splits like its kernel's input axis, B [rank, out] like
    # its output axis, the rank axis replicated: x A B comes out laid out as x kernel does.
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/lora_a$", P("fsdp")),
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/lora_b$", P(None, "tensor")),
    (r"(o_proj|down_proj)/lora_a$", P("tensor")),
    (r"(o_proj|down_proj)/lora_b$", P(None, "fsdp")),
    # RMSNorm scales (Gemma's sandwich norms, Qwen3/Gemma 3's per-head q/k norms): replicated
    (r"(^|/)(input_layernorm|post_attention_layernorm|pre_feedforward_layernorm|post_feedforward_layernorm|norm"
     r"|q_norm|k_norm)/weight$", P()),
)


class ShardingRuleError(ValueError):
    """A parameter that no partition rule names (it would silently get some default layout)."""


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Axis sizes; one of them may be -1 to take all remaining devices."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1


def mesh_shape(cfg: Any, devices: int) -> dict[str, int]:
    """The axis sizes {data, fsdp, tensor} of `cfg` (a `MeshConfig` or the config's `mesh` section) on `devices`
    devices, the -1 axis taking the rest; ValueError naming the problem when they cannot form them."""
    sizes = [int(cfg.data), int(cfg.fsdp), int(cfg.tensor)]
    if sizes.count(-1) > 1:
        raise ValueError(f"At most one mesh axis may be -1, got data={cfg.data}, fsdp={cfg.fsdp}, tensor={cfg.tensor}.")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"Mesh axis sizes must be >= 1 (or -1 for the rest), got {sizes}.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if devices % known:
            raise ValueError(f"{devices} devices cannot be split into axes {dict(zip(AXES, sizes))}.")
        sizes[sizes.index(-1)] = devices // known
    if math.prod(sizes) != devices:
        raise ValueError(
            f"Mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices but {devices} are "
            "available; make the product of the axis sizes equal the device count (or use -1)."
        )
    return dict(zip(AXES, sizes))


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes (data, fsdp, tensor) over `devices` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_shape(cfg, len(devices))
    return Mesh(np.asarray(devices).reshape(list(sizes.values())), AXES)


def _shape(leaf: Any) -> tuple[int, ...]:
    """The shape of an array or a `jax.ShapeDtypeStruct` (abstract state, e.g. from `nnx.eval_shape`)."""
    return tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)


def _path_str(path: tuple[Any, ...]) -> str:
    """'layers/0/self_attn/q_proj/kernel' from a pytree path (nnx State leaves end in `.value`)."""
    parts = [str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path]
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def matching_rule(path: str, rules=DEFAULT_RULES) -> tuple[str, P] | None:
    """The first `(pattern, spec)` of `rules` whose pattern is found in `path`, or None."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            return pattern, spec
    return None


def fit_spec(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    """`spec` for an array of `shape`: axes that do not divide their dim dropped, trailing Nones
    dropped (so an unsharded array is always `P()`, one canonical layout)."""
    if len(spec) > len(shape):
        return P()
    fixed = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        size = 1 if axis is None else math.prod(mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis))
        fixed.append(axis if axis is not None and dim % size == 0 else None)
    while fixed and fixed[-1] is None:
        fixed.pop()
    return P(*fixed)


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, rules=DEFAULT_RULES) -> P:
    """The PartitionSpec of the first matching rule, dropping axes that do not divide the dim.

    Raises `ShardingRuleError` when no rule matches (add one to the rules)."""
    found = matching_rule(path, rules)
    if found is None:
        raise ShardingRuleError(
            f"no partition rule matches parameter {path!r} (shape {tuple(shape)}); add a (regex, PartitionSpec) "
            "pair for it to bmrl.parallel.DEFAULT_RULES (P() to replicate it)."
        )
    return fit_spec(found[1], shape, mesh)


def param_shardings(state: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """A pytree of NamedShardings matching `state` (e.g. the state half of `nnx.split`).

    Every leaf must match a rule; all unmatched paths are named in one `ShardingRuleError`."""
    missing = []

    def one(path, leaf):
        name = _path_str(path)
        if matching_rule(name, rules) is None:
            missing.append(name)
            return None
        return NamedSharding(mesh, spec_for(name, _shape(leaf), mesh, rules))

    out = jax.tree_util.tree_map_with_path(one, state)
    if missing:
        raise ShardingRuleError(
            f"no partition rule matches {len(missing)} parameter(s): {', '.join(missing[:8])}"
            f"{' ...' if len(missing) > 8 else ''}; add (regex, PartitionSpec) pairs for them to "
            "bmrl.parallel.DEFAULT_RULES (P() to replicate)."
        )
    return out


def state_shardings(tree: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """NamedShardings for a training-state pytree (optimizer state, a float32 master copy): leaves
    whose path ends in a parameter's path take that parameter's layout, scalars are replicated."""
    rep = NamedSharding(mesh, P())

    def one(path, leaf):
        if len(_shape(leaf)) == 0:
            return rep
        return NamedSharding(mesh, spec_for(_path_str(path), _shape(leaf), mesh, rules))

    return jax.tree_util.tree_map_with_path(one, tree)


def shard_params(state: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """Place parameters on `mesh` by the partition rules."""
    return jax.device_put(state, param_shardings(state, mesh, rules))


def shard_state(tree: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """Place a training-state pytree (optimizer state) on `mesh` by `state_shardings`."""
    return jax.device_put(tree, state_shardings(tree, mesh, rules))


def shard_model(model: nnx.Module, mesh: Mesh, rules=DEFAULT_RULES) -> nnx.Module:
    """The same module with its parameters placed on `mesh`."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, shard_params(state, mesh, rules))


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """Leading (batch) axis split over (data, fsdp); the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def shard_batch(tree: Any, mesh: Mesh) -> Any:
    """Place every leaf of `tree` with its leading axis split over (data, fsdp)."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, np.ndim(x))), tree)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (scalars, keys, metrics)."""
    return NamedSharding(mesh, P())


def constrain_batch(tree: Any, mesh: Mesh) -> Any:
    """Inside jit: pin every leaf's leading (batch) axis to (data, fsdp), the rest replicated."""
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, np.ndim(x))), tree)


def cache_sharding(mesh: Mesh, kv_heads: int) -> NamedSharding:
    """The KV cache layout, per layer keys/values [batch, max_len, kv_heads, head_dim]: batch over
    (data, fsdp), kv heads over tensor (when it divides them; else replicated along tensor)."""
    heads = "tensor" if kv_heads % mesh.shape["tensor"] == 0 and mesh.shape["tensor"] > 1 else None
    return NamedSharding(mesh, P(BATCH_AXES, None, heads) if heads else P(BATCH_AXES))


def constrain_cache(cache: Any, mesh: Mesh) -> Any:
    """Inside jit: pin a KV cache (per layer (keys, values), each [batch, max_len, kv_heads, head_dim])
    to `cache_sharding`, so the decode loop carries one layout from prefill to the last token."""

    def one(x):
        return jax.lax.with_sharding_constraint(x, cache_sharding(mesh, x.shape[2]))

    return jax.tree.map(one, cache)
