"""Experiment configuration: typed dataclasses, YAML files, dotted overrides, clear errors.

A YAML file in `configs/` is merged onto the `Config` schema with OmegaConf structured configs, so an
unknown key or a value of the wrong type is refused by OmegaConf with the key's full name; values that
type-check but cannot work (a mix whose probabilities do not sum to 1, a cap above `max_turns`, an
unknown algorithm name) are refused by `validate`. Every refusal is a `ConfigError` naming the key and
what is allowed, raised before any work is done; the CLI turns it into exit status 2.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """An invalid configuration: `key` is the dotted key at fault."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


@dataclass
class ModelCfg:
    """The policy: a local Hugging Face directory, or a tiny decoder trained from scratch."""

    path: Optional[str] = None  # local HF directory; None = tiny model + tiny tokenizer from scratch
    model_type: str = "llama"
    vocab_size: int = 384  # tiny tokenizer's vocabulary (trained on the environments' text)
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rope_theta: float = 10000.0
    param_dtype: str = "float32"
    dtype: str = "float32"


@dataclass
class EnvCfg:
    name: str = "corridor"
    options: dict[str, Any] = field(default_factory=dict)  # static env options, e.g. {length: 6, eps: 0.2}
    show_budget: bool = False


@dataclass
class BudgetCfg:
    """Turn caps per rollout: fixed (budgets[0]), mix (budgets with probs), uniform (lo..hi)."""

    kind: str = "fixed"
    budgets: list[int] = field(default_factory=lambda: [8])
    probs: Optional[list[float]] = None  # mix only; None = uniform over budgets
    lo: int = 1
    hi: int = 8
    share_in_group: bool = True  # the attempts of one task share a cap


@dataclass
class RolloutCfg:
    max_turns: int = 16
    max_reply_tokens: int = 6
    max_len: int = 512
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass
class OptimCfg:
    lr: float = 1e-3
    warmup_steps: int = 0
    schedule: str = "cosine"  # or "constant"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0


@dataclass
class SFTCfg:
    """Behaviour cloning of eps-noisy oracle demonstrations (errors shown, recovery not)."""

    steps: int = 300
    batch_size: int = 32
    noise: float = 0.25  # probability of a random wrong action in a demonstration turn
    demo_turns: int = 12
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(lr=3e-3, warmup_steps=20))


@dataclass
class TrainCfg:
    steps: int = 40
    tasks_per_step: int = 16
    group_size: int = 8
    advantage: str = "grpo"  # grpo | rloo | reinforce
    loss: str = "ppo"  # ppo | pg
    epochs: int = 1
    minibatches: int = 1
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"  # token_mean | seq_mean
    process_coef: float = 0.0  # weight of progress-delta (process) advantages; 0 = outcome only
    gamma: float = 1.0
    max_nonfinite: int = 5  # stop after this many non-finite updates in a row
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(lr=1e-3))


@dataclass
class EvalCfg:
    ts: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    attempts: int = 8  # n attempts per task (K <= n)
    num_tasks: int = 64
    every: int = 0  # evaluate every N train steps (0 = only at the end)
    mode: str = "exact"  # exact | truncate | both
    temperature: float = 1.0
    bootstrap: int = 1000
    probe_states: int = 256  # decision-accuracy probe set size


@dataclass
class DataCfg:
    data_dir: Optional[str] = None  # TFDS data dir; None = <out_dir>/data
    train_size: int = 4096
    test_size: int = 256


@dataclass
class CheckpointCfg:
    every: int = 10
    keep: int = 3


@dataclass
class MeshCfg:
    data: int = -1
    fsdp: int = 1
    tensor: int = 1


@dataclass
class Config:
    seed: int = 0
    out_dir: str = "runs/default"
    model: ModelCfg = field(default_factory=ModelCfg)
    env: EnvCfg = field(default_factory=EnvCfg)
    budget: BudgetCfg = field(default_factory=BudgetCfg)
    rollout: RolloutCfg = field(default_factory=RolloutCfg)
    sft: SFTCfg = field(default_factory=SFTCfg)
    train: TrainCfg = field(default_factory=TrainCfg)
    eval: EvalCfg = field(default_factory=EvalCfg)
    data: DataCfg = field(default_factory=DataCfg)
    checkpoint: CheckpointCfg = field(default_factory=CheckpointCfg)
    mesh: MeshCfg = field(default_factory=MeshCfg)


def _omega_error(err: OmegaConfBaseException) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    msg = str(err).splitlines()[0]
    if "not in" in msg and key:
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = _section(parent)
        allowed = ", ".join(f.name for f in dataclasses.fields(node)) if node else ""
        msg += f" Allowed keys{' in ' + parent if parent else ''}: {allowed}."
    return ConfigError(key, msg)


def _section(dotted: str):
    node: Any = Config
    for part in [p for p in dotted.split(".") if p]:
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            return None
        default = fields[part].default_factory() if fields[part].default_factory is not dataclasses.MISSING else None
        if not dataclasses.is_dataclass(default):
            return None
        node = type(default)
    return node


