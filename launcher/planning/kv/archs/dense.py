"""Grouped-query or multi-head full attention (Llama, Qwen2/3, MiniMax-M2): K and V of
max(1, KV heads / TP) heads per token and layer, one group of every layer (vLLM's
FullAttentionSpec). The fallback: the architecture of any config no other module claims."""

from __future__ import annotations

from launcher.planning.kv import specs
from launcher.planning.kv.archs.common import attention_gaps
from launcher.planning.kv.cache import (
    Caches,
    default_block,
    dtype_note,
    kv_cache_dtype,
    require_attention,
)

NAMES = ("LlamaForCausalLM", "MiniMaxM2ForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
         "Qwen3MoeForCausalLM")
CONFIG_FIELDS = ()


def claims(t: dict) -> bool:
    return True


def describes(model) -> bool:
    return True


def read(t: dict) -> dict:
    return {}


def unmodelled(t: dict) -> str:
    return attention_gaps(t, ("full_attention",))


def count_weights(t: dict, expert_format: str, source: str):
    return None


def caches(model, engine, tp: int, device) -> Caches:
    """KV heads split over TP and are replicated when TP exceeds them (config/model.py:1683)."""
    require_attention(model)
    kv_dtype, why = kv_cache_dtype(engine.kv_cache_dtype, model)
    spec = specs.attention(default_block(engine, device), max(1, model.num_kv_heads // tp),
                           model.head_dim, kv_dtype, model.dtype)
    return Caches((spec,) * model.full_attention_layers, kv_dtype,
                  (dtype_note(kv_dtype, why, model),))
