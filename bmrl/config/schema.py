"""The config schema: one typed dataclass per section, a field's trailing comment its documentation.

`Config` is what every run reads; `bmrl.config.load` fills it from YAML and overrides and
`bmrl.config.validate` refuses values that cannot work. Also here: reading the schema (the type hint
of a dotted key, a reader's name for a type) for error messages, sweeps and the docs renderer.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from bmrl.eval.settings import EvalSettings  # the evaluation defaults (bmrl.eval.settings), read by eval.* and reproduce.*

class ConfigError(ValueError):
    """An invalid configuration: `key` is the dotted key at fault."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


@dataclass
class LoRACfg:
    """Low-rank adapters on a frozen base (bmrl.model.lora): only the adapters train, are checkpointed and exported."""

    rank: int = 0  # adapter rank; 0 = off (every parameter trains)
    alpha: float = 16.0  # adapter scale alpha / rank
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])  # adapted projections by HF name (the same in every family)
    dropout: float = 0.0  # dropout on the adapters' input while learning, in [0, 1)


@dataclass
class ModelCfg:
    """The policy: a local Hugging Face directory, or a tiny decoder trained from scratch."""

    path: Optional[str] = None  # local HF directory; null = tiny model + tiny tokenizer from scratch
    model_type: str = "llama"  # tiny model architecture (ignored with path): a family of bmrl.model.families.FAMILIES
    vocab_size: int = 384  # tiny tokenizer's vocabulary (trained on the environments' text)
    hidden_size: int = 64  # tiny model width
    intermediate_size: int = 192  # tiny model MLP width
    num_hidden_layers: int = 2  # tiny model depth
    num_attention_heads: int = 4  # query heads; must divide hidden_size
    num_key_value_heads: int = 2  # key/value heads (GQA); must divide num_attention_heads
    rope_theta: float = 10000.0  # RoPE base frequency
    sliding_window: Optional[int] = None  # tiny model: sliding-window attention on the family's layers (Gemma: all but every 2nd/6th; others: all); null = none
    param_dtype: str = "float32"  # parameter storage dtype: float32 | bfloat16
    dtype: str = "float32"  # compute dtype: float32 | bfloat16
    lora: LoRACfg = field(default_factory=LoRACfg)  # LoRA adapters (rank 0 = full fine-tuning)


@dataclass
class EnvCfg:
    """The environment: a built-in JAX one by name, or your own Python one (Gymnasium-style, text)."""

    kind: str = "jax"  # jax (a built-in env, env.name) | python (your env.entry, tasks from data.tasks)
    name: str = "corridor"  # jax: an environment of bmrl.envs.ENVS
    entry: Optional[str] = None  # python: "package.module:factory", called as factory(**env.options) for each new env
    path: Optional[str] = None  # python: directory searched before sys.path for env.entry's module; null = the config file's
    options: dict[str, Any] = field(default_factory=dict)  # jax: static env options, e.g. {length: 6}; python: the factory's kwargs
    show_budget: bool = False  # jax: show "Turns left: N" in every observation (the policy sees its cap)
    step_timeout_s: float = 30.0  # python: a reset or step slower than this is a fault of its row
    workers: int = 32  # python: threads stepping environments concurrently (in each pipeline group)
    pipeline_groups: int = 4  # python: the batch plays as up to this many equal groups, so device work overlaps tool latency (1 = one batch)
    on_fault: str = "observe"  # python: observe (the row sees "tool error: ..." and goes on) | end (the row stops)


@dataclass
class BudgetCfg:
    """Turn caps per rollout: fixed (budgets[0]), mix (budgets with probs), uniform (lo..hi); a kind is a
    sampler of `bmrl.budget.SAMPLERS`, which reads the keys it names (a new one's own keys: `options`)."""

    kind: str = "fixed"  # a sampler of bmrl.budget.SAMPLERS
    budgets: list[int] = field(default_factory=lambda: [8])  # turn caps; fixed takes exactly one
    probs: Optional[list[float]] = None  # mix only; null = uniform over budgets
    lo: int = 1  # uniform only: smallest cap
    hi: int = 8  # uniform only: largest cap
    options: dict[str, Any] = field(default_factory=dict)  # keys of a sampler beyond budgets/probs/lo/hi (its dataclass fields)
    share_in_group: bool = True  # the attempts of one task share a cap


