"""One GPU's memory as vLLM divides it: ceil(total x utilization) - weights - (activation
peak + other persistent memory + CUDA graphs), the last three assumptions
(docs/kv-capacity.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.planning.kv.engine import Device, EngineArgs, Parallelism, default_batch_limits
from launcher.planning.kv.weights import weight_bytes_per_gpu

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Overheads:
    """Memory vLLM measures at start-up and that no formula gives: all assumptions."""

    activation_peak_gib: float  # torch peak above steady allocations during profile_run
    non_torch_gib: float  # NCCL/all2all buffers, workspaces, allocator slack
    cudagraph_gib: float  # CUDA-graph pool estimate (subtracted by default since 0.21)
    why: str = "default"

    @property
    def total_bytes(self) -> int:
        return round((self.activation_peak_gib + self.non_torch_gib + self.cudagraph_gib) * GIB)


# Per GPU class: (activation peak GiB at the default max-num-batched-tokens, that default,
# non-torch GiB, CUDA graphs GiB). Assumptions, documented in docs/kv-capacity.md.
OVERHEAD_DEFAULTS = {
    "blackwell": (6.0, 16384, 2.0, 2.0),  # GB200/B200/GB300: >= 160 GiB
    "hopper": (4.0, 8192, 1.5, 1.5),  # H100/H200: >= 70 GiB
    "small": (2.0, 2048, 1.0, 1.0),
    "cpu": (0.0, 4096, 0.0, 0.0),
}


def gpu_class(device: Device) -> str:
    kind = device.kind.lower()
    if kind == "cpu":
        return "cpu"
    if kind.startswith(("gb", "b2", "b3")) or device.memory_gib >= 160:
        return "blackwell"
    if kind.startswith("h") or device.memory_gib >= 70:
        return "hopper"
    return "small"


def default_overheads(device: Device, max_num_batched_tokens: int | None = None,
                      enforce_eager: bool = False) -> Overheads:
    """The activation peak scales with the tokens of the profiling run (assumed linear)."""
    cls = gpu_class(device)
    act, act_tokens, other, graphs = OVERHEAD_DEFAULTS[cls]
    tokens = max_num_batched_tokens or act_tokens
    act *= tokens / act_tokens
    graphs = 0.0 if enforce_eager else graphs
    return Overheads(round(act, 2), other, graphs, why=f"{cls} default at {tokens} batched tokens")


@dataclass(frozen=True)
class Memory:
    """One GPU's memory as vLLM divides it, with the assumptions it rests on."""

    requested_bytes: int  # ceil(total x utilization)
    weights_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int
    notes: tuple[str, ...]


def kv_memory(model, engine: EngineArgs, par: Parallelism, device: Device,
              overheads: Overheads | None, share: float = 1.0) -> Memory:
    """Memory per GPU: ceil(total x utilization) - weights - overheads (gpu_worker.py:753-757),
    or --kv-cache-memory-bytes as given. `share`: the part of the layers (and so of the
    weights) this GPU's pipeline stage holds."""
    requested = math.ceil(round(device.memory_gib * GIB) * engine.gpu_memory_utilization)
    notes = []
    weights = 0
    if model.weights:
        w = model.weights
        weights = math.ceil(weight_bytes_per_gpu(w, par, model.dtype, engine) * share)
        notes.append(
            f"weights {weights / GIB:.1f} GiB/GPU ({w.dense_params / 1e9:.2f}B {model.dtype} "
            f"/ TP{par.tp} + {w.expert_params / 1e9:.1f}B {w.expert_format} experts / EP{par.ep}"
            + (f", x {share:.3g} of the layers on this pipeline stage" if share != 1 else "")
            + ")"
        )
    if engine.kv_cache_memory_bytes is not None:
        kv_bytes, overhead = engine.kv_cache_memory_bytes, 0
        notes.append(f"--kv-cache-memory-bytes {kv_bytes} (vLLM skips profiling)")
    else:
        if not model.weights:
            notes.append("weights unknown: counted as 0")
        mbt = engine.max_num_batched_tokens or default_batch_limits(device)[0]
        ov = overheads or default_overheads(device, mbt, engine.enforce_eager)
        overhead = ov.total_bytes
        kv_bytes = max(0, requested - weights - overhead)
        notes.append(
            f"{device.memory_gib:g} GiB x utilization {engine.gpu_memory_utilization:g}; "
            f"activation peak {ov.activation_peak_gib:g} + other {ov.non_torch_gib:g} + "
            f"CUDA graphs {ov.cudagraph_gib:g} GiB assumed ({ov.why})"
        )
    return Memory(requested, weights, overhead, kv_bytes, tuple(notes))
