"""Validation: every value of a `Config` is checked here, once, with the key, the value and the fix.

`validate(cfg)` refuses what type-checks but cannot work (NaN, a cap above `max_turns`, a mix whose
probabilities do not sum to 1, an unknown algorithm name); `check_reproduce` the study's section;
`check_fits` the facts that need the built tokenizer and environment (does the context buffer hold
the prompt and the turns of the smallest cap? does a reply hold the longest action?), which
`bmrl.assembly.build_run` checks before a run writes anything. `check_caps` is the one check of turn
caps against `rollout.max_turns`, and `make_budget` the one conversion of a budget section into a
`bmrl.budget.Budget`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from bmrl.config.schema import (
    BudgetCfg,
    Config,
    ConfigError,
    FormatCfg,
    ModelCfg,
    OptimCfg,
)
from bmrl.model.families import SUPPORTED_MODEL_TYPES

FLOAT32_MAX = 3.4028234663852886e38
INT_MAX = 2**31 - 1  # int fields end up in int32 arrays (caps, sizes, steps)
SEED_MAX = 2**31 - 1  # jax.random.key keeps 32 bits without x64: larger seeds would collide


def _one_of(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise ConfigError(key, f"{value!r} is not allowed; choose one of: {', '.join(allowed)}.")


# Options the trainer passes an advantage estimator or a loss itself (from train.*): not settable as options.
TRAINER_PASSES = ("rewards", "group_size", "logp_new", "logp_old", "advantages", "loss_mask", "logp_ref", "entropy",
                  "clip_eps", "kl_coef", "entropy_coef", "aggregation", "clip")


def check_options(key: str, fn: Any, options: dict, taken: tuple[str, ...] = ()) -> None:
    """Refuse an option that `fn` (a registered estimator or loss) does not take as a keyword with a
    default, or that the trainer passes itself (`taken`); what is allowed comes from its signature."""
    import inspect

    params = inspect.signature(fn).parameters.values()
    allowed = [p.name for p in params if p.default is not inspect.Parameter.empty and p.name not in taken
               and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for name, value in dict(options or {}).items():
        if name not in allowed:
            raise ConfigError(f"{key}.{name}", f"is not an option of {fn.__name__}; its options: "
                              f"{', '.join(allowed) or 'none'} (set the shared ones under train.*).")
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}.{name}", f"must be a number, a bool or text, got {value!r}.")


def _check_advantage_values(options: dict) -> None:
    """The values of the estimators' options, by name (grpo, gigpo): normalize_std a bool, eps > 0,
    gamma in [0, 1] (gigpo's step discount), step_weight >= 0 (gigpo's weight of the step advantage)."""
    ranges = {"eps": (0, math.inf, True, True), "gamma": (0, 1, False, False), "step_weight": (0, math.inf, False, True)}
    for name, value in dict(options or {}).items():
        key = f"train.advantage_options.{name}"
        if name == "normalize_std" and not isinstance(value, bool):
            raise ConfigError(key, f"must be true or false, got {value!r}.")
        if name in ranges:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(key, f"must be a number, got {value!r}.")
            lo, hi, lo_open, hi_open = ranges[name]
            _in_range(key, value, lo, hi, lo_open=lo_open, hi_open=hi_open)


def _positive(cfg: Any, prefix: str, names: tuple[str, ...], minimum: int = 1) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value < minimum:  # None: a platform default (`bmrl.assembly.settings.rollout_config`)
            raise ConfigError(f"{prefix}.{name}", f"must be >= {minimum}, got {value}.")


def _in_range(key: str, value: float, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
    if not math.isfinite(value) or (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi):
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ConfigError(key, f"must be in {interval}, got {value}.")


def check_caps(key: str, caps, max_turns: int, fix: str = "raise rollout.max_turns or lower the caps") -> None:
    """Refuse turn caps (budgets, eval.ts, 1-based injection turns) outside [1, rollout.max_turns]."""
    caps = sorted(set(caps))
    if not caps:
        raise ConfigError(key, "is empty; give at least one turn cap.")
    if min(caps) < 1 or max(caps) > max_turns:
        above = f" (the largest cap {max(caps)} exceeds rollout.max_turns={max_turns})" if max(caps) > max_turns else ""
        raise ConfigError(key, f"every turn must be in [1, rollout.max_turns={max_turns}], got {caps}{above}; {fix}.")


def _cap_range(budget) -> tuple[int, int]:
    from bmrl.budget import cap_range  # bmrl.budget imports jax: not when the config is read (CLI start-up)

    return cap_range(budget)


def make_budget(b: BudgetCfg, prefix: str = "budget"):
    """The `bmrl.budget.Budget` of a budget section (raising ConfigError on a bad one).

    `prefix` is the section's dotted key, named in errors (e.g. `reproduce.variants.budgetmix`).
    """
    from bmrl import budget as budget_lib

    _one_of(f"{prefix}.kind", b.kind, tuple(budget_lib.SAMPLERS))
    takes = budget_lib.fields(b.kind)
    shared = ("budgets", "probs", "lo", "hi")
    for name in shared:  # a key that is null by default applies only to the kinds that read it
        if name not in takes and getattr(BudgetCfg(), name) is None and getattr(b, name) is not None:
            readers = [k for k in budget_lib.SAMPLERS if name in budget_lib.fields(k)]
            raise ConfigError(f"{prefix}.{name}", f"applies to kind={'|'.join(readers)} only; remove it (or null it) "
                              f"for kind={b.kind}.")
    own = [n for n in takes if n not in shared]
    for name in b.options:
        if name not in own:
            raise ConfigError(f"{prefix}.options.{name}", f"is not an option of budget kind {b.kind}; its options: "
                              f"{', '.join(own) or 'none'}.")
    values = {n: getattr(b, n) for n in takes if n in shared} | dict(b.options)
    try:
        return budget_lib.make(b.kind, **values)
    except TypeError as err:  # a required option of the sampler is missing
        raise ConfigError(f"{prefix}.options", f"budget kind {b.kind} needs {', '.join(own)}: {err}.") from None
    except budget_lib.BudgetError as err:
        field_ = err.field if err.field in shared else f"options.{err.field}"
        raise ConfigError(f"{prefix}.{field_}", str(err)) from None


def check_numbers(node: Any, key: str = "") -> None:
    """Refuse non-finite floats (NaN, inf), floats beyond float32 (they become inf on device) and ints
    beyond int32, anywhere in `node` (a config, section, mapping or list)."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            check_numbers(getattr(node, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(node, dict):
        for k, v in node.items():
            check_numbers(v, f"{key}.{k}")
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            check_numbers(v, f"{key}[{i}]")
    elif isinstance(node, float) and not (math.isfinite(node) and abs(node) <= FLOAT32_MAX):
        raise ConfigError(key, f"{node} is not a finite float32 number; give a value with |x| <= 3.4e38 (no nan, no inf).")
    elif isinstance(node, int) and not isinstance(node, bool) and abs(node) > INT_MAX:
        raise ConfigError(key, f"{node} is out of range; give an integer with |x| <= {INT_MAX}.")


