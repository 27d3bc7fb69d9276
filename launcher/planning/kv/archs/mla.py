"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2.5): one kv_lora_rank +
qk_rope_head_dim latent per token and layer, not split by TP (vLLM's MLAAttentionSpec,
model_executor/layers/attention/mla_attention.py:480, 1371-1399). vLLM uses MLA for
DeepSeek-V2/V3-style configs unless both qk head dims are 0
(model_executor/models/deepseek_v2.py:1277-1284); the MTP layers join the group with
--speculative-config method mtp (deepseek_mtp.py:106, 147-162)."""

from __future__ import annotations

from launcher.planning.kv import specs
from launcher.planning.kv.archs.common import attention_gaps
from launcher.planning.kv.cache import Caches, dtype_note, kv_cache_dtype, require_attention

NAMES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")
CONFIG_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "num_nextn_predict_layers")
# MLA backends' default block on CUDA when --block-size is not given (their smallest kernel
# block; v1/attention/backends/mla/*.py, docs/kv-architectures.md section 2); FLASHINFER_MLA
# leads the SM100 order (platforms/cuda.py:96-133).
MLA_BLOCK = {"FLASHINFER_MLA": 32, "FLASHMLA": 64, "CUTLASS_MLA": 128, "TOKENSPEED_MLA": 32,
             "TRITON_MLA": 16, "FLASH_ATTN_MLA": 16}


def claims(t: dict) -> bool:
    return bool(t.get("kv_lora_rank"))


def describes(model) -> bool:
    return model.mla_latent_dim > 0


def read(t: dict) -> dict:
    latent = int(t["kv_lora_rank"]) + int(t.get("qk_rope_head_dim") or 0)
    return {"mla_latent_dim": latent, "num_kv_heads": 1, "head_dim": latent,
            "mtp_layers": int(t.get("num_nextn_predict_layers") or 0)}


def unmodelled(t: dict) -> str:
    return attention_gaps(t, ("full_attention",))


def count_weights(t: dict, expert_format: str, source: str):
    return None


def block_size(engine, device) -> int:
    """vLLM for CPU forces 16 for MLA (platforms/cpu.py); on CUDA --block-size, else the
    backend's."""
    if device.platform == "cpu":
        return 16
    return engine.block_size or MLA_BLOCK.get(engine.attention_backend.upper() or
                                              "FLASHINFER_MLA", 16)


def caches(model, engine, tp: int, device) -> Caches:
    require_attention(model)
    kv_dtype, why = kv_cache_dtype(engine.kv_cache_dtype, model)
    block = block_size(engine, device)
    spec = specs.mla(block, model.mla_latent_dim, kv_dtype, model.dtype)
    layers = model.full_attention_layers + (model.mtp_layers if engine.mtp else 0)
    return Caches((spec,) * layers, kv_dtype, (
        dtype_note(kv_dtype, why, model),
        f"MLA: one {model.mla_latent_dim}-wide latent per token and layer, not split by "
        f"tensor parallelism; block {block}"))
