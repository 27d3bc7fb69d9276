"""DeepSeek-V4's compressed sparse attention in vLLM 0.33 (docs/kv-architectures.md
section 4, every rule cited there by file and line). A layer of compress ratio r reports:
a sliding-window KV cache (64-token blocks, every layer, MTP layers included); for r = 4
(CSA) or 128 (HCA) the compressed KV (one 584-byte state per r tokens, in --block-size
blocks) and a compressor state (fp32, its own window); for r = 4 also the indexer's
compressed keys and its compressor state. Pages are padded to 576 bytes (FlashMLA's
fp8_ds_mla layout); the mixed page sizes take vLLM's packed grouping (grouping.py)."""

from __future__ import annotations

from launcher.planning.kv import grouping
from launcher.planning.kv.cache import Caches
from launcher.planning.kv.specs import FullAttentionSpec, NoEstimate, SlidingWindowSpec

NAMES = ("DeepseekV4ForCausalLM",)
CONFIG_FIELDS = ("compress_ratios", "compress_rates", "layer_types", "sliding_window",
                 "index_head_dim", "num_nextn_predict_layers")
SWA_BLOCK = 64  # DeepseekV4SWACache (v1/attention/backends/mla/sparse_swa.py:85-87)
DS_MLA_STATE = 584  # fp8_ds_mla: 448 NoPE fp8 + 64 RoPE bf16 + 8 scale bytes (attention.py:880)
DS_MLA_ALIGN = 576  # pages padded to FlashMLA's stride (kv_cache_interface.py:719-725)
COMPRESSED_BLOCK = 256  # the only block the V4 sparse-MLA and indexer backends take
STATE_BLOCK = {4: 4, 128: 8}  # compressor state blocks by ratio (compressor.py:165-172)
RATIOS = (1, 4, 128)  # 1: sliding window only (MTP layers, ratio-0 layers)
INDEXER_QUANT_BLOCK = 128  # fp8 indexer keys: one fp32 scale per 128 values
MXFP4_BLOCK = 32  # MXFP4 indexer keys: one UE8M0 byte per 32 values


def claims(t: dict) -> bool:
    return "compress_ratios" in t or "compress_rates" in t


def describes(model) -> bool:
    return bool(model.compress_ratios)


def listed_ratios(t: dict) -> list:
    """config.json's compress ratios as written, one per decoder layer: the legacy
    `compress_ratios` list or `layer_types` + `compress_rates`; the MTP layers that the list
    may carry after num_hidden_layers are left out (transformers_utils/deepseek_v4_utils.py:
    6-18, attention.py:236-242)."""
    if isinstance(t.get("compress_ratios"), list):
        ratios = t["compress_ratios"]
    elif isinstance(t.get("compress_rates"), dict) and isinstance(t.get("layer_types"), list):
        ratios = [t["compress_rates"].get(x, 0) if isinstance(x, str) else x
                  for x in t["layer_types"]]
    else:
        return []
    n = t.get("num_hidden_layers")
    return ratios[:n] if isinstance(n, int) and n > 0 else ratios


def _is_ratio(r) -> bool:
    return r is None or (isinstance(r, int) and not isinstance(r, bool) and max(1, r) in RATIOS)


def compress_ratios(t: dict) -> tuple[int, ...]:
    """Each decoder layer's compress ratio (1 for a sliding-window-only layer); () when a
    value is not one (unmodelled names it)."""
    ratios = listed_ratios(t)
    if not all(_is_ratio(r) for r in ratios):
        return ()
    return tuple(max(1, r or 0) for r in ratios)


def read(t: dict) -> dict:
    ratios = compress_ratios(t)
    return {"compress_ratios": ratios, "full_attention_layers": len(ratios),
            "mtp_layers": int(t.get("num_nextn_predict_layers") or 0),
            "sliding_window": int(t.get("sliding_window") or 0),
            "index_head_dim": int(t.get("index_head_dim") or 0)}