def check_seed(key: str, seed: int) -> None:
    if not 0 <= seed <= SEED_MAX:
        raise ConfigError(
            key, f"{seed} is out of range; give a seed in 0..{SEED_MAX} (PRNG keys keep 32 bits, so larger seeds collide)."
        )


def check_reproduce(cfg: Config) -> dict:
    """Refuse a `reproduce` section that cannot run (checked by `bmrl reproduce` before any work);
    returns the `Budget` of each variant by name."""
    rep = cfg.reproduce
    if not rep.seeds or len(set(rep.seeds)) != len(rep.seeds):
        raise ConfigError("reproduce.seeds", f"needs one or more distinct seeds, got {rep.seeds}.")
    for seed in rep.seeds:
        check_seed("reproduce.seeds", seed)
    if not rep.variants:
        raise ConfigError("reproduce.variants", "needs at least one RL budget variant.")
    budgets = {}
    for name, coef in rep.process.items():
        if name not in rep.variants:
            raise ConfigError(f"reproduce.process.{name}", f"is not a variant; variants are {sorted(rep.variants)}.")
        _in_range(f"reproduce.process.{name}", float(coef), 0, 10, lo_open=True)
    from bmrl.learn import ADVANTAGES

    for name, estimator in rep.advantage.items():
        if name not in rep.variants:
            raise ConfigError(f"reproduce.advantage.{name}", f"is not a variant; variants are {sorted(rep.variants)}.")
        _one_of(f"reproduce.advantage.{name}", estimator, tuple(ADVANTAGES))
    for name, b in rep.variants.items():
        if name == "base" or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"reproduce.variants.{name}", "variant names are letters, digits, '_' or '-', and not 'base'.")
        budget = budgets[name] = make_budget(b, f"reproduce.variants.{name}")
        check_caps(f"reproduce.variants.{name}", _cap_range(budget), cfg.rollout.max_turns, "raise max_turns or lower the budget")
    for role in ("generous", "tight", "budgetmix"):
        if getattr(rep, role) not in rep.variants:
            raise ConfigError(f"reproduce.{role}", f"{getattr(rep, role)!r} is not a variant; variants are {sorted(rep.variants)}.")
    if rep.small_t not in cfg.eval.ts:
        raise ConfigError("reproduce.small_t", f"{rep.small_t} must be one of eval.ts={cfg.eval.ts}.")
    check_probes(rep.inject_turns, rep.inject_prob, rep.probe_noise, rep.window, cfg.rollout.max_turns)
    return budgets


