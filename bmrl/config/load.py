"""Loading: YAML files and dotted overrides merged onto the schema into a typed, validated `Config`.

    cfg = load("configs/corridor_tiny.yaml", ["budget.kind=mix", "budget.budgets=[4,8]"])
    save(cfg, f"{cfg.out_dir}/config.yaml")

Layers (the schema's defaults, then files, then overrides) are merged with OmegaConf structured
configs, so an unknown key or a wrong type is refused with the key's full name. Files are read
strictly: UTF-8 text only, no duplicate keys. Interpolation (`${...}`) is off everywhere: a value
holding `${` is refused, never expanded (a config file is the record of an experiment; it must not
depend on the environment it is read in). Every refusal is a `ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bmrl.config.schema import Config, ConfigError, element_hint, hint_of, section_names, type_name
from bmrl.config.validate import is_python_env, validate


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML itself says last wins)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    str(key), f"is given twice in one mapping (lines {seen[key]} and {line}); keep one of them."
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def yaml_text(text: str, where: str) -> Any:
    """Parse YAML `text` strictly (safe tags only, no duplicate keys); `where` names it in errors."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except ConfigError as err:
        raise ConfigError(err.key, f"{str(err).removeprefix(err.key + ': ')} ({where})") from None
    except yaml.YAMLError as err:
        raise ConfigError("", f"{where} is not valid YAML: {err}") from None


def _omega_error(err: OmegaConfBaseException, schema=Config) -> ConfigError:
    """An OmegaConf refusal as a ConfigError naming the key, with the allowed keys or the expected type."""
    key = getattr(err, "full_key", None) or ""
    msg = str(err).splitlines()[0]
    if "not in" in msg and key:
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = hint_of(parent, schema) if parent else schema
        if dataclasses.is_dataclass(node):
            msg = msg.rstrip(".") + f". Allowed keys{' in ' + parent if parent else ''}: {section_names(node)}."
    elif key:
        hint = hint_of(key, schema)
        if hint is not None:
            if re.search(r"\[\d+\]$", key):  # a list element: its element type
                hint = element_hint(hint)
            msg = f"{msg.rstrip('.')}. Expected {type_name(hint)}."
    return ConfigError(key, msg)


def _check_sections(layer: dict, schema, prefix: str = "") -> dict:
    """`layer` with empty sections dropped; a section given a non-mapping, or a text key a number or
    boolean (YAML reads `yes` as true), is refused by name."""
    out = {}
    for k, v in layer.items():
        hint = hint_of(str(k), schema) if dataclasses.is_dataclass(schema) else None
        if dataclasses.is_dataclass(hint):
            if v is None:
                continue
            if not isinstance(v, dict):
                raise ConfigError(
                    prefix + str(k), f"is a section; give a mapping of its keys ({section_names(hint)}), got {v!r}."
                )
            v = _check_sections(v, hint, f"{prefix}{k}.")
        elif typing.get_origin(hint) is dict and v is not None and not isinstance(v, dict):
            raise ConfigError(prefix + str(k), f"must be a mapping (e.g. {{name: value}}), got {v!r}.")
        elif type_name(hint) in ("str", "str or null") and isinstance(v, (bool, int, float)):  # OmegaConf would make it text
            raise ConfigError(prefix + str(k), f"must be text, got {type(v).__name__} {v!r}; quote it in YAML "
                              f"(e.g. {prefix}{k}: \"{v}\").")
        out[k] = v
    return out


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict:
    """Dotted `key.subkey=value` strings -> a nested mapping (values parsed as YAML: 3, [2,8], null)."""
    for o in overrides:
        if "=" not in o or not o.split("=", 1)[0].strip():
            raise ConfigError(o, "an override must look like key.subkey=value (e.g. budget.kind=mix).")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)))
    except (OmegaConfBaseException, yaml.YAMLError, ValueError) as err:
        raise ConfigError("", f"cannot parse overrides {list(overrides)}: {str(err).splitlines()[0]}") from None


def _required_keys(layers: list[dict]) -> list[str]:
    """Dotted keys that a layer marks `???` (OmegaConf's MISSING) and no later layer sets.

    OmegaConf's merge keeps the schema default when a layer says `???`, so "required" is checked here,
    on the raw layers, before merging."""
    marked: dict[str, bool] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                marked[f"{prefix}{k}"] = v == "???"

    for layer in layers:
        walk(layer, "")
    return sorted(k for k, is_missing in marked.items() if is_missing)


