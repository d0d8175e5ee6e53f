"""The SFT base policy: behaviour cloning of eps-noisy oracle demonstrations (errors; recovery in a fraction).

    summary = run_sft(cfg)     # writes <out_dir>/policy (HF dir), config.yaml, sft_metrics.jsonl, summary.json

Each step draws `sft.batch_size` fresh demonstrations (`bmrl.learn.demos.make_demos`, cut after the
demonstrator's first wrong action, except a fraction `sft.recovery` that go on and show the repair) of train-split levels and takes one optimizer step of token
cross-entropy on the reply tokens (action tokens + stop). Everything is a function of `cfg.seed` and
the step: step s uses levels s*B .. s*B+B-1 of a seed-shuffled train pool and demo key
fold_in(key, s). The trained policy is evaluated by the one evaluator, greedy and sampled, on
held-out test-split levels at the largest turn cap, then saved as a Hugging Face directory.

A Python env (env.kind=python) runs the same way: its demonstrations are the noisy oracle played from
the host on its `info["next_oracle_action"]` (`bmrl.learn.host_demos`; `check_demos` refuses an env
without it), the tasks are its task file's train lines, and a demonstration is at most
`rollout.max_len` tokens (later observations are known only as the env runs).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bmrl.config import Config
from bmrl.learn.demos import Demos, demo_tokens_needed, longest_reply, make_demos
from bmrl.learn.logprobs import token_logprobs
from bmrl.learn.optim import optimizer_from_config
from bmrl.rundir import RunDir


def sft_loss(
    model, tokens: jax.Array, length: jax.Array, loss_mask: jax.Array, max_targets: int | None = None
) -> tuple[jax.Array, dict]:
    """Token-mean cross-entropy on the loss-masked tokens and the argmax accuracy there.

    tokens: [B, L], length: [B], loss_mask: [B, L] (1 on reply tokens). The model sees each row's
    first `length` tokens (padding masked); the hidden state at i predicts token i + 1 (the
    alignment of `token_logprobs`). With `max_targets` (a static bound on loss tokens per row, e.g.
    turns x reply tokens) only those positions go through the unembedding: a demo trains on a few
    dozen of its hundreds of tokens, so this skips most of the [B, L, V] logits.
    """
    attention = jnp.arange(tokens.shape[1])[None, :] < length[:, None]
    mask = loss_mask.astype(jnp.float32)
    if max_targets is None:
        logits = model(tokens, attention_mask=attention)
        logp = token_logprobs(logits, tokens)
        pred = jnp.pad(jnp.argmax(logits[:, :-1], axis=-1), ((0, 0), (1, 0)), constant_values=-1)
        target, weight = tokens, mask
    else:
        hidden = model.hidden_states(tokens, attention_mask=attention)
        # Positions of the loss tokens (row-wise, padded with position 0 and weight 0).
        pos = jax.vmap(lambda m: jnp.nonzero(m > 0, size=max_targets, fill_value=0)[0])(mask)  # [B, K]
        weight = jnp.take_along_axis(mask, pos, axis=1) * (pos > 0)
        target = jnp.take_along_axis(tokens, pos, axis=1)
        h = jnp.take_along_axis(hidden, jnp.maximum(pos - 1, 0)[..., None], axis=1)  # state before each target
        logits = model.logits(h)  # [B, K, V]
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), target[..., None], axis=-1)[..., 0]
        pred = jnp.argmax(logits, axis=-1)
    n = jnp.maximum(weight.sum(), 1.0)
    loss = -(logp * weight).sum() / n
    correct = (pred == target).astype(jnp.float32) * weight
    return loss, {"token_acc": correct.sum() / n, "tokens": weight.sum()}


def make_sft_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, max_targets: int | None = None) -> Callable:
    """The jitted `step(params, opt_state, tokens, length, loss_mask) -> (params, opt_state, metrics)`.

    params and opt_state are donated; `max_targets` as in `sft_loss`.
    """

    def step(params, opt_state, tokens, length, loss_mask):
        def loss_fn(p):
            return sft_loss(nnx.merge(graphdef, p), tokens, length, loss_mask, max_targets)

        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params, loss=loss)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}

    return jax.jit(step, donate_argnums=(0, 1))


def demo_stats(d: Demos) -> dict[str, float]:
    """Host summary of a demo batch: turns, cut/success rates, demonstrator error rate, length."""
    d = jax.tree.map(np.asarray, d)
    active = d.turn_active
    return {
        "demo_turns": float(d.num_turns.mean()),
        "demo_success": float(d.success.mean()),
        "demo_cut": float(d.cut.mean()),
        "demo_wrong_rate": float(d.wrong[active].mean()) if active.any() else 0.0,
        "demo_tokens": float(d.length.mean()),
        "demo_overflow": float(d.overflow.mean()),
    }


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


def evaluate_policy(
    model, env, fmt, cfg: Config, tasks: dict, cap: int, key: jax.Array, modes: tuple[str, ...] = ("greedy", "sampled")
) -> dict[str, dict]:
    """Greedy and/or sampled (eval.temperature) attempts of `tasks` at turn cap `cap`, one per task,
    by the one evaluator (`bmrl.eval.evaluate`)."""
    from bmrl.eval.evaluate import evaluate
    from bmrl.build import rollout_config

    base = rollout_config(cfg, for_eval=True)
    out = {}
    for name, temp in (("greedy", 0.0), ("sampled", cfg.eval.temperature)):
        if name not in modes:
            continue
        rcfg = dataclasses.replace(base, sampling=dataclasses.replace(base.sampling, temperature=temp))
        res = evaluate(model, env, tasks, ts=[cap], ks=[1], attempts=1, rollout_cfg=rcfg,
                       key=jax.random.fold_in(key, int(temp * 1000)), fmt=fmt, bootstrap=0)
        out[name] = episode_stats(res)
    return out


def _count(tasks) -> int:
    """Tasks in a JAX env's {"seed": int[n]} or a Python env's list of dicts."""
    return len(tasks["seed"]) if isinstance(tasks, dict) else len(tasks)


def run_sft(cfg: Config, *, log: Callable[[str], Any] = print, return_model: bool = False, run=None) -> dict | tuple[dict, Any]:
    """Train the SFT base policy of `cfg`; write it and its summary under `cfg.out_dir`; return the summary
    (and the trained `Decoder` with `return_model=True`, for callers that go on in-process).

    Every config problem is raised (as `ConfigError`) before anything is written.
    """
    from bmrl.build import build_run, build_tokenizer, fitting_cap, load_policy, new_policy, split_tasks
    from bmrl.config import check_demos
    from bmrl.model.decoder import num_params
    from bmrl.model.hf import save_pretrained

    t_start = time.time()
    s = cfg.sft
    rundir = RunDir(cfg.out_dir)
    finished = rundir.claim(cfg, "sft")  # not writable / other settings: refused (exit 2) before any work
    if finished is not None:
        log(f"sft: {cfg.out_dir} already finished with these settings; nothing to do (delete it to redo it)")
        return (finished, load_policy(finished["policy_dir"])[0]) if return_model else finished
    if cfg.model.path is not None:
        model, tokenizer = load_policy(cfg.model.path)
    else:
        tokenizer = build_tokenizer(cfg) if run is None else run.tokenizer
        model = new_policy(cfg, tokenizer)
    run = build_run(cfg, tokenizer) if run is None else run  # `bmrl sft` passes the bundle it checked
    env, fmt = run.env, run.fmt
    python = cfg.env.kind == "python"
    check_demos(cfg, env)  # a Python env must name its oracle's next action
    cap = fitting_cap(cfg, env, fmt, run.budget.max_cap)  # the largest training cap that fits
    demo_len = cfg.rollout.max_len if python else min(cfg.rollout.max_len, demo_tokens_needed(env, fmt, s.demo_turns))
    tx = optimizer_from_config(s.optim, s.steps)

    out = Path(cfg.out_dir)
    rundir.write_config(cfg)
    metrics_path = out / "sft_metrics.jsonl"

    train = split_tasks(cfg, "train", run=run if python else None)
    test = split_tasks(cfg, "test", cfg.eval.num_tasks, run=run if python else None)
    if not python:
        train, test = train["seed"], {"seed": test["seed"]}
    key = jax.random.key(cfg.seed)
    order = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), len(train)))
    env_label = cfg.env.entry if python else f"{env.name} {env.options}"
    eval_key = jax.random.fold_in(key, 2)
    log(
        f"sft: {env_label} | {num_params(model):,} params | {s.steps} steps x {s.batch_size} demos "
        f"(noise {s.noise}, recovery {s.recovery}, <= {s.demo_turns} turns, {demo_len} tokens) | eval T={cap} on "
        f"{_count(test)} test levels"
    )
    t_eval = time.time()
    before = evaluate_policy(model, env, fmt, cfg, test, cap, eval_key, ("greedy",))["greedy"]

    log(f"sft: initial policy greedy success {before['success']:.3f} ({time.time() - t_eval:.1f}s)")
    graphdef, params = nnx.split(model)
    opt_state = jax.tree.map(jnp.copy, tx.init(params))  # distinct buffers: the step donates them
    max_targets = s.demo_turns * (longest_reply(env, fmt, cfg.rollout.max_reply_tokens) + 1)  # reply + stop, per turn
    step_fn = make_sft_step(graphdef, tx, max_targets)

    def demos_at(step: int) -> Demos:
        idx = order[(step * s.batch_size + np.arange(s.batch_size)) % len(order)]
        k = jax.random.fold_in(jax.random.fold_in(key, 1), step)
        caps = None
        if cfg.env.show_budget:  # show the budgets RL will: drawn from the run's budget sampler
            caps = jnp.minimum(run.budget.sample(jax.random.fold_in(k, 7), s.batch_size), s.demo_turns)
        tasks = [train[int(i)] for i in idx] if python else {"seed": jnp.asarray(train[idx])}
        return make_demos(
            env, fmt, tasks, k, num_turns=s.demo_turns, max_len=demo_len, noise=s.noise, recovery=s.recovery,
            caps=caps, max_reply_tokens=cfg.rollout.max_reply_tokens,
        )

    t_train = time.time()
    log_every = max(1, s.steps // 10)
    pending: list[tuple[int, dict]] = []  # device metrics, fetched at log steps (keeps dispatch async)
    losses: list[float] = []
    last: dict[str, float] = {}
    with metrics_path.open("w") as f:
        for step in range(s.steps):
            d = demos_at(step)
            params, opt_state, m = step_fn(params, opt_state, d.tokens, d.length, d.loss_mask)
            pending.append((step, m))
            if step % log_every == 0 or step == s.steps - 1:
                elapsed = round(time.time() - t_train, 3)
                for i, pm in pending:
                    row = {"step": i, **{k: float(v) for k, v in pm.items()}}
                    if i == step:
                        row.update(demo_stats(d), time_s=elapsed)
                        last = row
                    losses.append(row["loss"])
                    f.write(json.dumps(row) + "\n")
                pending.clear()
                f.flush()
                log(f"sft step {step:5d}  loss {last['loss']:.4f}  token acc {last['token_acc']:.3f}  ({elapsed:.1f}s)")
    jax.block_until_ready(params)
    train_time = time.time() - t_train
    model = nnx.merge(graphdef, params)

    result = evaluate_policy(model, env, fmt, cfg, test, cap, eval_key)
    policy_dir = out / "policy"
    save_pretrained(model, tokenizer, policy_dir)
    summary = {
        "env": env.name,
        "env_options": dict(cfg.env.options if python else env.options),
        "num_params": int(num_params(model)),
        "steps": s.steps,
        "batch_size": s.batch_size,
        "noise": s.noise,
        "eval_T": cap,
        "eval_tasks": _count(test),
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
        "train_time_s": round(train_time, 2),
        "wall_time_s": round(time.time() - t_start, 2),
        "policy_dir": str(policy_dir),
    }
    rundir.write_json("summary.json", summary)
    log(
        f"sft done: success@T={cap} greedy {summary['success_greedy']:.3f} sampled {summary['success_sampled']:.3f} "
        f"(init {before['success']:.3f}) | decision acc {summary['decision_accuracy_sampled']:.3f} | "
        f"loss {summary['final_loss']:.4f} | {summary['wall_time_s']:.0f}s"
    )
    return (summary, model) if return_model else summary
