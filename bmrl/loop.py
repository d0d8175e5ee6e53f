"""One training loop for RL and SFT: one state, one resume, one checkpoint cadence, one trainable/frozen split.

    loop = Loop(cfg, policy, optimizer, Schedule(steps, every=10), name="bmrl train", mesh=mesh)
    state = loop.start(RunRecord)           # TrainState: fresh, or the newest checkpoint's (its metrics records kept)
    state = loop.run(state, step, after)    # while state.step < steps:
                                            #   state, metrics = step(state)       the kind's update on its data
                                            #   figures = after(state, metrics)    its metrics, guards, evaluations
                                            #   a checkpoint when the schedule says so, then progress (figures)
    loop.close()

RL (`bmrl.train`) and SFT (`bmrl.sft`) bring what differs: the step function and its data source (a function of
the state's key, step and data position, so a resumed run draws what an uninterrupted one would), the hooks after
a step, and a run record: what their summaries need, with `to_meta(records)`, `from_meta(meta)` and
`metrics_records` (the metrics file's records at the checkpoint). Everything else is here, once: what trains
(`bmrl.assembly.learner.Learner`: with LoRA the adapters, on a frozen base that checkpoints record and a resume
checks), the optimizer state (placed on the mesh's partition rules when there is a mesh), the resume from the
newest verified checkpoint, the checkpoint cadence (`Schedule`), the metrics file and the progress bar.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax

from bmrl.assembly.learner import Learner
from bmrl.checkpoint import Checkpointer, key_data
from bmrl.config import Config, to_dict
from bmrl.learn.step import init_opt_state
from bmrl.metrics import MetricsLogger, Progress
from bmrl.parallel import param_shardings, state_shardings


@dataclasses.dataclass
class TrainState:
    """The one training state: what the loop threads from step to step and the checkpoint keeps."""

    params: Any
    opt_state: Any
    key: Any  # the run's base key, jax.random.key(cfg.seed); step s's draws derive from it and s
    step: int = 0
    data_position: int = 0  # tasks of the training stream consumed
    record: Any = None  # the kind's run record (bmrl.train.RunRecord, bmrl.sft.SFTRecord)

    def arrays(self) -> dict:
        """The checkpoint's arrays."""
        return {"params": self.params, "opt_state": self.opt_state, "key": key_data(self.key)}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When a run of `steps` updates writes. Metrics reach the host at log steps, the first of every `log_every`
    and the last (device metrics wait in between, keeping dispatch asynchronous). Checkpoints are saved at log
    steps, by count (every `every` steps and after the last) or by time (`minutes` after the last save)."""

    steps: int
    every: int = 0  # checkpoint every N steps and after the last (0: by time)
    minutes: float | None = None  # checkpoint at the first log step this long after the last save
    log_every: int = 1
    metrics: str = "metrics.jsonl"  # the metrics file in out_dir
    tensorboard: bool = True

    def logs(self, done: int) -> bool:
        """Whether the step that leaves `done` steps done is a log step."""
        return (done - 1) % self.log_every == 0 or done == self.steps

    def saves(self, done: int, since_save_s: float) -> bool:
        """Checkpoint after `done` steps, `since_save_s` seconds after the last save?"""
        counted = self.every > 0 and (done % self.every == 0 or done == self.steps)
        late = self.minutes is not None and since_save_s >= 60 * self.minutes
        return self.logs(done) and (counted or late)


def place_learner(optimizer, params: Any, mesh) -> tuple[Any, Any, tuple[Any, Any]]:
    """The learner's pinned layouts: `params` placed on `mesh` by the partition rules and a fresh
    optimizer state following them (bmrl.parallel). Returns (params, opt_state, (param_shardings,
    opt_state_shardings)); the update program is compiled for exactly these shardings."""
    param_sh = param_shardings(params, mesh)
    params = jax.device_put(params, param_sh)
    opt_sh = state_shardings(jax.eval_shape(functools.partial(init_opt_state, optimizer), params), mesh)
    return params, _init_opt_state(optimizer, params, opt_sh), (param_sh, opt_sh)


def _init_opt_state(optimizer, params: Any, shardings: Any = None) -> Any:
    """`init_opt_state(optimizer, params)` in one program, laid out by `shardings` when given (eager, every zeros,
    counter and copy was a one-op program of its own)."""
    init = functools.partial(init_opt_state, optimizer)
    return (jax.jit(init) if shardings is None else jax.jit(init, out_shardings=shardings))(params)


class Loop:
    """The trainable/frozen split and the fresh state (built once), the resume, the loop, its checkpoints,
    metrics and progress. Without a mesh the state stays where the policy is (SFT)."""

    def __init__(self, cfg: Config, policy: Any, optimizer: Any, schedule: Schedule, *, name: str,
                 mesh: Any = None, log: Callable[[str], Any] = print, progress: bool | None = False,
                 on_step: Callable[[int, int], Any] | None = None):
        self.cfg, self.schedule, self.name, self.log = cfg, schedule, name, log
        self.progress, self.on_step = progress, on_step
        learner, params = Learner.of(policy, cfg)  # LoRA: the adapters train, the base is a frozen input of the step
        if mesh is None:
            opt_state, self.shardings = _init_opt_state(optimizer, params), None  # distinct buffers: steps donate them
        else:
            if learner.lora:  # the frozen base, placed once
                base = jax.device_put(learner.base, param_shardings(learner.base, mesh))
                learner = dataclasses.replace(learner, base=base)
            params, opt_state, self.shardings = place_learner(optimizer, params, mesh)
        self.learner = learner
        self.fresh = TrainState(params, opt_state, jax.random.key(cfg.seed))
        self.ckpt = Checkpointer(os.path.join(cfg.out_dir, "checkpoints"), keep=cfg.checkpoint.keep)
        self.logger: MetricsLogger | None = None
        self.bar: Progress | None = None

    def start(self, record: type) -> TrainState:
        """The state to train from: the newest verified checkpoint's (refused for LoRA adapters of another
        base: `CheckpointMismatch`), else the fresh one with an empty `record()`; opens the metrics file (records
        after the checkpoint dropped) and the progress bar."""
        state = dataclasses.replace(self.fresh, record=record())
        restored = self.learner.restore(self.ckpt, state.arrays())
        if restored is not None:
            arrays, meta = restored
            params, opt_state = arrays["params"], arrays["opt_state"]
            if self.shardings is not None:
                params, opt_state = jax.device_put((params, opt_state), self.shardings)  # this mesh
            key = jax.random.wrap_key_data(jax.device_put(arrays["key"]))  # device_put: no program compiled
            state = TrainState(params, opt_state, key, int(meta["step"]), int(meta["data_position"]),
                               record.from_meta(meta))
            self.log(f"{self.name}: resumed from {self.ckpt.directory} at step {state.step}")
        s = self.schedule
        self.logger = MetricsLogger(self.cfg.out_dir, start_step=state.step, tensorboard=s.tensorboard,
                                    keep_records=state.record.metrics_records, name=s.metrics)
        self.bar = Progress(total=s.steps, initial=state.step, enable=self.progress, on_step=self.on_step)
        self.saved_at = time.time()
        return state

    def run(self, state: TrainState, step: Callable[[TrainState], tuple[TrainState, Any]],
            after: Callable[[TrainState, Any], dict], report: Callable[[TrainState], Any] | None = None) -> TrainState:
        """Steps until `schedule.steps`: `step`, then `after` (returns the progress bar's figures), then a
        checkpoint when due, then progress (`on_step` hears it after the step's checkpoint), then `report(state)`
        (a log line that reads the progress, e.g. `bmrl reproduce`'s stage ETA)."""
        while state.step < self.schedule.steps:
            state, metrics = step(state)
            figures = after(state, metrics)
            if self.schedule.saves(state.step, time.time() - self.saved_at):
                self.save(state)
            self.bar.update(**figures)
            if report is not None:
                report(state)
        return state

    def save(self, state: TrainState) -> None:
        """Checkpoint `state` and wait for it: a failed write stops the run here (`CheckpointWriteError`), before
        the next step donates the buffers."""
        self.saved_at = time.time()
        meta = {"data_position": state.data_position, "config": to_dict(self.cfg),
                "run": state.record.to_meta(self.logger.count)}
        self.ckpt.save(state.step, state.arrays(), meta | self.learner.checkpoint_meta())
        self.ckpt.commit()

    def close(self) -> None:
        for part in (self.bar, self.ckpt, self.logger):
            if part is not None:
                part.close()


__all__ = ["Loop", "Schedule", "TrainState", "place_learner"]