@dataclass
class RolloutCfg:
    """Static shapes and sampling of the compiled rollout (one compile per shape for a whole run)."""

    max_turns: int = 16  # turn buffer Tm; every cap (budget, eval.ts) must be <= max_turns
    max_reply_tokens: int = 6  # tokens per reply, stop token included
    max_len: int = 512  # context buffer L in tokens (prompt + observations + replies)
    temperature: float = 1.0  # sampling temperature during training rollouts (0 = greedy)
    top_k: int = 0  # keep the k most likely tokens (0 = off)
    top_p: float = 1.0  # nucleus sampling mass in (0, 1] (1 = off)
    compact_min_rows: int | None = None  # finished rows leave the batch: turns played in chunks of at least this many rows (0 = off; null = 16 on CPU, off on GPU/TPU, where each chunk re-reads the weights)
    compact_steps: int = 4  # the batch splits into at most this many chunks; only chunks with live rows play (one compile)
    attention_block: int | None = None  # keys per attention block over the KV cache (0 = whole buffer; null = 64 on CPU, 256 on GPU/TPU: the fastest measured on each)
    history_turns: int | None = None  # a history window: each turn sees the prompt and the last H turns, max_len need hold only H + 1 turns, and each turn trains as its own sample (null = the whole episode; JAX envs only)


@dataclass
class FormatCfg:
    """The conversation: how a reply carries its action, and an optional preamble of the system prompt."""

    kind: str = "action"  # action (the reply is the action) | think_answer (reasoning in think tags, then the action in answer tags)
    system_prompt: str | None = None  # text put before the task instructions in the system prompt; null = none
    history: str = "whole"  # whole (earlier replies stay in the context as sampled) | template (as the chat template renders them: Qwen3 drops their reasoning; each turn then trains as its own sample; JAX envs only)


@dataclass
class OptimCfg:
    """optax chain: global-norm clipping, then adamw with warmup and a cosine or constant schedule."""

    lr: float = 1e-3  # peak learning rate
    warmup_steps: int = 0  # linear warmup steps
    schedule: str = "cosine"  # cosine | constant (after warmup)
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    weight_decay: float = 0.0  # adamw decoupled weight decay
    b1: float = 0.9  # adam first-moment decay
    b2: float = 0.999  # adam second-moment decay
    eps: float = 1e-8  # adam epsilon
    max_grad_norm: float = 1.0  # global-norm gradient clipping (0 = off)


@dataclass
class SFTCfg:
    """Behaviour cloning of eps-noisy oracle demonstrations: errors shown, recovery from them in a fraction."""

    steps: int = 300  # optimizer steps
    batch_size: int = 32  # demonstrations per step
    noise: float = 0.25  # probability of a random wrong action in a demonstration turn
    recovery: float = 0.25  # fraction of demonstrations that go on after the demonstrator's first mistake (showing the repair); the rest end there
    demo_turns: int = 12  # turns per demonstration
    checkpoint_minutes: float = 5.0  # a checkpoint at the first log step this long after the last one (0: at every log step); a killed run resumes from it, bitwise
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(lr=3e-3, warmup_steps=20))  # SFT optimizer