PROBE_KEYS = ("reproduce.inject_turns", "reproduce.inject_prob", "reproduce.probe_noise", "reproduce.window")


def check_probes(inject_turns, inject_prob: float, probe_noise: float, window: int, max_turns: int,
                 keys: tuple[str, str, str, str] = PROBE_KEYS) -> None:
    """The error-injection and probe settings, of the `reproduce` section or of `bmrl eval`'s flags
    (`keys` name them): 1-based turns within the turn buffer, probabilities, a window >= 1."""
    if inject_turns:
        check_caps(keys[0], inject_turns, max_turns, "give 1-based turns, or none")
    _in_range(keys[1], inject_prob, 0, 1)
    _in_range(keys[2], probe_noise, 0, 1, hi_open=True)
    if window < 1:
        raise ConfigError(keys[3], f"must be >= 1 (turns allowed to get back on track), got {window}.")


def _env_options_error(name: str, options: dict) -> str | None:
    """Build env `name` with a character tokenizer to run its own option checks; the error or None."""
    from bmrl.envs import _CharTokenizer, env_class

    try:
        env_class(name)(_CharTokenizer(), **options)
    except (ValueError, TypeError) as err:
        return str(err)
    return None


ENV_KINDS = ("jax", "python")


def is_python_env(cfg: Config) -> bool:
    """Whether `cfg`'s env is a Python one (`env.kind=python`) rather than a built-in JAX one: the one
    place bmrl decides the env kind. `_check_env` checks each kind's keys by it, `load` anchors a Python
    env's paths by it, `bmrl.assembly.player_class` picks the player by it."""
    return cfg.env.kind == "python"


def _check_python_env(cfg: Config) -> None:
    """A python-kind env: an entry that looks like `module:factory`, a task file, host settings.
    Importing the entry and reading the tasks are runtime facts (`bmrl.assembly.python_env`)."""
    e = cfg.env
    if e.entry is None or not e.entry.strip():
        raise ConfigError("env.entry", "is required with env.kind=python; give 'package.module:factory' (e.g. "
                          "bmrl.envs.python.tools:ToolUse), a callable returning a new environment.")
    module, sep, attr = e.entry.partition(":")
    if not sep or not module.strip() or not attr.strip() or not all(p.isidentifier() for p in module.split(".")) \
            or not attr.isidentifier():
        raise ConfigError("env.entry", f"{e.entry!r} must look like 'package.module:factory' (a dotted module, a "
                          "colon, a name in it).")
    if cfg.data.tasks is None or not cfg.data.tasks.strip():
        raise ConfigError("data.tasks", "is required with env.kind=python; give a JSONL file with one task (a JSON "
                          "object, passed to reset as options) a line.")
    from bmrl.config.schema import EnvCfg

    if e.name != EnvCfg().name:
        raise ConfigError("env.name", f"names a built-in JAX env ({e.name!r}); with env.kind=python the environment is "
                          "env.entry: remove env.name.")
    if cfg.rollout.history_turns is not None:
        raise ConfigError("rollout.history_turns", f"{cfg.rollout.history_turns}: a history window runs in the compiled "
                          "loop of JAX envs only; a Python env keeps the whole episode: set it null.")
    if cfg.format.history != "whole":
        raise ConfigError("format.history", f"{cfg.format.history}: following the chat template's history rewrite runs "
                          "in the compiled loop of JAX envs only; a Python env keeps every reply whole: set it whole.")
    if e.show_budget:
        raise ConfigError("env.show_budget", "applies to JAX envs (they render the cap); with env.kind=python "
                          "set it false and show the budget from your environment if it should see one.")
    if not e.step_timeout_s > 0:
        raise ConfigError("env.step_timeout_s", f"must be > 0 seconds, got {e.step_timeout_s}.")
    _positive(e, "env", ("workers", "pipeline_groups"))
    from bmrl.rollout.host import ON_FAULT  # what a fault of user code does, as the host loop knows it

    _one_of("env.on_fault", e.on_fault, ON_FAULT)


