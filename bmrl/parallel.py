"""One mesh for everything: named axes (data, fsdp, tensor), partition rules by parameter name.

The same code runs on 1 CPU, 8 simulated CPU devices, a GPU or a TPU slice: parameters are placed
with `NamedSharding`s chosen by regex over their path (`layers/0/self_attn/q_proj/kernel`), the batch
is split along (data, fsdp), and jit propagates those shardings through the rollout and the update.
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
DEFAULT_RULES: tuple[tuple[str, P], ...] = (
    (r"embed_tokens/embedding$", P("tensor", "fsdp")),
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/kernel$", P("fsdp", "tensor")),
    (r"(o_proj|down_proj)/kernel$", P("tensor", "fsdp")),
    (r"(q_proj|k_proj|v_proj)/bias$", P("tensor")),
    (r"lm_head/kernel$", P("fsdp", "tensor")),
    (r".*", P()),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Axis sizes; one of them may be -1 to take all remaining devices."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes (data, fsdp, tensor) over `devices` (default: all devices)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"At most one mesh axis may be -1, got data={cfg.data}, fsdp={cfg.fsdp}, tensor={cfg.tensor}.")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"Mesh axis sizes must be >= 1 (or -1 for the rest), got {sizes}.")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices cannot be split into axes {dict(zip(AXES, sizes))}.")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"Mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices but {len(devices)} are "
            "available; make the product of the axis sizes equal the device count (or use -1)."
        )
    return Mesh(np.asarray(devices).reshape(sizes), AXES)


def _path_str(path: tuple[Any, ...]) -> str:
    """'layers/0/self_attn/q_proj/kernel' from a pytree path (nnx State leaves end in `.value`)."""
    parts = [str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path]
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def spec_for(path: str, shape: tuple[int, ...], mesh: Mesh, rules=DEFAULT_RULES) -> P:
    """The PartitionSpec of the first matching rule, dropping axes that do not divide the dim."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            break
    else:
        return P()
    if len(spec) > len(shape):
        return P()
    fixed = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        size = 1 if axis is None else math.prod(mesh.shape[a] for a in ((axis,) if isinstance(axis, str) else axis))
        fixed.append(axis if axis is not None and dim % size == 0 else None)
    return P(*fixed)


def param_shardings(state: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """A pytree of NamedShardings matching `state` (e.g. the state half of `nnx.split`)."""

    def one(path, leaf):
        return NamedSharding(mesh, spec_for(_path_str(path), np.shape(leaf), mesh, rules))

    return jax.tree_util.tree_map_with_path(one, state)


def shard_params(state: Any, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """Place parameters on `mesh` by the partition rules."""
    return jax.device_put(state, param_shardings(state, mesh, rules))


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
