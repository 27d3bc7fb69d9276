"""The simulated engine's KV block pool with prefix caching, shaped like vLLM v1's.

The model (docs/sim-prefix-cache.md has the vLLM sources): a full block of prompt tokens is
named by a hash chained on its parent block's hash, so two requests share a block only when
every token up to its end is the same. Free blocks sit in one queue, least recently freed
first; a freed block keeps its hash (it can still be hit) until the queue hands it out for
new tokens, which evicts it. A hit on a free block takes it out of the queue. A request's
hit is the longest run of its leading block hashes found, short of its last token (vLLM
always recomputes it for the logits).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence

# The first block's parent (vLLM's NONE_HASH). Hashes never leave the engine's process, so
# Python's own 64-bit hash serves: only equality matters, and it is ~20x cheaper than
# vLLM's sha256 on a 142k-token prompt.
ROOT_HASH = hash("launcher.sim prefix cache")


def block_hashes(token_ids: Sequence[int] | array, block_size: int,
                 salt: str | None = None) -> list[int]:
    """The chained hash of every full block of ``token_ids``: each block's hash covers its
    parent's hash and its own ids, so equal hashes mean equal prompts up to the block's end.

    ``salt`` (the request's cache_salt) goes into the first block's hash only, as vLLM
    adds it to the first block's extra keys, so salted and unsalted prompts never share.
    Ids given as an array are hashed in its own item width (the toy tokenizer's), a list as
    64-bit integers.
    """
    ids = token_ids if isinstance(token_ids, array) else array("q", token_ids)
    data = ids.tobytes()
    width = block_size * ids.itemsize
    out: list[int] = []
    parent = ROOT_HASH if not salt else hash((ROOT_HASH, "cache_salt", salt))
    for start in range(0, len(data) - width + 1, width):
        parent = hash((parent, data[start:start + width]))
        out.append(parent)
    return out


class BlockPool:
    """``num_blocks`` KV blocks: reference counts, the free queue (LRU order) and the map of
    cached block hashes. With caching off no block is ever given a hash."""

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self.refs = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        # block id -> None, in eviction order (front: next to be handed out)
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out: free ones, cached or not (vLLM's usage counts a
        cached block with no owner as free)."""
        return len(self.free)

    def longest_hit(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Block ids of the longest leading run of ``hashes`` held in the cache."""
        hit: list[int] = []
        if not self.caching:
            return hit
        cached = self.cached
        for h in hashes[:max_blocks]:
            block = cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (a hit on them uses free room)."""
        return sum(1 for b in blocks if self.refs[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """A request takes cached blocks: out of the free queue, one more reference."""
        for b in blocks:
            if self.refs[b] == 0:
                del self.free[b]
            self.refs[b] += 1

    def take(self, n: int) -> list[int]:
        """``n`` blocks from the front of the free queue, evicting their hashes."""
        out = []
        free = self.free
        for _ in range(n):
            b, _ = free.popitem(last=False)
            h = self.hash_of[b]
            if h is not None:
                self.hash_of[b] = None
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.evictions += 1
            self.refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """A request lets its blocks go. The tail goes back first, so that under pressure
        a prompt's last blocks are evicted before its first ones (vLLM frees in reverse)."""
        for b in reversed(blocks):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free[b] = None

    def cache(self, block: int, h: int) -> None:
        """Name a full block by its hash (a hash cached already keeps its first block)."""
        if not self.caching or self.hash_of[block] is not None or h in self.cached:
            return
        self.hash_of[block] = h
        self.cached[h] = block
