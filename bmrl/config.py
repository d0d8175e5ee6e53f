"""Experiment configuration: typed dataclasses, YAML files, dotted overrides, clear errors.

A YAML file in `configs/` is merged onto the `Config` schema with OmegaConf structured configs, so an
unknown key or a value of the wrong type is refused by OmegaConf with the key's full name; values that
type-check but cannot work (a mix whose probabilities do not sum to 1, a cap above `max_turns`, an
unknown algorithm name) are refused by `validate`. Every refusal is a `ConfigError` naming the key and
what is allowed, raised before any work is done; the CLI turns it into exit status 2.

    cfg = load("configs/corridor_tiny.yaml", ["budget.kind=mix", "budget.budgets=[4,8]"])
    save(cfg, f"{cfg.out_dir}/config.yaml")

A field's trailing comment is its documentation: `schema_markdown` renders every key with type,
default and meaning into docs/configs.md (`bmrl config --docs docs/configs.md`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import os
import re
import textwrap
import tokenize
import types
import typing
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

    path: Optional[str] = None  # local HF directory; null = tiny model + tiny tokenizer from scratch
    model_type: str = "llama"  # tiny model architecture: llama | qwen2 (ignored with path)
    vocab_size: int = 384  # tiny tokenizer's vocabulary (trained on the environments' text)
    hidden_size: int = 64  # tiny model width
    intermediate_size: int = 192  # tiny model MLP width
    num_hidden_layers: int = 2  # tiny model depth
    num_attention_heads: int = 4  # query heads; must divide hidden_size
    num_key_value_heads: int = 2  # key/value heads (GQA); must divide num_attention_heads
    rope_theta: float = 10000.0  # RoPE base frequency
    param_dtype: str = "float32"  # parameter storage dtype: float32 | bfloat16
    dtype: str = "float32"  # compute dtype: float32 | bfloat16


@dataclass
class EnvCfg:
    """The environment: a registered name and its static construction options."""

    name: str = "corridor"  # a name in bmrl.envs.ENVS: corridor | frozenlake | sokoban | toolchain
    options: dict[str, Any] = field(default_factory=dict)  # static env options, e.g. {length: 6, eps: 0.2}
    show_budget: bool = False  # show "Turns left: N" in every observation (the policy sees its cap)


@dataclass
class BudgetCfg:
    """Turn caps per rollout: fixed (budgets[0]), mix (budgets with probs), uniform (lo..hi)."""

    kind: str = "fixed"  # fixed | mix | uniform
    budgets: list[int] = field(default_factory=lambda: [8])  # turn caps; fixed takes exactly one
    probs: Optional[list[float]] = None  # mix only; null = uniform over budgets
    lo: int = 1  # uniform only: smallest cap
    hi: int = 8  # uniform only: largest cap
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
    """Behaviour cloning of eps-noisy oracle demonstrations (errors shown, recovery not)."""

    steps: int = 300  # optimizer steps
    batch_size: int = 32  # demonstrations per step
    noise: float = 0.25  # probability of a random wrong action in a demonstration turn
    demo_turns: int = 12  # turns per demonstration
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(lr=3e-3, warmup_steps=20))  # SFT optimizer


@dataclass
class TrainCfg:
    """Policy-gradient RL from the SFT base: grouped rollouts, advantages, PPO/PG updates."""

    steps: int = 40  # RL steps (one rollout batch + update each)
    tasks_per_step: int = 16  # distinct tasks per rollout batch
    group_size: int = 8  # attempts per task (batch = tasks_per_step * group_size)
    advantage: str = "grpo"  # grpo | rloo | reinforce
    loss: str = "ppo"  # ppo | pg
    epochs: int = 1  # passes over each rollout batch
    minibatches: int = 1  # minibatches per epoch; must divide the batch
    clip_eps: float = 0.2  # PPO ratio clip
    kl_coef: float = 0.0  # KL penalty to the frozen initial policy (0 = off)
    entropy_coef: float = 0.0  # entropy bonus (0 = off)
    aggregation: str = "token_mean"  # token_mean | seq_mean
    process_coef: float = 0.0  # weight of progress-delta (process) advantages; 0 = outcome only
    gamma: float = 1.0  # discount of per-turn process rewards, in (0, 1]
    max_nonfinite: int = 5  # stop after this many non-finite updates in a row
    remat: bool = False  # recompute decoder layers in the backward pass (less activation memory)
    microbatches: int = 1  # gradient accumulation: micro-batches per minibatch; must divide its rows
    f32_master: bool = False  # keep a float32 copy of the parameters in the optimizer (for param_dtype=bfloat16)
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(lr=1e-3))  # RL optimizer


@dataclass
class EvalCfg:
    """Pass@(K,T) evaluation on the held-out suite, and the decision-accuracy probe."""

    ts: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # turn budgets T of the surface; each <= rollout.max_turns
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # attempt counts K of the surface; each <= attempts
    attempts: int = 8  # n attempts per task (K <= n)
    num_tasks: int = 64  # held-out tasks evaluated
    every: int = 0  # evaluate every N train steps (0 = only at the end)
    mode: str = "exact"  # exact (run each T for real) | truncate (one run at max T, cut) | both
    temperature: float = 1.0  # sampling temperature during evaluation (0 = greedy)
    bootstrap: int = 1000  # bootstrap resamples for intervals (0 = none)
    probe_states: int = 256  # decision-accuracy probe set size


@dataclass
class DataCfg:
    """Task suites (TFDS, array_record) of level seeds: train seeds even, test seeds odd."""

    data_dir: Optional[str] = None  # TFDS data dir; null = <out_dir>/data
    train_size: int = 4096  # tasks in the training suite (even seeds)
    test_size: int = 256  # tasks in the held-out suite (odd seeds)


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
    inject_turns: list[int] = field(default_factory=lambda: [1])  # 1-based turns of the error-injection run ([] = none)
    inject_prob: float = 1.0  # probability of a forced wrong action at those turns
    probe_noise: float = 0.25  # noise of the oracle whose states form the decision-accuracy probe set
    window: int = 3  # turns allowed to get back on track after an error


@dataclass
class Config:
    """One experiment: every section, the seed and the output directory."""

    seed: int = 0  # PRNG seed of everything random in the run
    out_dir: str = "runs/default"  # where the run writes config.yaml, checkpoints, metrics, summary.json
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
    reproduce: ReproduceCfg = field(default_factory=ReproduceCfg)


# ---- loading: YAML layers + dotted overrides -> a typed Config --------------------------------------


def _type_name(hint: Any) -> str:
    """A reader's name for a field's type hint: 'int', 'list of int', 'float or null', 'mapping'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict or hint is dict:
        return "mapping"
    if dataclasses.is_dataclass(hint):
        return "section"
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def _hint(dotted: str, schema=Config) -> Any:
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


