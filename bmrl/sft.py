"""The SFT base policy: behaviour cloning of eps-noisy oracle demonstrations (errors; recovery in a fraction).

    summary = run_sft(cfg)     # writes <out_dir>/policy (HF dir; LoRA: policy_adapter/ too), config.yaml, sft_metrics.jsonl, summary.json

Each step draws `sft.batch_size` fresh demonstrations (the run's player: `bmrl.learn.demos.make_demos`
for a JAX env, cut after the demonstrator's first wrong action, except a fraction `sft.recovery` that
go on and show the repair) of train-split tasks and takes one optimizer step of token cross-entropy
on the reply tokens (action tokens + stop; `bmrl.learn.sft`). Everything is a function of
`cfg.seed` and the step: step s uses tasks s*B .. s*B+B-1 of a seed-shuffled train pool and demo key
fold_in(key, s). The trained policy is evaluated by the one evaluator, greedy and sampled, on
held-out test-split tasks at the largest turn cap, then saved as a Hugging Face directory.

A Python env (env.kind=python) runs the same way through its player: its demonstrations are the noisy
oracle played from the host on its `info["next_oracle_action"]` (`bmrl.learn.host_demos`;
`player.check_demos` refuses an env without it), the tasks are its task file's train lines, and a
demonstration is at most `rollout.max_len` tokens (later observations are known only as the env runs).
The run directory follows the rule of `bmrl.rundir` (refused when not writable or made with other
settings; a finished one is returned untouched); a killed run resumes from its newest checkpoint
(`<out_dir>/checkpoints`, saved at the log steps) with bitwise the same result; with LoRA only onto the
base its adapters were trained on (else `CheckpointMismatch`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.assembly import Run, base_dir, build_run, build_tokenizer, fitting_cap, load_policy, new_policy, with_lora
from bmrl.assembly.learner import Learner
from bmrl.checkpoint import Checkpointer
from bmrl.config import Config, to_dict
from bmrl.eval.run import evaluate_config
from bmrl.learn.demos import longest_reply, windowed_rows
from bmrl.learn.optim import optimizer_from_config
from bmrl.learn.sft import demo_stats, make_sft_step
from bmrl.learn.step import DROPOUT_STREAM, init_opt_state
from bmrl.metrics import MetricsLogger
from bmrl.model.decoder import num_params
from bmrl.model.peft import export_policy
from bmrl.rundir import RunDir


def episode_stats(result) -> dict[str, float]:
    """Success and per-turn decision quality of an evaluation's attempts (pooled over acted turns)."""
    ep = result.episodes
    active = ep.turn_active
    acted = active.any()
    mean = lambda x: float(x[active].mean()) if acted else 0.0  # noqa: E731
    return {
        "success": float(ep.success.mean()),
        "decision_accuracy": mean(ep.action == ep.oracle_action),
        "error_rate": mean(ep.error),
        "invalid_rate": mean(ep.invalid),
        "turns": float(ep.turns_used.mean()),
        "overflow": float(result.metrics["overflow"].mean),
    }


def evaluate_policy(model, run: Run, cfg: Config, tasks: Any, cap: int, key: jax.Array,
                    modes: tuple[str, ...] = ("greedy", "sampled")) -> dict[str, dict]:
    """Greedy and/or sampled (eval.temperature) attempts of `tasks` at turn cap `cap`, one per task,
    by the one evaluator (`bmrl.eval.run.evaluate_config`)."""
    base = run.eval_rollout
    out = {}
    for name, temp in (("greedy", 0.0), ("sampled", cfg.eval.temperature)):
        if name not in modes:
            continue
        rcfg = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, temperature=temp))
        res = evaluate_config(cfg, run, model, jax.random.fold_in(key, int(temp * 1000)), tasks, ts=[cap], ks=[1],
                              attempts=1, rollout_cfg=rcfg, mode="exact", bootstrap=0)
        out[name] = episode_stats(res)
    return out


def _policy(cfg: Config, run: Run | None) -> tuple[Any, Any, Run]:
    """(model, tokenizer, run): the policy SFT starts from and the run built for its tokenizer."""
    if cfg.model.path is not None:
        model, tokenizer = load_policy(cfg.model.path, cfg.model)
    else:
        tokenizer = build_tokenizer(cfg) if run is None else run.tokenizer
        model = new_policy(cfg, tokenizer)
    model = with_lora(cfg, model)  # model.lora.rank > 0: fresh adapters on the frozen model
    return model, tokenizer, build_run(cfg, tokenizer) if run is None else run  # `bmrl sft` passes its bundle


