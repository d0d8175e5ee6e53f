"""Memory planned up front: bytes per device of a configuration, checked before a run starts, and
rematerialisation of decoder layers (one of the options that lower them).

    plan = plan_memory(model_cfg, mesh, optimizer, rollout_batch=256, max_len=1024, update_rows=128)
    print(plan.table())
    plan.check()          # MemoryPlanError (a ConfigError: exit 2) with the numbers and what to change
    plan_for_axes(cfg, model_cfg, {"data": 4, "fsdp": 1, "tensor": 1}, optimizer, lora=None,
                  capacity=(32 * GIB, "tpu-v4-8"))   # a training config on devices this machine lacks

Everything is computed from shapes: `mesh` may be a `jax.sharding.Mesh`, an `AbstractMesh` or axis
sizes `{"data", "fsdp", "tensor"}`, so a v5p-8 is planned on a laptop (`bmrl plan`, `bmrl.plan`); only
`device_capacity` asks the local device, and `plan_for_config` (a run's plan) is `plan_for_axes` with it.

Parameters, gradients and optimizer state are exact: every leaf's shard shape under the partition
rules of `bmrl.parallel` (the optimizer state from `jax.eval_shape(optimizer.init, ...)`). The KV
cache is exact for the layout of `bmrl.parallel.cache_sharding`. Activations of the update are an
estimate from the model's shape (what the backward pass keeps per token and layer, attention scores
included; with `remat` only each layer's input plus one layer's worth), checked against XLA's
compiled buffer sizes in tests/test_memory.py. The update holds at least its optimizer step's copies
(`STEP_COPIES`). Where the matmuls read the parameters in another dtype than they are stored in, both
the rollout and the update hold a converted copy of them (`compute_copy_bytes`), and a rollout of a
model with tied embeddings a copy of the head (`head_copy_bytes`). The peak is params + optimizer state
(+ the KL reference's copy of the params in full fine-tuning) + max(the rollout's KV cache + copies,
the update's max(gradients + activations + compute copy, step copies)): rollout and update alternate.

With LoRA (`bmrl.model.lora`) the parameters are the frozen base (its dtype) plus the float32 adapters;
gradients and optimizer state are the adapters' alone, the KL reference is the base itself (no copy),
and activations add the adapters' rank-sized products; `plan_for_config` also plans full fine-tuning
of the same config and prints the saving.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh

from bmrl.config import ConfigError
from bmrl.machines import GIB

HEADROOM = 0.9  # plan to use at most this fraction of a device (XLA workspace, fragmentation)
# The update's optimizer step holds its new params + optimizer state in XLA's temporaries beside the donated
# inputs (the non-finite and no-signal guard of `bmrl.learn.step.keep_finite` reads all of them before choosing
# new or old), next to the gradients and activations. Measured (XLA:CPU memory_analysis of the compiled update at
# the Qwen2.5-0.5B widths, 2 layers, docs/benchmarks.md "Real shapes on CPU"): temporaries 4.82 / 6.91 / 12.23 x
# the float32 parameter bytes at 2 / 8 / 32 rows; the plan's max(gradients + activations, STEP_COPIES x (params +
# optimizer state)) is within -13% to +24% of those.
STEP_COPIES = 2
# Which backends compute bfloat16 and float16 dots in float32 (so a converted copy of the parameters is float32
# there): XLA:CPU. GPU and TPU read them in the compute dtype.
UPCASTS_NARROW_DOTS = frozenset({"cpu"})


class MemoryPlanError(ConfigError):
    """The configuration cannot fit the device memory (the message holds the plan and the fixes)."""


# ---------------------------------------------------------------- rematerialisation
def _tied_to(x: jax.Array, cotangent: jax.Array) -> jax.Array:
    """`x` plus a zero computed from `cotangent`: the same values (x + 0), but a data dependence on the
    backward pass that no compiler pass removes (NaN/inf in the cotangent poison the gradients anyway)."""
    return x + (cotangent.reshape(-1)[0] * 0).astype(x.dtype)


def recompute_in_backward(f):
    """`f(state, x, *rest) -> y` keeping only its arguments for the backward pass, which recomputes `f`
    from them: `jax.checkpoint`'s saving, with the recomputation made to depend on the cotangent.

    Why not `jax.checkpoint`: it keeps the recomputation apart with an optimization barrier on its
    inputs only, which XLA removes (`cse_barrier_expander`) before its last CSE and scheduling passes;
    the recomputed forward then merges with the original one or is scheduled right after it, and every
    layer's attention scores stay alive until that layer's backward (measured: XLA CPU temp grew by the
    same 2.5 GiB per layer at batch 8 x 1152 tokens with and without remat). Tying the recomputation's
    input to the cotangent of the layer's output means it can only run once the backward reaches it.
    """

    @jax.custom_vjp
    def run(state, x, *rest):
        return f(state, x, *rest)

    def forward(state, x, *rest):
        return f(state, x, *rest), (state, x, rest)

    def backward(saved, cotangent):
        state, x, rest = saved
        _, vjp = jax.vjp(f, state, _tied_to(x, cotangent), *rest)
        return vjp(cotangent)

    run.defvjp(forward, backward)
    return run


class _RematLayer(nnx.Module):
    """A decoder layer whose full forward (no cache) is recomputed in the backward pass."""

    def __init__(self, layer: nnx.Module):
        self.layer = layer

    def __call__(self, x, positions, mask, cache=None, write_index=None):
        if cache is not None:  # decoding keeps nothing for a backward pass
            return self.layer(x, positions, mask, cache, write_index)
        graphdef, state = nnx.split(self.layer)

        def forward(state, x, positions, mask):
            return nnx.merge(graphdef, state)(x, positions, mask)[0]

        return recompute_in_backward(forward)(state, x, positions, mask), None


def remat_layers(model: nnx.Module) -> nnx.Module:
    """Wrap every decoder layer of `model` (in place, e.g. a model merged inside jit) so only its input
    is kept for the backward pass; the same numbers, less activation memory, one more forward."""
    model.layers = nnx.List([layer if isinstance(layer, _RematLayer) else _RematLayer(layer) for layer in model.layers])
    return model


# ---------------------------------------------------------------- the plan
def _device_bytes(abstract: Any, shardings: Any) -> int:
    """Bytes one device holds of `abstract` (arrays or ShapeDtypeStructs) laid out by `shardings`."""
    total = 0
    for leaf, sh in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True):
        shape = sh.shard_shape(tuple(leaf.shape)) if len(leaf.shape) else ()
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def device_capacity(override_gb: float = 0.0) -> tuple[int, str]:
    """(bytes one device may use, where that number came from): `override_gb` when > 0, else the
    device's own `memory_stats()["bytes_limit"]` (GPU, TPU), else host RAM / local devices (CPU)."""
    if override_gb and override_gb > 0:
        return int(override_gb * GIB), "mesh.device_memory_gb"
    device = jax.local_devices()[0]
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory stats
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.platform} memory_stats()"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(jax.local_device_count(), 1), f"host RAM / {jax.local_device_count()} local devices"