@dataclass
class TrainCfg:
    """Policy-gradient RL from the SFT base: grouped rollouts, advantages, PPO/PG updates."""

    steps: int = 40  # RL steps (one rollout batch + update each)
    tasks_per_step: int = 16  # distinct tasks per rollout batch
    group_size: int = 8  # attempts per task (batch = tasks_per_step * group_size)
    advantage: str = "grpo"  # an estimator of bmrl.learn.ADVANTAGES
    advantage_options: dict[str, Any] = field(default_factory=dict)  # keyword options of that estimator, e.g. {normalize_std: false} for grpo (Dr. GRPO)
    loss: str = "ppo"  # a loss of bmrl.learn.LOSSES
    loss_options: dict[str, Any] = field(default_factory=dict)  # keyword options of that loss beyond the train.* ones, e.g. {clip_eps_high: 0.28} for ppo
    epochs: int = 1  # passes over each rollout batch
    minibatches: int = 1  # minibatches per epoch; must divide the batch
    clip_eps: float = 0.2  # PPO ratio clip
    kl_coef: float = 0.0  # KL penalty to the frozen initial policy (0 = off)
    entropy_coef: float = 0.0  # entropy bonus (0 = off)
    aggregation: str = "token_mean"  # token_mean | seq_mean
    process_coef: float = 0.0  # weight of progress-delta (process) advantages; 0 = outcome only
    gamma: float = 1.0  # discount of per-turn process rewards, in (0, 1]
    max_nonfinite: int = 5  # stop after this many non-finite updates in a row
    oversample: int = 0  # dynamic sampling (DAPO): roll out this many extra tasks' groups per step and train on tasks_per_step of them, those whose rewards differ first (0 = off)
    dead_after: int = 5  # flag the run as dead (log, summary.json, the study's report) after this many steps in a row without signal or with a raised invalid-action rate (bmrl.learn.health; 0 = off)
    dead_invalid_rise: float = 0.3  # an invalid-action rate at least this far above the run's first step counts toward dead_after
    remat: bool = False  # recompute decoder layers in the backward pass (less activation memory)
    microbatches: int = 1  # gradient accumulation: micro-batches per minibatch; must divide its rows
    f32_master: bool = False  # keep a float32 copy of the parameters in the optimizer (for param_dtype=bfloat16)
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(lr=1e-3))  # RL optimizer


@dataclass
class EvalCfg:
    """Pass@(K,T) evaluation on the held-out suite, and the decision-accuracy probe."""

    ts: Optional[list[int]] = None  # turn budgets T of the surface, each <= rollout.max_turns; null = the powers of 2 below rollout.max_turns and max_turns itself ([1, 2, 4, 8, 16] at 16, [1, 2, 4, 8] at 8)
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # attempt counts K of the surface; each <= attempts
    attempts: int = 8  # n attempts per task (K <= n)
    num_tasks: int = 64  # held-out tasks evaluated
    every: int = 0  # evaluate every N train steps (0 = only at the end)
    mode: str = "exact"  # exact (run each T for real) | truncate (one run at max T, cut) | both
    temperature: float = 1.0  # sampling temperature during evaluation (0 = greedy)
    bootstrap: int = 1000  # bootstrap resamples for intervals (0 = none)
    probe_states: int = EvalSettings.probe_states  # decision-accuracy probe set size


@dataclass
class DataCfg:
    """Tasks split train / validation / test by content (bmrl.data.suites): a JAX env's level seeds, a Python env's data.tasks."""

    data_dir: Optional[str] = None  # store the task suites here (TFDS array_record, built once, read back); null = computed in memory (the same splits); reproduce uses <out_dir>/data
    train_size: int = 4096  # jax: tasks in the training suite; python: at most this many, the first of the file's train split
    val_size: int = 64  # jax: tasks in the validation suite (training-time evaluation, eval.every), at least eval.num_tasks; python: as train_size
    test_size: int = 256  # jax: tasks in the held-out test suite (final evaluation), at least eval.num_tasks; python: as train_size
    tasks: Optional[str] = None  # python: JSONL file, one task (reset's options) a line, split by content hash (about 1 in 16 test, 1 in 16 validation; repeats dropped); relative = to the config file


@dataclass
class CheckpointCfg:
    """Orbax checkpoints of params, optimizer state, PRNG key, step and data position."""

    every: int = 10  # save every N train steps (and at the end)
    keep: int = 3  # keep the last N checkpoints (>= 1)


@dataclass
class MeshCfg:
    """Device mesh axes (data, fsdp, tensor); the product must equal the device count."""

    data: int = -1  # data-parallel axis size (-1 = all remaining devices)
    fsdp: int = 1  # parameter-sharding axis size (-1 = all remaining devices)
    tensor: int = 1  # tensor-parallel axis size (-1 = all remaining devices)
    device_memory_gb: float = 0.0  # memory per device for the memory plan; 0 = ask the device (GPU/TPU), else host RAM / devices


def _default_variants() -> dict[str, BudgetCfg]:
    return {
        "fixed_long": BudgetCfg(kind="fixed", budgets=[12]),
        "fixed_short": BudgetCfg(kind="fixed", budgets=[4]),
        "budgetmix": BudgetCfg(kind="mix", budgets=[4, 6, 8, 12]),
    }