def _element_hint(hint: Any) -> Any:
    """The element type of a list hint (`Optional[list[X]]` included)."""
    for h in (hint, *typing.get_args(hint)):
        if typing.get_origin(h) is list:
            return typing.get_args(h)[0] if typing.get_args(h) else Any
    return hint


def _section_names(node) -> str:
    return ", ".join(f.name for f in dataclasses.fields(node))


def _omega_error(err: OmegaConfBaseException, schema=Config) -> ConfigError:
    """An OmegaConf refusal as a ConfigError naming the key, with the allowed keys or the expected type."""
    key = getattr(err, "full_key", None) or ""
    msg = str(err).splitlines()[0]
    if "not in" in msg and key:
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = _hint(parent, schema) if parent else schema
        if dataclasses.is_dataclass(node):
            msg = msg.rstrip(".") + f". Allowed keys{' in ' + parent if parent else ''}: {_section_names(node)}."
    elif key:
        hint = _hint(key, schema)
        if hint is not None:
            if re.search(r"\[\d+\]$", key):  # a list element: its element type
                hint = _element_hint(hint)
            msg = f"{msg.rstrip('.')}. Expected {_type_name(hint)}."
    return ConfigError(key, msg)


def _check_sections(layer: dict, schema, prefix: str = "") -> dict:
    """`layer` with empty sections dropped; a section given a non-mapping is refused by name."""
    out = {}
    for k, v in layer.items():
        hint = _hint(str(k), schema) if dataclasses.is_dataclass(schema) else None
        if dataclasses.is_dataclass(hint):
            if v is None:
                continue
            if not isinstance(v, dict):
                raise ConfigError(
                    prefix + str(k), f"is a section; give a mapping of its keys ({_section_names(hint)}), got {v!r}."
                )
            v = _check_sections(v, hint, f"{prefix}{k}.")
        elif typing.get_origin(hint) is dict and v is not None and not isinstance(v, dict):
            raise ConfigError(prefix + str(k), f"must be a mapping (e.g. {{name: value}}), got {v!r}.")
        out[k] = v
    return out


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict:
    """Dotted `key.subkey=value` strings -> a nested mapping (values parsed as YAML: 3, [2,8], null)."""
    for o in overrides:
        if "=" not in o or not o.split("=", 1)[0].strip():
            raise ConfigError(o, "an override must look like key.subkey=value (e.g. budget.kind=mix).")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)))
    except (OmegaConfBaseException, yaml.YAMLError, ValueError) as err:
        raise ConfigError("", f"cannot parse overrides {list(overrides)}: {str(err).splitlines()[0]}") from None