def activation_bytes(mcfg: Any, rows: int, seq: int, tensor: int = 1, remat: bool = False) -> int:
    """Estimated bytes of the update's temporaries on one device: `rows` sequences of `seq` tokens.

    What the backward pass keeps per layer (inputs, norms, q/k/v, attention output, MLP; with `remat`
    only the layer's input), plus the larger of the two transients that never overlap: one layer's
    forward and backward (its tensors and one query block's attention scores, `[rows, heads,
    QUERY_BLOCK, seq]`) and one chunk of the log-prob head. A sequence no longer than QUERY_BLOCK is
    attended at once, its scores and probabilities kept (without remat) like any other tensor.
    Per family: Gemma's sandwich norms, Qwen3/Gemma 3's q/k norms and Gemma 2's soft-capped scores and
    logits add their tensors; a sliding window saves nothing here (the full forward masks, it does
    not drop). Checked against XLA's compiled temporaries in tests/test_memory.py, and at the
    Qwen2.5-0.5B shape (XLA CPU) within 1.4x (see `bench/device.py`).
    """
    from bmrl.model.attention import QUERY_BLOCK

    b = jnp.dtype(mcfg.dtype).itemsize
    hidden, inter, heads, kv, hd = (mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_attention_heads,
                                    mcfg.num_key_value_heads, mcfg.head_dim)
    capped_scores = 1 if getattr(mcfg, "attn_logit_softcapping", None) else 0
    block = seq if QUERY_BLOCK <= 0 or seq <= QUERY_BLOCK else QUERY_BLOCK
    qkv_grads = (heads + 2 * kv) * hd * 4 / tensor  # float32 gradients of q, k, v summed over query blocks
    per_token_layer = (
        hidden * b  # residual input
        + 2 * hidden * (b + 4)  # two RMSNorms (computed in float32)
        + 2 * (heads + 2 * kv) * hd * b / tensor  # q, k, v before and after RoPE
        + heads * hd * b / tensor + hidden * b  # attention output, o_proj output
        + 4 * inter * b / tensor + hidden * b  # gate, up, silu (GeGLU: gelu), product; down output
    )
    family = getattr(mcfg, "family", None)
    if family is not None and family.sandwich_norms:  # Gemma: two more RMSNorms per layer
        per_token_layer += 2 * hidden * (b + 4)
    if family is not None and family.qk_norm:  # Qwen3, Gemma 3: q and k normed per head (float32 inside)
        per_token_layer += (heads + kv) * hd * (b + 4) / tensor
    scores_per_query = heads * seq * (4 * (1 + capped_scores) + b) / tensor  # float32 scores (capped), probabilities
    tokens = rows * seq
    layers = mcfg.num_hidden_layers
    live_layer = per_token_layer * tokens + rows * block * (scores_per_query + heads * seq * 8 / tensor)
    if remat:  # XLA (CPU, measured) also keeps about one query block's probabilities per layer
        kept = layers * ((hidden * b + qkv_grads) * tokens + rows * block * heads * seq * b / tensor)
    else:
        kept = layers * (per_token_layer + qkv_grads + (scores_per_query if block == seq else 0)) * tokens
    vocab = mcfg.vocab_size
    chunk = 128 if vocab > 8192 else seq  # bmrl.learn.step chunks the log-probs of large vocabularies
    capped = 1 if getattr(mcfg, "final_logit_softcapping", None) else 0  # Gemma 2: tanh-capped logits too
    head = rows * chunk * vocab * 4 * (3 + capped)  # logits (and their capped copy), log-softmax, its gradient
    return int(kept + max(live_layer, head) + tokens * hidden * 4)  # + the final hidden (float32)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of one configuration, and what the device offers."""

    mesh: dict[str, int]
    params: int
    grads: int
    opt_state: int
    kv_cache: int
    activations: int
    capacity: int
    capacity_source: str
    notes: tuple[str, ...] = ()
    reference: int = 0  # the KL reference's copy of the params (full fine-tuning with train.kl_coef > 0)
    frozen: int = 0  # of `params`, the frozen base's bytes (LoRA; the rest are the adapters)
    step_copies: int = 0  # the optimizer step's copies of the trainable params + optimizer state (STEP_COPIES)
    compute_copy: int = 0  # the params as the matmuls read them, in the rollout and the update (compute_copy_bytes)
    head_copy: int = 0  # a rollout's copy of the tied head (head_copy_bytes)

    @property
    def rollout(self) -> int:
        """The rollout's bytes beside the params: its KV cache and its copies of the weights."""
        return self.kv_cache + self.compute_copy + self.head_copy

    @property
    def update(self) -> int:
        """The update's bytes beside the params and optimizer state it is given: the larger of the
        backward pass's (gradients + activations + the compute copy) and the optimizer step's (`step_copies`)."""
        return max(self.grads + self.activations + self.compute_copy, self.step_copies)

    @property
    def peak(self) -> int:
        """Params (+ the KL reference) + optimizer state + the larger of the rollout (`rollout`) and the
        update (`update`)."""
        return self.params + self.reference + self.opt_state + max(self.rollout, self.update)

    @property
    def usable(self) -> int:
        """Bytes of a device a plan may use: HEADROOM of its capacity (XLA workspace, fragmentation)."""
        return int(HEADROOM * self.capacity)

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable

    def table(self) -> str:
        gib = lambda n: f"{n / GIB:9.3f} GiB"  # noqa: E731
        mesh = " x ".join(f"{k} {v}" for k, v in self.mesh.items())
        rows = [
            f"memory plan per device (mesh {mesh}):",
            f"  parameters        {gib(self.params)}" + (f"  (frozen base {self.frozen / GIB:.3f} + adapters "
                                                        f"{(self.params - self.frozen) / GIB:.3f})" if self.frozen else ""),
            *([f"  KL reference      {gib(self.reference)}  (a copy of the parameters)"] if self.reference else []),
            f"  optimizer state   {gib(self.opt_state)}",
            f"  KV cache (rollout){gib(self.kv_cache)}",
            *([f"  compute copy      {gib(self.compute_copy)}  (the parameters as the matmuls read them; rollout "
               "and update)"] if self.compute_copy else []),
            *([f"  tied head copy    {gib(self.head_copy)}  (rollout)"] if self.head_copy else []),
            f"  gradients         {gib(self.grads)}",
            f"  activations       {gib(self.activations)}  (update, estimated)",
            f"  optimizer step    {gib(self.step_copies)}  ({STEP_COPIES} copies of the trained params + optimizer "
            "state; the update holds the larger of this and gradients + activations)",
            f"  peak              {gib(self.peak)}  of {gib(self.capacity).strip()} ({self.capacity_source}), "
            f"{self.peak / max(self.capacity, 1):.0%}",
        ]
        return "\n".join(rows + [f"  {n}" for n in self.notes])

    def check(self) -> None:
        """Raise `MemoryPlanError` when the peak exceeds HEADROOM x capacity, naming what to change."""
        if self.fits:
            return
        fixes = []
        if self.params + self.opt_state > 0.5 * self.capacity:
            fixes.append("shard parameters and optimizer state over more devices (raise mesh.fsdp)")
        if self.step_copies > self.grads + self.activations and self.step_copies >= self.kv_cache:
            fixes.append("the optimizer step's copies of the parameters and optimizer state set the peak: shard them "
                         "over more devices (raise mesh.fsdp) or train LoRA adapters (model.lora.rank)")
        if self.activations >= self.kv_cache:
            fixes.append("recompute decoder layers (train.remat=true), split minibatches into micro-batches "
                         "(raise train.microbatches) or raise train.minibatches")
        if self.compute_copy >= self.kv_cache and self.compute_copy >= self.grads + self.activations:
            fixes.append("the parameters' compute copy is the largest part: store them in the compute dtype "
                         "(model.param_dtype = model.dtype; with train.f32_master=true for bfloat16) or shard them "
                         "over more devices (raise mesh.fsdp)")
        if self.kv_cache >= self.grads + self.activations:
            fixes.append("shrink the rollout's KV cache: lower train.tasks_per_step x train.group_size, eval.num_tasks "
                         "or rollout.max_len, or spread the batch over more devices (mesh.data / mesh.fsdp)")
        fixes.append("use bfloat16 (model.param_dtype=bfloat16 model.dtype=bfloat16, with train.f32_master=true)")
        fixes.append("or, if the device really has more memory, set mesh.device_memory_gb")
        raise MemoryPlanError(
            "memory", f"this configuration needs {self.peak / GIB:.2f} GiB per device but "
            f"{HEADROOM:.0%} of {self.capacity / GIB:.2f} GiB is available.\n{self.table()}\nTo fit: "
            + "; ".join(fixes) + "."
        )