@dataclass
class ReproduceCfg:
    """`bmrl reproduce`: an SFT base, then RL under each budget variant (same steps, same seeds)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1])  # one full pipeline per seed; intervals pool (seed, task) units
    variants: dict[str, BudgetCfg] = field(default_factory=_default_variants)  # RL runs by name: their turn budgets
    generous: str = "fixed_long"  # the variant whose RL gain over the base is compared at large and small T
    tight: str = "fixed_short"  # the fixed tight-budget variant
    budgetmix: str = "budgetmix"  # the BudgetMix variant compared with both fixed ones
    small_t: int = 4  # the tight turn budget of finding 1 (must be in eval.ts)
    inject_turns: list[int] = field(default_factory=lambda: list(EvalSettings.inject_turns))  # 1-based turns of the error-injection run ([] = none); also bmrl eval's (--inject-turns)
    inject_prob: float = EvalSettings.inject_prob  # probability of a forced wrong action at those turns; also bmrl eval's (--inject-prob)
    probe_noise: float = EvalSettings.probe_noise  # noise of the oracle whose states form the decision-accuracy probe set; also bmrl eval's (--probe-noise)
    window: int = EvalSettings.window  # turns allowed to get back on track after an error; also bmrl eval's (--window)
    process: dict[str, float] = field(default_factory=dict)  # variant -> train.process_coef: RL with a step reward from the env's (privileged) progress
    advantage: dict[str, str] = field(default_factory=dict)  # variant -> train.advantage: RL with another advantage estimator (gigpo: step-level credit from the turns of a task's rollouts that share a state); F1's rule is applied to each such variant too


@dataclass
class Config:
    """One experiment: every section, the seed and the output directory."""

    seed: int = 0  # PRNG seed of everything random in the run
    out_dir: str = "runs/default"  # where the run writes config.yaml, checkpoints, metrics, summary.json
    model: ModelCfg = field(default_factory=ModelCfg)
    env: EnvCfg = field(default_factory=EnvCfg)
    budget: BudgetCfg = field(default_factory=BudgetCfg)
    rollout: RolloutCfg = field(default_factory=RolloutCfg)
    format: FormatCfg = field(default_factory=FormatCfg)
    sft: SFTCfg = field(default_factory=SFTCfg)
    train: TrainCfg = field(default_factory=TrainCfg)
    eval: EvalCfg = field(default_factory=EvalCfg)
    data: DataCfg = field(default_factory=DataCfg)
    checkpoint: CheckpointCfg = field(default_factory=CheckpointCfg)
    mesh: MeshCfg = field(default_factory=MeshCfg)
    reproduce: ReproduceCfg = field(default_factory=ReproduceCfg)

    def __post_init__(self) -> None:
        if self.eval.ts is None:  # the default grid fits the turn buffer it runs in
            self.eval.ts = default_ts(self.rollout.max_turns)


def default_ts(max_turns: int) -> list[int]:
    """The default grid of turn budgets for a turn buffer of `max_turns`: the powers of 2 below it, then
    `max_turns` itself ([1, 2, 4, 8, 16] at 16, [1, 2, 4, 8, 12] at 12), so every T is a cap the rollout runs."""
    out = [t for t in (2 ** i for i in range(max(int(max_turns), 1).bit_length())) if t < max_turns]
    return out + [max(int(max_turns), 1)]


# ---- reading the schema -----------------------------------------------------------------------------


def type_name(hint: Any) -> str:
    """A reader's name for a field's type hint: 'int', 'list of int', 'float or null', 'mapping'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict or hint is dict:
        return "mapping"
    if dataclasses.is_dataclass(hint):
        return "section"
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def hint_of(dotted: str, schema=Config) -> Any:
    """The type hint of dotted key `dotted` (list indices ignored), or None if it is not in the schema."""
    node: Any = schema
    hint: Any = schema
    for part in re.sub(r"\[\d+\]", "", dotted).split("."):
        if not dataclasses.is_dataclass(node):
            return hint if typing.get_origin(hint) is dict else None
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None
        hint = node = hints[part]
    return hint


def element_hint(hint: Any) -> Any:
    """The element type of a list hint (`Optional[list[X]]` included)."""
    for h in (hint, *typing.get_args(hint)):
        if typing.get_origin(h) is list:
            return typing.get_args(h)[0] if typing.get_args(h) else Any
    return hint


def section_names(node) -> str:
    return ", ".join(f.name for f in dataclasses.fields(node))

