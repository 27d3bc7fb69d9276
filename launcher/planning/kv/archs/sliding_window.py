"""Sliding-window layers between full-attention ones (Gemma 3's 5 local : 1 global,
gpt-oss's alternation), as config.json's layer_types lists them: a sliding_attention layer
keeps only the blocks that cover its last `sliding_window` tokens (vLLM's
SlidingWindowSpec, v1/kv_cache_interface.py), with the same page as a full-attention
layer; the planner groups the two kinds apart. With --disable-hybrid-kv-cache-manager
vLLM keeps every layer whole, as full attention (v1/core/kv_cache_utils.py
unify_hybrid_kv_cache_specs)."""

from __future__ import annotations

from launcher.planning.kv import specs
from launcher.planning.kv.archs.common import attention_gaps, layer_types
from launcher.planning.kv.cache import Caches, default_block, dtype_note, kv_cache_dtype

NAMES = ("Gemma3ForCausalLM", "GptOssForCausalLM")
CONFIG_FIELDS = ("sliding_window",)


def claims(t: dict) -> bool:
    return "sliding_attention" in layer_types(t)


def describes(model) -> bool:
    return model.sliding_window_layers > 0


def read(t: dict) -> dict:
    return {"sliding_window_layers": layer_types(t).count("sliding_attention"),
            "sliding_window": int(t.get("sliding_window") or 0)}


def unmodelled(t: dict) -> str:
    if not t.get("sliding_window"):
        return "its sliding_attention layers have no sliding_window in config.json"
    return attention_gaps(t, ("full_attention", "sliding_attention"))


def count_weights(t: dict, expert_format: str, source: str):
    return None


def caches(model, engine, tp: int, device) -> Caches:
    kv_dtype, why = kv_cache_dtype(engine.kv_cache_dtype, model)
    full = specs.attention(default_block(engine, device), max(1, model.num_kv_heads // tp),
                           model.head_dim, kv_dtype, model.dtype)
    window = specs.SlidingWindowSpec(full.block_size, model.sliding_window,
                                     full.page_size_bytes)
    kept = engine.hybrid_kv_cache_manager
    note = (f"sliding window of {model.sliding_window} tokens on {model.sliding_window_layers} "
            f"of {model.sliding_window_layers + model.full_attention_layers} layers"
            + ("" if kept else ", kept whole (--disable-hybrid-kv-cache-manager)"))
    return Caches((full,) * model.full_attention_layers
                  + (window if kept else full,) * model.sliding_window_layers,
                  kv_dtype, (dtype_note(kv_dtype, why, model), note))
