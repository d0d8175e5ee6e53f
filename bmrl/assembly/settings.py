"""The kind-independent settings of a run: the rollout configs (training and evaluation), the mesh, and
the format's errors as config errors.

    rollout = rollout_config(cfg)                  # eval_rollout: rollout_config(cfg, for_eval=True)
    mesh = mesh_config(cfg)                        # checked against the devices
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from bmrl.chat import ChatFormatError, HistoryError, TagLayoutError
from bmrl.config import Config, ConfigError
from bmrl.parallel import MeshConfig, make_mesh
from bmrl.rollout import RolloutConfig
from bmrl.sampling import SamplingConfig


# Platform defaults of the rollout's speed knobs (config null), measured side by side: on CPU, live-row
# compaction (BudgetMix {2,4,6,8} over all 8: 0.79-0.86 vs 1.0 off) and 64-key cache blocks are fastest;
# on an H200 compaction cost more than it saved (1.37 vs 1.04: a decode step there re-reads the weights
# for every chunk of rows) and 256-key blocks decoded 1.45x faster than 64 (bench/device.py, README).
PLATFORM_DEFAULTS = {"cpu": {"compact_min_rows": RolloutConfig.compact_min_rows,  # RolloutConfig's own: 16, 64
                             "attention_block": RolloutConfig.attention_block},
                     "accelerator": {"compact_min_rows": 0, "attention_block": 256}}


def platform_default(name: str, value: int | None) -> int:
    """`value`, or, when the config leaves it null, the default of the platform jax runs on."""
    if value is not None:
        return value
    return PLATFORM_DEFAULTS["cpu" if jax.default_backend() == "cpu" else "accelerator"][name]


def rollout_config(cfg: Config, for_eval: bool = False):
    """The `RolloutConfig` of the `rollout` section; evaluation samples at `eval.temperature` and keeps no
    learning samples; the speed knobs left null take the platform's defaults (`PLATFORM_DEFAULTS`)."""
    r = cfg.rollout
    temperature = cfg.eval.temperature if for_eval else r.temperature
    return RolloutConfig(
        max_turns=r.max_turns,
        max_reply_tokens=r.max_reply_tokens,
        max_len=r.max_len,
        sampling=SamplingConfig(temperature=temperature, top_k=r.top_k, top_p=r.top_p),
        compact_min_rows=platform_default("compact_min_rows", r.compact_min_rows), compact_steps=r.compact_steps,
        attention_block=platform_default("attention_block", r.attention_block), history_turns=r.history_turns,
        learning_samples=not for_eval,
    )


def mesh_config(cfg: Config):
    """The `MeshConfig` of the `mesh` section, refused (ConfigError) if the devices cannot form it."""
    mesh = MeshConfig(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    try:
        make_mesh(mesh)
    except ValueError as err:
        raise ConfigError("mesh", f"{dataclasses.asdict(mesh)}: {err}") from None
    return mesh


def run_format(cfg: Config, env: Any, make: Callable[[Any, str, str | None, str], Any]) -> Any:
    """`make(env, format.kind, format.system_prompt, format.history)`, the player's format builder
    (`bmrl.chat.env_format` for a JAX env, `bmrl.rollout.pyenv.host_format` for a Python env), its errors as
    ConfigErrors naming format.kind (a reply layout the tokenizer cannot hold), format.history (a template
    rewrite to follow that is not there) or model.path (a chat template bmrl cannot reproduce)."""
    try:
        return make(env, cfg.format.kind, cfg.format.system_prompt, cfg.format.history)
    except TagLayoutError as err:
        raise ConfigError("format.kind", str(err)) from None
    except HistoryError as err:
        raise ConfigError("format.history", str(err)) from None
    except ChatFormatError as err:
        raise ConfigError("model.path", f"{err} Use a model whose chat template bmrl can reproduce.") from None


__all__ = ["PLATFORM_DEFAULTS", "mesh_config", "platform_default", "rollout_config", "run_format"]
