"""The study's decomposition: is success bought by better single decisions, or by recovery after errors?

Everything here is computed from per-turn records of attempts (`Episodes`, numpy), grouped by task,
with percentile bootstrap intervals over tasks (`bmrl.eval.bootstrap.bootstrap_mean`). Per-task
values are averaged with equal weight per task; a task where a metric is undefined (no acted turn,
no error) is left out of that metric and the number of tasks used is reported.

Definitions (turns are 0-based inside arrays; reported turns are 1-based like first_success_turn):
- acted turn: `turn_active` and not `injected` (an injected action is not the policy's decision).
- decision accuracy: P(action == oracle_action) over acted turns, `oracle_action` being the best
  action in the state before the turn (invalid replies count as wrong).
- error: an active turn whose action was not the oracle's (a wrong, invalid or injected action) or
  where the environment reported an error (a slip, a wall bump, a failed tool call). `errors="decision"`
  keeps only the first kind, `errors="env"` only the second.
- first error turn: the 1-based turn of an attempt's first error (histogram over attempts; 0 = none).
- recovery P(success | first error at turn t): among attempts whose first error is at turn t, the
  fraction that still succeeded (within their cap); pooled over t: among attempts with any error.
- back on track within m turns: after the first error at turn t, the progress after some turn s with
  t < s <= t + m strictly exceeds the progress before turn t (the error's loss, if any, is undone and
  the agent has moved past where it was), or the attempt succeeded by turn t + m. Only errors whose
  whole window fits the attempt's cap (t + m < cap) count, so the cap itself never decides it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from bmrl import compiles
from bmrl.learn.demos import make_demos
from bmrl.rollout import default_format
from bmrl.rollout.engine import play
from bmrl.rollout.model_policy import ModelPolicy
from bmrl.rollout.policies import Replay, ReplayPolicy
from bmrl.eval.bootstrap import Interval, bootstrap_mean, mean_interval
from bmrl.eval.settings import EvalSettings
from bmrl.eval.streams import STREAMS

ERROR_KINDS = ("any", "decision", "env")


@dataclasses.dataclass(frozen=True)
class Episodes:
    """Per-turn records of `num_tasks * attempts` attempts, row = task * attempts + attempt.

    Arrays (numpy): action, oracle_action int32[B, Tm]; error, invalid, injected, turn_active
    bool[B, Tm]; progress float32[B, Tm + 1] (index 0 = after reset); success bool[B];
    first_success_turn, caps, turns_used int32[B]. The trajectory's other records (`OPTIONAL`: reward
    float32[B, Tm], format_error bool[B, Tm], terminated, truncated, overflow bool[B]) when it gave them:
    what an evaluation's metrics read (`bmrl.eval.metrics`); None in saved results (`bmrl.eval.saved`
    keeps FIELDS) and in episodes made by hand.
    """

    action: np.ndarray
    oracle_action: np.ndarray
    error: np.ndarray
    invalid: np.ndarray
    injected: np.ndarray
    turn_active: np.ndarray
    progress: np.ndarray
    success: np.ndarray
    first_success_turn: np.ndarray
    caps: np.ndarray
    turns_used: np.ndarray
    num_tasks: int
    attempts: int
    reward: np.ndarray | None = None
    format_error: np.ndarray | None = None
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    overflow: np.ndarray | None = None

    FIELDS = ("action", "oracle_action", "error", "invalid", "injected", "turn_active", "progress",
              "success", "first_success_turn", "caps", "turns_used")
    OPTIONAL = ("reward", "format_error", "terminated", "truncated", "overflow")

    def __post_init__(self) -> None:
        b = self.num_tasks * self.attempts
        for name in self.FIELDS + self.OPTIONAL:
            arr = getattr(self, name)
            if arr is not None and np.shape(arr)[0] != b:
                raise ValueError(
                    f"Episodes.{name} has {np.shape(arr)[0]} rows, expected num_tasks * attempts = "
                    f"{self.num_tasks} * {self.attempts} = {b} (row = task * attempts + attempt)."
                )
        tm = np.shape(self.action)[1]
        if np.shape(self.progress)[1] != tm + 1:
            raise ValueError(f"Episodes.progress must be [B, Tm + 1] = [.., {tm + 1}], got {np.shape(self.progress)}.")

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any], num_tasks: int, attempts: int) -> "Episodes":
        """From a Trajectory (or any object/mapping with the fields; of `OPTIONAL`, those it has), converted
        to numpy."""
        mapping = isinstance(arrays, Mapping)
        kw = {n: np.asarray(arrays[n] if mapping else getattr(arrays, n)) for n in cls.FIELDS}
        more = {n: arrays.get(n) if mapping else getattr(arrays, n, None) for n in cls.OPTIONAL}
        kw |= {n: np.asarray(v) for n, v in more.items() if v is not None}
        return cls(**kw, num_tasks=int(num_tasks), attempts=int(attempts))

    def select(self, rows: np.ndarray, num_tasks: int, attempts: int) -> "Episodes":
        """The episodes of `rows` (in order), regrouped as num_tasks x attempts."""
        kw = {n: None if getattr(self, n) is None else getattr(self, n)[rows] for n in self.FIELDS + self.OPTIONAL}
        return Episodes(**kw, num_tasks=num_tasks, attempts=attempts)

    @property
    def max_turns(self) -> int:
        return int(self.action.shape[1])

    def per_task(self, values: np.ndarray) -> np.ndarray:
        """[B, ...] -> [num_tasks, attempts, ...]."""
        return values.reshape(self.num_tasks, self.attempts, *values.shape[1:])

    def errors(self, kind: str = "any") -> np.ndarray:
        """bool[B, Tm]: error turns by the definition of `kind` (see the module docstring)."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"errors kind {kind!r} is unknown; choose one of {', '.join(ERROR_KINDS)}.")
        decision = (self.action != self.oracle_action) | self.invalid | self.injected
        env = self.error
        err = {"any": decision | env, "decision": decision, "env": env & ~decision}[kind]
        return err & self.turn_active

    def first_error_turn(self, kind: str = "any") -> np.ndarray:
        """int32[B]: 1-based turn of the first error, 0 when the attempt had none."""
        err = self.errors(kind)
        return np.where(err.any(1), err.argmax(1) + 1, 0).astype(np.int32)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Per-row num/den with NaN where den == 0 (undefined)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def decision_accuracy_per_task(ep: Episodes) -> np.ndarray:
    """float[num_tasks]: fraction of the task's acted turns (all attempts) where action == oracle."""
    acted = ep.turn_active & ~ep.injected
    right = acted & (ep.action == ep.oracle_action) & ~ep.invalid
    return _ratio(ep.per_task(right).sum((1, 2)), ep.per_task(acted).sum((1, 2)))