def _refuse_interpolation(node: Any, key: str = "") -> None:
    """Refuse any string holding `${`: OmegaConf would expand it (`${oc.env:VAR}`, `${other.key}`)."""
    if isinstance(node, dict):
        for k, v in node.items():
            _refuse_interpolation(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _refuse_interpolation(v, f"{key}[{i}]")
    elif isinstance(node, str) and "${" in node:
        raise ConfigError(
            key, f"{node!r} uses ${{...}} interpolation, which is off: it is not expanded in files or overrides. "
            "Write the value itself (e.g. the path, or the other key's number)."
        )


def build(
    data: dict | list[dict] | None = None, overrides: list[str] | tuple[str, ...] = (), schema=Config
):
    """Merge `data` (a parsed YAML mapping, or a list of them applied in order) and dotted `overrides`
    onto `schema`, then validate. Every refusal is a ConfigError naming the key."""
    layers = list(data) if isinstance(data, (list, tuple)) else [data or {}]
    layers.append(parse_overrides(overrides))
    for layer in layers:
        if not isinstance(layer, dict):
            raise ConfigError("", f"a config must be a mapping of sections, got {type(layer).__name__}: {layer!r}.")
        _refuse_interpolation(layer)
    layers = [_check_sections(layer, schema) for layer in layers]
    required = _required_keys(layers)
    if required:
        raise ConfigError(
            required[0], f"is required (the config file marks it ???); give it as an override, e.g. {required[0]}=VALUE."
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), *[OmegaConf.create(layer) for layer in layers])
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _omega_error(err, schema) from None
    if schema is Config:
        validate(cfg)
    return cfg


def read_yaml(path: str | os.PathLike) -> dict:
    """A YAML file's mapping ({} when empty). Refused (ConfigError): a missing file, a binary or
    non-UTF-8 file, bad YAML, a key given twice, a top level that is not a mapping."""
    if not os.path.isfile(path):
        what = "is a directory, not a file" if os.path.isdir(path) else "does not exist"
        raise ConfigError("", f"config file {str(path)!r} {what}; give the path of a YAML file (see configs/).")
    with open(path, "rb") as f:
        raw = f.read()
    if b"\x00" in raw:
        raise ConfigError("", f"{path} is a binary file (it holds NUL bytes), not a YAML config; give a text file.")
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise ConfigError(
            "", f"{path} is not UTF-8 text (byte {err.start}: {raw[err.start:err.start + 1]!r}); save it as UTF-8."
        ) from None
    data = yaml_text(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"{path} must hold a mapping of config sections, got {type(data).__name__}.")
    return data


def load(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a YAML config file (or only defaults) with dotted overrides (`budget.kind=mix`).

    Paths of a Python env are anchored here, so the saved config.yaml of a run stands on its own: a
    relative `data.tasks` becomes absolute against the config file's directory (the working
    directory without a file), and `env.path` (where `env.entry`'s module is looked for) defaults
    to that directory.
    """
    cfg = build(read_yaml(path) if path is not None else {}, overrides)
    if is_python_env(cfg):
        base = os.path.dirname(os.path.abspath(path)) if path is not None else os.getcwd()
        cfg.data.tasks = os.path.normpath(os.path.join(base, os.path.expanduser(cfg.data.tasks)))
        cfg.env.path = os.path.normpath(os.path.join(base, os.path.expanduser(cfg.env.path or ".")))
    return cfg


def to_dict(cfg: Config) -> dict:
    """A plain dict of `cfg` (for YAML/JSON dumps and checkpoints)."""
    return dataclasses.asdict(cfg)


def changed_keys(saved: dict, now: dict, sections: tuple[str, ...] | None = None, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two config dicts (compared as JSON), limited to the
    top-level `sections` when given, leaving out the keys in `ignore`: what a resumed run or a reused
    stage would silently change."""

    def flat(d: dict, prefix: str = ""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    def pick(d: dict) -> dict:
        return {k: v for k, v in flat(json.loads(json.dumps(d, default=str)))
                if (sections is None or k.split(".")[0] in sections) and k not in ignore}

    a, b = pick(saved), pick(now)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML; `load` of it gives back an equal Config."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)


def save(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML (creating the parent directory)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(to_yaml(cfg))