def _required_keys(layers: list[dict]) -> list[str]:
    """Dotted keys that a layer marks `???` (OmegaConf's MISSING) and no later layer sets.

    OmegaConf's merge keeps the schema default when a layer says `???`, so "required" is checked here,
    on the raw layers, before merging."""
    marked: dict[str, bool] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                marked[f"{prefix}{k}"] = v == "???"

    for layer in layers:
        walk(layer, "")
    return sorted(k for k, is_missing in marked.items() if is_missing)


def build(
    data: dict | list[dict] | None = None, overrides: list[str] | tuple[str, ...] = (), schema=Config
):
    """Merge `data` (a parsed YAML mapping, or a list of them applied in order) and dotted `overrides`
    onto `schema`, then validate. Every refusal is a ConfigError naming the key."""
    layers = list(data) if isinstance(data, (list, tuple)) else [data or {}]
    layers.append(parse_overrides(overrides))
    for layer in layers:
        if not isinstance(layer, dict):
            raise ConfigError("", f"a config must be a mapping of sections, got {type(layer).__name__}: {layer!r}.")
    layers = [_check_sections(layer, schema) for layer in layers]
    required = _required_keys(layers)
    if required:
        raise ConfigError(
            required[0], f"is required (the config file marks it ???); give it as an override, e.g. {required[0]}=VALUE."
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), *[OmegaConf.create(layer) for layer in layers])
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _omega_error(err, schema) from None
    if schema is Config:
        validate(cfg)
    return cfg