def recovery_per_task(ep: Episodes, kind: str = "any") -> tuple[np.ndarray, np.ndarray]:
    """(by_turn [num_tasks, Tm], pooled [num_tasks]): P(success | first error at turn t+1) per task,
    and P(success | any error); NaN where the task had no such attempt."""
    first = ep.per_task(ep.first_error_turn(kind))  # [N, A]
    won = ep.per_task(ep.success)
    turns = np.arange(1, ep.max_turns + 1)
    at = first[:, :, None] == turns[None, None, :]  # [N, A, Tm]
    by_turn = _ratio((at & won[:, :, None]).sum(1), at.sum(1))
    errored = first > 0
    pooled = _ratio((errored & won).sum(1), errored.sum(1))
    return by_turn, pooled


def back_on_track(ep: Episodes, window: int, kind: str = "any") -> np.ndarray:
    """bool/NaN [B]: back on track within `window` turns after the first error (module docstring);
    NaN for attempts without an error or whose window does not fit their cap."""
    if window < 1:
        raise ValueError(f"the recovery window must be >= 1 turn, got {window}.")
    first = ep.first_error_turn(kind) - 1  # 0-based, -1 = none
    out = np.full(first.shape, np.nan)
    rows = np.flatnonzero((first >= 0) & (first + window < ep.caps))
    for b in rows:
        t = first[b]
        before = ep.progress[b, t]  # progress before turn t
        after = ep.progress[b, t + 2 : t + window + 2]  # after turns t+1 .. t+window
        won = 0 < ep.first_success_turn[b] <= t + window + 1
        out[b] = float(won or bool(np.any(after > before + 1e-6)))
    return out


def first_error_histogram(ep: Episodes, kind: str = "any") -> np.ndarray:
    """float[num_tasks, Tm + 1]: per task, fraction of attempts whose first error is at turn t
    (column t, 1-based), column 0 = no error. Rows sum to 1."""
    first = ep.per_task(ep.first_error_turn(kind))
    onehot = first[:, :, None] == np.arange(ep.max_turns + 1)[None, None, :]
    return onehot.mean(1)


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """Decision quality and recovery of one set of attempts (see the module docstring)."""

    decision_accuracy: Interval
    error_rate: Interval  # errors per active turn
    recovery: Interval  # P(success | any error)
    recovery_by_turn: dict[int, Interval]  # 1-based turn of the first error -> P(success | it)
    back_on_track: Interval  # P(back on track within `window` turns | an error)
    window: int
    first_error_hist: np.ndarray  # [Tm + 1] mean fraction of attempts; index 0 = no error
    first_error_hist_lower: np.ndarray
    first_error_hist_upper: np.ndarray
    success: Interval  # P(success) of these attempts (within their caps)
    errors: str  # the error kind used
    num_attempts: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision_accuracy": self.decision_accuracy.to_dict(),
            "error_rate": self.error_rate.to_dict(),
            "recovery": self.recovery.to_dict(),
            "recovery_by_turn": {str(t): e.to_dict() for t, e in self.recovery_by_turn.items()},
            "back_on_track": {**self.back_on_track.to_dict(), "window": self.window},
            "first_error_hist": {
                "turn": list(range(len(self.first_error_hist))),
                "fraction": self.first_error_hist.tolist(),
                "lower": self.first_error_hist_lower.tolist(),
                "upper": self.first_error_hist_upper.tolist(),
            },
            "success": self.success.to_dict(),
            "errors": self.errors,
            "num_attempts": self.num_attempts,
        }


