"""Named machines for `bmrl plan` (their devices and each device's spec-sheet figures) and what the time model
assumes of them: plain data, no JAX, so `bmrl plan --help` lists the names without importing the planner.

    HARDWARE.lookup("tpu-v4-8")   # a `Hardware`; unknown names: UnknownName listing the known ones
    Assumptions(mfu=0.3, bandwidth_share=0.15, kv_fill=0.5)
"""

from __future__ import annotations

import dataclasses

from bmrl.registry import Registry

GB = 10**9
GIB = 2**30


# ---------------------------------------------------------------- hardware
@dataclasses.dataclass(frozen=True)
class Hardware:
    """A machine by name: its devices (what JAX lists: TPU chips, GPUs) and each device's figures."""

    name: str
    kind: str  # tpu | gpu | cpu
    devices: int
    memory: int  # bytes per device, the spec sheet's figure read in its own unit (GB = 1e9 bytes, GiB = 2**30)
    memory_text: str  # that figure as the spec sheet prints it
    peak_flops: float  # dense bfloat16 FLOP/s per device
    bandwidth: float  # HBM bytes/s per device
    source: str  # where the figures come from

    def line(self) -> str:
        other = f"{self.memory / GB:.1f} GB" if "GiB" in self.memory_text else f"{self.memory / GIB:.1f} GiB"
        return (f"{self.name}: {self.devices} device{'s' if self.devices > 1 else ''}, each {self.memory_text} "
                f"(= {other}), {self.peak_flops / 1e12:g} TFLOP/s bf16, {self.bandwidth / GB:g} GB/s "
                + ("RAM" if self.kind == "cpu" else "HBM"))


_V4 = dict(memory=32 * GIB, memory_text="32 GiB HBM2", peak_flops=275e12, bandwidth=1200e9,
           source="Google Cloud TPU docs, 'TPU v4' key specifications (per chip)")
_V5E = dict(memory=16 * GB, memory_text="16 GB HBM2", peak_flops=197e12, bandwidth=819e9,
            source="Google Cloud TPU docs, 'TPU v5e' key chip specifications")
_V5P = dict(memory=95 * GB, memory_text="95 GB HBM2e", peak_flops=459e12, bandwidth=2765e9,
            source="Google Cloud TPU docs, 'TPU v5p' key specifications (per chip)")
_H100 = dict(memory=80 * GB, memory_text="80 GB HBM3", peak_flops=989.5e12, bandwidth=3.35e12,
             source="NVIDIA H100 Tensor Core GPU datasheet, SXM5 (bf16 1979 TFLOPS with sparsity: 989.5 dense)")
_H200 = dict(memory=141 * GB, memory_text="141 GB HBM3e", peak_flops=989.5e12, bandwidth=4.8e12,
             source="NVIDIA H200 Tensor Core GPU datasheet, SXM (bf16 1979 TFLOPS with sparsity: 989.5 dense)")
_A100 = dict(memory=80 * GB, memory_text="80 GB HBM2e", peak_flops=312e12, bandwidth=2039e9,
             source="NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM (bf16 312 TFLOPS dense)")

HARDWARE: Registry[Hardware] = Registry("hardware", {
    # Cloud TPU v4 ("TPU v4" key specifications): 275 TFLOPs bf16, 32 GiB HBM2, 1200 GBps per chip; v4-8 = 4 chips
    "tpu-v4-8": Hardware("tpu-v4-8", "tpu", 4, **_V4),
    # Cloud TPU v5e ("TPU v5e" key chip specifications): 197 TFLOPs bf16, 16 GB, 819 GB/s; v5litepod-8 = 8 chips
    "tpu-v5e-8": Hardware("tpu-v5e-8", "tpu", 8, **_V5E),
    # Cloud TPU v5p ("TPU v5p" key specifications): 459 TFLOPs bf16, 95 GB HBM2e, 2765 GBps; v5p-8 = 4 chips
    "tpu-v5p-8": Hardware("tpu-v5p-8", "tpu", 4, **_V5P),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 80 GB, 3.35 TB/s, bf16 1979 TFLOPS with sparsity (989.5 dense)
    "h100": Hardware("h100", "gpu", 1, **_H100),
    "h100x8": Hardware("h100x8", "gpu", 8, **_H100),  # 8 x the same (an HGX/DGX H100 node)
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB, 4.8 TB/s, bf16 1979 TFLOPS with sparsity (989.5 dense)
    "h200": Hardware("h200", "gpu", 1, **_H200),
    "h200x8": Hardware("h200x8", "gpu", 8, **_H200),  # 8 x the same (an HGX H200 node)
    # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: 80 GB HBM2e, 2039 GB/s, bf16 312 TFLOPS (dense)
    "a100-80gb": Hardware("a100-80gb", "gpu", 1, **_A100),
    "a100-80gbx8": Hardware("a100-80gbx8", "gpu", 8, **_A100),  # 8 x the same (an HGX/DGX A100 80GB node)
    # Measured, not a spec sheet: this project's 2-core AMD EPYC VM under JAX 0.10's CPU backend (one device):
    # a jitted bf16 2048 x 2048 jnp.dot ran at 150-157 GFLOP/s, a jitted `x + 1` over 1 GiB of float32 moved
    # 3.8-4.3 GB/s (read + write). The memory is an assumption: set mesh.device_memory_gb to your RAM.
    "cpu": Hardware("cpu", "cpu", 1, memory=16 * GIB, memory_text="16 GiB RAM, assumed", peak_flops=150e9,
                    bandwidth=4e9, source="measured on a 2-core AMD EPYC VM (JAX CPU: bf16 matmul 150 GFLOP/s, "
                                          "copy 4 GB/s); 16 GiB of RAM assumed"),
})


# ---------------------------------------------------------------- assumptions
@dataclasses.dataclass(frozen=True)
class Assumptions:
    """What the time model assumes; each is printed with the plan and may be overridden."""

    mfu: float = 0.3  # achieved / peak FLOP/s of the learner and the prefill (see EXPLAINED)
    bandwidth_share: float = 0.15  # achieved / spec HBM bandwidth of a decode step
    kv_fill: float = 0.5  # the share of the context buffer a rollout step attends to, on average

    def __post_init__(self):
        for name in ("mfu", "bandwidth_share", "kv_fill"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}.")


EXPLAINED = {  # where each default of `Assumptions` comes from, printed with every plan
    "mfu": "learner and prefill FLOP/s over the peak; assumed, never measured at these sizes "
           "(bench/device.py's target is 40%)",
    "bandwidth_share": "decode bytes/s over the spec HBM bandwidth; measured on one H200 "
                       "(docs/benchmarks.md: 20-28% of a 2.7-2.8 TB/s copy = 11-16% of 4.8 TB/s)",
    "kv_fill": "share of the context buffer a rollout step attends to, on average (the context grows "
               "from the prompt to the buffer)",
}


__all__ = ["EXPLAINED", "GB", "GIB", "HARDWARE", "Assumptions", "Hardware"]