def _demo_source(cfg: Config, run: Run, train: Any, key: jax.Array, demo_len: int) -> Callable[[int], Any]:
    """`demos_at(step)`: step s's demonstrations, a function of (seed, s) only."""
    s, player = cfg.sft, run.player
    order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), player.count(train)))

    def demos_at(step: int):
        idx = order[(step * s.batch_size + np.arange(s.batch_size)) % len(order)]
        k = jax.random.fold_in(jax.random.fold_in(key, 1), step)
        caps = None
        if cfg.env.show_budget:  # show the budgets RL will: drawn from the run's budget sampler
            caps = jnp.minimum(run.budget.sample(jax.random.fold_in(k, 7), s.batch_size), s.demo_turns)
        return player.demos(player.take(train, idx), k, num_turns=s.demo_turns, max_len=demo_len, noise=s.noise,
                            recovery=s.recovery, caps=caps, max_reply_tokens=cfg.rollout.max_reply_tokens)

    return demos_at


def _fit(cfg: Config, run: Run, policy, demos_at: Callable, out_dir: str, log: Callable,
         on_step: Callable[[int, int], Any] | None = None) -> tuple[Any, list, dict]:
    """`sft.steps` optimizer steps on fresh demonstrations; metrics to sft_metrics.jsonl at log steps, where
    `on_step(steps done, steps)` hears the progress too, and a checkpoint is saved once `sft.checkpoint_minutes`
    passed since the last (the training loop's `Checkpointer`, keeping `checkpoint.keep`; a save costs
    seconds, a step far less): a killed run resumes from the newest one, bitwise as if uninterrupted
    (step s's demonstrations are a function of the seed and s). With LoRA the adapters train on the frozen base,
    whose identity the checkpoints record: a resume onto another base raises `CheckpointMismatch`
    (`bmrl.assembly.learner`). Returns (the trained policy, losses, the last logged row)."""
    s = cfg.sft
    tx = optimizer_from_config(s.optim, s.steps)
    learner, params = Learner.of(policy, cfg)  # LoRA: the adapters train, the base is a frozen input of the step
    opt_state = init_opt_state(tx, params)  # distinct buffers: the step donates them
    window = cfg.rollout.history_turns  # each turn its own row, in the contexts a windowed rollout builds
    to_rows = jax.jit(windowed_rows, static_argnums=(1, 2))
    max_targets = (1 if window else s.demo_turns) * (longest_reply(run.env, run.fmt, cfg.rollout.max_reply_tokens) + 1)
    step_fn = make_sft_step(learner.graphdef, tx, max_targets)
    dropout_key = jax.random.fold_in(jax.random.key(cfg.seed), DROPOUT_STREAM)  # LoRA dropout draws: (seed, step)
    t_train, log_every = time.time(), max(1, s.steps // 10)
    saved_at = t_train
    pending: list[tuple[int, dict]] = []  # device metrics, fetched at log steps (keeps dispatch async)
    ckpt = Checkpointer(os.path.join(out_dir, "checkpoints"), keep=cfg.checkpoint.keep)
    start, losses, last, records = 0, [], {}, None  # losses: every step's; last: the last logged row
    restored = learner.restore(ckpt, {"params": params, "opt_state": opt_state})  # LoRA: refused on another base
    if restored is not None:
        (params, opt_state), meta = (restored[0]["params"], restored[0]["opt_state"]), restored[1]
        start, losses, last, records = int(meta["step"]), meta["losses"], meta["last"], meta["metrics_records"]
        log(f"sft: resumed from {ckpt.directory} at step {start}")
    logger = MetricsLogger(out_dir, tensorboard=False, name="sft_metrics.jsonl", keep_records=records)  # the loop's logger
    try:
        for step in range(start, s.steps):
            d = demos_at(step)
            drop = jax.random.fold_in(dropout_key, step) if learner.dropout else None
            rows = (d.tokens, d.length, d.loss_mask) if window is None else to_rows(d, window, cfg.rollout.max_len)
            params, opt_state, m = step_fn(params, opt_state, *rows, learner.base, drop)
            pending.append((step, m))
            if step % log_every == 0 or step == s.steps - 1:
                elapsed = round(time.time() - t_train, 3)
                for i, pm in pending:
                    row = {k: float(v) for k, v in pm.items()}
                    if i == step:
                        row.update(demo_stats(d), time_s=elapsed)
                        last = {"step": i, **row}
                    losses.append(row["loss"])
                    logger.write(i, row)
                pending.clear()
                if time.time() - saved_at >= 60 * s.checkpoint_minutes:
                    saved_at = time.time()
                    ckpt.save(step + 1, {"params": params, "opt_state": opt_state},
                              {"config": to_dict(cfg), "losses": losses, "last": last, "metrics_records": logger.count}
                              | learner.checkpoint_meta())
                    ckpt.commit()  # written before the next step donates the buffers
                if on_step is not None:
                    on_step(step + 1, s.steps)
                log(f"sft step {step:5d}  loss {last['loss']:.4f}  token acc {last['token_acc']:.3f}  ({elapsed:.1f}s)")
    finally:
        logger.close()
        ckpt.close()
    jax.block_until_ready(params)
    return learner.merged(params), losses, last


def run_sft(cfg: Config, *, log: Callable[[str], Any] = print, return_model: bool = False, run=None,
            on_step: Callable[[int, int], Any] | None = None) -> dict | tuple[dict, Any]:
    """Train the SFT base policy of `cfg`; write it and its summary under `cfg.out_dir`; return the summary
    (and the trained `Decoder` with `return_model=True`, for callers that go on in-process). `on_step(n,
    steps)` hears the training progress at each log step (`bmrl reproduce`'s stage ETA).

    Every config problem is raised (as `ConfigError`) before anything is written.
    """
    t_start, s = time.time(), cfg.sft
    rundir = RunDir(cfg.out_dir)
    finished = rundir.claim(cfg, "sft")  # not writable / other settings: refused (exit 2) before any work
    if finished is not None:
        log(f"sft: {cfg.out_dir} already finished with these settings; nothing to do (delete it to redo it)")
        return (finished, load_policy(finished["policy_dir"], cfg.model)[0]) if return_model else finished
    model, tokenizer, run = _policy(cfg, run)
    env, fmt, player = run.env, run.fmt, run.player
    player.check_demos()  # a Python env must name its oracle's next action
    cap = fitting_cap(cfg, env, fmt, run.budget.max_cap)  # the largest training cap that fits
    windowed = cfg.rollout.history_turns is not None  # then whole demos are laid out, then cut into windows
    demo_len = player.demo_len(s.demo_turns, 1 << 30 if windowed else cfg.rollout.max_len)
    rundir.write_config(cfg)
    train, test = player.tasks("train"), player.tasks("test", cfg.eval.num_tasks)
    key = jax.random.key(cfg.seed)
    eval_key = jax.random.fold_in(key, 2)
    log(
        f"sft: {player.label} | {num_params(model):,} params | {s.steps} steps x {s.batch_size} demos "
        f"(noise {s.noise}, recovery {s.recovery}, <= {s.demo_turns} turns, {demo_len} tokens) | eval T={cap} on "
        f"{player.count(test)} test levels"
    )
    t_eval = time.time()
    before = evaluate_policy(model, run, cfg, test, cap, eval_key, ("greedy",))["greedy"]
    log(f"sft: initial policy greedy success {before['success']:.3f} ({time.time() - t_eval:.1f}s)")
    t_train = time.time()
    model, losses, last = _fit(cfg, run, model, _demo_source(cfg, run, train, key, demo_len),
                               cfg.out_dir, log, on_step)
    train_time = time.time() - t_train
    result = evaluate_policy(model, run, cfg, test, cap, eval_key)
    written = export_policy(model, tokenizer, cfg.out_dir, base_dir(cfg))  # LoRA: policy_adapter/ beside policy/
    policy_dir = Path(written["policy"])
    summary = _summary(cfg, run, model, cap, player.count(test), before, result, losses, last, policy_dir)
    summary |= {"train_time_s": round(train_time, 2), "wall_time_s": round(time.time() - t_start, 2),
                "policy_dir": str(policy_dir)} | ({"policy_adapter": written["policy_adapter"]}
                                                   if "policy_adapter" in written else {})
    rundir.write_json("summary.json", summary)
    log(
        f"sft done: success@T={cap} greedy {summary['success_greedy']:.3f} sampled {summary['success_sampled']:.3f} "
        f"(init {before['success']:.3f}) | decision acc {summary['decision_accuracy_sampled']:.3f} | "
        f"loss {summary['final_loss']:.4f} | {summary['wall_time_s']:.0f}s"
    )
    return (summary, model) if return_model else summary


def _summary(cfg: Config, run: Run, model, cap: int, num_test: int, before: dict, result: dict, losses: list,
             last: dict, policy_dir: Path) -> dict:
    """summary.json's measurements (times and the policy directory are added by the caller)."""
    s = cfg.sft
    return {
        "env": run.env.name,
        "env_options": run.player.options,
        "num_params": int(num_params(model)),
        "steps": s.steps,
        "batch_size": s.batch_size,
        "noise": s.noise,
        "eval_T": cap,
        "eval_tasks": num_test,
        "eval_temperature": cfg.eval.temperature,
        "success_greedy": result["greedy"]["success"],
        "success_sampled": result["sampled"]["success"],
        "decision_accuracy_greedy": result["greedy"]["decision_accuracy"],
        "decision_accuracy_sampled": result["sampled"]["decision_accuracy"],
        "error_rate_sampled": result["sampled"]["error_rate"],
        "invalid_rate_sampled": result["sampled"]["invalid_rate"],
        "init_success_greedy": before["success"],
        "final_loss": float(np.mean(losses[-10:])) if losses else float("nan"),
        "final_token_acc": last.get("token_acc", float("nan")),
        "eval": result,
    }


__all__ = ["episode_stats", "evaluate_policy", "run_sft"]