def decompose_episodes(
    ep: Episodes, *, window: int = EvalSettings.window, errors: str = "any", key: int = 0, num_resamples: int = 1000,
    confidence: float = 0.95,
) -> Decomposition:
    """Decision accuracy, error rate, recovery (per first-error turn and pooled), back-on-track rate
    and the first-error-turn histogram of `ep`, each with bootstrap intervals over tasks (each on its
    stream of `STREAMS`, offset by `key`)."""
    boot = dict(num_resamples=num_resamples, confidence=confidence)
    stream = {name: key + STREAMS[name] for name in ("decision_accuracy", "error_rate", "recovery", "back_on_track",
                                                    "success", "first_error_hist", "recovery_by_turn")}
    by_turn, pooled = recovery_per_task(ep, errors)
    err = ep.errors(errors)
    err_rate = _ratio(ep.per_task(err).sum((1, 2)), ep.per_task(ep.turn_active).sum((1, 2)))
    track = back_on_track(ep, window, errors)
    track_task = np.array([np.nanmean(r) if np.isfinite(r).any() else np.nan for r in ep.per_task(track)])
    hist = first_error_histogram(ep, errors)
    h_mean, h_lo, h_hi = bootstrap_mean(hist, key=stream["first_error_hist"], **boot)
    recovery_t = {}
    for t in range(ep.max_turns):
        if np.isfinite(by_turn[:, t]).any():
            recovery_t[t + 1] = mean_interval(by_turn[:, t], key=stream["recovery_by_turn"] + t, **boot)
    return Decomposition(
        decision_accuracy=mean_interval(decision_accuracy_per_task(ep), key=stream["decision_accuracy"], **boot),
        error_rate=mean_interval(err_rate, key=stream["error_rate"], **boot),
        recovery=mean_interval(pooled, key=stream["recovery"], **boot),
        recovery_by_turn=recovery_t,
        back_on_track=mean_interval(track_task, key=stream["back_on_track"], **boot),
        window=window,
        first_error_hist=np.asarray(h_mean), first_error_hist_lower=np.asarray(h_lo),
        first_error_hist_upper=np.asarray(h_hi),
        success=mean_interval(ep.per_task(ep.success).mean(1), key=stream["success"], **boot),
        errors=errors,
        num_attempts=int(ep.num_tasks * ep.attempts),
    )


# ---- decision accuracy on a fixed probe set -------------------------------------------------------
#
# A probe is a state reached by an eps-noisy oracle (bmrl.learn.demos, errors NOT cut), laid out in
# tokens exactly as a rollout would have shown it: the context `tokens[:context_len]` ends right
# before the reply of turn `turn`. The set depends only on (env, tasks, seed, noise), never on the
# policy, so two policies are compared on the same states.


@dataclasses.dataclass(frozen=True)
class ProbeSet:
    """S probe states. tokens int32[S, L] (context then padding), context_len/turn/oracle_action
    int32[S]; for scripted policies the demo replay: tasks {"seed": [S]}, keys [S], actions
    int32[S, Tm], caps int32[S]."""

    tokens: np.ndarray
    context_len: np.ndarray
    turn: np.ndarray
    oracle_action: np.ndarray
    tasks: dict[str, np.ndarray]
    keys: Any
    actions: np.ndarray
    caps: np.ndarray
    seed: int
    noise: float

    @property
    def size(self) -> int:
        return int(self.turn.shape[0])


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """The policy's action in every probe state and the accuracy P(action == oracle) with interval."""

    action: np.ndarray  # int32[S]
    correct: np.ndarray  # bool[S]
    turn: np.ndarray  # int32[S] 0-based turn of the probe
    accuracy: Interval
    seed: int
    noise: float

    def to_dict(self) -> dict[str, Any]:
        turns = np.unique(self.turn)
        return {
            "accuracy": self.accuracy.to_dict(), "states": int(self.correct.size), "seed": self.seed, "noise": self.noise,
            "accuracy_by_turn": {str(int(t) + 1): float(self.correct[self.turn == t].mean()) for t in turns},
            "invalid_rate": float((self.action < 0).mean()),
        }


