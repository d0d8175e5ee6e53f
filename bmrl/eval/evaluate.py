"""The evaluation harness: a Pass@(K,T) surface of a policy on held-out tasks, with its decomposition.

    result = evaluate(policy, env, {"seed": test_seeds}, ts=[1, 2, 4, 8], ks=[1, 2, 4], attempts=8,
                      rollout_cfg=cfg, key=jax.random.key(0), mode="exact")

Modes:
- `exact`: every T of the grid is run for real. One batch of rows (task, attempt, T) with cap T per
  row goes through the compiled rollout (caps are data, so the whole grid is one compile; a large
  batch runs in equal-size chunks of one shape). Column T of the surface uses the attempts run with
  cap T. Valid whether or not the policy sees its budget.
- `truncate`: each (task, attempt) runs once with the largest T; column T counts the attempts that
  first succeeded by turn T. Valid only when the policy cannot see its budget.
- `both`: exact, plus the truncation of its largest-T rows (which ARE the truncate run: same keys,
  same cap), and the largest |exact - truncate| over the grid.

Key layout: the key of a row depends only on (task index, attempt), never on its cap:
`fold_in(fold_in(key, task_index), attempt)`. With the budget hidden the first T turns of a cap-T
row and of the cap-max(T) row are then the same computation, so truncation equals the exact run
exactly (not just in distribution); with the budget shown the observations differ and so may the
runs. Two policies evaluated with the same key see the same environment randomness (paired).

`policy` is an `nnx.Module` (a language-model policy, run by `bmrl.rollout`) or a scripted policy
`(key, env, state) -> action id` (`bmrl.rollout.policies`); both are played by the one episode
engine with the same caps, keys and error injection: the oracle gives a ground truth for the estimator.

How rows are played is a `Runner` made by `runner=` (default `engine_runner`: the compiled episode
engine). A run's player hands over its own (`bmrl.assembly.players`, `player.evaluation_runner`): a Python
environment's (`bmrl.rollout.pyenv.PythonEnv`, tasks a list of dicts) plays a model policy from the host
on the same compiled turn (`bmrl.rollout.host`), with the same rows, caps and keys, so a wrapped JAX env
evaluates to the compiled path's numbers; faults of user code are counted (`EvalResult.faults`). The
evaluator itself never asks which kind of env it has.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl.envs.base import Env
from bmrl.eval.bootstrap import Interval, SurfaceInterval, bootstrap_mean, mean_interval
from bmrl.eval.decompose import Decomposition, Episodes, decompose_episodes
from bmrl.eval.metrics import METRICS
from bmrl.eval.passkt import pass_at_kt_per_task
from bmrl.eval.settings import EvalSettings
from bmrl.eval.streams import STREAMS
from bmrl.formats import Format
from bmrl.rollout.engine import check_config, default_format, episode_program
from bmrl.rollout.model_policy import ModelPolicy
from bmrl.rollout.policies import as_policy
from bmrl.rollout.types import Injection, RolloutConfig, check_caps

MODES = ("exact", "truncate", "both")
TRUNCATION_WARNING = (
    "env.show_budget is on: the policy sees its turn budget, so truncating a cap-{tmax} run at T is "
    "not the same as running it with cap T; the truncated surface is not a valid Pass@(K,T). Use mode='exact'."
)


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """What `evaluate` measured. N = tasks, A = attempts, K = len(ks), T = len(ts).

    first_success_turn: int32[N, A, T], column j = the attempts that count for T = ts[j] (exact: run
      with cap ts[j]; truncate: the cap-max(ts) run, 0 if it first succeeded after ts[j]).
    per_task: float64[N, K, T] unbiased per-task Pass@(k,T); surface: their mean with intervals.
    episodes: per-turn records of the cap-max(ts) attempts (decomposition, plots).
    """

    env: str
    mode: str
    ks: tuple[int, ...]
    ts: tuple[int, ...]
    attempts: int
    num_tasks: int
    show_budget: bool
    tasks: dict[str, np.ndarray]
    first_success_turn: np.ndarray
    per_task: np.ndarray
    surface: SurfaceInterval
    episodes: Episodes
    decomposition: Decomposition
    metrics: dict[str, Interval]
    surface_truncate: SurfaceInterval | None = None
    max_abs_difference: float | None = None
    injection: dict[str, Any] | None = None  # {"turns": [...], "prob": p} when errors were injected
    warnings: list[str] = dataclasses.field(default_factory=list)
    compiles: int = 0
    probe: Any = None  # decompose.ProbeResult (`dataclasses.replace(result, probe=...)`)
    injected: "EvalResult | None" = None  # the same evaluation under error injection (`attach_injection`)
    grid_action: np.ndarray | None = None  # int32[N, A, T, Tm]: exact modes, the actions of every row of the grid
    grid_logprob: np.ndarray | None = None  # float32[N, A, T, Tm]: exact modes, per-turn log-prob of the sampled reply
    faults: int | None = None  # Python envs: resets/steps of user code that failed (None for JAX envs)

    def pass1(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimate, lower, upper) of Pass@(1,T) over ts (needs 1 in ks)."""
        if 1 not in self.ks:
            raise ValueError(f"Pass@(1,T) needs K=1 on the grid; ks={list(self.ks)}.")
        i = self.ks.index(1)
        return self.surface.estimate[i], self.surface.lower[i], self.surface.upper[i]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: Pass@(1,T) at the smallest (its minimum over T) and largest T, the area
        under the surface (its mean over the grid), decision accuracy, recovery, injection and probes."""
        out: dict[str, Any] = {"env": self.env, "mode": self.mode, "tasks": self.num_tasks, "attempts": self.attempts}
        if 1 in self.ks:
            est, lo, hi = self.pass1()
            j = int(np.argmin(est))
            n = self.num_tasks
            out["pass1_min_over_T"] = {"T": self.ts[j], **Interval(float(est[j]), float(lo[j]), float(hi[j]), n).to_dict()}
            out["pass1_at_max_T"] = {"T": self.ts[-1], **Interval(float(est[-1]), float(lo[-1]), float(hi[-1]), n).to_dict()}
            out["pass1_by_T"] = {str(t): float(v) for t, v in zip(self.ts, est)}
        area = mean_interval(self.per_task.mean(axis=(1, 2)), key=STREAMS["area"], num_resamples=self.surface.num_resamples)
        out["area"] = area.to_dict()
        d = self.decomposition
        out["decision_accuracy"] = d.decision_accuracy.to_dict()
        out["recovery"] = d.recovery.to_dict()
        out["back_on_track"] = {**d.back_on_track.to_dict(), "window": d.window}
        out["error_rate"] = d.error_rate.to_dict()
        if self.probe is not None:
            out["probe_accuracy"] = self.probe.accuracy.to_dict()
        if self.injected is not None:
            inj = self.injected
            out["injected"] = {
                **(inj.injection or {}),
                "pass1_by_T": {str(t): float(v) for t, v in zip(inj.ts, inj.pass1()[0])} if 1 in inj.ks else {},
                "recovery": inj.decomposition.recovery.to_dict(),
                "back_on_track": inj.decomposition.back_on_track.to_dict(),
            }
        if self.max_abs_difference is not None:
            out["max_abs_exact_minus_truncate"] = self.max_abs_difference
        if self.faults is not None:
            out["faults"] = self.faults
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: settings, surfaces, metrics, decomposition (no per-turn arrays)."""
        out = {
            **self.summary(),
            "ks": list(self.ks), "ts": list(self.ts), "show_budget": self.show_budget,
            "surface": self.surface.to_dict(),
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "decomposition": self.decomposition.to_dict(),
            "injection": self.injection,
            "warnings": list(self.warnings),
            "compiles": self.compiles,
        }
        if self.surface_truncate is not None:
            out["surface_truncate"] = self.surface_truncate.to_dict()
        if self.probe is not None:
            out["probe"] = self.probe.to_dict()
        if self.injected is not None:
            out["injected_eval"] = self.injected.to_dict()
        return out


