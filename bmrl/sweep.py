"""Sweeps: one YAML file runs a command over a grid and/or zip of config values and seeds.

    command: train                   # train | sft | eval | reproduce | config (see COMMANDS)
    base: corridor_tiny.yaml         # config file, relative to the sweep file
    out_dir: runs/sweep_budgets      # default runs/<sweep file name>
    overrides: {train.steps: 30}     # applied to every run
    zip:                             # parallel lists: entry i of every key together
      budget.budgets: [[2], [8]]
    labels: [tight, generous]        # optional names of the zip entries (directory names)
    grid: {train.group_size: [4, 8]} # cartesian product
    seeds: [0, 1]                    # sets `seed`; the outermost loop
    metrics: [success]               # optional summary columns (default: every scalar metric)

Every run's config is built and validated before the first run starts, with what the run builds
(`bmrl.assembly.build_run`: context buffer, model directory, mesh), so a bad value anywhere stops the
sweep with a ConfigError (exit status 2) and nothing written. Runs execute one after another in
this process (sharing compile caches), each in `<out_dir>/<name>` with its resolved `config.yaml`; a
run is finished when its `summary.json` exists, so a rerun skips it. A run that raises is reported,
its traceback kept in `error.txt`, and it is run again next time (on several processes a failed run
ends the sweep instead: its peers may be waiting in the run's collectives). At the end `summary.md` and
`summary.csv` tabulate the swept values and scalar metrics of every run.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from bmrl import config as config_lib
from bmrl.config import Config, ConfigError
from bmrl.eval import markdown
from bmrl.registry import NotInstalled, Registry, UnknownName
from bmrl.rundir import RunDir
from bmrl.config.schema import hint_of

# name -> "module:function" (imported when a sweep uses it) or a callable; each takes a validated
# Config, writes cfg.out_dir/summary.json and returns the summary dict. `eval` and `reproduce` name the
# Config-only entry points those commands are to provide (the policy of eval being cfg.model.path).
COMMANDS: Registry[Callable[[Config], dict]] = Registry("sweep command", {
    "train": "bmrl.train:train",
    "sft": "bmrl.sft:run_sft",
    "eval": "bmrl.eval.run:run_eval",
    "reproduce": "bmrl.reproduce:reproduce",
})


def register_command(name: str, fn: str | Callable[[Config], dict]) -> None:
    """Make `name` usable as a sweep's `command` (a callable, or a lazy "module:function" path)."""
    COMMANDS.add(name, fn)


def resolve_command(name: str) -> Callable[[Config], dict]:
    """The function behind command `name`, imported now; a ConfigError if unknown or not installed."""
    try:
        return COMMANDS.lookup(name)
    except UnknownName:
        raise ConfigError("command", f"{name!r} is not a sweep command; choose one of: {COMMANDS.names()}.") from None
    except NotInstalled as err:
        raise ConfigError("command", f"{name!r} cannot run: {err}") from None


def _config_command(cfg: Config) -> dict:
    """`command: config`: only validates and records each run's config (a dry sweep; also for tests)."""
    from bmrl.assembly import build_run

    b = build_run(cfg).budget
    summary = {"min_cap": b.min_cap, "max_cap": b.max_cap, "batch": cfg.train.tasks_per_step * cfg.train.group_size}
    RunDir(cfg.out_dir).write_json("summary.json", summary)
    return summary


register_command("config", _config_command)


@dataclass
class SweepSpec:
    """The schema of a sweep file (validated like a config: unknown keys and wrong types are refused)."""

    command: str = "train"  # what each run executes: a name in bmrl.sweep.COMMANDS
    base: Optional[str] = None  # config file the runs start from, relative to the sweep file (null = defaults)
    out_dir: Optional[str] = None  # sweep directory; null = runs/<sweep file name without .yaml>
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted key: value, applied to every run
    grid: dict[str, list[Any]] = field(default_factory=dict)  # dotted key: values; cartesian product
    zip: dict[str, list[Any]] = field(default_factory=dict)  # dotted key: values; lists of one length, zipped
    labels: Optional[list[str]] = None  # names of the zip entries, used in directory names
    seeds: Optional[list[int]] = None  # values of `seed`; the outermost loop
    metrics: Optional[list[str]] = None  # summary columns (dotted keys of summary.json); null = all scalars


@dataclass
class Run:
    """One run of a sweep: its directory name, the swept values that define it, its config."""

    name: str
    values: dict[str, Any]
    config: Config


@dataclass
class Sweep:
    spec: SweepSpec
    path: str
    out_dir: str
    runs: list[Run]
    keys: list[str]  # swept keys in table order (zip, grid, seed)