def abstract_mesh(mesh: Mesh | AbstractMesh | Mapping[str, int]) -> AbstractMesh:
    """`mesh` as an `AbstractMesh` over (data, fsdp, tensor): axis sizes only, no devices."""
    from bmrl.parallel import AXES

    if isinstance(mesh, Mesh):
        return mesh.abstract_mesh
    if isinstance(mesh, AbstractMesh):
        return mesh
    return AbstractMesh(tuple(int(mesh[a]) for a in AXES), AXES)


@functools.lru_cache(maxsize=16)
def _abstract_params(mcfg: Any, lora: Any) -> tuple[Any, Any, Any]:
    """(params, trainable, frozen base or None) of `mcfg` (with `lora`'s adapters), as shapes: built once
    per architecture (`nnx.eval_shape` of a deep decoder takes about a second) and only read after."""
    from bmrl.model import Decoder
    from bmrl.model.lora import add_lora, split_lora

    model = nnx.eval_shape(lambda: Decoder(mcfg, rngs=nnx.Rngs(0)) if lora is None
                           else add_lora(Decoder(mcfg, rngs=nnx.Rngs(0)), lora))
    if lora is None:
        params = nnx.state(model)
        return params, params, None
    _, trainable, base = split_lora(model)
    return nnx.merge_state(trainable, base), trainable, base