# ---- keys and rows -------------------------------------------------------------------------------


def attempt_keys(key: jax.Array | int, num_tasks: int, attempts: int) -> np.ndarray:
    """Raw uint32 keys [num_tasks * attempts, 2]: row i * attempts + a holds the data of
    fold_in(fold_in(key, i), a). Raw (numpy) so that selecting rows compiles nothing."""
    if isinstance(key, (int, np.integer)):
        key = jax.random.key(int(key))
    return np.asarray(_attempt_keys(key, int(num_tasks), int(attempts)))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _attempt_keys(key: jax.Array, num_tasks: int, attempts: int) -> jax.Array:
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    per_task = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_tasks))
    keys = jax.vmap(lambda k: jax.vmap(lambda a: jax.random.fold_in(k, a))(jnp.arange(attempts)))(per_task)
    return jax.random.key_data(keys.reshape(-1))


def _num_tasks(tasks: Any) -> int:
    leaves = jax.tree.leaves(tasks)
    if not leaves:
        raise ValueError("tasks is empty: give a pytree of arrays [num_tasks], e.g. {'seed': seeds}.")
    n = {int(np.shape(x)[0]) if np.ndim(x) else -1 for x in leaves}
    if len(n) != 1 or min(n) < 1:
        raise ValueError(f"every leaf of tasks must be an array [num_tasks] with the same num_tasks >= 1; got leading sizes {sorted(n)}.")
    return n.pop()


