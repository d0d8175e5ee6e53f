"""Edits of a saved Hugging Face model directory, for the tests that break one on purpose."""

import json
from pathlib import Path
from typing import Callable

import numpy as np
from safetensors.numpy import load_file, save_file

WEIGHTS = "model.safetensors"


def edit_config(d: Path, **changes) -> None:
    """Set `changes` in `d/config.json`."""
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def edit_tensors(d: Path, edit: Callable[[dict[str, np.ndarray]], object]) -> None:
    """Apply `edit` to the tensors of `d/model.safetensors` (a dict it may change in place) and save them."""
    tensors = load_file(str(d / WEIGHTS))
    edit(tensors)
    save_file(tensors, str(d / WEIGHTS), metadata={"format": "pt"})