def build(data: dict | None = None, overrides: list[str] | tuple[str, ...] = (), schema=Config):
    """Merge `data` (a parsed YAML mapping) and dotted `overrides` onto `schema`, then validate."""
    try:
        base = OmegaConf.structured(schema)
        merged = OmegaConf.merge(base, OmegaConf.create(data or {}), OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _omega_error(err) from None
    if schema is Config:
        validate(cfg)
    return cfg


def load(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a YAML config file (or only defaults) with dotted overrides (`budget.kind=mix`)."""
    for o in overrides:
        if "=" not in o:
            raise ConfigError(o, "an override must look like key.subkey=value (e.g. budget.kind=mix).")
    data = {}
    if path is not None:
        if not os.path.isfile(path):
            raise ConfigError("", f"config file {str(path)!r} does not exist.")
        with open(path) as f:
            try:
                data = yaml.safe_load(f) or {}
            except yaml.YAMLError as err:
                raise ConfigError("", f"{path} is not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError("", f"{path} must hold a mapping of config sections, got {type(data).__name__}.")
    return build(data, overrides)


def to_dict(cfg: Config) -> dict:
    """A plain dict of `cfg` (for YAML/JSON dumps and checkpoints)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def _one_of(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ConfigError(key, f"{value!r} is not allowed; choose one of: {', '.join(allowed)}.")


def _positive(cfg: Any, prefix: str, names: tuple[str, ...], minimum: int = 1) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value < minimum:
            raise ConfigError(f"{prefix}.{name}", f"must be >= {minimum}, got {value}.")


def make_budget(b: BudgetCfg):
    """The `bmrl.budget.Budget` of a budget section (raising ConfigError on a bad one)."""
    from bmrl import budget as budget_lib

    try:
        if b.kind == "fixed":
            if len(b.budgets) != 1:
                raise ConfigError("budget.budgets", f"a fixed budget takes exactly one cap, got {b.budgets}.")
            return budget_lib.fixed(b.budgets[0])
        if b.kind == "mix":
            return budget_lib.mix(b.budgets, b.probs)
        if b.kind == "uniform":
            return budget_lib.uniform(b.lo, b.hi)
        raise ConfigError("budget.kind", f"{b.kind!r} is not allowed; choose one of: {', '.join(budget_lib.KINDS)}.")
    except budget_lib.BudgetError as err:
        key = "budget.probs" if "probabilit" in str(err) else "budget.lo" if b.kind == "uniform" else "budget.budgets"
        raise ConfigError(key, str(err)) from None


def validate(cfg: Config) -> None:
    """Refuse values that type-check but cannot work, naming the key and what is allowed."""
    from bmrl.learn import ADVANTAGES, LOSSES  # registries by name

    b = make_budget(cfg.budget)
    r = cfg.rollout
    _positive(r, "rollout", ("max_turns", "max_reply_tokens", "max_len"))
    if b.max_cap > r.max_turns:
        raise ConfigError(
            "budget", f"the largest cap {b.max_cap} exceeds rollout.max_turns={r.max_turns}; raise max_turns or lower the budget."
        )
    if r.temperature < 0:
        raise ConfigError("rollout.temperature", f"must be >= 0 (0 = greedy), got {r.temperature}.")
    if not 0 < r.top_p <= 1:
        raise ConfigError("rollout.top_p", f"must be in (0, 1], got {r.top_p}.")
    t = cfg.train
    _positive(t, "train", ("tasks_per_step", "group_size", "epochs", "minibatches", "max_nonfinite"))
    _positive(t, "train", ("steps",), minimum=0)
    _one_of("train.advantage", t.advantage, tuple(ADVANTAGES))
    _one_of("train.loss", t.loss, tuple(LOSSES))
    _one_of("train.aggregation", t.aggregation, ("token_mean", "seq_mean"))
    if (t.tasks_per_step * t.group_size) % t.minibatches:
        raise ConfigError("train.minibatches", f"{t.minibatches} does not divide the batch of {t.tasks_per_step * t.group_size} rollouts.")
    if not 0 < t.gamma <= 1:
        raise ConfigError("train.gamma", f"must be in (0, 1], got {t.gamma}.")
    for key, o in (("sft.optim", cfg.sft.optim), ("train.optim", t.optim)):
        _one_of(f"{key}.schedule", o.schedule, ("cosine", "constant"))
        if o.lr <= 0:
            raise ConfigError(f"{key}.lr", f"must be > 0, got {o.lr}.")
    if not 0 <= cfg.sft.noise < 1:
        raise ConfigError("sft.noise", f"must be in [0, 1), got {cfg.sft.noise}.")
    _positive(cfg.sft, "sft", ("batch_size", "demo_turns"))
    e = cfg.eval
    _one_of("eval.mode", e.mode, ("exact", "truncate", "both"))
    if not e.ts or min(e.ts) < 1 or max(e.ts) > r.max_turns:
        raise ConfigError("eval.ts", f"every T must be in [1, rollout.max_turns={r.max_turns}], got {e.ts}.")
    if not e.ks or min(e.ks) < 1 or max(e.ks) > e.attempts:
        raise ConfigError("eval.ks", f"every K must be in [1, eval.attempts={e.attempts}], got {e.ks}.")
    _positive(e, "eval", ("attempts", "num_tasks"))
    _one_of("model.param_dtype", cfg.model.param_dtype, ("float32", "bfloat16"))
    _one_of("model.dtype", cfg.model.dtype, ("float32", "bfloat16"))