def _abstract_opt_state(optimizer: Any, mcfg: Any, lora: Any) -> Any:
    """The optimizer state's shapes for the trainable params of `mcfg` (with `lora`), once per optimizer."""
    try:
        return _cached_opt_state(optimizer, mcfg, lora)
    except TypeError:  # an optimizer that cannot be hashed: computed each time
        return jax.eval_shape(optimizer.init, _abstract_params(mcfg, lora)[1])


@functools.lru_cache(maxsize=16)
def _cached_opt_state(optimizer: Any, mcfg: Any, lora: Any) -> Any:
    return jax.eval_shape(optimizer.init, _abstract_params(mcfg, lora)[1])


def parameter_totals(mcfg: Any, lora: Any = None) -> tuple[int, int]:
    """(parameters, their bytes) of the whole model, adapters included, unsharded (shapes only)."""
    leaves = jax.tree.leaves(_abstract_params(mcfg, _lora_or_none(lora))[0])
    count = sum(math.prod(x.shape) for x in leaves)
    return count, sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)


def kv_cache_bytes(mcfg: Any, mesh: Mesh | AbstractMesh | Mapping[str, int], rows: int, max_len: int) -> int:
    """Bytes one device holds of the KV cache of `rows` x `max_len` tokens, laid out by
    `bmrl.parallel.cache_sharding` (keys and values of every layer, in the compute dtype)."""
    from bmrl.parallel import cache_sharding

    mesh = abstract_mesh(mesh)
    cache = jax.ShapeDtypeStruct((rows, max_len, mcfg.num_key_value_heads, mcfg.head_dim), mcfg.dtype)
    return 2 * mcfg.num_hidden_layers * _device_bytes([cache], [cache_sharding(mesh, mcfg.num_key_value_heads)])