def unmodelled(t: dict) -> str:
    odd = [r for r in listed_ratios(t) if not _is_ratio(r)]
    if odd:
        shown = ", ".join(sorted({repr(r) for r in odd}))
        return (f"its compress ratios [{shown}] are not DeepSeek-V4's (0 or 1, 4, 128; "
                "vLLM's compressor takes no other)")
    missing = [k for k in ("num_hidden_layers", "sliding_window", "index_head_dim")
               if not t.get(k)]
    if missing or not compress_ratios(t):
        return ("its compressed sparse attention lacks " + ", ".join(missing or
                ["its per-layer compress ratios"]) + " in config.json")
    return ""


def count_weights(t: dict, expert_format: str, source: str):
    return None


def _pad(n: int, to: int = DS_MLA_ALIGN) -> int:
    return -(-n // to) * to


def layer_caches(ratio: int, window: int, head_dim: int, index_head_dim: int, block: int,
                 indexer_fp4: bool) -> list:
    """The caches one layer reports (attention.py:860-927, compressor.py:139-192,
    sparse_swa.py:76-147)."""
    out = [SlidingWindowSpec(SWA_BLOCK, window, _pad(SWA_BLOCK * DS_MLA_STATE))]
    if ratio == 1:
        return out
    coff = 2 if ratio == 4 else 1  # CSA compresses overlapping windows
    out.append(FullAttentionSpec(block, 0, "compressed", _pad(block // ratio * DS_MLA_STATE)))
    state_block = STATE_BLOCK[ratio]

    def state(dim: int) -> SlidingWindowSpec:  # kv + score state, fp32, window coff x ratio
        return SlidingWindowSpec(state_block, coff * ratio,
                                 _pad(state_block * 2 * coff * dim * 4), "state")

    out.append(state(head_dim))
    if ratio == 4:
        key = (index_head_dim // 2 + index_head_dim // MXFP4_BLOCK if indexer_fp4
               else index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4)
        out.append(FullAttentionSpec(block, 0, "indexer", _pad(block // ratio * key)))
        out.append(state(index_head_dim))
    return out


def _check(engine) -> int:
    """The block, after what vLLM 0.33 refuses: FlashMLA's fp8_ds_mla layout for auto and
    every fp8 dtype (attention.py:94-129), 256-token compressed blocks only."""
    dtype = engine.kv_cache_dtype
    if dtype != "auto" and dtype != "fp8_ds_mla" and not dtype.startswith("fp8"):
        raise NoEstimate(f"DeepSeek-V4's cache in {dtype} is not modelled: vLLM 0.33's FlashMLA "
                         "layout takes auto, fp8 or fp8_ds_mla")
    if not engine.hybrid_kv_cache_manager:
        raise NoEstimate("DeepSeek-V4 with --disable-hybrid-kv-cache-manager is not modelled: "
                         "vLLM then keeps each window cache whole, as full attention")
    block = engine.block_size or COMPRESSED_BLOCK
    if block != COMPRESSED_BLOCK:
        raise ValueError(f"--block-size {block}: DeepSeek-V4's sparse MLA and indexer backends "
                         f"take {COMPRESSED_BLOCK} only")
    return block


def caches(model, engine, tp: int, device) -> Caches:
    """Every layer's caches, and the MTP layers' (ratio 1, a sliding-window cache each) with
    --speculative-config method mtp; the indexer keys in MXFP4 or FP8."""
    block = _check(engine)
    mtp = model.mtp_layers if engine.mtp else 0
    out = []
    for r in [*model.compress_ratios, *[1] * mtp]:
        out += layer_caches(r, model.sliding_window, model.head_dim, model.index_head_dim,
                            block, engine.indexer_fp4)
    counts = {r: model.compress_ratios.count(r) for r in RATIOS}
    groups = len(grouping.plan(out).groups)
    notes = (
        f"KV cache fp8_ds_mla (--kv-cache-dtype {engine.kv_cache_dtype}: FlashMLA's layout, "
        f"584 B per state, pages padded to {DS_MLA_ALIGN} B)",
        f"DeepSeek-V4: {counts[128]} HCA, {counts[4]} CSA, {counts[1]} sliding-window-only "
        f"layers{f' + {mtp} MTP' if mtp else ''}, window {model.sliding_window}; indexer keys "
        f"{'MXFP4' if engine.indexer_fp4 else 'FP8'}; {groups} KV-cache groups",
    )
    return Caches(tuple(out), "fp8_ds_mla", notes, "docs/kv-architectures.md section 4")
