"""A plan for named hardware: memory per device and time per RL step of a training config, from shapes alone.

    hardware = HARDWARE.lookup("tpu-v4-8")        # unknown names: UnknownName listing the known ones
    p = plan(cfg, hardware, mfu=0.3, bandwidth_share=0.15)
    print(p.table())                               # memory by part, fits or not, seconds per step, assumptions
    p.fits, p.memory.peak, p.time.step_s, p.fixes  # the fixes name a knob and its smallest value that fits

Memory is `bmrl.memory`'s plan (`plan_for_axes`: the same arithmetic `bmrl train` checks before a run),
on the hardware's memory instead of the local device's. Nothing runs on a device: a v5p-8 is planned on
a laptop. Time is a roofline with every assumption in the result:

    rollout decode   steps x max(bytes read / (HBM bandwidth x bandwidth_share), FLOPs / (peak x mfu)),
                     bytes read per device and step = the weights (1/tensor of them) + kv_fill x its KV cache
    rollout prefill  rows x prefilled tokens x (2 P + 4 layers x kv_fill L x q width) / (devices x peak x mfu)
    learner          epochs x rows x L x k x (2 P + 4 layers x L x q width) / (devices x peak x mfu),
                     k = 3 (forward + backward; 2 with LoRA: no weight gradients of the frozen base)
                     + 1 with train.remat (a second forward) + 1 with a KL reference (its forward)

P counts the parameters that multiply (an untied input embedding is a lookup); L is rollout.max_len, the
buffer every row is padded to. The rollout plays every row to its largest cap and reply limit (the loop
stops earlier when all rows have stopped: an upper bound) and prefills the rest of the buffer; with a history
window every turn re-prefills its window, and with the chat template's history (`format.history: template`) what
each reply keeps is prefilled once more (the buffer at most). Where each turn is its own sample, the learner's rows
are rows x max_turns.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from bmrl import memory as memory_lib
from bmrl.config import ConfigError
from bmrl.machines import EXPLAINED, GB, GIB, HARDWARE, Assumptions, Hardware
from bmrl.memory import HEADROOM, STEP_COPIES, MemoryPlan, RunShapes


def size(n: float, capacity: float, width: int = 0) -> str:
    """`n` bytes in GiB, or in MiB on a device under 1 GiB (`capacity`: a tiny model's test), right-aligned."""
    return f"{n / GIB:{width}.2f} GiB" if capacity >= GIB else f"{n / 2**20:{width}.1f} MiB"


def _wrap(line: str, width: int = 116) -> str:
    """`line` broken at `width` columns, the continuation indented past its label."""
    import textwrap

    if len(line) <= width:
        return line.rstrip()
    indent = len(line) - len(line.lstrip()) + 2
    return "\n".join(textwrap.wrap(line, width, subsequent_indent=" " * indent, break_on_hyphens=False))


def assumption_lines(a: Assumptions, decode_steps: int | None = None) -> list[str]:
    """The assumptions of a plan, with where each comes from (the defaults') or that they were given."""
    steps = f" ({decode_steps} decode steps)" if decode_steps is not None else ""

    def why(name: str) -> str:
        default = getattr(Assumptions, name)
        if getattr(a, name) == default:
            return EXPLAINED[name]
        return f"given (the default {default:.0%}: {EXPLAINED[name]})"

    return ["  assumptions (override with --mfu, --bandwidth-share)",
            f"    MFU {a.mfu:.0%}: {why('mfu')}",
            f"    HBM bandwidth share {a.bandwidth_share:.0%}: {why('bandwidth_share')}",
            f"    KV fill {a.kv_fill:.0%}: {why('kv_fill')}",
            f"    every row plays its largest cap to the reply limit{steps}: an upper bound (the loop stops when "
            "every row has)",
            "    collectives (gradient all-reduce, fsdp all-gathers, tensor-parallel exchanges) are not timed"]


# ---------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds of one RL step (rollout + update; compiles and evaluations excluded) and what they count."""

    decode_steps: int  # one-token decode steps of the rollout (largest cap x reply limit, at most the buffer)
    prefill_tokens: int  # tokens per row prefilled (the buffer less the decoded tokens)
    rows_per_device: int  # rollout rows one device decodes
    decode_bytes: float  # bytes one device reads per decode step (weights + KV cache)
    decode_flops: float  # FLOPs of one device per decode step
    decode_s: float
    prefill_flops: float  # all devices
    prefill_s: float
    learner_tokens: int  # epochs x rows x L
    learner_factor: int  # forward passes' worth per token: 3 (2 with LoRA) + remat + KL reference
    learner_flops: float  # all devices
    learner_s: float

    @property
    def rollout_s(self) -> float:
        return self.decode_s + self.prefill_s

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.learner_s


@dataclasses.dataclass(frozen=True)
class Fix:
    """One knob that makes a plan fit: `overrides` (KEY=VALUE) and the plan with them, or None when no value does."""

    knob: str
    overrides: tuple[str, ...]
    plan: Plan | None
    tried: int = 0  # values tried

    def text(self) -> str:
        if self.plan is None:
            if self.knob == "together":
                return "all of them together do not fit either"
            return f"{self.knob}: no value fits" if self.tried else f"{self.knob}: no value left to try"
        p = self.plan
        cap = p.memory.capacity
        return (f"{' '.join(self.overrides)} fits: {size(p.memory.peak, cap)} of {size(p.usable, cap)} usable, "
                f"{p.time.step_s:.1f} s per step")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Memory per device and time per RL step of one config on one machine, with what they assume."""

    config_name: str
    hardware: Hardware
    mesh: dict[str, int]
    mesh_note: str
    mesh_fallback: bool  # the config's mesh cannot form the hardware's devices: all on the data axis instead
    model: Any  # the policy's ModelConfig
    lora_rank: int
    params: int  # parameters of the model (LoRA adapters apart)
    adapter_params: int  # LoRA adapters' parameters (0 without)
    matmul_params: int  # parameters that multiply per token, adapters included (P of the time model)
    shapes: RunShapes
    epochs: int
    steps: int  # train.steps
    memory: MemoryPlan
    time: StepTime
    assumptions: Assumptions
    fixes: tuple[Fix, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def usable(self) -> int:
        """Bytes of a device the plan may use (`MemoryPlan.usable`)."""
        return self.memory.usable

    @property
    def margin(self) -> int:
        return self.usable - self.memory.peak

    def table(self, assumptions: bool = True) -> str:
        """The plan as text: hardware, mesh, model, rows; memory per device by part and whether it fits;
        seconds per RL step by term; the assumptions (unless `assumptions=False`); the notes; the fixes."""
        m, t, s, a, hw, c = self.memory, self.time, self.shapes, self.assumptions, self.hardware, self.model
        gib = lambda n: size(n, m.capacity, 8)  # noqa: E731
        micro_rows = math.ceil(s.minibatch_rows / s.microbatches / (self.mesh["data"] * self.mesh["fsdp"]))
        lines = [
            f"bmrl plan: {self.config_name} on {hw.name}",
            f"  hardware  {hw.line()}",
            f"  mesh      {' x '.join(f'{k} {v}' for k, v in self.mesh.items())} ({self.mesh_note})",
            f"  model     {c.model_type}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
            f"MLP {c.intermediate_size}, {c.num_attention_heads} heads ({c.num_key_value_heads} KV) of {c.head_dim}, "
            f"vocab {c.vocab_size}"
            f"{', tied embeddings' if c.tie_word_embeddings else ''}",
            f"            P = {self.params / 1e6:.1f}M parameters"
            + (f" + {self.adapter_params / 1e6:.2f}M of LoRA rank {self.lora_rank}" if self.lora_rank else "")
            + f"; {c.param_dtype} parameters, {c.dtype} compute (activations, KV cache)",
            f"  rows      rollout {s.rollout_rows} x {s.max_len} tokens (an evaluation rollout: {s.eval_rows}); update "
            + (f"{s.batch_rows} x {s.turn_rows} turn rows" if s.turn_rows > 1 else f"{s.batch_rows} rows")
            + f" x {self.epochs} epoch{'s' if self.epochs > 1 else ''}",
            f"            in minibatches of {s.minibatch_rows}"
            + (f" split into {s.microbatches} micro-batches" if s.microbatches > 1 else "")
            + f": {micro_rows} row{'s' if micro_rows > 1 else ''} per device at a time"
            + ("; decoder layers rematerialised" if s.remat else ""),
            "",
            "  memory per device",
            f"    parameters        {gib(m.params)}"
            + (f"  (frozen base {size(m.frozen, m.capacity)} + adapters)" if m.frozen else ""),
            *([f"    KL reference      {gib(m.reference)}  (a copy of the parameters)"] if m.reference else []),
            f"    optimizer state   {gib(m.opt_state)}",
            f"    gradients         {gib(m.grads)}" + ("  (with a float32 accumulator)" if s.microbatches > 1 else ""),
            f"    activations       {gib(m.activations)}  (one micro-batch's update, estimated)",
            f"    optimizer step    {gib(m.step_copies)}  (the update's {STEP_COPIES} copies of the trained parameters "
            "+ optimizer state)",
            f"    KV cache          {gib(m.kv_cache)}  (a rollout of {s.kv_rows} rows)",
            *([f"    compute copy      {gib(m.compute_copy)}  (the parameters as the matmuls read them: "
               f"{'float32 on XLA:CPU' if hw.kind in memory_lib.UPCASTS_NARROW_DOTS else c.dtype}; rollout and update)"]
              if m.compute_copy else []),
            *([f"    tied head copy    {gib(m.head_copy)}  (the rollout's [vocab, hidden] head in {c.dtype})"]
              if m.head_copy else []),
            f"    peak              {gib(m.peak)}  = parameters + optimizer"
            + (" + reference" if m.reference else "") + " + max(KV cache"
            + (" + copies" if m.compute_copy or m.head_copy else "") + ", gradients + activations"
            + (" + compute copy" if m.compute_copy else "") + ", optimizer step)",
            f"    usable            {gib(self.usable)}  = {HEADROOM:.0%} of {size(m.capacity, m.capacity)} "
            f"({m.capacity_source})",
            ("    FITS" if self.fits else "    DOES NOT FIT") + f": margin {'+' if self.margin >= 0 else '-'}"
            f"{size(abs(self.margin), m.capacity)}",
            "",
            "  time per RL step (compiles, loading and evaluations excluded)",
            f"    rollout decode    {t.decode_s:8.2f} s  {t.decode_steps} steps x {t.decode_bytes / GB:.2f} GB "
            f"read per device ({t.rows_per_device} rows) at {a.bandwidth_share:.0%} of {hw.bandwidth / GB:g} GB/s",
            f"    rollout prefill   {t.prefill_s:8.2f} s  {s.rollout_rows} rows x {t.prefill_tokens} tokens, "
            f"{t.prefill_flops:.2e} FLOP",
            f"    learner           {t.learner_s:8.2f} s  {t.learner_tokens} tokens x {t.learner_factor} forwards, "
            f"{t.learner_flops:.2e} FLOP",
            f"    step              {t.step_s:8.2f} s  (FLOPs at {a.mfu:.0%} MFU of {math.prod(self.mesh.values())} x "
            f"{hw.peak_flops / 1e12:g} TFLOP/s)",
            f"    train.steps={self.steps}: {self.steps * t.step_s / 60:.0f} min",
        ]
        if assumptions:
            lines += ["", *assumption_lines(a, t.decode_steps)]
        lines += [f"  note: {n}" for n in self.notes + m.notes]
        if not self.fits:
            lines += ["", "  to fit (each knob alone, its smallest value that fits):"]
            lines += [f"    {f.text()}" for f in self.fixes if f.knob != "together"]
            lines += [f"  together: {f.text()}" for f in self.fixes if f.knob == "together"]
            if m.kv_cache >= m.update and m.kv_cache >= m.compute_copy + m.head_copy:
                lines.append(f"  the rollout's KV cache ({size(m.kv_cache, m.capacity)} for {s.kv_rows} rows) sets "
                             "the peak: lower train.tasks_per_step x train.group_size, eval.num_tasks x "
                             "len(eval.ts) or rollout.max_len, or raise mesh.tensor (it splits the KV heads)")
        return "\n".join(_wrap(line) for line in lines)

    def to_dict(self) -> dict:
        m, hw = self.memory, self.hardware
        return {
            "config": self.config_name,
            "hardware": dataclasses.asdict(hw),
            "mesh": dict(self.mesh), "mesh_note": self.mesh_note,
            "model": {"model_type": self.model.model_type, "params": self.params, "adapter_params": self.adapter_params,
                      "matmul_params": self.matmul_params,
                      "lora_rank": self.lora_rank, "param_dtype": self.model.param_dtype, "dtype": self.model.dtype},
            "shapes": dataclasses.asdict(self.shapes), "epochs": self.epochs, "steps": self.steps,
            "memory": {"params": m.params, "reference": m.reference, "opt_state": m.opt_state, "grads": m.grads,
                       "activations": m.activations, "step_copies": m.step_copies, "kv_cache": m.kv_cache,
                       "compute_copy": m.compute_copy, "head_copy": m.head_copy, "peak": m.peak, "capacity": m.capacity,
                       "capacity_source": m.capacity_source, "usable": self.usable, "fits": self.fits,
                       "margin": self.margin, "unit": "bytes per device"},
            "time": {**dataclasses.asdict(self.time), "rollout_s": self.time.rollout_s, "step_s": self.time.step_s},
            "assumptions": dataclasses.asdict(self.assumptions),
            "fixes": [{"knob": f.knob, "overrides": list(f.overrides), "fits": f.plan is not None,
                       "peak": f.plan.memory.peak if f.plan else None, "step_s": f.plan.time.step_s if f.plan else None}
                      for f in self.fixes],
            "notes": list(self.notes + m.notes),
        }


# ---------------------------------------------------------------- from a config
def policy_model_config(cfg: Any) -> Any:
    """The ModelConfig of the policy `bmrl train` builds for `cfg`, without weights: `model.path`'s config.json
    (an adapter directory's base) as `bmrl.assembly.load_policy` loads it, or the tiny decoder of the `model`
    section with the run's tokenizer (`build_tokenizer`, as a run builds it)."""
    from bmrl.assembly import base_dir, build_tokenizer, model_config
    from bmrl.model.hf import CheckpointError, load_config

    if cfg.model.path is None:
        return model_config(cfg, build_tokenizer(cfg))
    try:
        return load_config(base_dir(cfg), param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype)
    except CheckpointError as err:
        raise ConfigError("model.path", f"{err} (bmrl plan reads config.json only; no weights are needed)") from None


def mesh_axes(mesh_cfg: Any, devices: int) -> dict[str, int] | None:
    """The mesh section's axis sizes on `devices` devices (-1 takes the rest: `bmrl.parallel.mesh_shape`, as
    `make_mesh` forms them), or None when they cannot form it."""
    from bmrl.parallel import mesh_shape

    try:
        return mesh_shape(mesh_cfg, devices)
    except ValueError:
        return None


def _optimizer(cfg: Any) -> Any:
    """The run's optimizer, as `bmrl.train.Trainer.setup` builds it (only its state's shapes are read)."""
    from bmrl.learn import optimizer_from_config

    t = cfg.train
    return optimizer_from_config(t.optim, t.steps * t.epochs * t.minibatches, master_f32=t.f32_master)


def plan(cfg: Any, hardware: Hardware, *, mfu: float = Assumptions.mfu,
         bandwidth_share: float = Assumptions.bandwidth_share, kv_fill: float = Assumptions.kv_fill,
         mcfg: Any = None, config_name: str = "config", fixes: bool = True, optimizer: Any = None) -> Plan:
    """The plan of training config `cfg` on `hardware`: memory per device (`bmrl.memory.plan_for_axes`) and time
    per RL step under the assumptions given; with `fixes`, when it does not fit, each knob's smallest value that
    fits. `mcfg`: the policy's ModelConfig (default `policy_model_config(cfg)`); `optimizer`: the run's (default
    built from `train.optim` as `bmrl train` builds it). Shapes only: no device is used."""
    from bmrl.assembly import lora_spec
    from bmrl.config import make_budget

    assumptions = Assumptions(mfu, bandwidth_share, kv_fill)
    mcfg = policy_model_config(cfg) if mcfg is None else mcfg
    axes = mesh_axes(cfg.mesh, hardware.devices)
    given = " ".join(f"{a}={getattr(cfg.mesh, a)}" for a in ("data", "fsdp", "tensor"))
    fallback = axes is None
    if fallback:
        axes = {"data": hardware.devices, "fsdp": 1, "tensor": 1}
        mesh_note = f"the config's mesh {given} cannot form {hardware.devices} devices: all on the data axis"
    else:
        mesh_note = f"the config's mesh {given}"
    capacity = (memory_lib.device_capacity(cfg.mesh.device_memory_gb) if cfg.mesh.device_memory_gb > 0
                else (hardware.memory, f"{hardware.name}: {hardware.memory_text}"))
    spec = lora_spec(cfg)
    optimizer = _optimizer(cfg) if optimizer is None else optimizer
    memory = memory_lib.plan_for_axes(cfg, mcfg, axes, optimizer, lora=spec, capacity=capacity, backend=hardware.kind)
    shapes = RunShapes.of(cfg)
    params, param_bytes = memory_lib.parameter_totals(mcfg, spec)
    base_params = memory_lib.parameter_totals(mcfg)[0]
    untied_embedding = 0 if mcfg.tie_word_embeddings else mcfg.vocab_size * mcfg.hidden_size
    matmul_params = params - untied_embedding
    time = step_time(mcfg, axes, hardware, assumptions, shapes, cfg, matmul_params, param_bytes,
                     max_cap=make_budget(cfg.budget).max_cap, lora=bool(spec.rank))
    notes = []
    if hardware.kind == "gpu" and not cfg.mesh.device_memory_gb > 0:
        notes.append("JAX's GPU allocator may hold less than the whole memory (75% by default in many versions: "
                     "XLA_PYTHON_CLIENT_MEM_FRACTION); bmrl train plans with the limit the device reports")
    out = Plan(config_name, hardware, axes, mesh_note, fallback, mcfg, spec.rank, base_params, params - base_params,
               matmul_params, shapes, cfg.train.epochs, cfg.train.steps, memory, time, assumptions, notes=tuple(notes))
    if fixes and not out.fits:
        out = dataclasses.replace(out, fixes=find_fixes(cfg, out, optimizer))
    return out


def forward_flops(mcfg: Any, matmul_params: int, context: float) -> float:
    """FLOPs of one token's forward pass attending to `context` keys: 2 per multiplying parameter, 4 per key and
    query dimension per layer (scores and their weighted sum)."""
    return 2 * matmul_params + 4 * mcfg.num_hidden_layers * context * mcfg.num_attention_heads * mcfg.head_dim


def step_time(mcfg: Any, axes: dict[str, int], hardware: Hardware, a: Assumptions, shapes: RunShapes, cfg: Any,
              matmul_params: int, param_bytes: int, *, max_cap: int, lora: bool) -> StepTime:
    """The time model of the module docstring, term by term."""
    devices = math.prod(axes.values())
    flops_per_s = devices * hardware.peak_flops * a.mfu
    length = shapes.max_len
    turns = min(cfg.rollout.max_turns, max_cap)
    if cfg.rollout.history_turns is None:  # one context; the template's rewrite re-prefills what a reply keeps
        decode_steps = min(turns * cfg.rollout.max_reply_tokens, length)
        prefill_tokens = length - decode_steps if shapes.turn_rows == 1 else length
    else:  # a history window: every turn decodes its reply and re-prefills the window (at most the buffer)
        decode_steps = turns * cfg.rollout.max_reply_tokens
        prefill_tokens = turns * max(length - cfg.rollout.max_reply_tokens, 0)
    rows = math.ceil(shapes.rollout_rows / (axes["data"] * axes["fsdp"]))
    per_token = forward_flops(mcfg, matmul_params, a.kv_fill * length)
    kv = memory_lib.kv_cache_bytes(mcfg, axes, shapes.rollout_rows, length)
    decode_bytes = param_bytes / axes["tensor"] + a.kv_fill * kv
    decode_flops = rows * per_token / axes["tensor"]
    step = max(decode_bytes / (hardware.bandwidth * a.bandwidth_share), decode_flops / (hardware.peak_flops * a.mfu))
    prefill_flops = shapes.rollout_rows * prefill_tokens * per_token
    factor = (2 if lora else 3) + int(shapes.remat) + int(shapes.kl_reference)
    tokens = cfg.train.epochs * shapes.learner_rows * length
    learner_flops = tokens * factor * forward_flops(mcfg, matmul_params, length)
    return StepTime(decode_steps, prefill_tokens, rows, decode_bytes, decode_flops, decode_steps * step, prefill_flops,
                    prefill_flops / flops_per_s, tokens, factor, learner_flops, learner_flops / flops_per_s)


# ---------------------------------------------------------------- what makes it fit
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _replan(cfg: Any, base: Plan, overrides: list[str], optimizer: Any) -> Plan | None:
    """`base`'s plan of `cfg` with `overrides` (KEY=VALUE of the knobs above: ints and booleans) set on a copy.
    `optimizer`: the base's (the knobs change its schedule's length at most, never its state's shapes)."""
    import copy

    new = copy.deepcopy(cfg)
    for item in overrides:
        key, _, value = item.partition("=")
        *path, leaf = key.split(".")
        node = new
        for part in path:
            node = getattr(node, part)
        setattr(node, leaf, value == "true" if value in ("true", "false") else int(value))
    a = base.assumptions
    try:
        return plan(new, base.hardware, mfu=a.mfu, bandwidth_share=a.bandwidth_share, kv_fill=a.kv_fill,
                    mcfg=base.model, config_name=base.config_name, fixes=False, optimizer=optimizer)
    except ConfigError:  # e.g. train.microbatches that does not split the minibatch
        return None


def _valid(cfg: Any, overrides: tuple[str, ...]) -> bool:
    """Whether `cfg` with `overrides` passes the config's validation (what `bmrl train` would accept)."""
    from bmrl import config as config_lib

    try:
        config_lib.build(config_lib.to_dict(cfg), list(overrides))
    except ConfigError:
        return False
    return True


def _mesh_override(cfg: Any, devices: int, axis: str, size: int) -> list[str] | None:
    """The fewest mesh overrides that put `size` on `axis` (the other named axis kept, data taking the rest)."""
    other = "tensor" if axis == "fsdp" else "fsdp"
    keep = max(int(getattr(cfg.mesh, other)), 1)
    if devices % (size * keep):
        return None
    out = [f"mesh.{axis}={size}"]
    if cfg.mesh.data != -1:
        out.append(f"mesh.data={devices // (size * keep)}")
    if getattr(cfg.mesh, other) == -1:
        out.append(f"mesh.{other}=1")
    return out


def _first_fit(cfg: Any, base: Plan, knob: str, candidates: list[list[str]], optimizer: Any) -> Fix:
    """The first of `candidates` (override lists, ascending) whose plan fits, as a Fix; one without a plan
    when none does (or there is none)."""
    for overrides in candidates:
        p = _replan(cfg, base, overrides, optimizer)
        if p is not None and not p.mesh_fallback and p.fits and _valid(cfg, tuple(overrides)):
            return Fix(knob, tuple(overrides), p)
    return Fix(knob, (), None, len(candidates))


def _knobs(cfg: Any, base: Plan) -> dict[str, list[list[str]]]:
    """Each knob's candidate overrides, smallest first: what `find_fixes` tries."""
    t, s, devices = cfg.train, base.shapes, base.hardware.devices
    ways = base.mesh["data"] * base.mesh["fsdp"]
    knobs = {
        "train.minibatches": [[f"train.minibatches={m}"] for m in _divisors(s.batch_rows)
                              if m > t.minibatches and (s.batch_rows // m) % t.microbatches == 0],
        "train.microbatches": [[f"train.microbatches={m}"] for m in _divisors(s.minibatch_rows)  # past 1 row per
                               if m > t.microbatches and s.minibatch_rows // m >= ways],  # device: nothing saved
        "train.remat": [] if t.remat else [["train.remat=true"]],
        "model.lora.rank": [] if cfg.model.lora.rank else [["model.lora.rank=16"]],  # common; any rank costs ~the same
    }
    for axis in ("fsdp", "tensor"):
        knobs[f"mesh.{axis}"] = [o for k in _divisors(devices) if k > base.mesh[axis]
                                 for o in [_mesh_override(cfg, devices, axis, k)] if o]
    return knobs


def find_fixes(cfg: Any, base: Plan, optimizer: Any = None) -> tuple[Fix, ...]:
    """For a plan that does not fit: each knob alone at its smallest value that fits (train.minibatches,
    train.microbatches, train.remat, model.lora.rank, mesh.fsdp, mesh.tensor), or that none does; when no
    knob fits alone, the largest values of those that lower the peak, taken together until it fits (knob
    "together"; without a plan when even all of them do not fit)."""
    optimizer = _optimizer(cfg) if optimizer is None else optimizer
    knobs = _knobs(cfg, base)
    fixes = [_first_fit(cfg, base, knob, candidates, optimizer) for knob, candidates in knobs.items()]
    if any(f.plan is not None for f in fixes):
        return tuple(fixes)
    together: list[str] = []
    for knob in ("mesh.fsdp", "train.remat", "train.microbatches", "train.minibatches"):  # states, then activations
        if not knobs[knob]:
            continue
        trial = together + knobs[knob][-1]
        p = _replan(cfg, base, trial, optimizer)
        if p is None or p.mesh_fallback or p.memory.peak >= base.memory.peak:
            continue
        together = trial
        if p.fits and _valid(cfg, tuple(together)):
            return (*fixes, Fix("together", tuple(together), p))
    return (*fixes, Fix("together", (), None, 1))


# ---------------------------------------------------------------- notes in a config file
NOTES_BEGIN = "# --- bmrl plan (generated: "
NOTES_END = "# --- end bmrl plan ---"
_NOTES = re.compile(r"^# --- bmrl plan \(generated: .*?^# --- end bmrl plan ---\n", re.M | re.S)


def notes_block(plans: list[Plan], hardware: str, assumptions: Assumptions) -> str:
    """The generated comment block of a config file: the command that regenerates it, then each plan's table."""
    options = "".join(f" --{k.replace('_', '-')} {getattr(assumptions, k):g}" for k in ("mfu", "bandwidth_share")
                      if getattr(assumptions, k) != getattr(Assumptions, k))
    head = (f"{NOTES_BEGIN}bmrl plan --config <this file> model.path=DIR --hardware {hardware}{options} "
            "--write-notes) ---")
    body = "\n\n".join([*(p.table(assumptions=False) for p in plans),
                         "\n".join(_wrap(line) for line in assumption_lines(assumptions))])
    return "\n".join([head, *(f"# {line}".rstrip() for line in body.splitlines()), NOTES_END]) + "\n"


def read_notes(text: str) -> str | None:
    """The generated block of a config file's text, or None."""
    found = _NOTES.search(text)
    return found.group(0) if found else None


def with_notes(text: str, block: str) -> str:
    """`text` with its generated block replaced by `block`, or `block` added after the leading comment lines."""
    if read_notes(text) is not None:
        return _NOTES.sub(lambda _: block, text, count=1)
    lines = text.splitlines(keepends=True)
    head = 0
    while head < len(lines) and lines[head].startswith("#"):
        head += 1
    return "".join(lines[:head]) + ("#\n" if head else "") + block + "".join(lines[head:])


__all__ = ["Assumptions", "Fix", "HARDWARE", "Hardware", "NOTES_BEGIN", "NOTES_END", "Plan", "StepTime", "find_fixes",
           "forward_flops", "mesh_axes", "notes_block", "plan", "policy_model_config", "read_notes", "step_time",
           "with_notes"]
