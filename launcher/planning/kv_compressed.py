"""DeepSeek-V4's KV cache in vLLM 0.33: the caches each layer reports, how vLLM's planner
packs them into groups, and what a request holds of each group (docs/kv-architectures.md
section 4, every rule cited there by file and line).

Pure arithmetic. A layer of compress ratio r reports: a sliding-window KV cache (64-token
blocks, every layer, MTP layers included); for r = 4 (CSA) or 128 (HCA) the compressed KV
(one 584-byte state per r tokens, in --block-size blocks) and a compressor state (fp32,
its own window); for r = 4 also the indexer's compressed keys and its compressor state.
Pages are padded to 576 bytes (FlashMLA's fp8_ds_mla layout). Mixed page sizes in a
block-outermost layout take vLLM's packed grouping: every group draws block ids from one
pool, and one block id holds a page of each cache of the widest group.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

# vLLM 0.33 literals (docs/kv-architectures.md section 4)
SWA_BLOCK = 64  # DeepseekV4SWACache (v1/attention/backends/mla/sparse_swa.py:85-87)
DS_MLA_STATE = 584  # fp8_ds_mla: 448 NoPE fp8 + 64 RoPE bf16 + 8 scale bytes (attention.py:880)
DS_MLA_ALIGN = 576  # pages padded to FlashMLA's stride (kv_cache_interface.py:719-725)
COMPRESSED_BLOCK = 256  # the only block the V4 sparse-MLA and indexer backends take
STATE_BLOCK = {4: 4, 128: 8}  # compressor state blocks by ratio (compressor.py:165-172)
RATIOS = (1, 4, 128)  # 1: sliding window only (MTP layers, ratio-0 layers)
INDEXER_QUANT_BLOCK = 128  # fp8 indexer keys: one fp32 scale per 128 values
MXFP4_BLOCK = 32  # MXFP4 indexer keys: one UE8M0 byte per 32 values


@dataclass(frozen=True)
class Cache:
    """One cache of one layer: `window` 0 grows with the request (full attention)."""

    kind: str  # swa | compressed | indexer | state
    block: int  # tokens per block
    page: int  # bytes of one block, padded
    window: int = 0


@dataclass(frozen=True)
class Group:
    """A KV-cache group: its caches share block ids; one block id holds a page of each."""

    kind: str
    block: int
    window: int
    pages: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return sum(self.pages)

    def held(self, tokens: float, ahead: int) -> float:
        """Blocks a decoding request holds: a full group covers its tokens and the
        lookahead; a window group the window behind the step's first token and the step's
        1 + k scheduled plus k lookahead slots, +1 for a window not on a block boundary
        (kv_cache_interface.py:918-944, measured on vLLM's own manager)."""
        if not self.window:
            return math.ceil((tokens + ahead) / self.block)
        return math.ceil((self.window - 1 + 2 * ahead) / self.block) + 1

    def at_start_up(self, max_model_len: int, in_flight_tokens: int) -> int:
        """What vLLM's start-up line counts per request: a full group its blocks at
        max_model_len, a window group its admission bound, where every in-flight batch's
        tokens stay until settled (kv_cache_interface.py:918-944, config/vllm.py:601-609)."""
        if not self.window:
            return math.ceil(max_model_len / self.block)
        tokens = min(self.window - 1 + in_flight_tokens, max_model_len)
        return math.ceil(tokens / self.block) + 1


def pad(n: int, to: int) -> int:
    return -(-n // to) * to


def layer_caches(ratio: int, window: int, head_dim: int, index_head_dim: int, block: int,
                 indexer_fp4: bool) -> list[Cache]:
    """The caches one layer reports (attention.py:860-927, compressor.py:139-192,
    sparse_swa.py:76-147)."""
    out = [Cache("swa", SWA_BLOCK, pad(SWA_BLOCK * DS_MLA_STATE, DS_MLA_ALIGN), window)]
    if ratio == 1:
        return out
    coff = 2 if ratio == 4 else 1  # CSA compresses overlapping windows
    out.append(Cache("compressed", block, pad(block // ratio * DS_MLA_STATE, DS_MLA_ALIGN)))
    state_block = STATE_BLOCK[ratio]

    def state(dim: int) -> Cache:  # kv + score state, fp32, window coff x ratio
        return Cache("state", state_block, pad(state_block * 2 * coff * dim * 4, DS_MLA_ALIGN),
                     coff * ratio)

    out.append(state(head_dim))
    if ratio == 4:
        key = (index_head_dim // 2 + index_head_dim // MXFP4_BLOCK if indexer_fp4
               else index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4)
        out.append(Cache("indexer", block, pad(block // ratio * key, DS_MLA_ALIGN)))
        out.append(state(index_head_dim))
    return out


def approximate_gcd(values: list[int], lower: int) -> int:
    """The repeats per group that pad the balanced buckets least, ties to the larger
    (kv_cache_planning.py:879-911)."""
    lo, hi = max(1, lower), max(values)
    if lo > hi:
        return lo
    best, best_pad = lo, None
    for d in range(lo, hi + 1):
        waste = sum((d - x % d) % d for x in values)
        if best_pad is None or waste < best_pad or (waste == best_pad and d > best):
            best, best_pad = d, waste
    return best


def packed_groups(caches: list[Cache]) -> list[Group]:
    """vLLM's packed grouping of mixed page sizes (kv_cache_planning.py:914-1041): caches
    are bucketed by type, block and window; a bucket with the same count of each page size
    is a repeating pattern, split into groups of equally many repeats (the count that pads
    least, at least the largest mixed bucket's); other buckets stay whole. Window buckets
    are state buckets only when there is no pattern; then they split to fit the widest
    group."""
    buckets: dict[tuple, list[Cache]] = {}
    for c in caches:
        key = ("full" if not c.window else "window", c.block, c.window)
        buckets.setdefault(key, []).append(c)
    shaped = []
    for key, members in buckets.items():
        by_page: dict[int, list[Cache]] = defaultdict(list)
        for c in members:
            by_page[c.page].append(c)
        counts = {len(v) for v in by_page.values()}
        shaped.append((key, members, by_page, len(counts) == 1))

    def most(members: list[Cache]) -> int:
        return Counter(c.page for c in members).most_common(1)[0][1]

    floor = max((most(m) for _, m, by_page, balanced in shaped
                 if balanced and len(by_page) > 1), default=0)
    repeats = (approximate_gcd([most(m) for _, m, _, balanced in shaped if balanced], floor)
               if floor else None)

    def count(members: list[Cache], balanced: bool) -> int:
        return math.ceil(most(members) / repeats) if balanced and repeats else 1

    def widest(by_page: dict[int, list[Cache]], n: int) -> int:
        return sum(math.ceil(len(v) / n) * page for page, v in by_page.items())

    def is_state(key: tuple) -> bool:
        return repeats is None and key[0] == "window"

    anchor = max(widest(by_page, len(m) if is_state(key) else count(m, balanced))
                 for key, m, by_page, balanced in shaped)
    groups = []
    for key, members, by_page, balanced in shaped:
        n = count(members, balanced)
        if is_state(key):
            n = max(n, math.ceil(len(members) / max(anchor // members[0].page, 1)))
        kind = members[0].kind if len({c.kind for c in members}) == 1 else "compressed"
        if n == 1:
            groups.append(Group(kind, key[1], key[2], tuple(c.page for c in members)))
            continue
        # one cache of each page size per repeat; a bucket that is not a pattern stays whole
        # unless it is a state bucket, whose repeats vLLM also takes to the shortest list
        pattern = list(zip(*by_page.values(), strict=False))
        for i in range(n):
            pages = tuple(c.page for rep in pattern[i::n] for c in rep)
            groups.append(Group(kind, key[1], key[2], pages))
    return groups


@dataclass(frozen=True)
class Layout:
    """One DP rank's DeepSeek-V4 cache: its groups, the bytes of a block id, and what a
    request holds."""

    groups: tuple[Group, ...]
    block: int  # the compressed groups' block (--block-size)

    @property
    def bytes_per_block(self) -> int:
        return max(g.bytes for g in self.groups)

    @property
    def window_groups(self) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if g.window)

    @property
    def full_groups(self) -> int:
        return sum(1 for g in self.groups if not g.window)

    def window_blocks(self, ahead: int) -> int:
        """Blocks a decoding request holds in the window groups, whatever its length."""
        return sum(int(g.held(0, ahead)) for g in self.window_groups)

    def at_start_up(self, max_model_len: int, in_flight_tokens: int) -> int:
        return sum(g.at_start_up(max_model_len, in_flight_tokens) for g in self.groups)

    def describe(self) -> str:
        names = {"swa": "sliding-window KV", "compressed": "compressed KV + indexer keys",
                 "state": "compressor state", "indexer": "indexer keys"}
        parts = []
        for g in self.groups:
            win = f", window {g.window}" if g.window else ""
            parts.append(f"{names.get(g.kind, g.kind)} ({len(g.pages)} caches, "
                         f"{g.block}-token blocks{win}: {g.bytes:,} B)")
        return "; ".join(parts)


def layout(ratios: list[int], mtp_layers: int, window: int, head_dim: int,
           index_head_dim: int, block: int, indexer_fp4: bool) -> Layout:
    """The caches of every layer (and of the MTP layers that join with speculative
    decoding: ratio 1, a sliding-window cache each), grouped as vLLM groups them."""
    caches = []
    for r in [*ratios, *[1] * mtp_layers]:
        caches += layer_caches(r, window, head_dim, index_head_dim, block, indexer_fp4)
    return Layout(tuple(packed_groups(caches)), block)
