"""Named implementations of one extension point, in one shape for every registry of bmrl: environments
(`bmrl.envs.ENVS`), advantage estimators and losses (`bmrl.learn`), budget samplers (`bmrl.budget`),
model families (`bmrl.model.families`), sweep commands (`bmrl.sweep`), evaluation metrics
(`bmrl.eval.metrics.METRICS`) and `bmrl plan`'s machines (`bmrl.machines.HARDWARE`).

    LOSSES = Registry("loss", {"ppo": ppo_loss})
    @LOSSES.register("pg")                 # or LOSSES.add("pg", pg_loss)
    def pg_loss(...): ...
    LOSSES.lookup("pg")                    # unknown names: UnknownName listing the valid ones
    ENVS = Registry("environment", {"corridor": "bmrl.envs.corridor:Corridor"})   # imported on first get

A registry is a mapping of names (config validation and the generated config docs read its names, so
no list of valid values is kept by hand anywhere). An entry may be a lazy `"module:attr"` path, imported when first
asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name no entry of the registry has; the message lists the valid ones."""


class NotInstalled(ValueError):
    """A registered lazy entry whose module is not installed (or lacks the attribute)."""


class Registry(MutableMapping[str, T], Generic[T]):
    """Name -> implementation of one extension point (`what` names it in messages). `add`/`register`
    refuse a second entry under a taken name; item assignment replaces one (a deliberate override, as
    tests do with `monkeypatch.setitem`)."""

    def __init__(self, what: str, entries: Mapping[str, T | str] | None = None):
        self.what = what
        self._entries: dict[str, Any] = dict(entries or {})

    def add(self, name: str, entry: T | str) -> T | str:
        """Register `entry` (or a lazy "module:attr" path) under `name`; a name is registered once."""
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.what} {name!r} is registered already ({self._entries[name]!r}).")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name")` adds the decorated object."""
        return lambda entry: self.add(name, entry)

    def copy(self) -> Registry[T]:
        """A registry of the same entries (lazy ones still lazy): to register into without touching this one."""
        return Registry(self.what, self._entries)

    def names(self) -> str:
        """The registered names, sorted, for messages and docs ("a, b, c")."""
        return ", ".join(sorted(self._entries))

    def lookup(self, name: str) -> T:
        """The entry of `name` (a lazy path imported now); UnknownName listing the valid names (`get` is
        the mapping's: None for an unknown name)."""
        if name not in self._entries:
            raise UnknownName(f"unknown {self.what} {name!r}; valid: {self.names()}.")
        return self[name]

    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, str) and ":" in entry:
            module, attr = entry.split(":")
            try:
                entry = getattr(importlib.import_module(module), attr)
            except ModuleNotFoundError as err:  # the module (or a package above it) is missing, not one it imports
                if err.name and (module == err.name or module.startswith(err.name + ".")):
                    raise NotInstalled(f"{self.what} {name!r} is registered but {module} is not available.") from err
                raise
            except AttributeError:
                raise NotInstalled(f"{self.what} {name!r} is registered as {self._entries[name]}, but {module} "
                                   f"has no {attr}.") from None
        return entry

    def __setitem__(self, name: str, entry: T | str) -> None:
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {self.names()})"


__all__ = ["NotInstalled", "Registry", "UnknownName"]
