"""What a policy trains and what stays frozen, decided once for the RL loop and SFT alike.

    learner, params = Learner.of(policy, cfg)   # LoRA: params are the adapters, learner.base the frozen rest
    restored = learner.restore(ckpt, like)      # the newest checkpoint; adapters refused on another base
    ckpt.save(step, arrays, meta | learner.checkpoint_meta())   # LoRA: {"base": {"path", "sha256"}}
    model = learner.merged(params)              # the whole policy again (nothing copied)

With LoRA the base is an input of the step, never updated, and checkpoints hold the adapters only; so a
checkpoint records the base's identity (its directory and content hash) and a resume onto another base
is refused (`CheckpointMismatch`): adapters only fit the base they were trained on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx

from bmrl.assembly.policy import base_dir
from bmrl.checkpoint import CheckpointMismatch, Checkpointer
from bmrl.config import Config
from bmrl.model.lora import content_hash, has_lora, split_lora


@dataclasses.dataclass(frozen=True)
class Learner:
    """The policy's graph, its frozen base (None without LoRA), the base's identity and the adapters'
    dropout rate (0 without LoRA). The trainable params are not kept: the steps donate them."""

    graphdef: nnx.GraphDef
    base: Any = None  # nnx.State of the frozen base (LoRA) or None
    base_identity: dict | None = None  # {"path": base_dir(cfg), "sha256": content_hash(base)} (LoRA)
    dropout: float = 0.0  # cfg.model.lora.dropout with LoRA

    @classmethod
    def of(cls, policy: Any, cfg: Config) -> tuple[Learner, Any]:
        """(learner, params): with LoRA adapters (`bmrl.model.lora.has_lora`) the adapters train on the
        frozen base; otherwise every parameter trains."""
        if not has_lora(policy):
            graphdef, params = nnx.split(policy)
            return cls(graphdef), params
        graphdef, params, base = split_lora(policy)
        identity = {"path": base_dir(cfg), "sha256": content_hash(base)}
        return cls(graphdef, base, identity, float(cfg.model.lora.dropout)), params

    @property
    def lora(self) -> bool:
        return self.base is not None

    def policy_params(self, params: Any) -> Any:
        """The whole policy's state: `params`, with LoRA the adapters joined to the base (no copy)."""
        return nnx.merge_state(params, self.base) if self.lora else params

    def merged(self, params: Any) -> Any:
        """The policy module of `params` (with LoRA on the frozen base)."""
        return nnx.merge(self.graphdef, params, *([self.base] if self.lora else []))

    def checkpoint_meta(self) -> dict:
        """What a checkpoint records of the learner: the base's identity with LoRA, else nothing."""
        return {"base": self.base_identity} if self.lora else {}

    def check_checkpoint(self, meta: dict, directory: str) -> None:
        """Raise `CheckpointMismatch` when the checkpoint of `meta` (in `directory`) holds adapters of
        another base than this learner's."""
        if self.lora and meta.get("base") != self.base_identity:
            raise CheckpointMismatch(
                f"the checkpoints in {directory} hold LoRA adapters trained on another base "
                f"({meta.get('base') or 'none recorded'}) than this run loads ({self.base_identity}): adapters "
                "only fit the base they were trained on. Point model.path at that base, or use a new out_dir."
            )

    def restore(self, ckpt: Checkpointer, like: dict) -> tuple[dict, dict] | None:
        """(arrays, meta) of the newest verified checkpoint of `ckpt`, restored like `like`; None when there
        is none. Raises `CheckpointMismatch` for adapters of another base (`check_checkpoint`)."""
        restored = ckpt.restore_latest(like)
        if restored is not None:
            self.check_checkpoint(restored[1], ckpt.directory)
        return restored


__all__ = ["Learner"]
