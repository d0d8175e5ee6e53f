"""The files of a local Hugging Face model directory, each resolved inside it and read with its name in every error.

A model directory is untrusted input: an index entry `../x.safetensors`, an absolute path or a
symlink could make a load read files elsewhere, and pickled weights (`pytorch_model.bin`, `*.pt`)
run code when unpickled. So every file is resolved inside the directory (or, for a hub cache
snapshot, its `../../blobs`), pickles are refused with the conversion to run, and JSON and
safetensors failures become `CheckpointError`s that name the file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class CheckpointError(ValueError):
    """A Hugging Face directory that cannot be loaded as (or written from) a bmrl decoder."""


def check_directory(path: Path) -> None:
    """Refuse a missing path, a file, and top-level entries that are symlinks leaving the directory."""
    if not path.exists():
        raise CheckpointError(f"Checkpoint directory {str(path)!r} does not exist.")
    if not path.is_dir():
        raise CheckpointError(f"{str(path)!r} is a file, not a model directory (config.json + *.safetensors).")
    for entry in sorted(path.iterdir()):
        if entry.is_symlink():
            inside(path, entry.name, f"{path}")


def _roots(path: Path) -> tuple[Path, ...]:
    """Where a model's files may live: the directory, and a hub cache snapshot's shared `blobs`."""
    root = path.resolve()
    if root.parent.name == "snapshots":  # <cache>/models--org--name/snapshots/<rev>/file -> ../../blobs/<sha>
        return root, root.parent.parent / "blobs"
    return (root,)


def inside(path: Path, name: str, source: str) -> Path:
    """`path / name`, refusing absolute names, `..` and symlinks that resolve outside the directory.

    `source` says where the name came from (the index file, the directory listing) for the message.
    """
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise CheckpointError(
            f"{source} names {name!r}, outside the model directory {str(path)!r}: a model's files must be "
            "named relative to its directory, without '..'."
        )
    file = path / name
    try:
        resolved = file.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise CheckpointError(f"{file} cannot be resolved ({e}).") from e
    if not any(resolved.is_relative_to(root) for root in _roots(path)):
        raise CheckpointError(
            f"{file} is a symlink to {resolved}, outside the model directory {str(path)!r}; "
            "copy the file into the directory instead of linking it."
        )
    return file


def read_json(file: Path, what: str) -> dict[str, Any]:
    """A JSON object from `file`, or `CheckpointError` naming the file and what is wrong with it."""
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e}); it should be {what}.") from e
    except OSError as e:
        raise CheckpointError(f"{file} cannot be read ({e}).") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file} holds a JSON {type(raw).__name__}, not an object; it should be {what}.")
    return raw


@contextlib.contextmanager
def open_safetensors(file: Path) -> Iterator[Any]:
    """`safe_open(file)` whose header, parse and read errors name the file."""
    try:
        with safe_open(file, framework="flax") as f:
            yield f
    except CheckpointError:
        raise
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise CheckpointError(
            f"{file} is not a readable safetensors file ({type(e).__name__}: {e}); it may be truncated or "
            "corrupt: download or save it again."
        ) from e


def checkpoint_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file (inside `path`), from the index when there is one."""
    check_directory(path)
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index, "a safetensors index with a 'weight_map' of tensor name -> file").get(
            "weight_map"
        )
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index} has no 'weight_map' dict of tensor name -> file name.")
        files = {name: inside(path, file, str(index)) for name, file in weight_map.items()}
        absent = sorted({file for file in weight_map.values() if not (path / file).is_file()})
        if absent:
            raise CheckpointError(f"{index} names files that are not in {str(path)!r}: {', '.join(absent)}.")
        return files
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        _refuse_pickles(path)
        raise CheckpointError(f"{str(path)!r} has no *.safetensors weights.")
    files: dict[str, Path] = {}
    for shard in shards:
        with open_safetensors(shard) as f:
            for name in f.keys():
                if name in files:
                    raise CheckpointError(f"Tensor {name!r} is in both {files[name].name} and {shard.name}.")
                files[name] = shard
    return files


def _refuse_pickles(path: Path) -> None:
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{str(path)!r} has pickled weights only ({', '.join(pickles)}); bmrl reads safetensors, never "
            "pickles (unpickling can run arbitrary code). Convert once, where you trust the file: "
            f"transformers.AutoModelForCausalLM.from_pretrained({str(path)!r}).save_pretrained(<new dir>, "
            "safe_serialization=True), plus AutoTokenizer.from_pretrained(...).save_pretrained(<new dir>)."
        )