def _check_env(cfg: Config, max_cap: int) -> None:
    from bmrl.envs import ENVS, env_class

    e = cfg.env
    _one_of("env.kind", e.kind, ENV_KINDS)
    if is_python_env(cfg):
        return _check_python_env(cfg)
    for key, value in (("env.entry", e.entry), ("env.path", e.path), ("data.tasks", cfg.data.tasks)):
        if value is not None:
            raise ConfigError(key, f"applies to env.kind=python only; remove it, or set env.kind=python "
                              f"(env.kind is {e.kind!r}).")
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
    msg = _env_options_error(e.name, e.options)
    if msg:
        name = next((n for n in e.options if re.search(rf"\b{re.escape(n)}\b", msg)), None)
        raise ConfigError(f"env.options.{name}" if name else "env.options", msg)
    # bmrl.assembly.make_env raises the default number table to max_turns; an explicit one must reach every cap.
    if e.show_budget and "max_budget" in e.options and max_cap > int(e.options["max_budget"]):
        max_budget = int(e.options["max_budget"])
        raise ConfigError(
            "env.options.max_budget",
            f"{max_budget} is below the largest cap shown ({max_cap}); set env.options.max_budget >= {max_cap}.",
        )


def _check_lora(lora) -> None:
    from bmrl.model.lora import TARGETS  # the projections an adapter may sit on

    if lora.rank < 0:
        raise ConfigError("model.lora.rank", f"must be >= 0 (0 = no LoRA), got {lora.rank}.")
    if lora.alpha <= 0:
        raise ConfigError("model.lora.alpha", f"must be > 0, got {lora.alpha}.")
    _in_range("model.lora.dropout", lora.dropout, 0, 1, hi_open=True)
    if not lora.targets:
        raise ConfigError("model.lora.targets", f"is empty; name projections among {', '.join(TARGETS)}.")
    for target in lora.targets:
        _one_of("model.lora.targets", target, TARGETS)
    if len(set(lora.targets)) != len(lora.targets):
        raise ConfigError("model.lora.targets", f"names a projection twice: {list(lora.targets)}.")


