"""Evaluating saved policies from a Config: the shared core of `bmrl eval` and `bmrl reproduce`.

Every policy is evaluated on the same held-out test tasks with the same keys, over the grid
eval.ks x eval.ts in eval.mode; then on a fixed probe set of noisy-oracle states (decision
accuracy) and, when injection turns are given, again with errors injected (recovery with errors
equalised across policies). What the probes, the injection run and the back-on-track window are:
one `EvalSettings`, by default the config's (`EvalSettings.from_config`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import jax

from bmrl.assembly import build_run, load_policy
from bmrl.config import Config, ConfigError
from bmrl.eval.decompose import probe_accuracy, probe_set
from bmrl.eval.evaluate import attach_injection, evaluate
from bmrl.eval.report import write_report
from bmrl.eval.settings import EvalSettings
from bmrl.rundir import RunDir


def evaluate_config(cfg: Config, run: Any, policy: Any, key: Any, tasks: Any = None,
                    settings: EvalSettings | None = None, **grid: Any) -> Any:
    """The one spelling of "evaluate a policy from a config": `bmrl.eval.evaluate` of `policy` on the
    run's env (`run`, a `bmrl.assembly.Run`) over its first `eval.num_tasks` test tasks (or `tasks`), on the
    grid eval.ks x eval.ts in eval.mode with eval.attempts and eval.bootstrap, at eval.temperature,
    in the run's format, its rows played by the run's player; the back-on-track window of `settings`
    (default the config's). `grid`: what a caller evaluates differently (e.g. `ts=[cap], ks=[1], attempts=1`)."""
    e = cfg.eval
    settings = settings or EvalSettings.from_config(cfg)
    tasks = run.player.tasks("test", e.num_tasks) if tasks is None else tasks
    args = dict(ts=e.ts, ks=e.ks, attempts=e.attempts, rollout_cfg=run.eval_rollout, mode=e.mode,
                bootstrap=e.bootstrap, fmt=run.fmt, window=settings.window) | grid
    return evaluate(policy, run.env, tasks, key=key, runner=run.player.evaluation_runner, **args)


def evaluate_policies(
    cfg: Config,
    policies: Mapping[str, tuple[Any, Any]],
    settings: EvalSettings | None = None,
    *,
    log: Callable[[str], Any] = lambda msg: print(msg, file=sys.stderr),
) -> dict[str, Any]:
    """{name: EvalResult} for `policies` = {name: (model, tokenizer)}, with the probes, injection run
    and window of `settings` (default `EvalSettings.from_config(cfg)`; its turns are 1-based)."""
    e = cfg.eval
    settings = settings or EvalSettings.from_config(cfg)
    key = jax.random.key(cfg.seed)
    results = {}
    for i, (name, (model, tokenizer)) in enumerate(policies.items(), 1):
        run = build_run(cfg, tokenizer)  # this policy's tokenizer: env, format, checked buffer
        player = run.player
        tasks = player.tasks("test", e.num_tasks)
        log(f"eval {name} (policy {i}/{len(policies)}): {player.count(tasks)} tasks x {e.attempts} attempts, "
            f"T in {list(e.ts)}, mode {e.mode}")
        result = evaluate_config(cfg, run, model, key, tasks, settings)
        if result.faults:
            log(f"eval {name}: {result.faults} faults of {run.env.name} (exceptions, timeouts, bad returns); "
                "their tasks and messages are in the log")
        if player.replays_states:
            result = _probe_and_inject(cfg, run, model, tasks, result, key, settings)
        elif settings.probe_states > 0 or settings.injects:
            log(f"eval {name}: skipped the decision-accuracy probes and error injection: they replay a JAX "
                f"env's oracle states, and {run.env.name} is a Python env (env.kind=python)")
        results[name] = result
    return results


def _probe_and_inject(cfg: Config, run: Any, model: Any, tasks: Any, result: Any, key: Any,
                      settings: EvalSettings) -> Any:
    """`result` with decision accuracy on a fixed probe set of noisy-oracle states and, when
    `settings` injects, success with errors injected (a JAX env's states replayed)."""
    e, rcfg, env, fmt = cfg.eval, run.eval_rollout, run.env, run.fmt
    if settings.probe_states > 0:
        probes = probe_set(env, fmt, tasks, num_states=settings.probe_states, seed=cfg.seed, noise=settings.probe_noise,
                           num_turns=rcfg.max_turns, max_len=rcfg.max_len, reserve=rcfg.max_reply_tokens)
        probe = probe_accuracy(model, env, probes, rcfg, key=cfg.seed + 1, fmt=fmt, num_resamples=max(e.bootstrap, 0))
        result = dataclasses.replace(result, probe=probe)
    if settings.injects:
        result = attach_injection(result, model, env, tasks, turns=settings.inject_turns, prob=settings.inject_prob,
                                  key=key, fmt=fmt, rollout_cfg=rcfg, window=settings.window)
    return result


def run_eval(cfg: Config) -> dict:
    """Sweep command: evaluate the policy at cfg.model.path; report in <out_dir>/eval, summary.json."""
    if not cfg.model.path:
        raise ConfigError("model.path", "eval needs the directory of a saved policy (e.g. <sft out_dir>/policy).")
    rundir = RunDir(cfg.out_dir)
    finished = rundir.claim(cfg, "eval")  # not writable / other settings: refused (exit 2) before any work
    if finished is not None:
        return finished
    results = evaluate_policies(cfg, {"policy": load_policy(cfg.model.path, cfg.model)})
    rundir.write_config(cfg)
    _, summary = write_report(os.path.join(cfg.out_dir, "eval"), results, title="bmrl eval",
                              settings={"policy": cfg.model.path, "env": cfg.env.name})
    rundir.write_json("summary.json", summary["policy"], default=float)
    return summary["policy"]