def compute_copy_bytes(params: Any, shardings: Any, compute_dtype: Any, backend: str) -> int:
    """Bytes one device holds of the converted copy of `params` (ShapeDtypeStructs laid out by `shardings`) that
    XLA keeps while the matmuls read them in `compute_dtype`: the casts are loop-invariant in the rollout (hoisted
    out of its while loop) and the backward pass of the update keeps what its forward read. A leaf stored in the
    compute dtype needs no copy, except on a backend that computes narrow dots in float32
    (`UPCASTS_NARROW_DOTS`, XLA:CPU), where every narrow leaf, or one cast to a narrow compute dtype, is held in
    float32. Measured on XLA:CPU at Qwen2.5-0.5B widths (docs/benchmarks.md, "Real shapes on CPU"): the LoRA
    update's temporaries less its gradients and activations are 1.02 / 1.05 / 1.07x the frozen base's float32
    bytes at 2 / 6 / 12 layers, the rollout's the parameters' float32 bytes plus the tied head. GPU and TPU: a
    copy in the compute dtype, assumed (not measured)."""
    compute = jnp.dtype(compute_dtype)
    upcasts = backend in UPCASTS_NARROW_DOTS
    total = 0
    for leaf, sh in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True):
        stored = jnp.dtype(leaf.dtype)
        if not jnp.issubdtype(stored, jnp.floating):
            continue
        narrow = min(stored.itemsize, compute.itemsize) < 4
        if upcasts and narrow:
            held = jnp.dtype(jnp.float32)
        elif stored != compute:
            held = compute
        else:
            continue
        shape = sh.shard_shape(tuple(leaf.shape)) if len(leaf.shape) else ()
        total += math.prod(shape) * held.itemsize
    return total


