"""Evaluating saved policies from a Config: the shared core of `bmrl eval` and `bmrl reproduce`.

Every policy is evaluated on the same held-out test tasks with the same keys, over the grid
eval.ks x eval.ts in eval.mode; then on a fixed probe set of noisy-oracle states (decision
accuracy) and, when injection turns are given, again with errors injected (recovery with errors
equalised across policies).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bmrl.config import Config
from bmrl.rundir import RunDir


def evaluate_policies(
    cfg: Config,
    policies: Mapping[str, tuple[Any, Any]],
    *,
    inject_turns: Sequence[int] = (0,),
    inject_prob: float = 1.0,
    probe_noise: float = 0.25,
    window: int = 3,
    log: Callable[[str], Any] = lambda msg: print(msg, file=sys.stderr),
) -> dict[str, Any]:
    """{name: EvalResult} for `policies` = {name: (model, tokenizer)}; inject_turns are 0-based."""
    import jax

    from bmrl import build as pol
    from bmrl.eval.decompose import probe_accuracy, probe_set
    from bmrl.eval.evaluate import attach_injection, evaluate

    e = cfg.eval
    rcfg = pol.rollout_config(cfg, for_eval=True)
    key = jax.random.key(cfg.seed)
    common = dict(rollout_cfg=rcfg, window=window)
    python = cfg.env.kind == "python"
    results = {}
    for i, (name, (model, tokenizer)) in enumerate(policies.items(), 1):
        run = pol.build_run(cfg, tokenizer)  # this policy's tokenizer: env, format, checked buffer
        env, fmt = run.env, run.fmt
        tasks = pol.split_tasks(cfg, "test", e.num_tasks, run=run)
        num = len(tasks) if python else e.num_tasks
        log(f"eval {name} (policy {i}/{len(policies)}): {num} tasks x {e.attempts} attempts, T in {list(e.ts)}, mode {e.mode}")
        result = evaluate(model, env, tasks, key=key, mode=e.mode, fmt=fmt, ts=e.ts, ks=e.ks,
                          attempts=e.attempts, bootstrap=e.bootstrap, **common)
        if python:
            if result.faults:
                log(f"eval {name}: {result.faults} faults of {env.name} (exceptions, timeouts, bad returns); "
                    "their tasks and messages are in the log")
            if e.probe_states > 0 or (inject_turns and inject_prob > 0):
                log(f"eval {name}: skipped the decision-accuracy probes and error injection: they replay a JAX "
                    f"env's oracle states, and {env.name} is a Python env (env.kind=python)")
            results[name] = result
            continue
        if e.probe_states > 0:
            probes = probe_set(env, fmt, tasks, num_states=e.probe_states, seed=cfg.seed, noise=probe_noise,
                               num_turns=rcfg.max_turns, max_len=rcfg.max_len, reserve=rcfg.max_reply_tokens)
            probe = probe_accuracy(model, env, probes, rcfg, key=cfg.seed + 1, fmt=fmt,
                                   num_resamples=max(e.bootstrap, 0))
            result = dataclasses.replace(result, probe=probe)
        if inject_turns and inject_prob > 0:
            result = attach_injection(result, model, env, tasks, turns=list(inject_turns), prob=inject_prob, key=key,
                             fmt=fmt, **common)
        results[name] = result
    return results


def run_eval(cfg: Config) -> dict:
    """Sweep command: evaluate the policy at cfg.model.path; report in <out_dir>/eval, summary.json."""
    from bmrl import build as pol
    from bmrl.config import ConfigError
    from bmrl.eval.report import write_report

    if not cfg.model.path:
        raise ConfigError("model.path", "eval needs the directory of a saved policy (e.g. <sft out_dir>/policy).")
    rundir = RunDir(cfg.out_dir)
    finished = rundir.claim(cfg, "eval")  # not writable / other settings: refused (exit 2) before any work
    if finished is not None:
        return finished
    results = evaluate_policies(cfg, {"policy": pol.load_policy(cfg.model.path)})
    rundir.write_config(cfg)
    _, summary = write_report(os.path.join(cfg.out_dir, "eval"), results, title="bmrl eval",
                              settings={"policy": cfg.model.path, "env": cfg.env.name})
    rundir.write_json("summary.json", summary["policy"], default=float)
    return summary["policy"]
