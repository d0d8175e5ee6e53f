"""The RL training loop: rollout and update alternate, one readable loop (big_vision style).

    summary = train(cfg)            # cfg: bmrl.config.Config

    for step in range(start, steps):
        key = fold_in(base_key, step)                     # every draw derives from (seed, step)
        tasks = train split at data position step * tasks_per_step, each repeated group_size times
        caps = budget.sample(key_caps, ...)               # inside jit: caps are data, one compile
        traj = rollout(params, tasks, caps, key_rollout)  # one jit: generation + env steps
                                                          # (a Python env: host_rollout, same turn)
        params, opt_state, m = update(params, opt_state, ref, traj, key_update)
        log / evaluate Pass@(1,T) / checkpoint

Resumes from the newest checkpoint in `cfg.out_dir/checkpoints` automatically. Because every random
draw derives from (seed, step) and the checkpoint holds params, optimizer state, key and data
position, a run killed at any moment and resumed ends with bitwise-identical parameters on CPU.
Outputs in `cfg.out_dir`: config.yaml, metrics.jsonl, tb/, checkpoints/, policy/ (a Hugging Face
directory), summary.json; with a Python env (env.kind=python) also faults.jsonl, one line per fault
of user code (step, task, turn, kind, message), counted per step as `rollout/faults`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl import compiles as compiles_lib
from bmrl import config as config_lib
from bmrl import build as policy_lib
from bmrl import memory as memory_lib
from bmrl.distributed import to_host
from bmrl.checkpoint import Checkpointer, key_data, probe_writable
from bmrl.learn import optimizer_from_config
from bmrl.learn import step as step_lib
from bmrl.metrics import MetricsLogger, Progress, read_jsonl, to_scalar, write_json_atomic, write_jsonl_atomic
from bmrl.parallel import make_mesh, param_shardings, shard_batch, state_shardings
from bmrl.rollout import Injection, check_config, make_rollout

EVAL_STREAM = 0x3E7A1  # fold_in constant separating evaluation keys from training keys


class NonFiniteError(RuntimeError):
    """Training stopped: too many non-finite updates in a row."""


# ---------------------------------------------------------------- policy, tasks
def init_policy(cfg, tokenizer=None) -> tuple[nnx.Module, Any]:
    """(policy, tokenizer): from `cfg.model.path` (a Hugging Face directory, e.g. an SFT output), or
    a fresh tiny decoder (seed `cfg.seed`) with `tokenizer` (default: the tiny one, `bmrl.build`)."""
    if cfg.model.path:
        return policy_lib.load_policy(cfg.model.path)
    tok = policy_lib.build_tokenizer(cfg) if tokenizer is None else tokenizer
    return policy_lib.new_policy(cfg, tok), tok


def tasks_at(seeds: np.ndarray, position: int, count: int, seed: int) -> np.ndarray:
    """`count` task seeds starting at data position `position` of a deterministic stream: the split
    in a fresh permutation per pass (keyed by (seed, pass)), so position alone fixes the batch."""
    n = len(seeds)
    out = np.empty(count, np.int32)
    for i in range(count):
        p = position + i
        order = np.random.default_rng([seed, p // n]).permutation(n)
        out[i] = seeds[order[p % n]]
    return out


# ---------------------------------------------------------------- evaluation
def make_evaluator(graphdef, env, fmt, cfg, test_tasks, mesh):
    """Pass@(1,T) at every T of `cfg.eval.ts` on `num_tasks` test tasks (level seeds; a Python env's
    task dicts), one attempt each, each T an exact cap: `bmrl.eval.evaluate` (the one evaluator) with
    rows sharded over the training mesh and gathered across processes. Returns `evaluate(params, key)
    -> {T: (success rate, standard error)}`; its `trace_count()` counts the compiles of its own (an
    evaluation that samples like training, at the training batch shape, reuses the training rollout
    program)."""
    from bmrl.eval.evaluate import evaluate as evaluate_policy

    ts = list(cfg.eval.ts)
    n = min(cfg.eval.num_tasks, len(test_tasks))
    rcfg = policy_lib.rollout_config(cfg, for_eval=True)
    if cfg.env.kind == "python":
        tasks = list(test_tasks[:n])
    else:
        check_config(env, fmt, rcfg, min(ts))
        tasks = {"seed": np.asarray(test_tasks[:n], np.int32)}
    place = lambda tree: shard_batch(jax.tree.map(jnp.asarray, tree), mesh)  # noqa: E731
    compiled = [0]

    def evaluate(params, key) -> dict[int, tuple[float, float]]:
        res = evaluate_policy(nnx.merge(graphdef, params), env, tasks, ts=ts, ks=[1], attempts=1, rollout_cfg=rcfg,
                              key=key, fmt=fmt, bootstrap=0, chunk_size=n, place=place, gather=to_host)
        compiled[0] += res.compiles
        rate = res.surface.estimate[0]
        return {int(t): (float(p), math.sqrt(max(p * (1 - p), 0.0) / n)) for t, p in zip(ts, rate)}

    evaluate.trace_count = lambda: compiled[0]
    return evaluate


# ---------------------------------------------------------------- the loop
def _rollout_stats(traj) -> dict:
    acted = jnp.maximum(traj.turn_active.sum(), 1)
    return dict(
        success=traj.success.mean(),
        turns_used=traj.turns_used.mean(),
        caps=traj.caps.mean(),
        invalid_rate=(traj.invalid & traj.turn_active).sum() / acted,
        error_rate=(traj.error & traj.turn_active).sum() / acted,
        format_error_rate=(traj.format_error & traj.turn_active).sum() / acted,  # no answer (format.kind)
        truncated=traj.truncated.mean(),
        overflow=traj.overflow.mean(),
        tokens=traj.length.sum(),
        sampled_tokens=traj.loss_mask.sum(),
    )


def _check_resume_config(saved: dict | None, cfg) -> list[str]:
    """Keys whose values differ between the checkpoint's config and this run's (out_dir ignored)."""
    if not saved:
        return []
    return config_lib.changed_keys(saved, config_lib.to_dict(cfg), ignore=("out_dir", "train.steps"))



def place_learner(optimizer, params: Any, mesh) -> tuple[Any, Any, tuple[Any, Any]]:
    """The learner's pinned layouts: `params` placed on `mesh` by the partition rules and a fresh
    optimizer state following them (bmrl.parallel). Returns (params, opt_state, (param_shardings,
    opt_state_shardings)); the update program is compiled for exactly these shardings."""
    param_sh = param_shardings(params, mesh)
    params = jax.device_put(params, param_sh)
    opt_state = step_lib.init_opt_state(optimizer, params)
    opt_sh = state_shardings(opt_state, mesh)
    return params, jax.device_put(opt_state, opt_sh), (param_sh, opt_sh)

def train(cfg, *, progress: bool | None = None, run: policy_lib.Run | None = None,
          on_step: Callable[[int, int], Any] | None = None, evaluate: bool = True) -> dict:
    """Run RL training for `cfg` (a validated `bmrl.config.Config`); returns the summary dict.

    `evaluate=False` skips the training-time Pass@(1,T) evaluations (at the start, every `eval.every`
    steps and at the end): for callers that evaluate the trained policy themselves (`bmrl reproduce`
    evaluates the base once and every policy on the full grid in its own stage).

    Raises `NonFiniteError` after `cfg.train.max_nonfinite` non-finite updates in a row (the
    parameters and checkpoints keep the last finite values), `CheckpointWriteError` when a save
    fails (the previous checkpoint is kept), `OutputNotWritable`, `NoGoodCheckpoint` or
    `CheckpointMismatch` before training. A run that already finished returns its summary untouched.
    """
    wall0 = time.time()
    t, out = cfg.train, cfg.out_dir
    probe_writable(out)  # OutputNotWritable (exit 2) before anything is written
    finished = _finished_summary(out, t.steps)
    if finished is not None:  # resuming a finished run: nothing to do, nothing rewritten
        print(f"bmrl train: {out} already finished {t.steps} steps; nothing to do (raise train.steps to "
              "train on).", flush=True)
        return finished
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.yaml"), "w") as f:
        f.write(config_lib.to_yaml(cfg))

    mesh = make_mesh(policy_lib.mesh_config(cfg) if run is None else run.mesh)
    policy, tok = init_policy(cfg, None if run is None else run.tokenizer)
    run = policy_lib.build_run(cfg, tok) if run is None else run  # checked before any write by `bmrl train`
    env, fmt, rcfg, budget = run.env, run.fmt, run.rollout, run.budget
    python = cfg.env.kind == "python"  # a Python env: host_rollout on the same compiled turn, tasks are dicts
    held_out = {s: policy_lib.split_tasks(cfg, s, max(cfg.eval.num_tasks, 1), run=run)
                for s in {policy_lib.eval_split(cfg, run), "test"}}  # in between: validation; first and last: test
    if python:
        train_tasks = policy_lib.split_tasks(cfg, "train", run=run)
        train_seeds = np.arange(len(train_tasks), dtype=np.int32)  # the data stream draws task indices
    else:
        train_seeds = policy_lib.split_tasks(cfg, "train", run=run)["seed"]
        held_out = {s: tasks["seed"] for s, tasks in held_out.items()}
    batch = t.tasks_per_step * t.group_size

    graphdef, params = nnx.split(policy)
    updates_per_step = t.epochs * t.minibatches
    optimizer = optimizer_from_config(t.optim, t.steps * updates_per_step, master_f32=t.f32_master)
    plan = memory_lib.plan_for_config(cfg, policy.config, mesh, optimizer)
    if jax.process_index() == 0:
        print(plan.table(), flush=True)
        for note in fmt.notes:  # where the trained context differs from the chat template's rendering
            print(f"bmrl train: format: {note}", flush=True)
    plan.check()  # MemoryPlanError (a ConfigError, exit 2) before anything big is allocated
    params, opt_state, (param_sh, opt_sh) = place_learner(optimizer, params, mesh)
    ref_params = jax.tree.map(jnp.copy, params) if t.kl_coef > 0 else None
    base_key = jax.random.key(cfg.seed)

    # Resume from the newest complete checkpoint, if any.
    ckpt = Checkpointer(os.path.join(out, "checkpoints"), keep=cfg.checkpoint.keep, every=cfg.checkpoint.every)
    start, data_position = 0, 0
    eval_log: dict[int, dict[int, tuple[float, float]]] = {}
    tokens_seen, last, keep_records = 0, {}, None
    restored = ckpt.restore_latest({"params": params, "opt_state": opt_state, "key": key_data(base_key)})
    if restored is not None:
        state, meta = restored
        params, opt_state = jax.device_put((state["params"], state["opt_state"]), (param_sh, opt_sh))  # this mesh
        base_key = jax.random.wrap_key_data(jnp.asarray(state["key"]))
        start, data_position = int(meta["step"]), int(meta["data_position"])
        eval_log, tokens_seen, last, keep_records = _run_record_from(meta)
        changed = _check_resume_config(meta.get("config"), cfg)
        if changed:
            print(f"bmrl train: warning: resuming step {start} with a changed config: {', '.join(changed)}")
        print(f"bmrl train: resumed from {ckpt.directory} at step {start}", flush=True)

    rollout_fn = None if python else make_rollout(graphdef, env, fmt, rcfg)
    update = step_lib.make_update(graphdef, optimizer, t, rcfg.sampling.temperature, shardings=(param_sh, opt_sh))
    sample_caps = compiles_lib.counted_jit(
        lambda key: budget.sample(key, batch, t.group_size, cfg.budget.share_in_group), name="budget_sample")

    evaluators = {s: make_evaluator(graphdef, env, fmt, cfg, tasks, mesh) for s, tasks in held_out.items()}
    inject = Injection.none(rcfg.max_turns)
    counted_before = compiles_lib.counts()

    def compile_counts() -> dict[str, int]:
        """Compiles of this run per program (bmrl.compiles), since the run started."""
        now = compiles_lib.counts()
        out = {k: v - counted_before.get(k, 0) for k, v in now.items() if v - counted_before.get(k, 0)}
        return out

    compiles = lambda: sum(compile_counts().values())  # noqa: E731

    logger = MetricsLogger(out, start_step=start, keep_records=keep_records)
    if python:  # faults logged after the checkpoint resumed from are logged again by the replayed steps
        _keep_faults_up_to(out, start)
    bar = Progress(total=t.steps, initial=start, enable=progress, on_step=on_step)
    compile_history: list[int] = []

    def run_eval(step: int) -> None:
        """Pass@(1,T) at `step`: the test split at the first and last step (the gain), validation between."""
        split = "test" if step in (0, t.steps) else policy_lib.eval_split(cfg, run)
        res = evaluators[split](params, jax.random.fold_in(jax.random.fold_in(base_key, EVAL_STREAM), step))
        eval_log[step] = res
        prefix = "eval" if split == "test" else "val"
        logger.write(step, {f"{prefix}/pass1_T{T}": p for T, (p, _) in res.items()}
                     | {f"{prefix}/pass1_T{T}_se": se for T, (_, se) in res.items()})
        text = "  ".join(f"T={T}: {p:.3f}±{se:.3f}" for T, (p, se) in res.items())
        bar.write(f"eval step {step} ({split}): Pass@(1,T) {text}")

    every = cfg.eval.every if evaluate else 0
    if start == 0 and evaluate:
        run_eval(0)  # the starting policy, the baseline of every gain
    try:
        for step in range(start, t.steps):
            t0 = time.perf_counter()
            key = jax.random.fold_in(base_key, step)
            seeds = np.repeat(tasks_at(train_seeds, data_position, t.tasks_per_step, cfg.seed), t.group_size)
            caps = shard_batch(sample_caps(jax.random.fold_in(key, 0)), mesh)  # same sharding as eval caps: one compile
            if python:
                played = env.play(nnx.merge(graphdef, params), fmt, rcfg, [train_tasks[i] for i in seeds],
                                  np.asarray(jax.device_get(caps)), jax.random.fold_in(key, 1))
                traj = played.trajectory
                _log_faults(out, step + 1, played.faults, [train_tasks[i] for i in seeds])
            else:
                tasks = shard_batch({"seed": jnp.asarray(seeds)}, mesh)
                traj = rollout_fn(params, tasks, caps, jax.random.fold_in(key, 1), inject)
            stats = _rollout_stats(traj) | ({"faults": len(played.faults)} if python else {})
            params, opt_state, m = update(params, opt_state, ref_params, traj, jax.random.fold_in(key, 2))
            m, stats = jax.device_get((m, stats))
            data_position += t.tasks_per_step
            dt = time.perf_counter() - t0
            tokens_seen += int(stats["tokens"])
            compile_history.append(compiles())
            last = {f"train/{k}": v for k, v in m.items()} | {f"rollout/{k}": v for k, v in stats.items()}
            last |= {"perf/step_s": dt, "perf/tokens_per_s": float(stats["tokens"]) / dt,
                     "perf/compiles": compiles(), "data_position": data_position}
            last |= {f"compiles/{k}": v for k, v in compile_counts().items()}
            logger.write(step + 1, last)
            bar.update(success=float(stats["success"]), tok_s=float(stats["tokens"]) / dt,
                       loss=float(m["loss"]))
            if int(m["consecutive_skips"]) >= t.max_nonfinite:
                raise NonFiniteError(
                    f"stopping at step {step + 1}: {int(m['consecutive_skips'])} non-finite updates in a row "
                    f"(train.max_nonfinite={t.max_nonfinite}); each was skipped, so the parameters are those of "
                    f"the last finite update and no checkpoint holds nan/inf. Lower train.optim.lr, check "
                    f"train.optim.max_grad_norm, or use model.param_dtype=float32. Last good checkpoint: "
                    f"{ckpt.describe_last_good()}."
                )
            done = step + 1
            if every and done % every == 0 and done != t.steps:
                run_eval(done)
            if ckpt.due(done, t.steps):
                ckpt.save(done, {"params": params, "opt_state": opt_state, "key": key_data(base_key)},
                          {"data_position": data_position, "config": config_lib.to_dict(cfg),
                           "run": _run_record(eval_log, tokens_seen, last, logger.count)})
                ckpt.commit()  # a failed write stops the run here (CheckpointWriteError), not a save later
        if evaluate and t.steps not in eval_log:
            run_eval(t.steps)
    finally:
        bar.close()
        ckpt.close()
        logger.close()

    from bmrl.model import save_pretrained

    policy_dir = os.path.join(out, "policy")
    save_pretrained(nnx.merge(graphdef, params), tok, policy_dir)
    final_eval = (eval_log.get(t.steps) or eval_log[max(eval_log)]) if eval_log else {}
    first_eval = eval_log[min(eval_log)] if eval_log else {}
    summary = {
        "steps": t.steps,
        "resumed_from": start,
        "wall_s": time.time() - wall0,
        "compiles": compile_counts(),
        "eval_compiles": sum(e.trace_count() for e in evaluators.values()),
        "compile_history": compile_history,
        "skipped_updates": int(last.get("train/skipped_total", 0)) if last else 0,
        "tokens_seen": tokens_seen,
        "final": {k: to_scalar(v) for k, v in last.items()},
        "eval": {str(T): {"pass1": p, "se": se} for T, (p, se) in final_eval.items()},
        "eval_initial": {str(T): {"pass1": p, "se": se} for T, (p, se) in first_eval.items()},
        "eval_history": {str(s): {str(T): p for T, (p, _) in r.items()} for s, r in sorted(eval_log.items())},  # test at 0 and the end, validation between
        "policy": policy_dir,
    }
    write_json_atomic(os.path.join(out, "summary.json"), summary)
    return summary


def _keep_faults_up_to(out: str, step: int) -> None:
    """Drop the lines of `out`/faults.jsonl after `step` (a resume replays those steps and logs them again)."""
    path = os.path.join(out, "faults.jsonl")
    if jax.process_index() == 0 and os.path.exists(path):
        write_jsonl_atomic(path, [r for r in read_jsonl(path) if r.get("step", 0) <= step])


def _log_faults(out: str, step: int, faults: list, tasks: list) -> None:
    """Append the faults of user code in one training batch to `out`/faults.jsonl, with their tasks."""
    if not faults or jax.process_index() != 0:
        return
    with open(os.path.join(out, "faults.jsonl"), "a") as f:
        f.writelines(json.dumps({"step": step, "row": x.row, "task": tasks[x.row], "turn": x.turn, "kind": x.kind,
                                 "message": x.message}, default=str) + "\n" for x in faults)


def _run_record(eval_log: dict, tokens_seen: int, last: dict, records: int) -> dict:
    """What a resumed run needs to write the same summary and metrics as an uninterrupted one."""
    return {"tokens_seen": int(tokens_seen), "metrics_records": int(records),
            "last": {k: to_scalar(v) for k, v in last.items()},
            "eval_log": {str(s): {str(T): [p, se] for T, (p, se) in r.items()} for s, r in eval_log.items()}}


def _run_record_from(meta: dict) -> tuple[dict, int, dict, int | None]:
    """(eval_log, tokens_seen, last, metrics_records) stored by `_run_record` (empty for old checkpoints)."""
    run = meta.get("run") or {}
    evals = {int(s): {int(T): (float(p), float(se)) for T, (p, se) in r.items()}
             for s, r in run.get("eval_log", {}).items()}
    return evals, int(run.get("tokens_seen", 0)), dict(run.get("last", {})), run.get("metrics_records")


def _finished_summary(out: str, steps: int) -> dict | None:
    """The summary of a run in `out` that already finished `steps` steps (summary.json and the final
    checkpoint present), else None."""
    path = os.path.join(out, "summary.json")
    if not (os.path.isfile(path) and os.path.isdir(os.path.join(out, "checkpoints", str(steps)))):
        return None
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("steps") == steps else None


__all__ = ["NonFiniteError", "init_policy", "make_evaluator", "tasks_at", "train"]
