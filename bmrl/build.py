"""From a `Config` to the objects a run needs, each library type built from its section in one function.

    run = build_run(cfg)                       # tokenizer, env, format (the `format` section), budget, rollout configs, mesh:
                                               # built once, every runtime fact checked, nothing written
    policy = new_policy(cfg, run.tokenizer)    # or: policy, tokenizer = load_policy(cfg.model.path)
    tasks = split_tasks(cfg, "test", cfg.eval.num_tasks)

`build_run` is what a command calls before it writes anything, and what it passes down (train, SFT
and evaluation take the bundle instead of rebuilding its parts). Every problem a user can fix in the
config is a `ConfigError` naming the key (exit status 2 in the CLI).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from bmrl.config import (
    Config,
    ConfigError,
    check_demos,
    check_fits,
    check_reproduce,
    fitting_cap,
    make_budget,
)

__all__ = [
    "Run",
    "build_reproduce_run",
    "build_run",
    "build_tokenizer",
    "check_fits",
    "data_dir",
    "eval_split",
    "fitting_cap",
    "host_config",
    "load_policy",
    "make_budget",
    "make_env",
    "mesh_config",
    "model_config",
    "new_policy",
    "python_parts",
    "python_sizes",
    "python_splits",
    "rollout_config",
    "run_format",
    "run_splits",
    "split_tasks",
    "suite_line",
    "suite_sizes",
    "suite_summary",
]

def build_tokenizer(cfg: Config, parts: tuple | None = None):
    """The run's tokenizer: the HF directory's when `model.path` is set, else a tiny byte-level BPE
    trained on the environment's own text with `model.vocab_size` entries: a JAX env's fragments
    (`bmrl.envs.corpus`); a Python env's instructions, first observations over the tasks (the first
    `CORPUS_TASKS`, reset seed = task index) and action strings.

    With `format.kind=think_answer` the tiny tokenizer also gets the think/answer tags as special
    tokens (`bmrl.formats.add_tag_tokens`): short replies, and tags that never merge with the text.
    Deterministic: the same env (and tasks), vocab size and format kind always give the same vocabulary.
    `parts`: a Python env's `python_parts(cfg)` when the caller has them already (read once per run).
    """
    if cfg.model.path is not None:
        return _hf_tokenizer(cfg.model.path)
    tokenizer = _tiny_tokenizer(cfg, parts)
    if cfg.format.kind == "think_answer":
        from bmrl.formats import add_tag_tokens

        add_tag_tokens(tokenizer)
    return tokenizer


def _tiny_tokenizer(cfg: Config, parts: tuple | None):
    from bmrl.envs import corpus
    from bmrl.model.tokenizer import train_tiny_tokenizer

    if cfg.env.kind == "python":
        from bmrl.rollout.pyenv import DEFAULT_INSTRUCTIONS

        factory, _, observations = parts or python_parts(cfg)
        probe = factory()
        texts = [str(getattr(probe, "instructions", None) or DEFAULT_INSTRUCTIONS), *observations,
                 *(str(a) for a in (getattr(probe, "action_strings", None) or ()))]
    else:
        try:
            texts = corpus([cfg.env.name], observations=False)
        except ValueError as err:
            raise ConfigError("env.name", str(err)) from None
    try:
        return train_tiny_tokenizer(texts, vocab_size=cfg.model.vocab_size)
    except ValueError as err:
        raise ConfigError("model.vocab_size", str(err)) from None


def model_config(cfg: Config, tokenizer):
    """The `ModelConfig` of a tiny policy from the `model` section (vocab at least the tokenizer's)."""
    from bmrl.model.config import ConfigError as ModelConfigError
    from bmrl.model.config import ModelConfig

    m = cfg.model
    try:
        return ModelConfig(
            model_type=m.model_type,
            vocab_size=max(m.vocab_size, len(tokenizer)),
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            rope_theta=m.rope_theta,
            sliding_window=m.sliding_window,
            max_position_embeddings=max(2048, cfg.rollout.max_len),
            param_dtype=m.param_dtype,
            dtype=m.dtype,
        )
    except ModelConfigError as err:
        raise ConfigError("model", str(err)) from None


def new_policy(cfg: Config, tokenizer):
    """A freshly initialised tiny `Decoder` from the `model` section, seeded by `cfg.seed`."""
    from bmrl.model.decoder import init_model

    return init_model(model_config(cfg, tokenizer), cfg.seed)


def load_policy(path: str | os.PathLike):
    """`(model, tokenizer)` from a local Hugging Face directory (`bmrl.model.from_pretrained`).

    A missing directory or one without tokenizer files fails with a message saying what to pass.
    """
    from bmrl.model.hf import CheckpointError, from_pretrained

    _check_dir(path)
    try:
        model, tokenizer = from_pretrained(path)
    except CheckpointError as err:
        raise ConfigError("model.path", f"{err} Fix the directory or point model.path elsewhere.") from None
    if tokenizer is None:
        raise ConfigError(
            "model.path", f"{str(path)!r} holds no tokenizer files (tokenizer.json ...); a policy needs its "
            "tokenizer: save it with bmrl.model.save_pretrained(model, tokenizer, path)."
        )
    return model, tokenizer


def _check_dir(path) -> None:
    if not os.path.isdir(path):
        raise ConfigError(
            "model.path", f"{str(path)!r} is not a directory; pass a local Hugging Face model directory "
            "(config.json + *.safetensors + tokenizer files), e.g. <out_dir>/policy written by `bmrl sft`."
        )


def _hf_tokenizer(path):
    """The tokenizer of HF directory `path`, once its config.json has loaded (weights are not read)."""
    from bmrl.model.hf import TOKENIZER_FILES, CheckpointError, load_config
    from bmrl.model.tokenizer import load_tokenizer

    _check_dir(path)
    try:
        load_config(path)
    except CheckpointError as err:
        raise ConfigError("model.path", f"{err} Fix the directory or point model.path elsewhere.") from None
    if not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise ConfigError(
            "model.path", f"{str(path)!r} holds no tokenizer files (tokenizer.json ...); a policy needs its "
            "tokenizer: save it with bmrl.model.save_pretrained(model, tokenizer, path)."
        )
    try:
        return load_tokenizer(path)
    except Exception as err:  # transformers raises many kinds; name the directory
        raise ConfigError("model.path", f"the tokenizer in {str(path)!r} could not be loaded: {err}") from None


def python_parts(cfg: Config) -> tuple[Any, Any, list[str]]:
    """(factory, `bmrl.data.TaskSplits`, first observations) of a python-kind env: `env.entry` imported
    from `env.path` (default: the working directory) and `sys.path` with one env built and checked, the
    `data.tasks` file read and split (`python_splits`), and the first observations of the file's tasks
    (`bmrl.rollout.pyenv.reset_texts`). Raises ConfigError naming env.entry, env.options, data.tasks
    or a data size."""
    from bmrl.envs.python.protocol import EntryError, load_entry
    from bmrl.envs.python.tasks import TaskFileError, read_tasks
    from bmrl.rollout.pyenv import reset_texts

    e = cfg.env
    try:
        factory = load_entry(e.entry, e.options, search=[e.path or os.getcwd()])
    except EntryError as err:
        raise ConfigError(f"env.{err.part}", str(err)) from None
    try:
        tasks = read_tasks(cfg.data.tasks)
    except TaskFileError as err:
        raise ConfigError("data.tasks", str(err)) from None
    return factory, python_splits(cfg, tasks), reset_texts(factory, tasks)


SIZE_KEYS = {"train": "train_size", "validation": "val_size", "test": "test_size"}  # split -> its data.* size


def python_sizes(cfg: Config) -> dict[str, int]:
    """How many tasks of each split a Python env keeps: at most `data.<split>_size`, the first ones (a
    task file holds what it holds; the report states the counts)."""
    return {s: getattr(cfg.data, key) for s, key in SIZE_KEYS.items()}


def python_splits(cfg: Config, tasks: list[dict]) -> Any:
    """The `bmrl.data.TaskSplits` of a Python env's `tasks` (the `data.tasks` file's, in order): disjoint
    by content, repeated tasks dropped (`bmrl.data.suites.task_splits`), cut to `python_sizes`; stored
    under `data.data_dir` when set (TFDS array_record, built once, read back), else in memory, the same.

    Raises ConfigError naming data.tasks when the train or test split would be empty (too few tasks:
    about 1 in 16 lands in test).
    """
    from bmrl.data.suites import read_task_suite, task_splits

    full = task_splits(tasks)
    counts = full.counts()
    held = ", ".join(f"{n} {s}" for s, n in counts.items())
    repeats = f" ({full.duplicates} repeated task(s) dropped)" if full.duplicates else ""
    if not counts["train"] or not counts["test"]:
        raise ConfigError("data.tasks", f"{cfg.data.tasks!r}: its {sum(counts.values())} distinct task(s){repeats} "
                          f"split into {held}; a run needs train and test tasks. A task's split is decided by its "
                          "content hash (about 1 in 16 tasks lands in test, 1 in 16 in validation): give more "
                          "distinct tasks (48 give about 3 test tasks).")
    sizes = {split: min(n, counts[split]) for split, n in python_sizes(cfg).items()}
    if cfg.data.data_dir is None:
        return full.head(sizes)
    stored = read_task_suite(cfg.env.entry, tasks, sizes, cfg.data.data_dir)
    return dataclasses.replace(stored, duplicates=full.duplicates)


def host_config(cfg: Config):
    """The `HostConfig` of a python-kind `env` section (timeout, workers, what a fault does)."""
    from bmrl.rollout.host import HostConfig

    return HostConfig(step_timeout_s=cfg.env.step_timeout_s, workers=cfg.env.workers, on_fault=cfg.env.on_fault,
                      groups=cfg.env.pipeline_groups)


def make_env(cfg: Config, tokenizer, parts: tuple | None = None):
    """The environment of the `env` section for `tokenizer`: a JAX `Env` (its options and
    `show_budget`), or for kind python a `bmrl.rollout.pyenv.PythonEnv` with its tasks (from `parts`,
    `python_parts(cfg)`, when given)."""
    from bmrl.envs import make

    if cfg.env.kind == "python":
        from bmrl.rollout.pyenv import PythonEnv

        factory, splits, observations = parts or python_parts(cfg)
        return PythonEnv.build(cfg.env.entry, factory, splits.tasks, tokenizer, host_config(cfg), texts=observations,
                               duplicates=splits.duplicates)

    options = dict(cfg.env.options)
    if cfg.env.show_budget and "max_budget" not in options and cfg.rollout.max_turns > 128:
        options["max_budget"] = cfg.rollout.max_turns  # the shown number table must reach every cap
    try:
        return make(cfg.env.name, tokenizer, **{**options, "show_budget": cfg.env.show_budget})
    except (TypeError, ValueError) as err:
        raise ConfigError("env.options", str(err)) from None


def run_format(cfg: Config, env):
    """The run's conversation format from the `format` section: `env`'s tokenizer's chat template (or
    the plain format), `format.kind`'s reply layout and `format.system_prompt` before the instructions
    (`bmrl.chat.env_format` for a JAX env, `bmrl.rollout.pyenv.host_format` for a Python env)."""
    from bmrl.chat import ChatFormatError, TagLayoutError, env_format
    from bmrl.rollout.pyenv import host_format

    f = cfg.format
    try:
        if cfg.env.kind == "python":
            return host_format(env, f.kind, f.system_prompt)
        return env_format(env, f.kind, f.system_prompt)
    except TagLayoutError as err:
        raise ConfigError("format.kind", str(err)) from None
    except ChatFormatError as err:
        raise ConfigError("model.path", f"{err} Use a model whose chat template bmrl can reproduce.") from None


def rollout_config(cfg: Config, for_eval: bool = False):
    """The `RolloutConfig` of the `rollout` section; evaluation samples at `eval.temperature`."""
    from bmrl.rollout import RolloutConfig
    from bmrl.sampling import SamplingConfig

    r = cfg.rollout
    temperature = cfg.eval.temperature if for_eval else r.temperature
    return RolloutConfig(
        max_turns=r.max_turns,
        max_reply_tokens=r.max_reply_tokens,
        max_len=r.max_len,
        sampling=SamplingConfig(temperature=temperature, top_k=r.top_k, top_p=r.top_p),
        compact_min_rows=r.compact_min_rows, compact_steps=r.compact_steps, attention_block=r.attention_block,
    )


def mesh_config(cfg: Config):
    """The `MeshConfig` of the `mesh` section, refused (ConfigError) if the devices cannot form it."""
    from bmrl.parallel import MeshConfig, make_mesh

    mesh = MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    try:
        make_mesh(mesh)
    except ValueError as err:
        raise ConfigError("mesh", f"{dataclasses.asdict(mesh)}: {err}") from None
    return mesh


@dataclasses.dataclass(frozen=True)
class Run:
    """What a run builds from its `Config`, once, before it writes anything; passed down to the
    trainer, SFT and evaluation so that none of them rebuilds (or re-validates) a part."""

    cfg: Config
    tokenizer: Any
    env: Any  # bmrl.envs.Env for `tokenizer`, or a bmrl.rollout.pyenv.PythonEnv (env.kind=python, tasks inside)
    fmt: Any  # the conversation format of the `format` section for env's tokenizer (run_format)
    budget: Any  # bmrl.budget.Budget of the `budget` section
    rollout: Any  # bmrl.rollout.RolloutConfig of training rollouts (rollout.temperature)
    eval_rollout: Any  # the same at eval.temperature
    mesh: Any  # bmrl.parallel.MeshConfig, checked against the devices
    warnings: tuple[str, ...] = ()  # non-fatal problems of the context buffer (see check_fits)


def build_run(cfg: Config, tokenizer=None) -> Run:
    """Build (and so check) everything a run of `cfg` needs but the policy: the tokenizer (`tokenizer`
    if given, e.g. a loaded policy's), environment, format, budget, rollout configs and mesh.

    Every runtime fact is checked here, before a command writes anything: the model directory and its
    config.json, the format, the context buffer against every cap, the reply limit against the longest
    action in the reply format,
    the mesh against the devices. Raises ConfigError naming the key.
    """
    parts = python_parts(cfg) if cfg.env.kind == "python" else None  # user code imported and reset once
    tokenizer = build_tokenizer(cfg, parts) if tokenizer is None else tokenizer
    env = make_env(cfg, tokenizer, parts)
    fmt = run_format(cfg, env)
    budget = make_budget(cfg.budget)
    problems = check_fits(cfg, env, fmt, budget)
    return Run(cfg, tokenizer, env, fmt, budget, rollout_config(cfg), rollout_config(cfg, for_eval=True),
               mesh_config(cfg), tuple(problems))


def build_reproduce_run(cfg: Config) -> Run:
    """`build_run` for `bmrl reproduce`: also checks the reproduce section and every variant's budget
    against the context buffer (each RL stage's), before anything is written."""
    budgets = check_reproduce(cfg)
    run = build_run(cfg)
    check_demos(cfg, run.env)  # the SFT base plays the env's oracle (a Python env must name it)
    for budget in budgets.values():
        check_fits(cfg, run.env, run.fmt, budget)
    return run


def suite_sizes(cfg: Config) -> dict[str, int]:
    """The sizes of a JAX env's splits: `data.train_size`, `data.val_size` and `data.test_size`, the
    held-out ones at least `eval.num_tasks` (every evaluation takes a prefix)."""
    d, n = cfg.data, max(cfg.eval.num_tasks, 1)
    return {"train": d.train_size, "validation": max(d.val_size, n), "test": max(d.test_size, n)}


def data_dir(cfg: Config) -> str | None:
    """Where the run's task suites are stored (`data.data_dir`; `bmrl reproduce` sets `<out_dir>/data`
    for all its stages), or None: computed in memory, the same splits."""
    return cfg.data.data_dir


def run_splits(cfg: Config, run: Run | None = None, sizes: dict[str, int] | None = None):
    """The `bmrl.data.Splits` of a JAX env's run (`run.env`'s levels, else the env of `cfg`).

    Stored under `data.data_dir` (TFDS array_record, built once, then read back) when it is set; else
    computed in memory (once per process), the same splits.
    """
    from bmrl.data.suites import compute_splits, read_suite
    from bmrl.envs import _CharTokenizer

    env = run.env if run is not None else make_env(cfg, _CharTokenizer())  # levels need no tokenizer
    sizes = sizes or suite_sizes(cfg)
    if cfg.data.data_dir is not None:
        return read_suite(env, sizes, cfg.data.data_dir)
    return _memo(compute_splits, env, sizes)


_SPLITS: dict[str, Any] = {}


def _memo(compute, env, sizes):
    """`compute(env, sizes)` once per process per (env, level options, sizes)."""
    from bmrl.data.suites import suite_name

    key = suite_name(env, sizes)
    if key not in _SPLITS:
        _SPLITS[key] = compute(env, sizes)
    return _SPLITS[key]


def split_tasks(cfg: Config, split: str, n: int | None = None, run: Run | None = None) -> Any:
    """The first n tasks of `split` ("train", "validation" or "test"): `{"seed": int32[n]}` of a JAX
    env (default n: its size, `suite_sizes`; `run_splits` says how the splits are made); for a
    Python env the first n (default all) of `run.env`'s task dicts (`python_splits`)."""
    if cfg.env.kind == "python":
        if run is None:
            raise ValueError("the tasks of a Python env live in its Run: pass run=build_run(cfg).")
        return run.env.split(split, n)
    sizes = suite_sizes(cfg)
    if split not in sizes:
        raise ValueError(f"Unknown split {split!r}; valid splits are {list(sizes)}.")
    n = sizes[split] if n is None else n
    return {"seed": run_splits(cfg, run, {**sizes, split: max(sizes[split], n)}).head(split, n)}


def eval_split(cfg: Config, run: Run | None = None) -> str:
    """The split that training-time evaluation reads: validation (a Python env whose task file put no
    task in it: test)."""
    if cfg.env.kind == "python" and not split_tasks(cfg, "validation", run=run):
        return "test"
    return "validation"


def suite_summary(cfg: Config, run: Run | None = None) -> dict:
    """How the run's tasks were split, for reports: the split sizes, `overlap` = how many of the
    `eval.num_tasks` test tasks have a level (content hash) among the training tasks', `disjoint_by`
    ("content", or "seed" for a JAX env with too few levels) and `path` (the stored suites' directory,
    or None); a Python env's also `duplicates` (its task file's repeated tasks, dropped)."""
    from bmrl.data import level_hashes, suite_overlap

    n = max(cfg.eval.num_tasks, 1)
    if cfg.env.kind == "python":
        if run is None:  # the task file's splits, without importing the env
            from bmrl.envs.python.tasks import TaskFileError, read_tasks

            try:
                splits = python_splits(cfg, read_tasks(cfg.data.tasks))
            except TaskFileError as err:
                raise ConfigError("data.tasks", str(err)) from None
            tasks, duplicates = splits.tasks, splits.duplicates
        else:
            tasks, duplicates = run.env.tasks, run.env.duplicates
        train, val, test = tasks["train"], tasks["validation"], tasks["test"][:n]
        overlap = suite_overlap(level_hashes(None, train), level_hashes(None, test))
        return {"train": len(train), "validation": len(val), "test": len(test), "overlap": overlap,
                "disjoint_by": "content", "duplicates": duplicates, "path": data_dir(cfg)}
    splits = run_splits(cfg, run)
    return {**{s: len(v) for s, v in splits.seeds.items()}, "test": n,
            "overlap": suite_overlap(splits.hashes["train"], splits.hashes["test"][:n]), "disjoint_by": splits.by,
            "path": data_dir(cfg)}


def suite_line(suites: dict) -> str:
    """One report line for `suite_summary`'s dict: how the splits were made and their overlap."""
    what = "task" if "duplicates" in suites else "level"  # a Python env's task file, or a JAX env's levels
    how = (f"disjoint by {what} content" if suites["disjoint_by"] == "content"
           else "disjoint by seed only (too few distinct levels to split by content)")
    if suites.get("duplicates"):
        how += f" ({suites['duplicates']} repeated task(s) of the task file dropped)"
    line = (f"Tasks: {suites['train']} train, {suites['validation']} validation, {suites['test']} test, {how}; "
            f"{suites['overlap']} of the {suites['test']} test tasks repeat a training {what}.")
    if suites["overlap"]:
        line += " The test levels repeat training levels: held-out results measure partly seen levels."
    return line
