"""RL training: rollout and update alternate in the one training loop (`bmrl.loop`, shared with SFT).

    summary = train(cfg)            # cfg: bmrl.config.Config

    trainer = Trainer(cfg, run)                 # setup: everything built once
    state = trainer.setup(policy)               # TrainState: params, opt state, key, data position, run record
                                                #   (a fresh one, or the newest checkpoint's: trainer.loop.start)
    state = trainer.loop.run(state, trainer.step, trainer.after_step)   # while state.step < steps:
        trainer.step(state)                     # key = fold_in(key, step): every draw derives from (seed, step)
                                                # rows = the train split at the data position, x group_size
                                                # caps = budget.sample(...): inside jit, caps are data
                                                # traj, faults = player.play(params, rows, caps, key)
                                                # params, opt_state = update(..., traj, key)
        trainer.after_step(state, m)            # hooks: log, run health, non-finite guard, evaluate Pass@(1,T)
                                                # then the loop's checkpoint (every checkpoint.every steps), progress
    summary = trainer.finish(state, ...)        # the policy as a Hugging Face directory, summary.json

With `train.oversample` (dynamic sampling) each step plays that many extra task groups and trains on
`tasks_per_step` of them, the groups whose rewards differ first (`select_groups`): one shape, selection by
data. Run health (`bmrl.learn.health`): a run that has lost its signal (no group with differing rewards, or
an invalid-action rate far above its start, for `train.dead_after` steps in a row) is said to be dead in the
log, in metrics.jsonl (`health/dead`) and in summary.json (`health`), and trains on.

The run's player (`bmrl.assembly.players`) plays the env: a JAX env in one compiled loop, a Python env
from the host on the same compiled turn; the loop never asks which.
Resumes from the newest checkpoint in `cfg.out_dir/checkpoints` automatically. Because every random
draw derives from (seed, step) and the checkpoint holds params, optimizer state, key and data
position (with LoRA: the adapters, their optimizer state and the base's identity, its path and
content hash, so a resume against another base is refused), a run killed at any moment and resumed ends with bitwise-identical parameters on CPU.
Outputs in `cfg.out_dir`: config.yaml, metrics.jsonl, tb/, checkpoints/, policy/ (a Hugging Face
directory; with LoRA also policy_adapter/, a PEFT adapter on the base), summary.json; with a Python env (env.kind=python) also faults.jsonl, one line per fault
of user code (step, task, turn, kind, message), counted per step as `rollout/faults`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl import compiles as compiles_lib
from bmrl import memory as memory_lib
from bmrl.assembly import Run, base_dir, build_run, init_policy, lora_spec
from bmrl.assembly.checks import evaluation_tasks
from bmrl.distributed import TRANSFERS, main_writes, process_info, to_host, warm_collectives
from bmrl.eval.run import evaluate_config
from bmrl.learn import optimizer_from_config
from bmrl.learn.advantages import group_has_signal
from bmrl.learn.health import RunHealth
from bmrl.learn import step as step_lib
from bmrl.loop import Loop, Schedule, TrainState
from bmrl.metrics import read_jsonl, to_scalar, write_jsonl_atomic
from bmrl.model.peft import export_policy
from bmrl.parallel import make_mesh, shard_batch
from bmrl.rundir import RunDir

EVAL_STREAM = 0x3E7A1  # fold_in constant separating evaluation keys from training keys


class NonFiniteError(RuntimeError):
    """Training stopped: too many non-finite updates in a row."""


# ---------------------------------------------------------------- tasks
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
def make_evaluator(graphdef, run, cfg, tasks, mesh):
    """Pass@(1,T) at every T of `cfg.eval.ts` on `tasks` (the run player's held-out tasks), one attempt each,
    each T an exact cap: `bmrl.eval.run.evaluate_config` (the one evaluator) with rows sharded over the
    training mesh and gathered across processes. Returns `evaluate(params, key) -> {T: (success rate,
    standard error)}`; its `trace_count()` counts the compiles of its own (the program "eval_rollout", apart
    from training's "rollout" even where their shapes and sampling agree)."""
    ts = list(cfg.eval.ts)
    n = run.player.count(tasks)
    place = lambda tree: shard_batch(jax.device_put(tree), mesh)  # noqa: E731  (no program per shape)
    compiled = [0]

    def evaluate(params, key) -> dict[int, tuple[float, float]]:
        res = evaluate_config(cfg, run, nnx.merge(graphdef, params), key, tasks, ts=ts, ks=[1], attempts=1,
                              mode="exact", bootstrap=0, chunk_size=n, place=place, gather=to_host)
        compiled[0] += res.compiles
        rate = res.surface.estimate[0]
        return {int(t): (float(p), math.sqrt(max(p * (1 - p), 0.0) / n)) for t, p in zip(ts, rate)}

    evaluate.trace_count = lambda: compiled[0]
    return evaluate


@jax.jit
def _copy_tree(tree: Any) -> Any:
    """Every array of `tree` copied into a buffer of its own, in one program (the KL reference: the steps donate
    the parameters)."""
    return jax.tree.map(jnp.copy, tree)


@jax.jit
def _rollout_stats(traj) -> dict:
    """The rollout's metrics, in one program (eager, each was a one-op program of its own)."""
    acted = jnp.maximum(traj.turn_active.sum(), 1)
    rows = step_lib.learning_rows(traj)  # the sequences the learner reads (per-turn samples with a history window)
    return dict(
        success=traj.success.mean(),
        turns_used=traj.turns_used.mean(),
        caps=traj.caps.mean(),
        invalid_rate=(traj.invalid & traj.turn_active).sum() / acted,
        error_rate=(traj.error & traj.turn_active).sum() / acted,
        format_error_rate=(traj.format_error & traj.turn_active).sum() / acted,  # no answer (format.kind)
        truncated=traj.truncated.mean(),
        overflow=traj.overflow.mean(),
        tokens=rows["length"].sum(),
        sampled_tokens=rows["loss_mask"].sum(),
    )


def select_groups(traj, *, group_size: int, keep: int):
    """Dynamic sampling (DAPO's group filter, by data in a static shape): the first `keep` task groups of
    `traj` (rows task-major, `group_size` each) whose rewards differ, then, to fill the batch, the first
    groups whose rewards are all equal (they add no gradient). Returns a Trajectory of keep * group_size rows."""
    signal = group_has_signal(traj.outcome_reward, group_size)  # [groups]
    order = jnp.argsort((~signal).astype(jnp.int32), stable=True)[:keep]  # groups with signal first, each kind in stream order
    rows = (order[:, None] * group_size + jnp.arange(group_size)[None, :]).reshape(-1)
    return jax.tree.map(lambda x: x[rows], traj)


# ---------------------------------------------------------------- the run record
@dataclasses.dataclass
class RunRecord:
    """What a resumed RL run needs to write the same summary and metrics as an uninterrupted one."""

    eval_log: dict = dataclasses.field(default_factory=dict)  # {step: {T: (pass1, se)}}
    tokens_seen: int = 0
    last: dict = dataclasses.field(default_factory=dict)  # the last step's metrics
    metrics_records: int | None = None  # records in metrics.jsonl at the checkpoint
    health: dict = dataclasses.field(default_factory=dict)  # bmrl.learn.health.RunHealth.to_dict()

    def to_meta(self, records: int) -> dict:
        return {"tokens_seen": int(self.tokens_seen), "metrics_records": int(records), "health": self.health,
                "last": {k: to_scalar(v) for k, v in self.last.items()},
                "eval_log": {str(s): {str(T): [p, se] for T, (p, se) in r.items()} for s, r in self.eval_log.items()}}

    @classmethod
    def from_meta(cls, meta: dict) -> RunRecord:
        """The record `to_meta` stored (empty for old checkpoints)."""
        run = meta.get("run") or {}
        evals = {int(s): {int(T): (float(p), float(se)) for T, (p, se) in r.items()}
                 for s, r in run.get("eval_log", {}).items()}
        return cls(evals, int(run.get("tokens_seen", 0)), dict(run.get("last", {})), run.get("metrics_records"),
                   dict(run.get("health") or {}))


# ---------------------------------------------------------------- RL's parts of the loop
class Trainer:
    """Everything an RL run builds once (setup), its step, the hooks after it, and the finish; the loop,
    state, resume and checkpoints are `bmrl.loop`'s."""

    def __init__(self, cfg, run, *, progress: bool | None, on_step: Callable | None, evaluate: bool):
        t = self.t = cfg.train
        self.cfg, self.run, self.out, self.player = cfg, run, cfg.out_dir, run.player
        self.mesh = make_mesh(run.mesh)
        warm_collectives(self.mesh)  # several processes on CPU: their Gloo groups, made together
        self.evaluate_on = evaluate
        self.progress, self.on_step = progress, on_step
        self.batch = (t.tasks_per_step + t.oversample) * t.group_size  # rollout rows (dynamic sampling: more)
        self.train_tasks = self.player.tasks("train")
        self.held_out = evaluation_tasks(cfg, self.player)  # in between: validation; first and last: test
        self.compile_history: list[int] = []
        self.transfer_s = self.eval_transfer_s = 0.0  # seconds spent gathering rows across processes

    def setup(self, policy) -> TrainState:
        """Optimizer, memory plan, the loop (its placed learner), programs and evaluators; the state resumed
        from the newest complete checkpoint, if any (else a fresh one)."""
        cfg, t = self.cfg, self.t
        optimizer = optimizer_from_config(t.optim, t.steps * t.epochs * t.minibatches, master_f32=t.f32_master)
        plan = memory_lib.plan_for_config(cfg, policy.config, self.mesh, optimizer, lora=lora_spec(cfg))
        if jax.process_index() == 0:
            print(plan.table(), flush=True)
            for note in self.run.fmt.notes:  # where the trained context differs from the chat template's rendering
                print(f"bmrl train: format: {note}", flush=True)
        plan.check()  # MemoryPlanError (a ConfigError, exit 2) before anything big is allocated
        self.loop = Loop(cfg, policy, optimizer, Schedule(t.steps, every=cfg.checkpoint.every), name="bmrl train",
                         mesh=self.mesh, log=lambda text: print(text, flush=True), progress=self.progress,
                         on_step=self.on_step)
        learner = self.learner = self.loop.learner  # LoRA: the adapters train; the frozen base is the KL reference
        fresh = self.loop.fresh.params
        self.ref_params = learner.base if learner.lora else _copy_tree(fresh) if t.kl_coef > 0 else None
        state = self.loop.start(RunRecord)
        rcfg = self.run.rollout
        self.play = self.player.playing(learner.graphdef, rcfg, self.mesh)
        self.update = step_lib.make_update(learner.graphdef, optimizer, t, rcfg.sampling.temperature,
                                           shardings=self.loop.shardings, frozen=learner.lora, dropout=learner.dropout)
        budget, batch = self.run.budget, self.batch
        self.sample_caps = compiles_lib.counted_jit(
            lambda key: budget.sample(key, batch, t.group_size, cfg.budget.share_in_group), name="budget_sample")
        self.evaluators = {s: make_evaluator(learner.graphdef, self.run, cfg, tasks, self.mesh)
                           for s, tasks in self.held_out.items()}
        self.counted_before = compiles_lib.counts()
        _keep_faults_up_to(self.out, state.step)  # faults after the checkpoint are logged again by the replayed steps
        self.health = RunHealth.from_dict(state.record.health, t.dead_after, t.dead_invalid_rise)
        self.select = compiles_lib.counted_jit(partial(select_groups, group_size=t.group_size, keep=t.tasks_per_step),
                                               name="select_groups") if t.oversample else None
        self.start = state.step
        return state

    def compile_counts(self) -> dict[str, int]:
        """Compiles of this run per program (bmrl.compiles), since the run started."""
        now, before = compiles_lib.counts(), self.counted_before
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}

    def step(self, state: TrainState) -> tuple[TrainState, dict]:
        """One step: a rollout batch of the data stream at its position, under caps of the budget, then
        the update. Returns the next state and the step's metrics (on the host)."""
        t, cfg = self.t, self.cfg
        t0, moved0 = time.perf_counter(), TRANSFERS["seconds"]
        key = jax.random.fold_in(state.key, state.step)
        drawn = t.tasks_per_step + t.oversample
        idx = tasks_at(np.arange(self.player.count(self.train_tasks), dtype=np.int32), state.data_position,
                       drawn, cfg.seed)
        rows = self.player.take(self.train_tasks, np.repeat(idx, t.group_size))
        caps = shard_batch(self.sample_caps(jax.random.fold_in(key, 0)), self.mesh)  # as eval caps: one compile
        traj, faults = self.play(self.learner.policy_params(state.params), rows, caps, jax.random.fold_in(key, 1))
        _log_faults(self.out, state.step + 1, faults, rows)
        stats = _rollout_stats(traj) | ({"faults": len(faults)} if faults is not None else {})
        if self.select is not None:  # dynamic sampling: tasks_per_step of the groups, those with signal first
            traj = self.select(traj)
        params, opt_state, m = self.update(state.params, state.opt_state, self.ref_params, traj,
                                           jax.random.fold_in(key, 2))
        m, stats = to_host((m, stats))
        dt, moved = time.perf_counter() - t0, TRANSFERS["seconds"] - moved0
        self.transfer_s += moved
        data_position = state.data_position + drawn
        record = dataclasses.replace(state.record, tokens_seen=state.record.tokens_seen + int(stats["tokens"]))
        self.compile_history.append(sum(self.compile_counts().values()))
        last = {f"train/{k}": v for k, v in m.items()} | {f"rollout/{k}": v for k, v in stats.items()}
        last |= {"perf/step_s": dt, "perf/transfer_s": moved, "perf/tokens_per_s": float(stats["tokens"]) / dt,
                 "perf/compiles": sum(self.compile_counts().values()), "data_position": data_position}
        last |= {f"compiles/{k}": v for k, v in self.compile_counts().items()}
        record.last = last
        return TrainState(params, opt_state, state.key, state.step + 1, data_position, record), m

    def after_step(self, state: TrainState, m: dict) -> dict:
        """The hooks of a finished step: log, the non-finite guard, evaluation; returns the progress bar's figures."""
        t, last, done = self.t, state.record.last, state.step
        taken = t.epochs * t.minibatches - int(last["train/no_signal_updates"])  # minibatch steps with signal
        flag = self.health.observe(done, float(last["rollout/success"]), taken > 0, float(last["rollout/invalid_rate"]))
        state.record.health = self.health.to_dict()
        last["health/dead"] = int(self.health.dead)
        self.loop.logger.write(done, last)
        if flag is not None:  # said loudly, once per kind; the run goes on (the study checks verdicts without it)
            self.loop.bar.write(f"bmrl train: WARNING: {self.out}: the run has lost its signal: dead since step "
                                f"{flag.step}: {flag.reason}.")
        if int(m["consecutive_skips"]) >= t.max_nonfinite:
            raise NonFiniteError(
                f"stopping at step {done}: {int(m['consecutive_skips'])} non-finite updates in a row "
                f"(train.max_nonfinite={t.max_nonfinite}); each was skipped, so the parameters are those of "
                f"the last finite update and no checkpoint holds nan/inf. Lower train.optim.lr, check "
                f"train.optim.max_grad_norm, or use model.param_dtype=float32. Last good checkpoint: "
                f"{self.loop.ckpt.describe_last_good()}."
            )
        every = self.cfg.eval.every if self.evaluate_on else 0
        if every and done % every == 0 and done != t.steps:
            self.evaluate(state)
        return {"success": float(last["rollout/success"]), "tok_s": float(last["perf/tokens_per_s"]), "loss": float(m["loss"])}

    def evaluate(self, state: TrainState) -> None:
        """Pass@(1,T) at the state's step: the test split at the first and last step (the gain), validation between."""
        step = state.step
        split = "test" if step in (0, self.t.steps) else self.run.player.eval_split()
        moved0 = TRANSFERS["seconds"]
        res = self.evaluators[split](self.learner.policy_params(state.params), jax.random.fold_in(jax.random.fold_in(state.key, EVAL_STREAM), step))
        state.record.eval_log[step] = res
        self.eval_transfer_s += TRANSFERS["seconds"] - moved0
        prefix = "eval" if split == "test" else "val"
        self.loop.logger.write(step, {f"{prefix}/pass1_T{T}": p for T, (p, _) in res.items()}
                               | {f"{prefix}/pass1_T{T}_se": se for T, (_, se) in res.items()})
        text = "  ".join(f"T={T}: {p:.3f}±{se:.3f}" for T, (p, se) in res.items())
        self.loop.bar.write(f"eval step {step} ({split}): Pass@(1,T) {text}")

    def finish(self, state: TrainState, tokenizer, wall0: float) -> dict:
        """Save the policy (a Hugging Face directory; with LoRA also the PEFT adapter) and return the summary."""
        t, rec = self.t, state.record
        written = export_policy(self.learner.merged(state.params), tokenizer, self.out, base_dir(self.cfg))
        policy_dir = written["policy"]
        log = rec.eval_log
        final_eval = (log.get(t.steps) or log[max(log)]) if log else {}
        first_eval = log[min(log)] if log else {}
        return {
            "steps": t.steps,
            "resumed_from": self.start,
            "wall_s": time.time() - wall0,
            "compiles": self.compile_counts(),
            "eval_compiles": sum(e.trace_count() for e in self.evaluators.values()),
            "compile_history": self.compile_history,
            "skipped_updates": int(rec.last.get("train/skipped_total", 0)) if rec.last else 0,
            "health": self.health.to_dict(),
            "tokens_seen": rec.tokens_seen,
            "final": {k: to_scalar(v) for k, v in rec.last.items()},
            "eval": {str(T): {"pass1": p, "se": se} for T, (p, se) in final_eval.items()},
            "eval_initial": {str(T): {"pass1": p, "se": se} for T, (p, se) in first_eval.items()},
            "eval_history": {str(s): {str(T): p for T, (p, _) in r.items()} for s, r in sorted(log.items())},  # test at 0 and the end, validation between
            "policy": policy_dir,
            "distributed": self.distributed_record(state),
        } | ({"policy_adapter": written["policy_adapter"]} if "policy_adapter" in written else {})

    def distributed_record(self, state: TrainState) -> dict:
        """Where the run ran and what crossing processes cost: processes, devices, the mesh, and the
        seconds of host gathers across processes (`bmrl.distributed.to_host`) per step of this session
        and per evaluation (0 on one process)."""
        info, ran = process_info(), max(state.step - self.start, 1)
        evals = sum(1 for s in state.record.eval_log if s >= self.start) or 1
        return {"processes": info.process_count, "devices": info.device_count,
                "local_devices": info.local_device_count, "mesh": dict(self.mesh.shape),
                "transfer_s_per_step": self.transfer_s / ran, "transfer_s_per_eval": self.eval_transfer_s / evals}


def train(cfg, *, progress: bool | None = None, run: Run | None = None,
          on_step: Callable[[int, int], Any] | None = None, evaluate: bool = True) -> dict:
    """Run RL training for `cfg` (a validated `bmrl.config.Config`); returns the summary dict.

    `evaluate=False` skips the training-time Pass@(1,T) evaluations (at the start, every `eval.every`
    steps and at the end): for callers that evaluate the trained policy themselves (`bmrl reproduce`
    evaluates the base once and every policy on the full grid in its own stage).

    Raises `NonFiniteError` after `cfg.train.max_nonfinite` non-finite updates in a row (the
    parameters and checkpoints keep the last finite values), `CheckpointWriteError` when a save
    fails (the previous checkpoint is kept), `OutputNotWritable` or `ConfigError` (an out_dir made with
    other settings: `bmrl.rundir`), `NoGoodCheckpoint` or `CheckpointMismatch` before training. A run
    that already finished returns its summary untouched.
    """
    wall0 = time.time()
    t, out = cfg.train, cfg.out_dir
    rundir = RunDir(out)
    finished = rundir.claim(cfg, "rl", accept=lambda s: s.get("steps") == t.steps and os.path.isdir(
        os.path.join(out, "checkpoints", str(t.steps))))  # not writable / other settings: refused, exit 2
    if finished is not None:  # resuming a finished run: nothing to do, nothing rewritten
        print(f"bmrl train: {out} already finished {t.steps} steps; nothing to do (raise train.steps to "
              "train on).", flush=True)
        return finished
    rundir.write_config(cfg)
    policy, tok = init_policy(cfg, None if run is None else run.tokenizer)
    run = build_run(cfg, tok) if run is None else run  # checked before any write by `bmrl train`
    trainer = Trainer(cfg, run, progress=progress, on_step=on_step, evaluate=evaluate)
    state = trainer.setup(policy)
    try:
        if state.step == 0 and evaluate:
            trainer.evaluate(state)  # the starting policy, the baseline of every gain
        state = trainer.loop.run(state, trainer.step, trainer.after_step)
        if evaluate and t.steps not in state.record.eval_log:
            trainer.evaluate(state)
    finally:
        trainer.loop.close()
    summary = trainer.finish(state, tok, wall0)
    rundir.write_json("summary.json", summary)
    if trainer.health.dead and jax.process_index() == 0:
        print(f"bmrl train: WARNING: {out} finished {t.steps} steps as a dead run ({trainer.health.describe()}); "
              "its summary.json says so under 'health'. Lower train.optim.lr, add train.optim.warmup_steps or "
              "train.oversample (docs/training_stability.md).", file=sys.stderr, flush=True)
    return summary


def _keep_faults_up_to(out: str, step: int) -> None:
    """Drop the lines of `out`/faults.jsonl after `step` (a resume replays those steps and logs them again)."""
    path = os.path.join(out, "faults.jsonl")

    def write() -> None:
        if os.path.exists(path):
            write_jsonl_atomic(path, [r for r in read_jsonl(path) if r.get("step", 0) <= step])

    main_writes("bmrl-faults", write, wait=False)  # no other process reads faults.jsonl during the run


def _log_faults(out: str, step: int, faults: list, tasks: list) -> None:
    """Append the faults of user code in one training batch to `out`/faults.jsonl, with their tasks."""
    if not faults:
        return

    def write() -> None:
        with open(os.path.join(out, "faults.jsonl"), "a") as f:
            f.writelines(json.dumps({"step": step, "row": x.row, "task": tasks[x.row], "turn": x.turn,
                                     "kind": x.kind, "message": x.message}, default=str) + "\n" for x in faults)

    main_writes("bmrl-faults", write, wait=False)  # a log line per faulty step: no meeting for each


__all__ = ["NonFiniteError", "RunRecord", "Trainer", "make_evaluator", "select_groups", "tasks_at", "train"]
