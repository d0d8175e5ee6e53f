"""The player: the one object of a run that knows whether its env is compiled JAX or Python on the host.

    player = run.player                                   # chosen once, by `bmrl.assembly.build_run`
    tasks = player.tasks("train")                         # a split's tasks (level seeds, or task dicts)
    rows = player.take(tasks, idx)                        # the rows of a batch: tasks[idx]
    play = player.playing(graphdef, rollout_cfg, mesh)    # compiled once
    traj, faults = play(params, rows, caps, key)          # one batch of episodes; faults: None (JAX) or a list
    demos = player.demos(rows, key, num_turns=..., ...)   # SFT demonstrations (the noisy oracle)
    evaluate(..., runner=player.evaluation_runner)        # how the evaluator plays its rows

`JaxPlayer` plays a built-in env in one compiled loop (`bmrl.rollout.engine`); `HostPlayer` plays a
Python env from the host on the same compiled turn (`bmrl.rollout.pyenv`). Train, SFT, evaluation,
compare and reproduce use this protocol and never ask which kind they have; the evaluator gets
`player.env`, a player's tasks and the player's `evaluation_runner`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl.assembly.tasks import split_tasks
from bmrl.distributed import gather_objects, gather_rows, global_batch_array, local_rows, process_share, to_host
from bmrl.envs.python.protocol import Fault
from bmrl.eval.evaluate import Runner, engine_runner
from bmrl.learn.demos import Demos, demo_tokens_needed, make_demos
from bmrl.learn.host_demos import make_host_demos
from bmrl.parallel import shard_batch
from bmrl.rollout import Injection, make_rollout
from bmrl.rollout.pyenv import host_format
from bmrl.rollout.types import row_keys


@dataclasses.dataclass(frozen=True, eq=False)
class JaxPlayer:
    """A built-in JAX env: tasks are level seeds (`{"seed": int32[n]}`), episodes one compiled loop."""

    cfg: Any  # bmrl.config.Config: where its level splits come from (bmrl.assembly.tasks.split_tasks)
    env: Any  # bmrl.envs.Env
    fmt: Any  # bmrl.formats.Format
    label: str  # the env as logs and reports name it
    options: dict  # the env's options, as summaries record them
    replays_states: bool = True  # probes and error injection can replay its oracle states

    def tasks(self, split: str, n: int | None = None) -> dict:
        """The first `n` (default all) tasks of `split`: `{"seed": int32[n]}`."""
        return {"seed": np.asarray(split_tasks(self.cfg, split, n, run=self)["seed"])}

    def count(self, tasks: dict) -> int:
        return len(tasks["seed"])

    def take(self, tasks: dict, idx: Any) -> dict:
        """Rows `tasks[idx]` (any int array of indices)."""
        return {"seed": np.asarray(np.asarray(tasks["seed"])[np.asarray(idx)], np.int32)}

    def playing(self, graphdef: nnx.GraphDef, rollout_cfg: Any, mesh: Any = None) -> Callable:
        """`play(params, rows, caps, key) -> (Trajectory, None)`: the compiled rollout, rows sharded on `mesh`."""
        rollout_fn = make_rollout(graphdef, self.env, self.fmt, rollout_cfg)
        inject = Injection.none(rollout_cfg.max_turns)

        def play(params, rows: dict, caps: Any, key: Any):
            tasks = shard_batch(jax.tree.map(jnp.asarray, rows), mesh)
            return rollout_fn(params, tasks, caps, key, inject), None

        return play

    def demo_len(self, num_turns: int, max_len: int) -> int:
        """Tokens a demonstration of `num_turns` turns needs at most (within `max_len`)."""
        return min(max_len, demo_tokens_needed(self.env, self.fmt, num_turns))

    def demos(self, rows: dict, key: Any, **kw: Any) -> Demos:
        """The noisy oracle's demonstrations of `rows` (`bmrl.learn.demos.make_demos`, one jit)."""
        return make_demos(self.env, self.fmt, jax.tree.map(jnp.asarray, rows), key, **kw)

    def evaluation_runner(self, *args: Any) -> Runner:
        """The evaluator's `Runner` (`bmrl.eval.evaluate`): the compiled episode engine, model or scripted
        policies, with error injection."""
        return engine_runner(*args)


