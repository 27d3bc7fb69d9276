"""The weights one GPU holds: what config.json alone cannot say (parameter counts by
storage format), and how TP and EP split them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.planning.kv.specs import DTYPE_BYTES, dtype_bytes

if TYPE_CHECKING:
    from launcher.planning.kv.engine import EngineArgs, Parallelism


@dataclass(frozen=True)
class WeightFacts:
    """Parameter counts by storage format."""

    dense_params: int  # stored in the model dtype; every EP rank holds a copy (split by TP)
    expert_params: int  # routed experts of all layers; split over the EP group
    expert_format: str = "nvfp4"  # nvfp4 | fp8 | bf16
    group_size: int = 16  # NVFP4 block size: one FP8 E4M3 scale per 16 weights
    mtp_params: int = 0  # loaded only with speculative decoding (MTP)
    vision_params: int = 0  # not loaded with --language-model-only
    source: str = "recipe"
    # as a recipe declares them: bits per stored weight (0: by expert_format / model dtype)
    expert_bits: float = 0.0
    dense_bits: float = 0.0
    # without a count of MTP weights, an MTP layer weighs one of the `layers` decoder layers
    layers: int = 0
    mtp_layers: int = 0

    @classmethod
    def from_billions(cls, dense_b: float, expert_b: float, **kw) -> WeightFacts:
        return cls(dense_params=round(dense_b * 1e9), expert_params=round(expert_b * 1e9), **kw)

    def expert_bytes_per_param(self) -> float:
        """NVFP4: 4 bits + one FP8 scale per group (the per-tensor FP32 scales are noise)."""
        if self.expert_bits:
            return self.expert_bits / 8
        if self.expert_format == "nvfp4":
            return 0.5 + 1 / self.group_size
        if self.expert_format == "fp8":
            return 1.0
        return float(DTYPE_BYTES[self.expert_format])


def weight_bytes_per_gpu(weights: WeightFacts, par: Parallelism, model_dtype: str,
                         engine: EngineArgs) -> int:
    """Dense weights split over TP (replicated across DP); routed experts over the EP
    group. The MTP layer is skipped without speculative decoding (its "mtp." weights map to
    None, model_executor/models/qwen3_5.py:478) and the vision tower with
    --language-model-only (interfaces.py:347-395, config/multimodal.py:700)."""
    dense = weights.dense_params
    if engine.num_speculative_tokens:
        dense += weights.mtp_params
    if not engine.language_model_only:
        dense += weights.vision_params
    per_dense = weights.dense_bits / 8 if weights.dense_bits else dtype_bytes(model_dtype, "model")
    dense_bytes = dense * per_dense / par.tp
    expert_bytes = weights.expert_params * weights.expert_bytes_per_param() / par.ep
    if engine.mtp and not weights.mtp_params and weights.mtp_layers and weights.layers:
        # counts declared without the MTP layers: each weighs one decoder layer
        share = weights.mtp_layers / weights.layers
        dense_bytes += weights.dense_params * per_dense / par.tp * share
        expert_bytes += weights.expert_params * weights.expert_bytes_per_param() / par.ep * share
    return math.ceil(dense_bytes + expert_bytes)
