"""A Python environment as a run uses it: the factory, the tasks by split, a pool of environment
objects (one per row), the reply format, and the runner the evaluator calls.

    env = PythonEnv.build("pkg.mod:make", factory, {"train": [...], "validation": [...], "test": [...]}, tokenizer,
                          HostConfig())
    fmt = host_format(env)
    out = env.play(policy, fmt, rollout_cfg, tasks, caps, key)      # a HostRollout: trajectory + faults

It stands where a run holds a JAX `Env` (`bmrl.assembly.Run.env`): the same `name`, `show_budget`
(always False: a Python env shows its budget itself, if at all), `max_obs_len` (tokens of the longest
first observation of the tasks; later observations are known only as the env runs) and
`max_action_len` (of the optional `action_strings`). Environment objects are reused across batches
(every attempt resets its own); one whose call timed out is replaced, so no object is ever called
from two threads at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bmrl import compiles
from bmrl.envs.python.protocol import Fault
from bmrl.envs.text import encode
from bmrl.formats import Format
from bmrl.rollout.host import HostConfig, HostRollout, host_rollout
from bmrl.rollout.types import RolloutConfig

DEFAULT_INSTRUCTIONS = "Solve the task in the observation. Each reply is one action for the environment."
CORPUS_TASKS = 256  # reset observations read for the tiny tokenizer and the buffer check
HOST_PROGRAMS = ("host_start", "host_act", "host_observe", "host_outputs")
log = logging.getLogger(__name__)


def reset_texts(factory: Callable[[], Any], tasks: Sequence[dict], limit: int = CORPUS_TASKS,
                first_seed: int = 0) -> list[str]:
    """First observations of the first `limit` tasks (reset seed = `first_seed` + task index) of one env
    object; a task whose reset fails or returns no text is skipped (it faults again, counted, when played)."""
    env, texts = factory(), []
    for i, task in enumerate(list(tasks)[:limit]):
        try:
            obs = env.reset(seed=first_seed + i, options=task)[0]
        except Exception as e:  # noqa: BLE001 - user code: a fault of that task, not of the run
            log.warning("reset of task %d (%r) failed while reading first observations: %s: %s", i, task,
                        type(e).__name__, e)
            continue
        if isinstance(obs, str):
            texts.append(obs)
    return texts


@dataclasses.dataclass(eq=False)
class PythonEnv:
    """A Python environment with its tasks, for one tokenizer (module docstring)."""

    name: str
    factory: Callable[[], Any]
    tasks: dict[str, list[dict]]
    tokenizer: Any
    hcfg: HostConfig
    instructions: str = DEFAULT_INSTRUCTIONS
    action_strings: tuple[str, ...] = ()
    max_obs_len: int = 1
    max_action_len: int = 0
    show_budget: bool = False
    duplicates: int = 0  # repeated tasks of the task file, dropped from the splits (reported)
    pool: list = dataclasses.field(default_factory=list)

    @classmethod
    def build(cls, name: str, factory: Callable[[], Any], tasks: dict[str, list[dict]], tokenizer,
              hcfg: HostConfig, texts: Sequence[str] | None = None, duplicates: int = 0) -> PythonEnv:
        """Read instructions and action strings from one env object, and the longest first observation
        (`texts`, default `reset_texts` over the tasks) in tokens."""
        probe = factory()
        texts = reset_texts(factory, [t for split in tasks.values() for t in split]) if texts is None else texts
        actions = tuple(str(a) for a in (getattr(probe, "action_strings", None) or ()))
        return cls(
            name=name, factory=factory, tasks=tasks, tokenizer=tokenizer, hcfg=hcfg,
            instructions=str(getattr(probe, "instructions", None) or DEFAULT_INSTRUCTIONS), action_strings=actions,
            max_obs_len=max([len(encode(tokenizer, t)) for t in texts] + [1]),
            max_action_len=max([len(encode(tokenizer, a)) for a in actions] + [0]), duplicates=duplicates,
            pool=[probe],
        )

    def split(self, split: str, n: int | None = None) -> list[dict]:
        """The first `n` (default all) tasks of `split` ("train", "validation" or "test")."""
        if split not in self.tasks:
            raise ValueError(f"Unknown split {split!r}; valid splits are {sorted(self.tasks)}.")
        return self.tasks[split][: len(self.tasks[split]) if n is None else n]

    def envs(self, n: int) -> list[Any]:
        """`n` environment objects (built on first use, then reused)."""
        while len(self.pool) < n:
            self.pool.append(self.factory())
        return self.pool[:n]

    def _renew(self, faults: Sequence[Fault]) -> None:
        for f in faults:
            if f.kind in ("timeout", "busy"):  # its call may still run: never hand the object out again
                self.pool[f.row] = self.factory()

    def play(self, policy, fmt: Format, cfg: RolloutConfig, tasks: Sequence[dict], caps: Any, key: Any,
             script: Any = None) -> HostRollout:
        """One batch: row b plays `tasks[b]` with cap `caps[b]` (`bmrl.rollout.host.host_rollout`; with
        `script`, its actions: teacher-forced into `policy`, or played without a model when it is None)."""
        out = host_rollout(policy, self.envs(len(tasks)), self.tokenizer, np.asarray(caps), key, cfg, fmt,
                           tasks=list(tasks), hcfg=self.hcfg, script=script)
        self._renew(out.faults)
        return out

    def runner(self, policy, fmt: Format, cfg: RolloutConfig, tasks: Sequence[dict]):
        """(run({"index": int[B]}, caps, keys) -> Trajectory, trace_count) for the evaluator: rows
        name tasks by index into `tasks`; `run.faults` collects every fault."""
        tasks = list(tasks)

        def run(rows: dict, caps: Any, keys: Any):
            out = self.play(policy, fmt, cfg, [tasks[int(i)] for i in np.asarray(rows["index"])], caps, keys)
            run.faults.extend(out.faults)
            return out.trajectory

        run.faults = []
        return run, lambda: sum(compiles.counts().get(n, 0) for n in HOST_PROGRAMS)


def host_format(env: PythonEnv, reply_format: str = "action", system_prompt: str | None = None,
                history: str = "whole") -> Format:
    """The reply format of a Python env for its tokenizer: the chat template's if it has one, else
    the plain one (`bmrl.chat.make_format`), with the env's instructions and action strings."""
    from bmrl.chat import make_format

    return make_format(env.tokenizer, env.instructions, reply_format, system_prompt=system_prompt,
                       action_strings=env.action_strings or None, history=history)


__all__ = ["CORPUS_TASKS", "DEFAULT_INSTRUCTIONS", "PythonEnv", "host_format", "reset_texts"]