@dataclass
class RunResult:
    name: str
    status: str  # done | skipped | failed
    summary: dict = field(default_factory=dict)
    error: str = ""
    seconds: float = 0.0


# ---- expansion ----------------------------------------------------------------------------------


def _nest(flat: dict[str, Any]) -> dict:
    """{"a.b": 1, "a.c": 2} -> {"a": {"b": 1, "c": 2}} (dict values merged)."""
    out: dict = {}
    for key, value in flat.items():
        node = out
        *parents, leaf = str(key).split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(key, "sets a key inside a value that is not a section.")
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = {**node[leaf], **value}
        else:
            node[leaf] = value
    return out


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def expand(spec: SweepSpec) -> list[dict[str, Any]]:
    """The swept values of every run, in run order: seeds outermost, then zip entries, then the grid
    (last key fastest). Each item maps dotted keys (and "seed") to values."""
    zipped = [dict(zip(spec.zip, entry)) for entry in zip(*spec.zip.values())] if spec.zip else [{}]
    grid = [dict(zip(spec.grid, combo)) for combo in itertools.product(*spec.grid.values())]
    seeds = [{"seed": s} for s in spec.seeds] if spec.seeds is not None else [{}]
    return [{**z, **g, **s} for s in seeds for z in zipped for g in grid]


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "+".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return "+".join(f"{k}-{_fmt(v)}" for k, v in value.items())
    return str(value)


