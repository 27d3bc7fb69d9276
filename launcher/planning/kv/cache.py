"""What an architecture's layers report for one engine (launcher/planning/kv/archs): a
spec per layer cache, the cache dtype, and the notes the numbers rest on."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.planning.kv.engine import Device, EngineArgs
from launcher.planning.kv.specs import NoEstimate


@dataclass(frozen=True)
class Caches:
    specs: tuple  # one per layer cache, in layer order (launcher/planning/kv/specs.py)
    kv_cache_dtype: str
    notes: tuple[str, ...]
    accounting: str = "docs/kv-capacity.md"  # where the accounting is explained


def kv_cache_dtype(flag: str, model) -> tuple[str, str]:
    """(cache dtype, why). "auto" follows the checkpoint's ModelOpt KV algo, else the model
    dtype (engine/arg_utils.py:2296-2299)."""
    if flag != "auto":
        return flag, f"--kv-cache-dtype {flag}"
    if model.kv_cache_quant_algo and model.kv_cache_quant_algo != "auto":
        where = model.sources.get("kv_cache_quant_algo", "the checkpoint's quant config")
        return model.kv_cache_quant_algo, f"from {where}"
    return "auto", f"auto = model dtype {model.dtype} (checkpoint asks for no KV quantization)"


def dtype_note(kv_dtype: str, why: str, model) -> str:
    return f"KV cache {kv_dtype if kv_dtype != 'auto' else model.dtype} ({why})"


def default_block(engine: EngineArgs, device: Device) -> int:
    """--block-size, else the attention backend's preference: 16 on CUDA (FlashInfer), 128
    on CPU (platforms/interface.py:750-790)."""
    return engine.block_size or (128 if device.platform == "cpu" else 16)


def require_attention(model) -> None:
    """An architecture whose cache follows its full-attention layers needs some."""
    if not model.full_attention_layers:
        raise NoEstimate("its config.json (or model.facts) gives no full-attention layers, "
                         "which this architecture's cache follows")
