"""The player of a Python env (`env.kind=python`): task dicts of its task file as tasks, episodes
stepped from the host on the compiled turn (`bmrl.rollout.pyenv`), faults of user code counted, each
process stepping its own rows on several hosts. The protocol it shares with
`bmrl.assembly.jax_player.JaxPlayer` is described in `bmrl.assembly.players`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bmrl.assembly.checks import check_first_turn, check_oracle
from bmrl.assembly.python_env import host_config, python_parts, python_splits, read_task_file
from bmrl.assembly.settings import run_format
from bmrl.assembly.tasks import data_dir
from bmrl.config import Config
from bmrl.data import level_hashes, suite_overlap
from bmrl.distributed import gather_objects, gather_rows, global_batch_array, local_rows, process_share, to_host
from bmrl.envs.python.protocol import Fault
from bmrl.eval.evaluate import Runner
from bmrl.learn.demos import Demos
from bmrl.learn.host_demos import make_host_demos
from bmrl.rollout.pyenv import DEFAULT_INSTRUCTIONS, PythonEnv, host_format
from bmrl.rollout.types import row_keys


@dataclasses.dataclass(frozen=True, eq=False)
class HostPlayer:
    """A Python env (`bmrl.rollout.pyenv.PythonEnv`): tasks are lists of task dicts, episodes stepped
    from the host on the compiled turn; faults of user code come back with the trajectory."""

    cfg: Any  # bmrl.config.Config
    env: Any  # bmrl.rollout.pyenv.PythonEnv, its tasks inside
    fmt: Any
    replays_states: ClassVar[bool] = False  # its states live in user code: no probes, no injection
    evaluates_on_mesh: ClassVar[bool] = False  # its evaluations play on the host, not over the mesh

    # ---- the kind's facts from the config alone (before, or without, a built env) ----

    @staticmethod
    def prepare(cfg: Config) -> tuple[Any, Any, list[str]]:
        """What must be read before the tokenizer: the entry imported, the task file read and split, the
        first observations (`bmrl.assembly.python_env.python_parts`); once per run."""
        return python_parts(cfg)

    @staticmethod
    def tokenizer_texts(cfg: Config, parts: tuple | None = None) -> list[str]:
        """The text a tiny tokenizer is trained on: the env's instructions, the first observations of its
        tasks and its action strings."""
        factory, _, observations = parts or python_parts(cfg)
        probe = factory()
        return [str(getattr(probe, "instructions", None) or DEFAULT_INSTRUCTIONS), *observations,
                *(str(a) for a in (getattr(probe, "action_strings", None) or ()))]

    @staticmethod
    def make_env(cfg: Config, tokenizer: Any, parts: tuple | None = None) -> Any:
        """A `bmrl.rollout.pyenv.PythonEnv` with its tasks (from `parts`, `prepare(cfg)`, when given)."""
        factory, splits, observations = parts or python_parts(cfg)
        return PythonEnv.build(cfg.env.entry, factory, splits.tasks, tokenizer, host_config(cfg), texts=observations,
                               duplicates=splits.duplicates)

    @staticmethod
    def make_format(cfg: Config, env: Any) -> Any:
        """The run's conversation format (`bmrl.rollout.pyenv.host_format`)."""
        return run_format(cfg, env, host_format)

    @staticmethod
    def report_name(cfg: Config) -> str:
        """The env as the study's reports name it: its entry."""
        return cfg.env.entry

    @staticmethod
    def compare_label(cfg: Config) -> str:
        """The env as a comparison names it."""
        return f"python {cfg.env.entry}"

    @staticmethod
    def settings_line(cfg: Config) -> str:
        """The env as an evaluation report's settings state it: entry, options and task file."""
        return f"{cfg.env.entry} (python) {dict(cfg.env.options)}, tasks {cfg.data.tasks}"

    @staticmethod
    def split(cfg: Config, split: str, n: int | None = None, env: Any = None) -> list[dict]:
        """The first `n` (default all) task dicts of `split` of the built `env` (its tasks live in it)."""
        if env is None:
            raise ValueError("the tasks of a Python env live in its Run: pass run=build_run(cfg).")
        return env.split(split, n)

    @staticmethod
    def suite_summary(cfg: Config, env: Any = None) -> dict:
        """How the task file was split (without `env`: read again, the env not imported): split sizes,
        the overlap of the first `eval.num_tasks` test tasks with the training tasks (content), the task
        file's repeated tasks (dropped) and `path`."""
        if env is None:
            splits = python_splits(cfg, read_task_file(cfg))
            tasks, duplicates = splits.tasks, splits.duplicates
        else:
            tasks, duplicates = env.tasks, env.duplicates
        train, val, test = tasks["train"], tasks["validation"], tasks["test"][:max(cfg.eval.num_tasks, 1)]
        overlap = suite_overlap(level_hashes(None, train), level_hashes(None, test))
        return {"train": len(train), "validation": len(val), "test": len(test), "overlap": overlap,
                "disjoint_by": "content", "duplicates": duplicates, "path": data_dir(cfg)}

    # ---- the built run's ----

    @property
    def label(self) -> str:
        """The env as logs name it: its entry."""
        return self.cfg.env.entry

    @property
    def options(self) -> dict:
        """`env.options`, as summaries record them."""
        return dict(self.cfg.env.options)

    def tasks(self, split: str, n: int | None = None) -> list[dict]:
        """The first `n` (default all) task dicts of `split`."""
        return self.env.split(split, n)

    def eval_split(self) -> str:
        """The split training-time evaluation reads: validation, or test when the task file put no task
        in validation."""
        return "validation" if self.env.split("validation") else "test"

    def check_fits(self, budget: Any) -> list[str]:
        """The buffer against one turn (`bmrl.assembly.checks.check_first_turn`; later observations are
        known only as the env runs)."""
        return check_first_turn(self.cfg, self.env, self.fmt)

    def check_demos(self) -> None:
        """Its oracle must be playable for SFT demonstrations (`bmrl.assembly.checks.check_oracle`)."""
        check_oracle(self.cfg, self.env)

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


__all__ = ["HostPlayer"]