@dataclasses.dataclass(frozen=True, eq=False)
class HostPlayer:
    """A Python env (`bmrl.rollout.pyenv.PythonEnv`): tasks are lists of task dicts, episodes stepped
    from the host on the compiled turn; faults of user code come back with the trajectory."""

    env: Any  # bmrl.rollout.pyenv.PythonEnv
    fmt: Any
    label: str  # env.entry: how logs and reports name the env
    options: dict  # env.options
    replays_states: bool = False  # its states live in user code: no probes, no injection

    def tasks(self, split: str, n: int | None = None) -> list[dict]:
        """The first `n` (default all) task dicts of `split`."""
        return self.env.split(split, n)

    def count(self, tasks: list) -> int:
        return len(tasks)

    def take(self, tasks: list, idx: Any) -> list[dict]:
        return [tasks[int(i)] for i in np.asarray(idx)]

    def playing(self, graphdef: nnx.GraphDef, rollout_cfg: Any, mesh: Any = None) -> Callable:
        """`play(params, rows, caps, key) -> (Trajectory, faults)`: the host loop (`PythonEnv.play`).

        On several processes each one steps only the environments of its own rows of the batch (those
        its devices hold: `bmrl.distributed.local_rows`), with the row keys of the whole batch and a
        copy of the parameters on its first device; the rows come back as one batch-sharded
        Trajectory and the faults of all processes, gathered, on every process (process 0 logs them)."""

        def play(params, rows: list, caps: Any, key: Any):
            if mesh is not None and jax.process_count() > 1:
                return self._play_local_rows(graphdef, rollout_cfg, mesh, params, rows, caps, key)
            out = self.env.play(nnx.merge(graphdef, params), self.fmt, rollout_cfg, rows, to_host(caps), key)
            return out.trajectory, out.faults

        return play

    def _play_local_rows(self, graphdef, rollout_cfg, mesh, params, rows: list, caps: Any, key: Any):
        batch = len(rows)
        part = local_rows(mesh, batch)
        keys = row_keys(key, batch)[part]
        here = jax.local_devices()[0]
        local_params = jax.device_put(to_host(params), here)  # gathered where fsdp/tensor split it
        out = self.env.play(nnx.merge(graphdef, local_params), self.fmt, rollout_cfg, rows[part],
                            to_host(caps)[part], keys)
        trajectory = global_batch_array(mesh, to_host(out.trajectory), batch)
        mine = [dataclasses.asdict(dataclasses.replace(f, row=f.row + part.start)) for f in out.faults]
        faults = [Fault(**f) for process in gather_objects(mine) for f in process]
        return trajectory, faults

    def demo_len(self, num_turns: int, max_len: int) -> int:
        return max_len  # later observations are known only as the env runs

    def demos(self, rows: list, key: Any, **kw: Any) -> Demos:
        """The noisy oracle played from the host on `info["next_oracle_action"]` (`bmrl.learn.host_demos`)."""
        return make_host_demos(self.env, self.fmt, rows, key, **kw)

    def evaluation_runner(self, policy: Any, env: Any, tasks: list, fmt: Any, rollout_cfg: Any, inject: Any,
                          min_cap: int) -> Runner:
        """The evaluator's `Runner` (`bmrl.eval.evaluate`): a model policy played from the host, rows naming
        their task by index (`PythonEnv.runner`), faults counted. Scripted policies and error injection need
        a JAX env's states."""
        if not isinstance(policy, nnx.Module):
            raise TypeError("a Python environment is played by a model policy (an nnx.Module); scripted policies "
                            "act on a JAX env's states.")
        if np.asarray(inject.turns).any() and float(np.asarray(inject.prob)) > 0:
            raise ValueError("error injection needs a JAX environment (its oracle picks the wrong action); evaluate "
                             "a Python environment without inject.")
        tasks = list(tasks)
        if jax.process_count() > 1:  # each process plays its share of the rows on a copy of the policy
            policy = _local_copy(policy)
        run, trace_count = env.runner(policy, fmt or host_format(env), rollout_cfg, tasks)
        play = _split_over_processes(run) if jax.process_count() > 1 else run
        return Runner(play, trace_count, {"index": np.arange(len(tasks), dtype=np.int32)},
                      faults=lambda: len(play.faults), on_host=True)


def _local_copy(policy: nnx.Module) -> nnx.Module:
    """`policy` with its parameters gathered (where fsdp/tensor split them across processes) onto this
    process's first device: a model one process can run alone."""
    graphdef, state = nnx.split(policy)
    return nnx.merge(graphdef, jax.device_put(to_host(state), jax.local_devices()[0]))


def _split_over_processes(run: Callable) -> Callable:
    """`run(rows, caps, keys) -> Trajectory` with each process playing its `process_share` of the rows
    (the environments of the others' rows never step here) and the rows gathered back in order on every
    process (`gather_rows`). `.faults` holds every process's faults, rows numbered in the whole chunk.
    A chunk of fewer rows than processes is played whole by every process (no share to give)."""

    def play(rows: dict, caps: Any, keys: Any):
        index = np.asarray(rows["index"])
        if len(index) < jax.process_count():
            before = len(run.faults)
            trajectory = run(rows, caps, keys)
            play.faults.extend(run.faults[before:])
            return trajectory
        mine = process_share(len(index))
        before = len(run.faults)
        trajectory = to_host(run({"index": index[mine]}, np.asarray(caps)[mine], np.asarray(keys)[mine]))
        found = [dataclasses.asdict(dataclasses.replace(f, row=f.row + int(mine[0]))) for f in run.faults[before:]]
        play.faults.extend(Fault(**f) for process in gather_objects(found) for f in process)
        return gather_rows(trajectory, len(index))

    play.faults = []
    return play


__all__ = ["HostPlayer", "JaxPlayer"]
