"""LoRA: low-rank adapters on a frozen base (Hu et al. 2021), with PEFT's conventions.

    model = add_lora(model, rank=16, alpha=16, targets=TARGETS, seed=0)
    graphdef, adapters, base = nnx.split(model, LoRAParam, ...)   # the trainable half, the frozen half
    plain = merge_lora(model)                                      # a plain Decoder (export, merged rollout)

A target projection `kernel: [in, out]` computes y = x kernel (+ bias) + (alpha / rank) * (x A) B with
`lora_a` A: [in, rank] drawn uniform(+-1/sqrt(in)) (PEFT's kaiming-uniform default) and `lora_b`
B: [rank, out] zero, so the starting policy is the base exactly: the adapter term is an exact zero
added to the base's output. Adapters are float32 `LoRAParam`s, not `nnx.Param`s: the base's filters
(`nnx.state(model, nnx.Param)`, export, parameter counts) see only the base, which keeps its stored
dtype. Paths keep HF names (`.../q_proj/kernel` beside `.../q_proj/lora_a`), so partition rules
and PEFT tensor names follow by name.

Dropout on the adapter's input (PEFT's `lora_dropout`) is applied only inside `lora_dropout(key)`
(the learner's loss); rollout, evaluation and the KL reference never drop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl.model.decoder import Decoder

# The projections LoRA may adapt, by their HF names (the same in every family).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE_OF = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
              "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


class LoRAParam(nnx.Variable):
    """An adapter matrix (float32, trainable); deliberately not an `nnx.Param` (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class LoRASpec:
    """rank (0 = off), alpha (scale alpha / rank), targets (HF projection names), dropout (on the input)."""

    rank: int = 0
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS
    dropout: float = 0.0

    def __post_init__(self):
        unknown = [t for t in self.targets if t not in TARGETS]
        if self.rank < 0 or self.alpha <= 0 or not 0.0 <= self.dropout < 1.0 or unknown or not self.targets:
            raise ValueError(f"invalid LoRA spec {self} (rank >= 0, alpha > 0, 0 <= dropout < 1, targets a "
                             f"non-empty subset of {', '.join(TARGETS)}).")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def of(cls, section: Any) -> LoRASpec:
        """The spec of a `model.lora` config section (anything with rank, alpha, targets, dropout)."""
        return cls(int(section.rank), float(section.alpha), tuple(section.targets), float(section.dropout))


_dropout: list = []  # the stack of (key, counter) set by `lora_dropout` while a loss is traced


@contextlib.contextmanager
def lora_dropout(key: jax.Array | None) -> Iterator[None]:
    """Adapters drop their input (rate `LoRASpec.dropout`) for calls made inside this block, each
    adapted projection with its own key folded from `key`; `None` (or rate 0) drops nothing."""
    _dropout.append([key, 0])
    try:
        yield
    finally:
        _dropout.pop()


class LoRALinear(nnx.Linear):
    """An `nnx.Linear` (its own kernel and bias, untouched) plus the adapter term (module docstring)."""

    def __init__(self, base: nnx.Linear, spec: LoRASpec, key: jax.Array | None, arrays: tuple | None = None):
        # Adopt the base's variables and settings as they are (no new kernel is allocated).
        for name in ("kernel", "in_features", "out_features", "use_bias", "dtype", "param_dtype", "precision",
                     "dot_general", "promote_dtype", "preferred_element_type"):
            setattr(self, name, getattr(base, name))
        self.bias = base.bias if base.bias is not None else nnx.data(None)
        lora_a, lora_b = _lora_init(key, base.in_features, base.out_features, spec.rank) if arrays is None else arrays
        self.lora_a = LoRAParam(lora_a)
        self.lora_b = LoRAParam(lora_b)
        self.scale = spec.scale
        self.dropout = spec.dropout

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        """The base's output plus scale * (x A) B, added in float32 and rounded once. x A runs in the
        compute dtype with a float32 result (the backward pass keeps x as the base's own matmul
        would, not a float32 copy); the rank-sized x A and B stay float32."""
        y = super().__call__(inputs, out_sharding)
        h = inputs.astype(self.dtype) if self.dtype is not None else inputs
        if self.dropout and _dropout and _dropout[-1][0] is not None:
            frame = _dropout[-1]
            keep = jax.random.bernoulli(jax.random.fold_in(frame[0], frame[1]), 1.0 - self.dropout, h.shape)
            frame[1] += 1
            h = jnp.where(keep, h / jnp.asarray(1.0 - self.dropout, h.dtype), jnp.zeros((), h.dtype))
        xa = jnp.matmul(h, self.lora_a[...].astype(h.dtype), preferred_element_type=jnp.float32)
        delta = (xa @ self.lora_b[...]) * self.scale
        return (y.astype(jnp.float32) + delta).astype(y.dtype)

    def merged_kernel(self) -> jax.Array:
        """kernel + scale * A B in float32, rounded once to the kernel's dtype."""
        kernel = self.kernel[...]
        delta = self.lora_a[...] @ self.lora_b[...] * self.scale
        return (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)


def targets_of(model: Decoder) -> Iterator[tuple[int, str, nnx.Module, str]]:
    """(layer index, HF projection name, its parent module, attribute) for every projection."""
    for i, layer in enumerate(model.layers):
        for name, parent in _MODULE_OF.items():
            yield i, name, getattr(layer, parent), name


def add_lora(model: Decoder, spec: LoRASpec, seed: int = 0) -> Decoder:
    """`model` with adapters on `spec.targets` of every layer (in place; returned). Rank 0: unchanged.
    A matrices are drawn from `fold_in(key(seed), projection index)`, so the same seed gives the same adapters."""
    if spec.rank == 0:
        return model
    if has_lora(model):
        raise ValueError("the model already has LoRA adapters.")
    found = [(n, parent, attr) for n, (_, name, parent, attr) in enumerate(targets_of(model)) if name in spec.targets]
    shapes = tuple((n, getattr(parent, attr).in_features, getattr(parent, attr).out_features) for n, parent, attr in found)
    arrays = _adapter_arrays(jax.random.key(seed), shapes, spec.rank)
    for (n, parent, attr), pair in zip(found, arrays, strict=True):
        setattr(parent, attr, LoRALinear(getattr(parent, attr), spec, None, pair))
    return model


def _lora_init(key: jax.Array, d_in: int, d_out: int, rank: int) -> tuple[jax.Array, jax.Array]:
    """(A, B) of one adapter: A uniform in +-1/sqrt(d_in) (drawn from `key`), B zero."""
    bound = 1.0 / d_in**0.5
    return (jax.random.uniform(key, (d_in, rank), jnp.float32, -bound, bound),
            jnp.zeros((rank, d_out), jnp.float32))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _adapter_arrays(key: jax.Array, shapes: tuple, rank: int) -> list:
    """Every adapter's (A, B) in one program (eager, each draw and zeros was a one-op program of its own): adapter
    n of `shapes` ((n, d_in, d_out) each) from `fold_in(key, n)`. Each draw is fenced (optimization_barrier) so
    XLA fuses nothing into it: the values are the eager draws' bit for bit."""
    out = []
    for n, d_in, d_out in shapes:
        a, b = _lora_init(jax.random.fold_in(key, n), d_in, d_out, rank)
        out.append((jax.lax.optimization_barrier(a), b))
    return out


def adapters(model: Decoder) -> Iterator[tuple[int, str, LoRALinear]]:
    """(layer index, HF projection name, module) of every adapted projection, in layer order."""
    for i, name, parent, attr in targets_of(model):
        module = getattr(parent, attr)
        if isinstance(module, LoRALinear):
            yield i, name, module


def has_lora(model: Any) -> bool:
    return isinstance(model, Decoder) and any(True for _ in adapters(model))


def spec_of(model: Decoder, dropout: float = 0.0) -> LoRASpec | None:
    """The spec a LoRA model was built with (None without adapters); the dropout is not kept in the
    graph's shape, so it is passed back in."""
    found = list(adapters(model))
    if not found:
        return None
    rank = found[0][2].lora_a.shape[1]
    return LoRASpec(rank, found[0][2].scale * rank, tuple(dict.fromkeys(n for _, n, _ in found)), dropout)


def split_lora(model: Decoder) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graphdef, adapters, base): the trainable and the frozen halves; `nnx.merge(graphdef, adapters, base)`."""
    return nnx.split(model, LoRAParam, ...)


def merge_lora(model: Decoder) -> Decoder:
    """A plain `Decoder` (no adapters) whose target kernels are the merged kernel + scale * A B, the
    rest shared with `model`; `model` itself when it has no adapters. Works eagerly and under jit."""
    if not has_lora(model):
        return model
    return _plain(model, {(*("layers", i, _MODULE_OF[name], name), "kernel"): m.merged_kernel()
                          for i, name, m in adapters(model)})


def base_model(model: Decoder) -> Decoder:
    """A plain `Decoder` on the base's own arrays (adapters dropped, nothing copied)."""
    return _plain(model, {})


def _plain(model: Decoder, replaced: dict) -> Decoder:
    """A plain `Decoder` of `model`'s config on its base arrays, those at the paths of `replaced` replaced."""
    values = {path: replaced.get(path, var[...]) for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Decoder(model.config, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, nnx.from_flat_state(values))


def content_hash(state: Any) -> str:
    """sha256 over a state's arrays (path, dtype, shape, bytes) in path order: the base's identity."""
    h = hashlib.sha256()
    for path, var in sorted(nnx.to_flat_state(state), key=lambda kv: tuple(map(str, kv[0]))):
        value = np.asarray(jax.device_get(var[...]))
        h.update(f"{'/'.join(map(str, path))}:{value.dtype}:{value.shape};".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()