def _check_grid(ts: Sequence[int], ks: Sequence[int], attempts: int, cfg: RolloutConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    ts_ = tuple(sorted({int(t) for t in ts}))
    ks_ = tuple(sorted({int(k) for k in ks}))
    if not ts_ or ts_[0] < 1 or ts_[-1] > cfg.max_turns:
        raise ValueError(f"every T must be in [1, rollout max_turns={cfg.max_turns}], got ts={list(ts)}; raise max_turns.")
    if not ks_ or ks_[0] < 1 or ks_[-1] > attempts:
        raise ValueError(f"every K must be in [1, attempts={attempts}], got ks={list(ks)}; sample more attempts.")
    return ts_, ks_


# ---- running attempts ----------------------------------------------------------------------------


def _take(tree: Any, rows: np.ndarray) -> Any:
    return jax.tree.map(lambda x: np.asarray(x)[rows], tree)


def _run_rows(runner: Callable, tasks: Any, caps: np.ndarray, keys: np.ndarray, chunk: int,
              place: Callable = lambda x: x, gather: Callable = np.asarray) -> dict[str, np.ndarray]:
    """Run rows in chunks of exactly `chunk` rows (the last padded by repeating row 0), concatenated.
    `place` puts a chunk's inputs on devices (e.g. sharded over a mesh); `gather` brings an output
    array back to the host (e.g. across processes)."""
    total = caps.shape[0]
    outs = []
    for start in range(0, total, chunk):
        rows = np.arange(start, start + chunk)
        rows = np.where(rows < total, rows, 0)
        out = runner(place(_take(tasks, rows)), place(caps[rows].astype(np.int32)), place(keys[rows]))
        n = min(chunk, total - start)
        rec = {f: np.asarray(gather(getattr(out, f)))[:n] for f in _FIELDS}
        rec["turn_logprob"] = _turn_logprob(jax.tree.map(lambda x: np.asarray(gather(x)), out), n, rec["action"].shape[1])
        outs.append(rec)
    return {f: np.concatenate([o[f] for o in outs]) for f in outs[0]}


def _turn_logprob(out: Any, n: int, max_turns: int) -> np.ndarray:
    """float32[n, Tm]: summed log-prob of the tokens the policy sampled at each turn (0 for scripted)."""
    lp = np.asarray(out.logprobs)[:n] * np.asarray(out.loss_mask)[:n]
    turn = np.asarray(out.turn_of_token)[:n]
    res = np.zeros((n, max_turns + 1), np.float64)
    rows = np.broadcast_to(np.arange(n)[:, None], turn.shape)
    np.add.at(res, (rows, np.where(turn >= 0, turn, max_turns)), lp)
    return res[:, :max_turns].astype(np.float32)


_FIELDS = Episodes.FIELDS + Episodes.OPTIONAL


@dataclasses.dataclass(frozen=True)
class Runner:
    """How `evaluate` plays its rows: `run(tasks, caps, keys) -> Trajectory` on `tasks` (the task tree
    the rows index, e.g. `{"seed": int32[N]}`), its compile count, and the faults of user code so far
    (None: the env runs no user code). `on_host`: rows stay on this host (no `place` / `gather`)."""

    run: Callable[[Any, Any, Any], Any]
    trace_count: Callable[[], int]
    tasks: Any
    faults: Callable[[], int] | None = None
    on_host: bool = False


def engine_runner(policy: Any, env: Env, tasks: Any, fmt: Format | None, cfg: RolloutConfig, inject: Injection,
                  min_cap: int) -> Runner:
    """The `Runner` of a JAX env: a model or scripted policy played by the compiled episode engine."""
    if isinstance(policy, nnx.Module):
        fmt = fmt or default_format(env)
        check_config(env, fmt, cfg, min_cap)
    spec, params = as_policy(policy, fmt, cfg)
    if not isinstance(spec, ModelPolicy):
        cfg = RolloutConfig(max_turns=cfg.max_turns, max_reply_tokens=1, max_len=1)
    run = episode_program(spec, env, cfg, name="eval_rollout" if isinstance(spec, ModelPolicy) else "episode")
    return Runner(lambda rows, caps, keys: run(params, rows, caps, keys, inject), run.trace_count, tasks)


# ---- the harness ---------------------------------------------------------------------------------


def evaluate(
    policy: nnx.Module | Callable,
    env: Env,
    tasks: Any,
    *,
    ts: Sequence[int],
    ks: Sequence[int],
    attempts: int,
    rollout_cfg: RolloutConfig,
    key: jax.Array | int,
    mode: str = "exact",
    fmt: Format | None = None,
    bootstrap: int = 1000,
    inject: Injection | None = None,
    chunk_size: int = 256,
    window: int = EvalSettings.window,
    errors: str = "any",
    confidence: float = 0.95,
    place: Callable = lambda x: x,
    gather: Callable = np.asarray,
    runner: Callable[..., Runner] = engine_runner,
) -> EvalResult:
    """Pass@(K,T) of `policy` on `tasks` ({"seed": int32[N]} ...) over the grid ks x ts.

    mode: "exact" (every T run with cap T, one compile), "truncate" (the largest T once, truncated)
    or "both" (exact, plus the truncation and the largest |difference|). `attempts` per task (K <=
    attempts). `chunk_size`: rows per rollout call (every call has this shape; default 256, capped
    at num_tasks * attempts so exact and truncate share one compiled program). `inject`: forced
    wrong actions (`injection_at(max_turns, turns, prob)`, turns 1-based). `window`/`errors`: see
    `bmrl.eval.decompose`. Intervals: percentile bootstrap over tasks with `bootstrap` resamples.
    `place`/`gather`: how rows go to the devices and results come back (the training loop shards
    them over its mesh and gathers across processes); the default is one host. `runner(policy, env, tasks,
    fmt, rollout_cfg, inject, min_cap) -> Runner`: how rows are played (a run's player hands over its own).
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is unknown; choose one of {', '.join(MODES)}.")
    if not isinstance(bootstrap, (int, np.integer)) or (bootstrap != 0 and bootstrap < 10):
        raise ValueError(f"bootstrap must be 0 (no intervals) or an integer >= 10 resamples, got {bootstrap!r}.")
    if not isinstance(attempts, (int, np.integer)) or attempts < 1:
        raise ValueError(f"attempts must be an integer >= 1, got {attempts!r}.")
    ts, ks = _check_grid(ts, ks, int(attempts), rollout_cfg)
    inject = inject if inject is not None else Injection.none(rollout_cfg.max_turns)
    if np.shape(inject.turns) != (rollout_cfg.max_turns,):
        raise ValueError(f"inject.turns must be bool[max_turns={rollout_cfg.max_turns}], got {np.shape(inject.turns)}.")
    played = runner(policy, env, tasks, fmt, rollout_cfg, inject, ts[0])
    if played.on_host:
        place, gather = (lambda x: x), np.asarray
    tasks = jax.tree.map(np.asarray, played.tasks)
    num_tasks = _num_tasks(tasks)
    tmax = ts[-1]
    run_rows, trace_count = played.run, played.trace_count

    base = num_tasks * attempts
    chunk = max(1, min(int(chunk_size), base))
    keys = attempt_keys(key, num_tasks, attempts)
    task_of_row = np.repeat(np.arange(num_tasks), attempts)  # row = task * attempts + attempt
    before = trace_count()
    if mode == "truncate":
        caps = np.full((base,), tmax, np.int32)
        check_caps(caps, rollout_cfg)
        out = _run_rows(run_rows, _take(tasks, task_of_row), caps, keys, chunk, place, gather)
        fst_max = out["first_success_turn"].reshape(num_tasks, attempts)
        fst = _truncate(fst_max, ts)
        big, grid_action, grid_logprob = out, None, None
    else:
        # rows (task, attempt, T) with T fastest; the key of a row is its (task, attempt) key.
        caps = np.tile(np.asarray(ts, np.int32), base)
        check_caps(caps, rollout_cfg)
        out = _run_rows(run_rows, _take(tasks, np.repeat(task_of_row, len(ts))), caps, np.repeat(keys, len(ts), axis=0), chunk, place, gather)
        fst = out["first_success_turn"].reshape(num_tasks, attempts, len(ts))
        grid_action = out["action"].reshape(num_tasks, attempts, len(ts), -1)
        grid_logprob = out["turn_logprob"].reshape(num_tasks, attempts, len(ts), -1)
        last = np.arange(base) * len(ts) + len(ts) - 1
        big = {f: v[last] for f, v in out.items()}
    compiles = trace_count() - before

    boot = dict(num_resamples=int(bootstrap), confidence=confidence)
    per_task = _per_task_surface(fst, ks, ts)
    surface = _surface(per_task, ks, ts, key=STREAMS["surface"], **boot)
    result_warnings: list[str] = []
    surface_tr, max_diff = None, None
    if mode == "both":
        fst_tr = _truncate(fst[:, :, -1], ts)
        surface_tr = _surface(_per_task_surface(fst_tr, ks, ts), ks, ts, key=STREAMS["surface"], **boot)
        max_diff = float(np.abs(surface.estimate - surface_tr.estimate).max())
    if env.show_budget and mode in ("truncate", "both"):
        result_warnings.append(TRUNCATION_WARNING.format(tmax=tmax))
    overflow = out["overflow"]
    if overflow.any():
        result_warnings.append(
            f"{int(overflow.sum())} of {overflow.size} attempts ran out of the context buffer "
            f"(max_len={rollout_cfg.max_len}) before their cap: they count as failures. Raise rollout max_len."
        )
    faults = played.faults() if played.faults is not None else None
    if faults:
        result_warnings.append(f"{faults} resets/steps of {env.name} failed (exceptions, timeouts, bad returns): the "
                               "rows saw 'tool error: ...' observations (see the log for tasks and messages).")
    for w in result_warnings:
        warnings.warn(w, stacklevel=2)

    episodes = Episodes.from_arrays(big, num_tasks, attempts)
    metrics = _metrics(episodes, boot)
    return EvalResult(
        env=env.name, mode=mode, ks=ks, ts=ts, attempts=int(attempts), num_tasks=num_tasks,
        show_budget=bool(env.show_budget), tasks={k: np.asarray(v) for k, v in dict(tasks).items()} if isinstance(tasks, dict) else tasks,
        first_success_turn=fst, per_task=per_task, surface=surface, episodes=episodes,
        decomposition=decompose_episodes(episodes, window=window, errors=errors, **boot),
        metrics=metrics, surface_truncate=surface_tr, max_abs_difference=max_diff,
        injection=_describe(inject), warnings=result_warnings, compiles=int(compiles), grid_action=grid_action,
        grid_logprob=grid_logprob, faults=faults,
    )


def _truncate(fst_max: np.ndarray, ts: Sequence[int]) -> np.ndarray:
    """[N, A] first-success turns of cap-max runs -> [N, A, T]: kept where <= T, else 0."""
    t = np.asarray(ts)[None, None, :]
    f = fst_max[:, :, None]
    return np.where((f > 0) & (f <= t), f, 0).astype(np.int32)


def _per_task_surface(fst: np.ndarray, ks: Sequence[int], ts: Sequence[int]) -> np.ndarray:
    """[N, A, T] (column j counts for ts[j]) -> unbiased per-task Pass@(k,T) [N, K, T]."""
    cols = [pass_at_kt_per_task(fst[:, :, j], ks, [t])[:, :, 0] for j, t in enumerate(ts)]
    return np.stack(cols, axis=-1)


def _surface(per_task: np.ndarray, ks, ts, *, key: int, num_resamples: int, confidence: float) -> SurfaceInterval:
    if num_resamples == 0:  # intervals switched off
        est = per_task.mean(axis=0)
        return SurfaceInterval(est, est, est, tuple(ks), tuple(ts), float(confidence), 0, per_task.shape[0])
    est, lo, hi = bootstrap_mean(per_task, key=key, num_resamples=num_resamples, confidence=confidence)
    return SurfaceInterval(est, lo, hi, tuple(ks), tuple(ts), float(confidence), int(num_resamples), per_task.shape[0])


def _metrics(ep: Episodes, boot: dict) -> dict[str, Interval]:
    """Every metric of the table (`bmrl.eval.metrics.METRICS`) of the cap-max(ts) attempts, with its interval."""
    return {name: mean_interval(m.per_task(ep), key=m.stream, **boot) for name, m in METRICS.items()}


def injection_at(max_turns: int, turns: Sequence[int], prob: float) -> Injection:
    """The engine's injection mask for the 1-based `turns` (as config, flags, reports and callers count
    them): the one place they become the compiled engine's 0-based turns."""
    turns = [int(t) for t in turns]
    if any(t < 1 or t > max_turns for t in turns):
        raise ValueError(f"injection turns {turns} must be 1-based turns in [1, max_turns={max_turns}].")
    return Injection.at(max_turns, [t - 1 for t in turns], prob)


def _describe(inject: Injection) -> dict[str, Any] | None:
    turns = np.flatnonzero(np.asarray(inject.turns)).tolist()
    prob = float(np.asarray(inject.prob))
    if not turns or prob <= 0:
        return None
    return {"turns": [t + 1 for t in turns], "prob": prob}  # the engine's 0-based mask, reported 1-based


def attach_injection(result: EvalResult, policy: nnx.Module | Callable, env: Env, tasks: Any, *, turns: Sequence[int],
                     prob: float, rollout_cfg: RolloutConfig, key: jax.Array | int, **kwargs) -> EvalResult:
    """Evaluate again with errors injected at the 1-based `turns` with probability `prob` (same keys,
    grid and attempts as `result`), and return a copy of `result` with it as `injected`."""
    inject = injection_at(rollout_cfg.max_turns, turns, prob)
    injected = evaluate(
        policy, env, tasks, ts=result.ts, ks=result.ks, attempts=result.attempts, rollout_cfg=rollout_cfg,
        key=key, mode="exact", inject=inject, bootstrap=result.surface.num_resamples, **kwargs,
    )
    return dataclasses.replace(result, injected=injected)