def _check_model(m: ModelCfg) -> None:
    _check_lora(m.lora)
    _one_of("model.param_dtype", m.param_dtype, ("float32", "bfloat16"))
    _one_of("model.dtype", m.dtype, ("float32", "bfloat16"))
    if m.path is not None:
        if not m.path.strip():
            raise ConfigError("model.path", "is empty; give a local Hugging Face directory or null for a tiny model.")
        return
    _one_of("model.model_type", m.model_type, SUPPORTED_MODEL_TYPES)
    if m.sliding_window is not None and m.sliding_window <= 0:
        raise ConfigError("model.sliding_window", f"{m.sliding_window} must be a positive number of positions, or null.")
    _positive(m, "model", ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads"))
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError("model.num_attention_heads", f"{m.num_attention_heads} does not divide hidden_size={m.hidden_size}.")
    if m.num_attention_heads % m.num_key_value_heads:
        raise ConfigError(
            "model.num_key_value_heads", f"{m.num_key_value_heads} does not divide num_attention_heads={m.num_attention_heads}."
        )
    if m.rope_theta <= 0:
        raise ConfigError("model.rope_theta", f"must be > 0, got {m.rope_theta}.")


def _check_format(f: FormatCfg) -> None:
    from bmrl.formats import HISTORIES, REPLY_FORMATS

    _one_of("format.kind", f.kind, REPLY_FORMATS)
    _one_of("format.history", f.history, HISTORIES)
    if f.system_prompt is not None and not isinstance(f.system_prompt, str):
        raise ConfigError("format.system_prompt", f"must be text or null, got {type(f.system_prompt).__name__} "
                          f"{f.system_prompt!r}; quote it in YAML.")
    if f.system_prompt is not None and not f.system_prompt.strip():
        raise ConfigError("format.system_prompt", "is blank; give the preamble text, or null for none.")


def _check_optim(key: str, o: OptimCfg) -> None:
    from bmrl.learn.optim import SCHEDULES  # the schedule registry

    _one_of(f"{key}.schedule", o.schedule, SCHEDULES)
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

    Static checks only; what needs the tokenizer and the environment is `check_fits`, which
    `bmrl.assembly.build_run` runs before a run writes anything.
    """
    from bmrl.eval.evaluate import MODES  # the registries of allowed values, read where they live
    from bmrl.learn import ADVANTAGES, LOSSES
    from bmrl.learn.losses import AGGREGATIONS

    check_seed("seed", cfg.seed)
    check_numbers(cfg)
    if not cfg.out_dir.strip():
        raise ConfigError("out_dir", "is empty; give the directory the run writes to.")
    _check_model(cfg.model)
    r = cfg.rollout
    _positive(r, "rollout", ("max_turns", "max_reply_tokens", "max_len"))
    b = make_budget(cfg.budget)
    check_caps("budget", _cap_range(b), r.max_turns, "raise max_turns or lower the budget")
    if r.temperature < 0:
        raise ConfigError("rollout.temperature", f"must be >= 0 (0 = greedy), got {r.temperature}.")
    _positive(r, "rollout", ("top_k", "compact_min_rows", "attention_block"), minimum=0)
    _positive(r, "rollout", ("compact_steps", "history_turns"))
    _in_range("rollout.top_p", r.top_p, 0, 1, lo_open=True)
    _check_format(cfg.format)
    e = cfg.eval
    check_caps("eval.ts", e.ts, r.max_turns, "every T of the surface must be a cap the rollout can run")
    _check_env(cfg, max(_cap_range(b)[1], max(e.ts)))
    t = cfg.train
    _positive(t, "train", ("tasks_per_step", "group_size", "epochs", "minibatches", "max_nonfinite"))
    _positive(t, "train", ("steps", "oversample", "dead_after"), minimum=0)
    _in_range("train.dead_invalid_rise", t.dead_invalid_rise, 0, 1, lo_open=True)
    _one_of("train.advantage", t.advantage, tuple(ADVANTAGES))
    _one_of("train.loss", t.loss, tuple(LOSSES))
    _one_of("train.aggregation", t.aggregation, AGGREGATIONS)
    check_options("train.advantage_options", ADVANTAGES[t.advantage], t.advantage_options, TRAINER_PASSES)
    _check_advantage_values(t.advantage_options)
    check_options("train.loss_options", LOSSES[t.loss], t.loss_options, TRAINER_PASSES)
    if (t.tasks_per_step * t.group_size) % t.minibatches:
        raise ConfigError("train.minibatches", f"{t.minibatches} does not divide the batch of {t.tasks_per_step * t.group_size} rollouts.")
    _positive(t, "train", ("microbatches",))
    rows = t.tasks_per_step * t.group_size // t.minibatches
    if rows % t.microbatches:
        raise ConfigError("train.microbatches", f"{t.microbatches} does not divide a minibatch of {rows} rollouts; "
                          "choose a divisor of tasks_per_step * group_size / minibatches.")
    _in_range("train.gamma", t.gamma, 0, 1, lo_open=True)
    if t.clip_eps <= 0:
        raise ConfigError("train.clip_eps", f"must be > 0, got {t.clip_eps}.")
    for name in ("kl_coef", "entropy_coef", "process_coef"):
        if getattr(t, name) < 0:
            raise ConfigError(f"train.{name}", f"must be >= 0 (0 = off), got {getattr(t, name)}.")
    for key, o in (("sft.optim", cfg.sft.optim), ("train.optim", t.optim)):
        _check_optim(key, o)
    _in_range("sft.noise", cfg.sft.noise, 0, 1, hi_open=True)
    _in_range("sft.recovery", cfg.sft.recovery, 0, 1)
    _in_range("sft.checkpoint_minutes", cfg.sft.checkpoint_minutes, 0, math.inf, hi_open=True)
    _positive(cfg.sft, "sft", ("batch_size", "demo_turns"))
    _positive(cfg.sft, "sft", ("steps",), minimum=0)
    _one_of("eval.mode", e.mode, MODES)
    _positive(e, "eval", ("attempts", "num_tasks"))
    _positive(e, "eval", ("every", "bootstrap", "probe_states"), minimum=0)
    if not e.ks or min(e.ks) < 1 or max(e.ks) > e.attempts:
        raise ConfigError("eval.ks", f"every K must be in [1, eval.attempts={e.attempts}], got {e.ks}.")
    if e.temperature < 0:
        raise ConfigError("eval.temperature", f"must be >= 0 (0 = greedy), got {e.temperature}.")
    _positive(cfg.data, "data", ("train_size", "val_size", "test_size"))
    _positive(cfg.checkpoint, "checkpoint", ("every", "keep"))
    sizes = {name: getattr(cfg.mesh, name) for name in ("data", "fsdp", "tensor")}
    for name, size in sizes.items():
        if size == 0 or size < -1:
            raise ConfigError(f"mesh.{name}", f"must be >= 1, or -1 for all remaining devices; got {size}.")
    if list(sizes.values()).count(-1) > 1:
        raise ConfigError("mesh", f"at most one axis may be -1 (all remaining devices), got {sizes}.")
    if cfg.mesh.device_memory_gb < 0:
        raise ConfigError("mesh.device_memory_gb", f"must be >= 0 (0 = ask the device), got {cfg.mesh.device_memory_gb}.")