def read_yaml(path: str | os.PathLike) -> dict:
    """A YAML file's mapping ({} when empty); a missing file or bad YAML is a ConfigError."""
    if not os.path.isfile(path):
        raise ConfigError("", f"config file {str(path)!r} does not exist.")
    with open(path) as f:
        try:
            data = yaml.safe_load(f) or {}
        except yaml.YAMLError as err:
            raise ConfigError("", f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError("", f"{path} must hold a mapping of config sections, got {type(data).__name__}.")
    return data


def load(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a YAML config file (or only defaults) with dotted overrides (`budget.kind=mix`)."""
    return build(read_yaml(path) if path is not None else {}, overrides)


def to_dict(cfg: Config) -> dict:
    """A plain dict of `cfg` (for YAML/JSON dumps and checkpoints)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML; `load` of it gives back an equal Config."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)


def save(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML (creating the parent directory)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(to_yaml(cfg))


# ---- validation: values that type-check but cannot work ---------------------------------------------


def _one_of(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ConfigError(key, f"{value!r} is not allowed; choose one of: {', '.join(allowed)}.")


def _positive(cfg: Any, prefix: str, names: tuple[str, ...], minimum: int = 1) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value < minimum:
            raise ConfigError(f"{prefix}.{name}", f"must be >= {minimum}, got {value}.")


def _in_range(key: str, value: float, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
    if (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi):
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ConfigError(key, f"must be in {interval}, got {value}.")


def make_budget(b: BudgetCfg, prefix: str = "budget"):
    """The `bmrl.budget.Budget` of a budget section (raising ConfigError on a bad one).

    `prefix` is the section's dotted key, named in errors (e.g. `reproduce.variants.budgetmix`).
    """
    from bmrl import budget as budget_lib

    _one_of(f"{prefix}.kind", b.kind, budget_lib.KINDS)
    if b.probs is not None and b.kind != "mix":
        raise ConfigError(f"{prefix}.probs", f"applies to kind=mix only; remove it (or null it) for kind={b.kind}.")
    try:
        if b.kind == "fixed":
            if len(b.budgets) != 1:
                raise ConfigError(f"{prefix}.budgets", f"a fixed budget takes exactly one cap, got {b.budgets}.")
            return budget_lib.fixed(b.budgets[0])
        if b.kind == "mix":
            return budget_lib.mix(b.budgets, b.probs)
        return budget_lib.uniform(b.lo, b.hi)
    except budget_lib.BudgetError as err:
        field_ = "probs" if "probabilit" in str(err) else "lo" if b.kind == "uniform" else "budgets"
        raise ConfigError(f"{prefix}.{field_}", str(err)) from None


def check_reproduce(cfg: Config) -> None:
    """Refuse a `reproduce` section that cannot run (checked by `bmrl reproduce` before any work)."""
    rep = cfg.reproduce
    if not rep.seeds or len(set(rep.seeds)) != len(rep.seeds):
        raise ConfigError("reproduce.seeds", f"needs one or more distinct seeds, got {rep.seeds}.")
    if not rep.variants:
        raise ConfigError("reproduce.variants", "needs at least one RL budget variant.")
    for name, b in rep.variants.items():
        if name == "base" or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"reproduce.variants.{name}", "variant names are letters, digits, '_' or '-', and not 'base'.")
        cap = make_budget(b, f"reproduce.variants.{name}").max_cap
        if cap > cfg.rollout.max_turns:
            raise ConfigError(
                f"reproduce.variants.{name}",
                f"the largest cap {cap} exceeds rollout.max_turns={cfg.rollout.max_turns}; raise max_turns or lower the budget.",
            )
    for role in ("generous", "tight", "budgetmix"):
        if getattr(rep, role) not in rep.variants:
            raise ConfigError(f"reproduce.{role}", f"{getattr(rep, role)!r} is not a variant; variants are {sorted(rep.variants)}.")
    if rep.small_t not in cfg.eval.ts:
        raise ConfigError("reproduce.small_t", f"{rep.small_t} must be one of eval.ts={cfg.eval.ts}.")
    if bad := [t for t in rep.inject_turns if not 1 <= t <= cfg.rollout.max_turns]:
        raise ConfigError("reproduce.inject_turns", f"1-based turns in 1..rollout.max_turns={cfg.rollout.max_turns}; got {bad}.")
    _in_range("reproduce.inject_prob", rep.inject_prob, 0, 1)
    _in_range("reproduce.probe_noise", rep.probe_noise, 0, 1, hi_open=True)
    _positive(rep, "reproduce", ("window",))


def _env_options_error(name: str, options: dict) -> str | None:
    """Build env `name` with a character tokenizer to run its own option checks; the error or None."""
    from bmrl.envs import _CharTokenizer, env_class

    try:
        env_class(name)(_CharTokenizer(), **options)
    except (ValueError, TypeError) as err:
        return str(err)
    return None


_ENV_CHECKS: dict[str, str | None] = {}


def _check_env(cfg: Config, max_cap: int) -> None:
    from bmrl.envs import ENVS, env_class

    e = cfg.env
    _one_of("env.name", e.name, tuple(ENVS))
    try:
        cls = env_class(e.name)
    except ValueError as err:
        raise ConfigError("env.name", str(err)) from None
    if "show_budget" in e.options:
        raise ConfigError("env.options.show_budget", "set env.show_budget instead (one switch for env and rollout).")
    valid = {k: v for k, v in {**cls.COMMON_OPTIONS, **cls.OPTIONS}.items() if k != "show_budget"}
    for name in e.options:
        if name not in valid:
            allowed = ", ".join(f"{k} (default {v!r})" for k, v in valid.items())
            raise ConfigError(f"env.options.{name}", f"is not an option of env {e.name!r}; valid options: {allowed}.")
    memo = repr((e.name, sorted(e.options.items())))
    if memo not in _ENV_CHECKS:
        _ENV_CHECKS[memo] = _env_options_error(e.name, e.options)
    if _ENV_CHECKS[memo]:
        msg = _ENV_CHECKS[memo]
        name = next((n for n in e.options if re.search(rf"\b{re.escape(n)}\b", msg)), None)
        raise ConfigError(f"env.options.{name}" if name else "env.options", msg)
    # bmrl.policy.make_env raises the default number table to max_turns; an explicit one must reach every cap.
    if e.show_budget and "max_budget" in e.options and max_cap > int(e.options["max_budget"]):
        max_budget = int(e.options["max_budget"])
        raise ConfigError(
            "env.options.max_budget",
            f"{max_budget} is below the largest cap shown ({max_cap}); set env.options.max_budget >= {max_cap}.",
        )


def _check_model(m: ModelCfg) -> None:
    _one_of("model.param_dtype", m.param_dtype, ("float32", "bfloat16"))
    _one_of("model.dtype", m.dtype, ("float32", "bfloat16"))
    if m.path is not None:
        if not m.path.strip():
            raise ConfigError("model.path", "is empty; give a local Hugging Face directory or null for a tiny model.")
        return
    _one_of("model.model_type", m.model_type, ("llama", "qwen2"))
    _positive(m, "model", ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads"))
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError("model.num_attention_heads", f"{m.num_attention_heads} does not divide hidden_size={m.hidden_size}.")
    if m.num_attention_heads % m.num_key_value_heads:
        raise ConfigError(
            "model.num_key_value_heads", f"{m.num_key_value_heads} does not divide num_attention_heads={m.num_attention_heads}."
        )


def _check_optim(key: str, o: OptimCfg) -> None:
    _one_of(f"{key}.schedule", o.schedule, ("cosine", "constant"))
    if o.lr <= 0:
        raise ConfigError(f"{key}.lr", f"must be > 0, got {o.lr}.")
    _positive(o, key, ("warmup_steps",), minimum=0)
    _in_range(f"{key}.min_lr_ratio", o.min_lr_ratio, 0, 1)
    _in_range(f"{key}.b1", o.b1, 0, 1, hi_open=True)
    _in_range(f"{key}.b2", o.b2, 0, 1, hi_open=True)
    for name in ("weight_decay", "max_grad_norm"):
        if getattr(o, name) < 0:
            raise ConfigError(f"{key}.{name}", f"must be >= 0, got {getattr(o, name)}.")
    if o.eps <= 0:
        raise ConfigError(f"{key}.eps", f"must be > 0, got {o.eps}.")


def validate(cfg: Config) -> None:
    """Refuse values that type-check but cannot work, naming the key and what is allowed.

    Static checks only; what needs the tokenizer (does the smallest cap fit the context buffer?) is
    `bmrl.policy.check_fits`, which runners call once the environment is built, before any work.
    """
    from bmrl.learn import ADVANTAGES, LOSSES  # registries by name

    if not cfg.out_dir.strip():
        raise ConfigError("out_dir", "is empty; give the directory the run writes to.")
    _check_model(cfg.model)
    b = make_budget(cfg.budget)
    r = cfg.rollout
    _positive(r, "rollout", ("max_turns", "max_reply_tokens", "max_len"))
    if b.max_cap > r.max_turns:
        raise ConfigError(
            "budget", f"the largest cap {b.max_cap} exceeds rollout.max_turns={r.max_turns}; raise max_turns or lower the budget."
        )
    if r.temperature < 0:
        raise ConfigError("rollout.temperature", f"must be >= 0 (0 = greedy), got {r.temperature}.")
    _positive(r, "rollout", ("top_k",), minimum=0)
    _in_range("rollout.top_p", r.top_p, 0, 1, lo_open=True)
    _check_env(cfg, max(b.max_cap, max(cfg.eval.ts, default=1)))
    t = cfg.train
    _positive(t, "train", ("tasks_per_step", "group_size", "epochs", "minibatches", "max_nonfinite"))
    _positive(t, "train", ("steps",), minimum=0)
    _one_of("train.advantage", t.advantage, tuple(ADVANTAGES))
    _one_of("train.loss", t.loss, tuple(LOSSES))
    _one_of("train.aggregation", t.aggregation, ("token_mean", "seq_mean"))
    if (t.tasks_per_step * t.group_size) % t.minibatches:
        raise ConfigError("train.minibatches", f"{t.minibatches} does not divide the batch of {t.tasks_per_step * t.group_size} rollouts.")
    _in_range("train.gamma", t.gamma, 0, 1, lo_open=True)
    if t.clip_eps <= 0:
        raise ConfigError("train.clip_eps", f"must be > 0, got {t.clip_eps}.")
    for name in ("kl_coef", "entropy_coef", "process_coef"):
        if getattr(t, name) < 0:
            raise ConfigError(f"train.{name}", f"must be >= 0 (0 = off), got {getattr(t, name)}.")
    for key, o in (("sft.optim", cfg.sft.optim), ("train.optim", t.optim)):
        _check_optim(key, o)
    _in_range("sft.noise", cfg.sft.noise, 0, 1, hi_open=True)
    _positive(cfg.sft, "sft", ("batch_size", "demo_turns"))
    _positive(cfg.sft, "sft", ("steps",), minimum=0)
    e = cfg.eval
    _one_of("eval.mode", e.mode, ("exact", "truncate", "both"))
    _positive(e, "eval", ("attempts", "num_tasks"))
    _positive(e, "eval", ("every", "bootstrap", "probe_states"), minimum=0)
    if not e.ts or min(e.ts) < 1 or max(e.ts) > r.max_turns:
        raise ConfigError("eval.ts", f"every T must be in [1, rollout.max_turns={r.max_turns}], got {e.ts}.")
    if not e.ks or min(e.ks) < 1 or max(e.ks) > e.attempts:
        raise ConfigError("eval.ks", f"every K must be in [1, eval.attempts={e.attempts}], got {e.ks}.")
    if e.temperature < 0:
        raise ConfigError("eval.temperature", f"must be >= 0 (0 = greedy), got {e.temperature}.")
    _positive(cfg.data, "data", ("train_size", "test_size"))
    _positive(cfg.checkpoint, "checkpoint", ("every", "keep"))
    sizes = {name: getattr(cfg.mesh, name) for name in ("data", "fsdp", "tensor")}
    for name, size in sizes.items():
        if size == 0 or size < -1:
            raise ConfigError(f"mesh.{name}", f"must be >= 1, or -1 for all remaining devices; got {size}.")
    if list(sizes.values()).count(-1) > 1:
        raise ConfigError("mesh", f"at most one axis may be -1 (all remaining devices), got {sizes}.")


# ---- documentation: the schema as markdown (docs/configs.md) ----------------------------------------


def _field_comments(cls) -> dict[str, str]:
    """The trailing `# comment` of each field line in `cls`'s source: the field's documentation."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = comments.get(node.end_lineno) or comments.get(node.lineno)
            if text:
                out[node.target.id] = text
    return out


def _plain_data(value: Any) -> Any:
    """Dataclasses (also inside dicts and lists) as plain dicts, for YAML."""
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_data(v) for v in value]
    return value


def _fmt_default(value: Any) -> str:
    if value is None:
        return "null"
    return yaml.safe_dump(_plain_data(value), default_flow_style=True).strip().removesuffix("\n...")


def schema_markdown(cfg: Any = None, prefix: str = "") -> str:
    """Every section and key of the schema with type, default and meaning, as markdown tables."""
    cfg = Config() if cfg is None else cfg
    cls = type(cfg)
    hints, notes = typing.get_type_hints(cls), _field_comments(cls)
    rows, sections = [], []
    for f in dataclasses.fields(cls):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            sections.append(schema_markdown(value, f"{prefix}{f.name}."))
            continue
        default = _fmt_default(value).replace("|", "\\|")
        meaning = notes.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{prefix}{f.name}` | {_type_name(hints[f.name])} | `{default}` | {meaning} |")
    title = prefix.rstrip(".") or "top level"
    doc = cls.__doc__ or ""
    text = f"### `{title}`\n\n"
    if doc and not doc.startswith(cls.__name__ + "("):  # dataclasses invent a signature docstring
        text += inspect.cleandoc(doc) + "\n\n"
    if rows:
        text += "| key | type | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
    return text + "".join(sections)


DOC_BEGIN, DOC_END = "<!-- schema:begin (generated by `bmrl config --docs FILE`) -->", "<!-- schema:end -->"


def update_docs(path: str | os.PathLike) -> bool:
    """Rewrite the generated schema block of `path` (between DOC_BEGIN and DOC_END); True if it changed."""
    with open(path) as f:
        text = f.read()
    if DOC_BEGIN not in text or DOC_END not in text:
        raise ConfigError("", f"{path} has no generated block; add the lines {DOC_BEGIN} and {DOC_END}.")
    head, rest = text.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    new = f"{head}{DOC_BEGIN}\n\n{schema_markdown().strip()}\n\n{DOC_END}{tail}"
    if new != text:
        with open(path, "w") as f:
            f.write(new)
    return new != text
