"""The SFT base policy: behaviour cloning of eps-noisy oracle demonstrations (errors; recovery in a fraction).

    summary = run_sft(cfg)     # writes <out_dir>/policy (HF dir; LoRA: policy_adapter/ too), config.yaml, sft_metrics.jsonl, summary.json

Each step draws `sft.batch_size` fresh demonstrations (the run's player: `bmrl.learn.demos.make_demos`
for a JAX env, cut after the demonstrator's first wrong action, except a fraction `sft.recovery` that
go on and show the repair) of train-split tasks and takes one optimizer step of token cross-entropy
on the reply tokens (action tokens + stop; `bmrl.learn.sft`), in the one training loop that RL uses
(`bmrl.loop`: SFT brings the step and its data source). Everything is a function of `cfg.seed` and the
step: step s uses tasks s*B .. s*B+B-1 (the data position) of a seed-shuffled train pool and demo key
fold_in(key, s). The trained policy is evaluated by the one evaluator, greedy and sampled, on
held-out test-split tasks at the largest turn cap, then saved as a Hugging Face directory.

A Python env (env.kind=python) runs the same way through its player: its demonstrations are the noisy
oracle played from the host on its `info["next_oracle_action"]` (`bmrl.learn.host_demos`;
`player.check_demos` refuses an env without it), the tasks are its task file's train lines, and a
demonstration is at most `rollout.max_len` tokens (later observations are known only as the env runs).
The run directory follows the rule of `bmrl.rundir` (refused when not writable or made with other
settings; a finished one is returned untouched); a killed run resumes from its newest checkpoint
(`<out_dir>/checkpoints`, saved at the first log step `sft.checkpoint_minutes` after the last) with
bitwise the same result; with LoRA only onto the base its adapters were trained on (else `CheckpointMismatch`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from bmrl.assembly import Run, base_dir, build_run, build_tokenizer, fitting_cap, load_policy, new_policy, with_lora
from bmrl.config import Config
from bmrl.eval.run import evaluate_config
from bmrl.learn.demos import longest_reply, windowed_rows
from bmrl.learn.optim import optimizer_from_config
from bmrl.learn.sft import demo_stats, make_sft_step
from bmrl.learn.step import DROPOUT_STREAM
from bmrl.loop import Loop, Schedule, TrainState
from bmrl.model.decoder import num_params
from bmrl.model.peft import export_policy
from bmrl.rollout.types import per_turn_contexts
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


def _windowed(cfg: Config, run: Run) -> bool:
    """Whether each demonstrated turn trains as its own row, in the context a rollout would give it (a history
    window, `rollout.history_turns`, or the chat template's history, `format.history: template`: the run's
    rollout sees contexts of its own per turn), rather than each whole demonstration as one append-only row."""
    return per_turn_contexts(run.rollout, run.fmt)


def _demo_source(cfg: Config, run: Run, train: Any, key: jax.Array, demo_len: int) -> Callable[[int, int], Any]:
    """`demos_at(step, position)`: the demonstrations of the train tasks at data position `position` of a
    seed-shuffled pool, drawn with step `step`'s key: a function of (seed, step, position) only."""
    s, player = cfg.sft, run.player
    order = np.asarray(_permutation(jax.random.fold_in(key, 0), player.count(train)))

    def demos_at(step: int, position: int):
        idx = order[(position + np.arange(s.batch_size)) % len(order)]
        k = jax.random.fold_in(jax.random.fold_in(key, 1), step)
        caps = None
        if cfg.env.show_budget:  # show the budgets RL will: drawn from the run's budget sampler
            caps = jnp.minimum(run.budget.sample(jax.random.fold_in(k, 7), s.batch_size), s.demo_turns)
        return player.demos(player.take(train, idx), k, num_turns=s.demo_turns, max_len=demo_len, noise=s.noise,
                            recovery=s.recovery, caps=caps, max_reply_tokens=cfg.rollout.max_reply_tokens)

    return demos_at


_permutation = jax.jit(jax.random.permutation, static_argnums=1)  # one program (eager: an iota and a shuffle)


@dataclasses.dataclass
class SFTRecord:
    """What a resumed SFT run needs to write the same metrics and summary as an uninterrupted one."""

    losses: list = dataclasses.field(default_factory=list)  # every step's loss
    last: dict = dataclasses.field(default_factory=dict)  # the last logged row
    metrics_records: int | None = None  # records in sft_metrics.jsonl at the checkpoint

    def to_meta(self, records: int) -> dict:
        return {"losses": self.losses, "last": self.last, "metrics_records": int(records)}

    @classmethod
    def from_meta(cls, meta: dict) -> SFTRecord:
        run = meta["run"]
        return cls(list(run["losses"]), dict(run["last"]), run["metrics_records"])