def short_names(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix of each key that no other key shares: budget.kind -> kind."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            short = ".".join(parts[-n:])
            if not any(o != key and (o == short or o.endswith("." + short)) for o in keys):
                break
        out[key] = short
    return out


def run_name(values: dict[str, Any], spec: SweepSpec, zip_index: int | None = None) -> str:
    """Directory name of a run: `<label or zip values>,<grid values>,seed=<s>`, e.g. `kind=mix,seed=1`."""
    keys = [*spec.zip, *spec.grid, *(["seed"] if spec.seeds is not None else [])]
    short = short_names(keys)
    parts = []
    if spec.labels is not None and zip_index is not None:
        parts.append(spec.labels[zip_index])
        keys = [k for k in keys if k not in spec.zip]
    parts += [f"{short[k]}={_fmt(values[k])}" for k in keys]
    return re.sub(r"[^A-Za-z0-9._+=,-]", "_", ",".join(parts)) or "run"


def _check_spec(spec: SweepSpec) -> None:
    lengths = {k: len(v) for k, v in spec.zip.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError("zip", f"every list must have the same length, got {lengths}.")
    for section in ("grid", "zip"):
        for key, values in getattr(spec, section).items():
            if not values:
                raise ConfigError(f"{section}.{key}", "is an empty list; give at least one value.")
            if hint_of(key) is None:
                raise ConfigError(f"{section}.{key}", f"{key!r} is not a config key; see docs/configs.md.")
    if spec.seeds is not None and not spec.seeds:
        raise ConfigError("seeds", "is an empty list; give at least one seed or remove it.")
    if spec.seeds is not None and len(set(spec.seeds)) != len(spec.seeds):
        raise ConfigError("seeds", f"has repeated seeds: {spec.seeds}.")
    if spec.labels is not None:
        if not spec.zip:
            raise ConfigError("labels", "names zip entries, but there is no zip.")
        n = len(next(iter(spec.zip.values())))
        if len(spec.labels) != n or len(set(spec.labels)) != n:
            raise ConfigError("labels", f"needs {n} distinct names (one per zip entry), got {spec.labels}.")
    both = set(spec.grid) & set(spec.zip)
    if both:
        raise ConfigError(f"grid.{sorted(both)[0]}", "is also in zip; sweep a key in one place.")
    swept = set(spec.grid) | set(spec.zip) | ({"seed"} if spec.seeds is not None else set())
    if "seed" in spec.grid or "seed" in spec.zip:
        if spec.seeds is not None:
            raise ConfigError("seeds", "seed is also swept in grid/zip; sweep it in one place.")
    for key in swept:
        if key == "out_dir":
            raise ConfigError(f"grid.{key}", "the sweep sets each run's out_dir; set the sweep's out_dir instead.")
    for key in _flatten(spec.overrides):
        if key in swept:
            raise ConfigError(f"overrides.{key}", "is swept; remove it from overrides.")
        if key == "out_dir":
            raise ConfigError("overrides.out_dir", "the sweep sets each run's out_dir; set the sweep's out_dir instead.")


def _check_runtime(command: str, cfg: Config) -> None:
    """What `bmrl <command>` checks before writing, for one run of the sweep (ConfigError if bad): `bmrl train`'s
    also that its rows split over the mesh (`check_batch_split`, as `bmrl.commands.train` checks them)."""
    from bmrl.assembly import build_reproduce_run, build_run
    from bmrl.assembly.checks import check_batch_split

    run = (build_reproduce_run if command == "reproduce" else build_run)(cfg)
    if command == "train":
        check_batch_split(cfg, run)


def load_sweep(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (), out_dir: str | None = None) -> Sweep:
    """Read, expand and validate a sweep file: every run's Config is built now (ConfigError on any).

    `overrides` (dotted `key=value`) apply to every run, after the sweep's own overrides; they may not
    touch a swept key. `out_dir` replaces the sweep file's. Nothing is written.
    """
    path = str(path)
    spec = config_lib.build(config_lib.read_yaml(path), schema=SweepSpec)
    _check_spec(spec)
    resolve_command(spec.command)
    cli = config_lib.parse_overrides(overrides)
    swept = set(spec.grid) | set(spec.zip) | ({"seed"} if spec.seeds is not None else set())
    for key in _flatten(cli):
        if key in swept:
            raise ConfigError(key, "is swept by this sweep; an override cannot set it.")
        if key == "out_dir":
            raise ConfigError(key, "each run's out_dir is set by the sweep; use --out to move the sweep.")
    base = {}
    if spec.base is not None:
        base_path = os.path.join(os.path.dirname(os.path.abspath(path)), spec.base)
        try:
            base = config_lib.read_yaml(base_path)
        except ConfigError as err:
            raise ConfigError("base", str(err)) from None
    stem = os.path.splitext(os.path.basename(path))[0]
    sweep_dir = out_dir or spec.out_dir or os.path.join("runs", stem)

    zip_len = len(next(iter(spec.zip.values()))) if spec.zip else 1
    runs, keys = [], [*spec.zip, *spec.grid, *(["seed"] if spec.seeds is not None else [])]
    grid_n = math.prod(len(v) for v in spec.grid.values())
    for i, values in enumerate(expand(spec)):
        zip_index = (i // grid_n) % zip_len if spec.zip else None
        name = run_name(values, spec, zip_index)
        layers = [base, _nest(_flatten(spec.overrides)), cli, _nest(values), {"out_dir": os.path.join(sweep_dir, name)}]
        try:
            cfg = config_lib.build(layers)
            _check_runtime(spec.command, cfg)
        except ConfigError as err:
            where = ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()) or "the only run"
            message = str(err).removeprefix(err.key + ": ").rstrip(".")
            raise ConfigError(err.key, f"{message} (in sweep run {where}).") from None
        runs.append(Run(name, values, cfg))
    seen: dict[str, dict] = {}
    for run in runs:
        if run.name in seen:
            raise ConfigError("sweep", f"runs {seen[run.name]} and {run.values} get the same directory name {run.name!r}.")
        seen[run.name] = run.values
    return Sweep(spec=spec, path=path, out_dir=sweep_dir, runs=runs, keys=keys)


# ---- running ------------------------------------------------------------------------------------


def claim_runs(sweep: Sweep) -> dict[str, dict | None]:
    """{run name: its saved summary if finished, else None}, after the one rule of `bmrl.rundir` for
    every run directory and the sweep's own, before any work: a directory that is not writable
    (`OutputNotWritable`) or holds a run made with other settings (`ConfigError`) is refused."""
    RunDir(sweep.out_dir).claim()
    kind = RUN_KINDS.get(sweep.spec.command)
    return {run.name: RunDir(run.config.out_dir).claim(run.config, kind) for run in sweep.runs}


RUN_KINDS = {"train": "rl", "sft": "sft", "eval": "eval"}  # a command's run-directory kind (bmrl.rundir.SECTIONS)


def run_sweep(sweep: Sweep, fail_fast: bool = False, log: Callable[[str], None] = print) -> list[RunResult]:
    """Run every unfinished run in order, then write summary.md and summary.csv; results per run.
    Refused before any work by `claim_runs`."""
    fn = resolve_command(sweep.spec.command)
    finished = claim_runs(sweep)
    top = RunDir(sweep.out_dir)
    top.write_text("sweep.yaml", yaml.safe_dump({**dataclasses.asdict(sweep.spec), "runs": [r.name for r in sweep.runs]},
                                                sort_keys=False))
    results: list[RunResult] = []
    n = len(sweep.runs)
    summarise = True
    try:
        for i, run in enumerate(sweep.runs, 1):
            run_dir, rundir = run.config.out_dir, RunDir(run.config.out_dir)
            if finished[run.name] is not None:
                log(f"[{i}/{n}] {run.name}: skipped, already finished")
                results.append(RunResult(run.name, "skipped", finished[run.name]))
                continue
            rundir.write_config(run.config)
            log(f"[{i}/{n}] {run.name}: running {sweep.spec.command}")
            start = time.time()
            try:
                out = fn(run.config)
            except Exception as err:  # a failed run is reported and retried next time, never "finished"
                seconds = time.time() - start
                _discard(os.path.join(run_dir, "summary.json"), keep_as=".failed")
                message = f"{type(err).__name__}: {err}".splitlines()[0]
                if _multiprocess():
                    # A peer may sit in one of this run's collectives: no process can go on to the next run,
                    # nor reach the summary's barrier. The sweep ends here on every process (bmrl.cli stops
                    # this one at once, the others stop on its missing heartbeat); the same command retries
                    # this run (it has no summary.json) and resumes it from its last checkpoint.
                    log(f"[{i}/{n}] {run.name}: FAILED after {seconds:.1f}s: {message}; a multi-process sweep "
                        f"stops at a failed run (rerun the same command to retry it)")
                    summarise = False
                    raise
                with open(os.path.join(run_dir, "error.txt"), "w") as f:
                    f.write(traceback.format_exc())
                log(f"[{i}/{n}] {run.name}: FAILED after {seconds:.1f}s: {message} (traceback in {run_dir}/error.txt)")
                results.append(RunResult(run.name, "failed", error=message, seconds=seconds))
                if fail_fast:
                    break
                continue
            seconds = time.time() - start
            if rundir.finished() is None:
                rundir.write_json("summary.json", dict(out or {}))
            _discard(os.path.join(run_dir, "error.txt"))
            log(f"[{i}/{n}] {run.name}: done in {seconds:.1f}s")
            results.append(RunResult(run.name, "done", rundir.finished() or {}, seconds=seconds))
    finally:
        if summarise:
            md, rows = summary_table(sweep, results)
            top.write_text("summary.md", md)
            table = io.StringIO(newline="")
            csv.writer(table).writerows(rows)
            top.write_text("summary.csv", table.getvalue())
    return results


def _multiprocess() -> bool:
    """True when this sweep is one of several JAX processes (`bmrl launch`, a TPU slice)."""
    from bmrl.distributed import is_multiprocess

    return is_multiprocess()


def _discard(path: str, keep_as: str | None = None) -> None:
    """Remove `path` (or rename it to path + keep_as) if it is there; another process of a
    multi-process sweep may have done it first."""
    try:
        if keep_as is None:
            os.remove(path)
        else:
            os.replace(path, path + keep_as)
    except FileNotFoundError:
        pass


# ---- summary table ------------------------------------------------------------------------------


def scalar_metrics(summary: dict) -> dict[str, float | int | bool]:
    """The numbers of a summary (nested dicts flattened to dotted keys; strings and lists dropped)."""
    return {k: v for k, v in _flatten(summary).items() if isinstance(v, (int, float, bool))}


def _cell(value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return _fmt(value)


def summary_table(sweep: Sweep, results: list[RunResult]) -> tuple[str, list[list[Any]]]:
    """(markdown, CSV rows) with one row per run: name, status, swept values, metrics.

    Metric columns are the sweep's `metrics`, or else every scalar metric any run reported (in order
    of first appearance). Runs not reached yet are listed as `pending`.
    """
    by_name = {r.name: r for r in results}
    metrics = {r.name: scalar_metrics(r.summary) for r in results}
    if sweep.spec.metrics is not None:
        columns = list(sweep.spec.metrics)
    else:
        columns = list(dict.fromkeys(k for m in metrics.values() for k in m))
    header = ["run", "status", *sweep.keys, *columns]
    rows: list[list[Any]] = [header]
    for run in sweep.runs:
        r = by_name.get(run.name)
        values = [v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else json.dumps(v)
                  for v in (run.values[k] for k in sweep.keys)]
        m = metrics.get(run.name, {})
        rows.append([run.name, r.status if r else "pending", *values, *(m.get(c, "") for c in columns)])
    out = io.StringIO()
    out.write(f"# Sweep {os.path.basename(sweep.path)}: {sweep.spec.command}, {len(sweep.runs)} runs\n\n")
    out.write(markdown.table(header, [[_cell(v) if not isinstance(v, str) else v for v in row] for row in rows[1:]]) + "\n")
    failed = [r for r in results if r.status == "failed"]
    if failed:
        out.write("\nFailed runs (tracebacks in each run's error.txt):\n\n")
        out.writelines(f"- {r.name}: {r.error}\n" for r in failed)
    return out.getvalue(), rows