def head_copy_bytes(mcfg: Any, params: Any, shardings: Any) -> int:
    """Bytes one device holds of a rollout's copy of a tied head (the embedding table read as the output
    projection, in the compute dtype): 0 without tied embeddings. Measured on XLA:CPU: a bfloat16 copy of
    the [vocab, hidden] table in the rollout's temporaries (0.25 GiB at Qwen2.5's 151,936 x 896)."""
    if not mcfg.tie_word_embeddings:
        return 0
    table = (mcfg.vocab_size, mcfg.hidden_size)
    for leaf, sh in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True):
        if tuple(leaf.shape) == table:
            return math.prod(sh.shard_shape(table)) * jnp.dtype(mcfg.dtype).itemsize
    raise ValueError(f"no [vocab, hidden] = {list(table)} embedding among the parameters of a tied model")


def _lora_or_none(lora: Any) -> Any:
    return lora if lora is not None and lora.rank else None


def plan_memory(
    mcfg: Any,
    mesh: Mesh | AbstractMesh | Mapping[str, int],
    optimizer: Any,
    *,
    rollout_batch: int,
    max_len: int,
    update_rows: int,
    microbatches: int = 1,
    remat: bool = False,
    device_memory_gb: float = 0.0,
    kl_reference: bool = False,
    lora: Any = None,
    capacity: tuple[int, str] | None = None,
    backend: str | None = None,
) -> MemoryPlan:
    """The `MemoryPlan` of a decoder `mcfg` (a `ModelConfig`) on `mesh` (a Mesh, an AbstractMesh or
    axis sizes) with `optimizer`: a rollout of `rollout_batch` rows x `max_len` tokens, an update over
    minibatches of `update_rows` rows split into `microbatches`; `kl_reference`: a KL term to the
    starting policy; `lora`: a `bmrl.model.lora.LoRASpec` (rank 0 or None: full fine-tuning);
    `capacity`: (bytes, source) of one device, default `device_capacity(device_memory_gb)`; `backend`:
    "cpu", "gpu" or "tpu", where it runs (default this process's: it sizes the compute copy).
    Allocates nothing and needs no devices (shapes only)."""
    from bmrl.parallel import BATCH_AXES, param_shardings, state_shardings

    mesh = abstract_mesh(mesh)
    lora = _lora_or_none(lora)
    params, trainable, base = _abstract_params(mcfg, lora)
    frozen = 0 if base is None else _device_bytes(base, param_shardings(base, mesh))
    p_sh = param_shardings(params, mesh)
    backend = jax.default_backend() if backend is None else backend
    copy = compute_copy_bytes(params, p_sh, mcfg.dtype, backend)
    head = head_copy_bytes(mcfg, params, p_sh)
    t_sh = param_shardings(trainable, mesh)
    opt = _abstract_opt_state(optimizer, mcfg, lora)
    param_bytes = _device_bytes(params, p_sh)
    grads = _device_bytes(trainable, t_sh)
    opt_bytes = _device_bytes(opt, state_shardings(opt, mesh))
    step_copies = STEP_COPIES * (grads + opt_bytes)  # the trained params' bytes are the gradients' (before any accumulator)
    notes = []
    if microbatches > 1:  # a float32 accumulator next to the micro-batch gradient
        f32 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), trainable)
        grads += _device_bytes(f32, t_sh)
        notes.append(f"gradients accumulated over {microbatches} micro-batches (float32 accumulator)")
    kv = kv_cache_bytes(mcfg, mesh, rollout_batch, max_len)
    ways = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
    rows = math.ceil(update_rows / max(microbatches, 1) / ways)
    acts = activation_bytes(mcfg, rows, max_len, mesh.shape["tensor"], remat)
    if lora is not None:
        acts += lora_activation_bytes(mcfg, lora, rows, max_len, remat)
    if remat:
        notes.append("decoder layers rematerialised in the backward pass")
    capacity, source = capacity if capacity is not None else device_capacity(device_memory_gb)
    reference = param_bytes if kl_reference and lora is None else 0
    return MemoryPlan(dict(mesh.shape), param_bytes, grads, opt_bytes, kv, acts, capacity, source, tuple(notes),
                      reference, frozen, step_copies, copy, head)