def _fit(cfg: Config, run: Run, policy, demos_at: Callable, log: Callable,
         on_step: Callable[[int, int], Any] | None = None) -> tuple[Any, list, dict]:
    """`sft.steps` optimizer steps on fresh demonstrations, in the one training loop (`bmrl.loop`: its resume,
    checkpoints and LoRA split). Metrics go to sft_metrics.jsonl at log steps (a tenth of the steps), where a
    checkpoint is saved once `sft.checkpoint_minutes` passed since the last (a save costs seconds, a step far
    less); `on_step(steps done, steps)` hears the progress at log steps. A killed run resumes from
    the newest checkpoint, bitwise as if uninterrupted. Returns (the trained policy, every step's loss, the
    last logged row)."""
    s = cfg.sft
    tx = optimizer_from_config(s.optim, s.steps)
    schedule = Schedule(s.steps, minutes=s.checkpoint_minutes, log_every=max(1, s.steps // 10),
                        metrics="sft_metrics.jsonl", tensorboard=False)
    loop = Loop(cfg, policy, tx, schedule, name="sft", log=log)  # progress: `report`, at log steps
    learner = loop.learner  # LoRA: the adapters train, the base is a frozen input of the step
    windowed = _windowed(cfg, run)  # each turn its own row, in the contexts a windowed rollout builds
    to_rows = jax.jit(windowed_rows, static_argnums=(1, 2))
    reply = longest_reply(run.env, run.fmt, cfg.rollout.max_reply_tokens) + 1  # stop included
    max_targets = (1 if windowed else s.demo_turns) * reply
    sft_step = make_sft_step(learner.graphdef, tx, max_targets)
    t_train = time.time()
    pending: list[tuple[int, dict]] = []  # device metrics, fetched at log steps (keeps dispatch async)

    def step(state: TrainState) -> tuple[TrainState, tuple[dict, Any]]:
        d = demos_at(state.step, state.data_position)
        drop = None
        if learner.dropout:  # LoRA's dropout draws: a function of (seed, step)
            drop = jax.random.fold_in(jax.random.fold_in(state.key, DROPOUT_STREAM), state.step)
        if windowed:
            rows = to_rows(d, cfg.rollout.history_turns, cfg.rollout.max_len)
        else:
            rows = (d.tokens, d.length, d.loss_mask)
        params, opt_state, m = sft_step(state.params, state.opt_state, *rows, learner.base, drop)
        return dataclasses.replace(state, params=params, opt_state=opt_state, step=state.step + 1,
                                   data_position=state.data_position + s.batch_size), (m, d)

    def after(state: TrainState, out: tuple[dict, Any]) -> dict:
        """Step metrics to sft_metrics.jsonl at log steps, the last with its demonstrations' stats."""
        m, d = out
        pending.append((state.step - 1, m))
        if not schedule.logs(state.step):
            return {}
        elapsed, rec = round(time.time() - t_train, 3), state.record
        for i, pm in pending:
            row = {k: float(v) for k, v in pm.items()}
            if i == state.step - 1:
                row.update(demo_stats(d), time_s=elapsed)
                rec.last = {"step": i, **row}
            rec.losses.append(row["loss"])
            loop.logger.write(i, row)
        pending.clear()
        return {"loss": rec.last["loss"]}

    def report(state: TrainState) -> None:
        """At a log step, after its checkpoint: `on_step` hears the progress, then the step's line (a stage's ETA
        line, `bmrl reproduce`, reads this step's progress)."""
        if schedule.logs(state.step):
            rec = state.record
            if on_step is not None:
                on_step(state.step, s.steps)
            log(f"sft step {state.step - 1:5d}  loss {rec.last['loss']:.4f}  token acc {rec.last['token_acc']:.3f}  "
                f"({rec.last['time_s']:.1f}s)")

    state = loop.start(SFTRecord)
    try:
        state = loop.run(state, step, after, report)
    finally:
        loop.close()
    jax.block_until_ready(state.params)
    return learner.merged(state.params), state.record.losses, state.record.last


def run_sft(cfg: Config, *, log: Callable[[str], Any] = print, return_model: bool = False, run=None,
            on_step: Callable[[int, int], Any] | None = None) -> dict | tuple[dict, Any]:
    """Train the SFT base policy of `cfg`; write it and its summary under `cfg.out_dir`; return the summary
    (and the trained `Decoder` with `return_model=True`, for callers that go on in-process). `on_step(n,
    steps)` hears the training progress at log steps (a tenth of the steps, and the last) (`bmrl reproduce`'s stage ETA).

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
    # windowed: whole demonstrations are laid out, then cut into each turn's row
    demo_len = player.demo_len(s.demo_turns, 1 << 30 if _windowed(cfg, run) else cfg.rollout.max_len)
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
    model, losses, last = _fit(cfg, run, model, _demo_source(cfg, run, train, key, demo_len), log, on_step)
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