def probe_set(
    env, fmt, tasks: Mapping[str, Any], *, num_states: int, seed: int, noise: float = EvalSettings.probe_noise,
    num_turns: int, max_len: int, reserve: int = 0,
) -> ProbeSet:
    """`num_states` probe states: demo i plays task i mod N with the eps-noisy oracle (errors not
    cut) and one of its turns is drawn uniformly, among those whose context + `reserve` tokens (the
    reply) fits `max_len`. Deterministic in `seed`."""
    import jax

    n = int(np.shape(jax.tree.leaves(tasks)[0])[0])
    if num_states < 1:
        raise ValueError(f"num_states must be >= 1, got {num_states}.")
    rows = np.arange(num_states) % n
    sel = {k: np.asarray(v)[rows] for k, v in tasks.items()}
    keys = jax.random.split(jax.random.key(seed), num_states)
    demos = make_demos(env, fmt, sel, keys, num_turns=num_turns, max_len=max_len, noise=noise, cut_after_error=False)
    d = jax.tree.map(np.asarray, demos)
    ok = d.turn_active & (d.reply_start >= 0) & (d.reply_start + reserve <= max_len)
    if not ok.any(1).all():
        bad = int(np.flatnonzero(~ok.any(1))[0])
        raise ValueError(f"probe demo {bad} has no turn whose context fits max_len={max_len}; raise max_len.")
    rng = np.random.default_rng(seed)
    turn = np.array([rng.choice(np.flatnonzero(r)) for r in ok], np.int32)
    s = np.arange(num_states)
    context_len = d.reply_start[s, turn].astype(np.int32)
    tokens = np.where(np.arange(max_len)[None, :] < context_len[:, None], d.tokens, fmt.pad_id).astype(np.int32)
    actions = np.where(d.action >= 0, d.action, 0).astype(np.int32)
    return ProbeSet(
        tokens=tokens, context_len=context_len, turn=turn, oracle_action=d.oracle_action[s, turn].astype(np.int32),
        tasks=sel, keys=keys, actions=actions, caps=np.asarray(d.caps, np.int32), seed=int(seed), noise=float(noise),
    )


def probe_accuracy(policy, env, probes: ProbeSet, rollout_cfg, *, key: Any = 0, fmt=None,
                   num_resamples: int = 1000, confidence: float = 0.95) -> ProbeResult:
    """The policy replies once in every probe state (sampled with `rollout_cfg.sampling`, a fixed
    key per state); accuracy = P(parsed action == oracle action), bootstrap over states.

    `policy` is an nnx.Module (generates a reply from the probe context) or a scripted policy
    `(key, env, state) -> action` (acts in the replayed state).
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    if isinstance(key, (int, np.integer)):
        key = jax.random.key(int(key))
    keys = jax.random.split(key, probes.size)
    if isinstance(policy, nnx.Module):
        fmt = fmt or default_format(env)
        if probes.tokens.shape[1] != rollout_cfg.max_len:
            raise ValueError(
                f"the probe set was built with max_len={probes.tokens.shape[1]} but rollout_cfg.max_len="
                f"{rollout_cfg.max_len}; build it with the same max_len."
            )
        graphdef, params = nnx.split(policy)
        act = _probe_program(ModelPolicy(graphdef, fmt, rollout_cfg), env)
        action = act(params, jnp.asarray(probes.tokens), jnp.asarray(probes.context_len), keys)
    elif callable(policy):
        replay = Replay(jnp.asarray(probes.actions), jnp.asarray(probes.turn), keys)
        traj = play(ReplayPolicy(then=policy), env, probes.tasks, probes.caps, probes.keys, probes.actions.shape[1],
                    params=replay)
        action = np.asarray(traj.action)[np.arange(probes.size), probes.turn]
    else:
        raise TypeError(f"policy must be an nnx.Module or a scripted policy, got {type(policy).__name__}.")
    action = np.asarray(action, np.int32)
    correct = action == probes.oracle_action
    acc = mean_interval(correct.astype(float), key=STREAMS["probe_accuracy"], num_resamples=num_resamples, confidence=confidence)
    return ProbeResult(action=action, correct=correct, turn=probes.turn, accuracy=acc, seed=probes.seed, noise=probes.noise)


def _probe_program(policy, env):
    """jitted (params, context [S, L], context_len [S], keys [S]) -> action [S]: the model replies once
    from each probe context, exactly as it would at that turn of a rollout (same decode, same parse)."""
    import jax.numpy as jnp

    def act(params, context, context_len, keys):
        bound = policy.bind(params)
        s = bound.start_from_context(context, context_len, keys)
        s = bound.decode_reply(s, jnp.int32(0), jnp.ones(context_len.shape, bool))
        return bound.parse(s, env, context_len)[0]

    return compiles.program("probe", (policy, env), lambda: compiles.counted_jit(act, name="probe"))