def lora_activation_bytes(mcfg: Any, lora: Any, rows: int, seq: int, remat: bool = False) -> int:
    """What the adapters add to the update's kept activations: each adapted projection's rank-sized
    float32 product x A per token and layer (x itself, in the compute dtype, is what full fine-tuning
    keeps for the kernel's gradient too: already in `activation_bytes`)."""
    layers = 1 if remat else mcfg.num_hidden_layers
    return int(4 * lora.rank * len(lora.targets) * layers * rows * seq)


@dataclasses.dataclass(frozen=True)
class RunShapes:
    """The numbers of a training config that size its memory: rows and tokens of the rollout and the update."""

    batch_rows: int  # rows an update trains on: tasks_per_step x group_size
    rollout_rows: int  # rows a training rollout plays: (tasks_per_step + oversample) x group_size
    eval_rows: int  # rows of one evaluation rollout: eval.num_tasks x len(eval.ts)
    max_len: int  # the context buffer (rollout.max_len): every row's length in the rollout and the update
    minibatch_rows: int  # rows of one optimizer step: batch_rows / train.minibatches
    microbatches: int  # train.microbatches (each minibatch's rows split into this many)
    remat: bool  # train.remat
    kl_reference: bool  # train.kl_coef > 0: a KL term to the starting policy
    turn_rows: int = 1  # learner rows per rollout row: 1, or rollout.max_turns when each turn is a sample of its own

    @property
    def learner_rows(self) -> int:
        """Rows the update trains on: the batch's, or one per turn of each (`per_turn_samples`) (minibatches of
        `minibatch_rows` rows still: memory stays that of one minibatch, time grows with the turns)."""
        return self.batch_rows * self.turn_rows

    @classmethod
    def of(cls, cfg: Any) -> RunShapes:
        """The shapes of `cfg` (a `bmrl.config.Config`); ConfigError when train.microbatches does not split
        a minibatch."""
        t = cfg.train
        batch = t.tasks_per_step * t.group_size
        mb = batch // max(t.minibatches, 1)
        if t.microbatches < 1 or mb % t.microbatches:
            raise ConfigError("train.microbatches", f"must be >= 1 and divide the minibatch of {mb} rows "
                              f"(tasks_per_step x group_size / minibatches), got {t.microbatches}.")
        return cls(batch, (t.tasks_per_step + t.oversample) * t.group_size,  # dynamic sampling plays more
                   cfg.eval.num_tasks * len(cfg.eval.ts), cfg.rollout.max_len, mb, t.microbatches, t.remat,
                   t.kl_coef > 0, cfg.rollout.max_turns if per_turn_samples(cfg) else 1)

    @property
    def kv_rows(self) -> int:
        """Rows of the largest rollout, training or evaluation: the KV cache the plan holds."""
        return max(self.rollout_rows, self.eval_rows)


