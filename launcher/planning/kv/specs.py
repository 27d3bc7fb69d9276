"""One spec per kind of layer cache, as vLLM 0.33's v1/kv_cache_interface.py has them: what
one page (one block of one layer) weighs, what a running request holds of it and what
vLLM's start-up line counts for it.

A spec `grows` when a request holds a block per `block_size` tokens (full attention, MLA,
DeepSeek-V4's compressed caches); the others hold a fixed number of blocks whatever the
request's length (sliding window, compressor state, GDN/Mamba state).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Bytes per element of the dtypes a cache or a weight can have.
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2}
DTYPE_BYTES |= {"bfloat16": 2, "bf16": 2}
ONE_BYTE_KV = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "int8"}
NVFP4_KV = {"nvfp4", "nvfp4_4over6"}


class NoEstimate(ValueError):
    """The estimate does not model this model: said in one sentence, never a guess."""


def dtype_bytes(name: str, what: str) -> int:
    try:
        return DTYPE_BYTES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"{what}: dtype {name!r} is not one this estimate knows") from None


def head_bytes(head_dim: int, kv_dtype: str, model_dtype: str) -> int:
    """One head's vector for one token in the cache dtype ("auto": the model dtype). NVFP4
    packs head/2 bytes of data and head/16 of FP8 scales (utils/torch_utils.py
    nvfp4_kv_cache_full_dim)."""
    if kv_dtype == "auto":
        return head_dim * dtype_bytes(model_dtype, "model")
    if kv_dtype in ONE_BYTE_KV:
        return head_dim
    if kv_dtype in NVFP4_KV:
        return head_dim // 2 + head_dim // 16
    return head_dim * dtype_bytes(kv_dtype, "--kv-cache-dtype")


@dataclass(frozen=True)
class FullAttentionSpec:
    """K and V of every token: heads on this GPU x (K + V) per head
    (kv_cache_interface.py:586-602)."""

    block_size: int
    bytes_per_token: int  # one layer, one GPU
    kind: str = "full"
    padded_page: int = 0  # a page the layer pads or lays out itself (DeepSeek-V4)
    grows = True

    @property
    def page_size_bytes(self) -> int:
        return self.padded_page or self.block_size * self.bytes_per_token

    def with_block(self, block_size: int) -> FullAttentionSpec:
        return dataclasses.replace(self, block_size=block_size)

    def blocks_held(self, tokens: float, ahead: int) -> int:
        """Blocks a request of `tokens` holds, with `ahead` lookahead slots."""
        return math.ceil((tokens + ahead) / self.block_size)

    def blocks_at_start_up(self, max_model_len: int, in_flight_tokens: int) -> int:
        """What vLLM's start-up line counts for a request at max_model_len."""
        return math.ceil(max_model_len / self.block_size)


def attention(block_size: int, kv_heads: int, head_dim: int, kv_dtype: str,
              model_dtype: str) -> FullAttentionSpec:
    """Grouped-query or multi-head attention: K and V of `kv_heads` heads per token."""
    return FullAttentionSpec(block_size, 2 * kv_heads * head_bytes(head_dim, kv_dtype,
                                                                  model_dtype))


def mla(block_size: int, latent_dim: int, kv_dtype: str, model_dtype: str) -> FullAttentionSpec:
    """MLAAttentionSpec: one latent per token, no V (head_size_v = 0), the same on every TP
    rank (kv_cache_interface.py:742-743)."""
    if kv_dtype in NVFP4_KV:
        raise NoEstimate(f"an MLA cache in {kv_dtype} is not modelled (vLLM's sparse MLA "
                         "formats only)")
    return FullAttentionSpec(block_size, head_bytes(latent_dim, kv_dtype, model_dtype), "mla")


@dataclass(frozen=True)
class SlidingWindowSpec:
    """SlidingWindowSpec (and DeepSeek-V4's window caches): the blocks that cover the window.
    A decoding request holds ceil((window - 1 + 2k) / block) + 1 blocks (k speculative
    tokens; measured on vLLM's own manager with DeepSeek-V4's caches); vLLM's
    start-up line counts the admission bound, the window behind every in-flight token
    (kv_cache_interface.py:918-944)."""

    block_size: int
    window: int
    page: int  # bytes of one block, padded as the layer pads it
    kind: str = "swa"
    grows = False

    @property
    def page_size_bytes(self) -> int:
        return self.page

    def with_block(self, block_size: int) -> SlidingWindowSpec:
        per_token = self.page // self.block_size
        return dataclasses.replace(self, block_size=block_size, page=block_size * per_token)

    def blocks_held(self, ahead: int, tokens: int) -> int:
        """At most the window's blocks; a request shorter than the window holds its own."""
        return min(math.ceil((self.window - 1 + 2 * ahead) / self.block_size) + 1,
                   math.ceil((tokens + ahead) / self.block_size))

    def blocks_at_start_up(self, max_model_len: int, in_flight_tokens: int) -> int:
        tokens = min(self.window - 1 + in_flight_tokens, max_model_len)
        return math.ceil(tokens / self.block_size) + 1


@dataclass(frozen=True)
class MambaSpec:
    """MambaSpec (GDN's conv + SSM state): one state per request, its page padded to the
    attention page (kv_cache_interface.py:1062-1070). A running request holds 1 + k state
    blocks; the start-up line reserves one more in align mode, and one more again where
    FlashInfer's GDN prefill exports checkpoints (single_type_kv_cache_manager.py:1629-1657,
    1775-1795). `alignment` and `kernel_block` are the grid the attention block grows on
    until one page holds the state (platforms/interface.py:1098-1104)."""

    state_bytes: int
    conv_dtype: str
    ssm_dtype: str
    cache_mode: str  # "align" with prefix caching, else "none"
    alignment: int
    kernel_block: int
    speculative_tokens: int = 0
    checkpoints: bool = False  # FlashInfer GDN prefill: one more block reserved in align mode
    page: int = 0  # padded to the attention page by the planner
    block_size: int = 0
    kind: str = "mamba"
    grows = False

    @property
    def page_size_bytes(self) -> int:
        return self.page or self.state_bytes

    def blocks_held(self, ahead: int, tokens: int) -> int:
        return 1 + self.speculative_tokens

    def blocks_at_boundary(self) -> int:
        """Align mode keeps the state of the block boundary just crossed for one step."""
        return 1 if self.cache_mode == "align" else 0

    def blocks_at_start_up(self, max_model_len: int, in_flight_tokens: int) -> int:
        extra = 1 + int(self.checkpoints) if self.cache_mode == "align" else 0
        return 1 + self.speculative_tokens + extra
