"""One run directory: what a run writes there, and the one rule for meeting an existing one.

    rd = RunDir(cfg.out_dir)
    done = rd.claim(cfg, "rl")       # before any work: not writable / other settings -> refused (exit 2)
    if done is not None:
        return done                  # already finished with these settings: its summary, nothing rewritten
    rd.write_config(cfg)             # config.yaml, atomically
    ...
    rd.write_json("summary.json", summary)   # atomically: a reader (or a rerun) never sees a cut file

The rule, the same for train, sft, eval, reproduce's stages and sweep runs:
- not writable (or a file where the directory should be): `OutputNotWritable`, exit status 2;
- its config.yaml made with other settings (in the sections the run's result depends on, `SECTIONS`):
  `ConfigError` naming the keys and the fix (delete the directory or choose another out_dir), exit 2;
- finished (its marker, summary.json, present and accepted): the saved summary; the caller does nothing.

On a multi-process run (`bmrl.distributed`) every process makes the same calls and only process 0
writes (`bmrl.distributed.main_writes`): one set of outputs, however many hosts; orbax checkpoints, written by every
process, are the one exception (`bmrl.checkpoint`).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from bmrl.config import Config, ConfigError, changed_keys, read_yaml, to_dict, to_yaml

# The config sections a run's result depends on, by kind; a run directory made with other values of
# these is refused instead of being silently reused or resumed. None: every key but out_dir.
SECTIONS: dict[str, tuple[str, ...] | None] = {
    "sft": ("seed", "model", "env", "format", "rollout", "budget", "data", "sft"),
    "rl": ("seed", "model", "env", "format", "rollout", "budget", "data", "train"),
    "eval": ("seed", "model", "env", "format", "rollout", "data", "eval"),
}
IGNORED = {"rl": ("out_dir", "train.steps")}  # never compared (by kind; default: out_dir): raising train.steps trains on


class OutputNotWritable(OSError):
    """The output directory cannot be written (exit 2)."""


def probe_writable(path: str | os.PathLike) -> None:
    """Raise OutputNotWritable unless `path` (or, when it does not exist yet, its nearest existing
    parent) is a directory where a file can be created; creates nothing that stays."""
    path = os.path.abspath(os.fspath(path))
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise OutputNotWritable(errno.ENOTDIR, f"output directory {path}: {probe} exists and is not a directory; "
                                "choose another out_dir")
    test = os.path.join(probe, f".bmrl-write-probe-{os.getpid()}")
    try:
        with open(test, "wb") as f:
            f.write(b"0")
        os.remove(test)
    except OSError as err:
        raise OutputNotWritable(err.errno, f"output directory {path} is not writable ({probe}: "
                                f"{err.strerror or err}); choose a writable out_dir or fix its permissions") from None


def _default(o: Any) -> Any:
    """JSON for numpy scalars and arrays (their Python values), anything else as its text."""
    return o.tolist() if hasattr(o, "tolist") else str(o)


class RunDir:
    """The output directory of one run (module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def changed(self, cfg: Config, kind: str | None) -> list[str]:
        """Keys of `cfg` that differ from the config.yaml here, in the sections of `kind` (none: no file)."""
        path = self.file("config.yaml")
        if not os.path.isfile(path):
            return []
        return changed_keys(read_yaml(path), to_dict(cfg), SECTIONS.get(kind) if kind else None,
                            ignore=IGNORED.get(kind, ("out_dir",)))

    def finished(self, marker: str = "summary.json", accept: Callable[[dict], bool] = lambda s: True) -> dict | None:
        """The saved summary when `marker` holds one that `accept`s, else None (not finished)."""
        try:
            with open(self.file(marker)) as f:
                summary = json.load(f)
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) and accept(summary) else None

    def claim(self, cfg: Config | None = None, kind: str | None = None, marker: str = "summary.json",
              accept: Callable[[dict], bool] = lambda s: True) -> dict | None:
        """The one rule (module docstring), applied before any work: raises `OutputNotWritable` or
        `ConfigError` (both exit status 2); returns the saved summary of a finished run, else None.
        Without `cfg` only writability is checked."""
        probe_writable(self.path)
        if cfg is None:
            return None
        changed = self.changed(cfg, kind)
        if changed:
            shown = ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else "")
            raise ConfigError(changed[0], f"{self.path} holds a run made with other settings ({shown}); delete "
                              f"{self.path} to redo it with these, or choose another out_dir.")
        return self.finished(marker, accept)

    def write_text(self, name: str, text: str) -> str:
        """Write `name` through a temporary file and a rename (old file or new one, never a cut one); on
        process 0 only, and every process returns once it is there (`bmrl.distributed.main_writes`: a
        reproduce stage reads the last one's policy/ and summary.json). Returns the path."""
        path = self.file(name)

        def write() -> None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)

        if "jax" in sys.modules:  # a JAX run may be one process of several; without JAX there is one
            from bmrl.distributed import main_writes

            main_writes(f"bmrl-rundir-{name}", write)
        else:
            write()
        return path

    def write_json(self, name: str, obj: Any, **dump: Any) -> str:
        """`obj` as indented JSON in `name`, atomically (`write_text`); `dump`: more `json.dumps` options."""
        return self.write_text(name, json.dumps(obj, **{"indent": 2, "default": _default, **dump}))

    def write_config(self, cfg: Config) -> str:
        """The resolved config as config.yaml (`bmrl.config.load` of it gives `cfg` back), atomically."""
        return self.write_text("config.yaml", to_yaml(cfg))


__all__ = ["IGNORED", "OutputNotWritable", "RunDir", "SECTIONS", "probe_writable"]