def per_turn_samples(cfg: Any) -> bool:
    """Does `cfg` (a `bmrl.config.Config`) train each turn as its own sample: a history window, or earlier replies
    as the chat template renders them (`format.history: template`, which a run refuses where the template rewrites
    nothing)? The config's side of `bmrl.rollout.types.per_turn_contexts`."""
    return cfg.rollout.history_turns is not None or cfg.format.history == "template"


def plan_for_axes(cfg: Any, mcfg: Any, mesh: Mesh | AbstractMesh | Mapping[str, int], optimizer: Any, *, lora: Any,
                  capacity: tuple[int, str], backend: str | None = None) -> MemoryPlan:
    """The plan of a training run from shapes alone (no devices): `cfg` a `bmrl.config.Config`, `mcfg` its
    policy's ModelConfig, `mesh` the axis sizes it runs on, `optimizer` its optimizer, `lora` its
    `LoRASpec` (`bmrl.assembly.lora_spec`; None or rank 0: full fine-tuning), `capacity` (bytes, source)
    of one device, `backend` the kind of device ("cpu", "gpu", "tpu"; default this process's). With LoRA,
    also plans full fine-tuning of the same config and notes the saving."""
    shapes = RunShapes.of(cfg)
    spec = _lora_or_none(lora)

    def plan(spec):
        return plan_memory(mcfg, mesh, optimizer, rollout_batch=shapes.kv_rows, max_len=shapes.max_len,
                           update_rows=shapes.minibatch_rows, microbatches=shapes.microbatches, remat=shapes.remat,
                           kl_reference=shapes.kl_reference, lora=spec, capacity=capacity, backend=backend)

    out = plan(spec)
    if spec is None:
        return out
    full = plan(None)
    adapters = (out.params - out.frozen) / max(out.frozen, 1)
    saving = (
        f"LoRA rank {spec.rank} on {len(spec.targets)} projections: adapters {adapters:.2%} of the base's bytes; "
        f"full fine-tuning of this config needs {full.peak / GIB:.3f} GiB (params {full.params / GIB:.3f}, "
        f"optimizer {full.opt_state / GIB:.3f}, gradients {full.grads / GIB:.3f}"
        + (f", KL reference {full.reference / GIB:.3f}" if full.reference else "")
        + f"): LoRA saves {(full.peak - out.peak) / GIB:.3f} GiB ({1 - out.peak / max(full.peak, 1):.0%})"
    )
    return dataclasses.replace(out, notes=out.notes + (saving,))


def plan_for_config(cfg: Any, mcfg: Any, mesh: Mesh, optimizer: Any, *, lora: Any) -> MemoryPlan:
    """The plan of a training run on `mesh` (`cfg`: a `bmrl.config.Config`; `mcfg` its policy's ModelConfig;
    `lora` the run's `LoRASpec`, None or rank 0 without adapters): `plan_for_axes` with this mesh's axis
    sizes and the capacity of the local device (`device_capacity`, or `mesh.device_memory_gb`)."""
    return plan_for_axes(cfg, mcfg, dict(mesh.shape), optimizer, lora=lora,
                         capacity=device_capacity(cfg.mesh.device_memory_gb))


__all__ = ["GIB", "HEADROOM", "STEP_COPIES", "MemoryPlan", "MemoryPlanError", "RunShapes", "abstract_mesh", "activation_bytes",
           "compute_copy_bytes", "device_capacity", "head_copy_bytes", "kv_cache_bytes", "lora_activation_bytes", "parameter_totals", "plan_for_axes",
           "per_turn_samples", "plan_for_config", "plan_memory", "remat_layers"]
