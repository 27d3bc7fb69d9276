"""vLLM 0.33's grouping planner (v1/core/kv_cache_planning.py): the layers' specs in,
KV-cache groups out. Every group draws block ids from one
pool; one block id holds a page of each cache of a group, so a block weighs the widest
group's pages.

- GDN/Mamba state next to attention: the attention block grows until one attention page
  holds one state, and the state's page is padded to it (platforms/interface.py:1098-1104);
- equal pages: layers bucketed by spec, groups of equally many layers (the smaller
  bucket's count, or the larger's when under 1.5x the smaller, :519-543);
- mixed pages (DeepSeek-V4's block-outermost layout): the packed grouping (:914-1041).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from launcher.planning.kv.specs import MambaSpec

GROUP_NAMES = {"swa": "sliding-window KV", "compressed": "compressed KV + indexer keys",
               "state": "compressor state", "indexer": "indexer keys", "full": "full-attention KV"}
WINDOW_WORDS = {"swa": "sliding-window", "state": "compressor-state"}


@dataclass(frozen=True)
class Group:
    """A KV-cache group: its caches share block ids; `spec` says what a request holds."""

    spec: object  # a spec of launcher.planning.kv.specs
    pages: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return sum(self.pages)

    @property
    def window(self) -> int:
        return getattr(self.spec, "window", 0)


@dataclass(frozen=True)
class Layout:
    """One engine's KV-cache groups."""

    groups: tuple[Group, ...]

    @property
    def bytes_per_block(self) -> int:
        return max(g.bytes for g in self.groups)

    @property
    def layers_per_group(self) -> int:
        return max(len(g.pages) for g in self.groups)

    @property
    def growing(self) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if g.spec.grows)

    @property
    def window_groups(self) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if g.window)

    @property
    def state_groups(self) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if isinstance(g.spec, MambaSpec))

    @property
    def block_size(self) -> int:
        return (self.growing or self.groups)[0].spec.block_size

    @property
    def page_size_bytes(self) -> int:
        """The one page every layer has, else (packed) a block id's bytes."""
        pages = {p for g in self.groups for p in g.pages}
        return pages.pop() if len(pages) == 1 else self.bytes_per_block

    def fixed_blocks(self, speculative_tokens: int, longest: int) -> int:
        """Blocks a running request (of at most `longest` tokens) holds in the groups that
        do not grow with it."""
        return sum(g.spec.blocks_held(speculative_tokens, longest) for g in self.groups
                   if not g.spec.grows)

    def at_start_up(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks vLLM's start-up line counts for one request at max_model_len."""
        return sum(g.spec.blocks_at_start_up(max_model_len, in_flight_tokens)
                   for g in self.groups)

    def describe(self) -> str:
        parts = []
        for g in self.groups:
            win = f", window {g.window}" if g.window else ""
            parts.append(f"{GROUP_NAMES.get(g.spec.kind, g.spec.kind)} ({len(g.pages)} caches, "
                         f"{g.spec.block_size}-token blocks{win}: {g.bytes:,} B)")
        return "; ".join(parts)

    def window_words(self) -> str:
        kinds = dict.fromkeys(WINDOW_WORDS.get(g.spec.kind, g.spec.kind)
                              for g in self.window_groups)
        return " and ".join(kinds)


def plan(specs: list) -> Layout:
    """The groups vLLM makes of these per-layer specs."""
    specs = unify_pages(specs)
    if len({s.page_size_bytes for s in specs}) > 1:
        return Layout(tuple(packed_groups(specs)))
    return Layout(tuple(uniform_page_groups(specs)))


def hybrid_block_size(attn_bytes_per_token: int, state_bytes: int, alignment: int,
                      kernel_block: int = 16) -> int:
    """Smallest multiple of `alignment` whose attention page holds one state, rounded to
    the backends' common kernel block (platforms/interface.py:1098-1104)."""
    block = alignment * math.ceil(state_bytes / (alignment * attn_bytes_per_token))
    return kernel_block * math.ceil(block / kernel_block)


def unify_pages(specs: list) -> list:
    """Attention next to GDN/Mamba state: grow the attention block until its page holds one
    state, then pad the state's page to it."""
    states = [s for s in specs if isinstance(s, MambaSpec)]
    attn = [s for s in specs if not isinstance(s, MambaSpec)]
    if not states or not attn:
        return specs
    state, first = states[0], attn[0]
    block = max(first.block_size, hybrid_block_size(first.bytes_per_token, state.state_bytes,
                                                    state.alignment, state.kernel_block))
    page = block * first.bytes_per_token
    return [dataclasses.replace(s, page=page, block_size=block) if isinstance(s, MambaSpec)
            else s.with_block(block) for s in specs]


def group_size(counts: list[int]) -> int:
    """Layers per group: the smallest bucket's count, or the largest's when it is under 1.5x
    the smallest (kv_cache_planning.py:519-543)."""
    size = min(counts)
    return max(counts) if max(counts) < size * 1.5 else size


def uniform_page_groups(specs: list) -> list[Group]:
    """Equal pages: one bucket per distinct spec, each split into groups of `group_size`
    layers (the last padded to it)."""
    buckets = Counter(specs)
    size = group_size(list(buckets.values()))
    return [Group(spec, (spec.page_size_bytes,) * size)
            for spec, n in buckets.items() for _ in range(math.ceil(n / size))]


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


def _buckets(specs: list) -> list[tuple[tuple, list, dict, bool]]:
    """Caches bucketed by type (grows or window), block and window; each with its caches
    by page size and whether every page size has the same count (a repeating pattern)."""
    buckets: dict[tuple, list] = {}
    for s in specs:
        key = ("full" if s.grows else "window", s.block_size, getattr(s, "window", 0))
        buckets.setdefault(key, []).append(s)
    shaped = []
    for key, members in buckets.items():
        by_page: dict[int, list] = defaultdict(list)
        for s in members:
            by_page[s.page_size_bytes].append(s)
        shaped.append((key, members, by_page, len({len(v) for v in by_page.values()}) == 1))
    return shaped


def _most(members: list) -> int:
    return Counter(s.page_size_bytes for s in members).most_common(1)[0][1]


def packed_groups(specs: list) -> list[Group]:
    """vLLM's packed grouping of mixed page sizes (kv_cache_planning.py:914-1041): a bucket
    with the same count of each page size is a repeating pattern, split into groups of
    equally many repeats (the count that pads least, at least the largest mixed bucket's);
    other buckets stay whole. Window buckets are state buckets only when there is no
    pattern; then they split to fit the widest group."""
    shaped = _buckets(specs)
    floor = max((_most(m) for _, m, by_page, balanced in shaped
                 if balanced and len(by_page) > 1), default=0)
    repeats = (approximate_gcd([_most(m) for _, m, _, balanced in shaped if balanced], floor)
               if floor else None)

    def count(members: list, balanced: bool) -> int:
        return math.ceil(_most(members) / repeats) if balanced and repeats else 1

    def widest(by_page: dict[int, list], n: int) -> int:
        return sum(math.ceil(len(v) / n) * page for page, v in by_page.items())

    def is_state(key: tuple) -> bool:
        return repeats is None and key[0] == "window"

    anchor = max(widest(by_page, len(m) if is_state(key) else count(m, balanced))
                 for key, m, by_page, balanced in shaped)
    groups = []
    for key, members, by_page, balanced in shaped:
        n = count(members, balanced)
        if is_state(key):
            n = max(n, math.ceil(len(members) / max(anchor // members[0].page_size_bytes, 1)))
        kind = members[0].kind if len({s.kind for s in members}) == 1 else "compressed"
        spec = dataclasses.replace(members[0], kind=kind)
        # one cache of each page size per repeat; a bucket that is not a pattern stays whole
        # unless it is a state bucket, whose repeats vLLM also takes to the shortest list
        pattern = list(zip(*by_page.values(), strict=False)) if n > 1 else [members]
        for i in range(n):
            groups.append(Group(spec, tuple(s.page_size_bytes for rep in pattern[i::n]
                                            for s in rep)))
    return groups
