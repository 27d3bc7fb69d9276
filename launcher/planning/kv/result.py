"""The estimate's result for one endpoint: vLLM's numbers per DP rank and in all, the
dry-run's lines that show how they follow, and plan.json's record of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from launcher.planning.kv.facts import KNOWN_FACTS_SOURCE
from launcher.planning.kv.memory import GIB, MIB
from launcher.run.lengths import Lengths


def _size(n: int) -> str:
    """Bytes as a person reads them: 96 MiB, 1.5 GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB" if n >= MIB else \
        f"{n / 1024:.0f} KiB"


@dataclass(frozen=True)
class KvCapacity:
    """One endpoint's KV capacity per DP rank and in all, with what it rests on."""

    name: str
    tp: int
    dp: int
    kv_cache_dtype: str
    ssm_dtype: str
    conv_dtype: str
    attention_bytes_per_token: int  # one layer, one GPU
    mamba_state_bytes: int  # one GDN layer, one request, one GPU (before padding)
    block_size: int  # attention tokens per block
    page_size_bytes: int  # one layer's page; GDN pages padded to it
    mamba_padding_pct: float
    mamba_cache_mode: str
    layers_per_group: int
    attention_groups: int
    mamba_groups: int
    bytes_per_block: int
    weights_bytes: int  # per GPU
    requested_bytes: int  # ceil(total x utilization)
    overhead_bytes: int  # activation peak + non-torch + CUDA graphs
    kv_cache_bytes: int  # per GPU
    num_gpu_blocks: int  # per DP rank, what vLLM logs as num_gpu_blocks
    lengths: Lengths
    state_blocks_per_request: int  # GDN state blocks a running request holds (on or off)
    state_blocks_at_boundary: int  # align mode: one more per GDN group, one step per boundary
    blocks_per_request_at_max: int
    blocks_per_request_at_mean: float
    max_num_seqs: int
    per_rank_at_max_length: int
    per_rank_at_mean_length: int
    max_model_len: int
    vllm_log_max_concurrency: float  # "Maximum concurrency for max_model_len tokens"
    vllm_log_kv_cache_tokens: int  # "GPU KV cache size: N tokens"
    assumptions: tuple[str, ...]
    sources: dict[str, str]
    prefix_caching: bool = True
    prefix_caching_why: str = ""
    alignment: int = 16  # the grid of the hybrid block
    other_prefix_caching: dict | None = None  # the same estimate with the flag flipped
    # steady state: a running request holds its prompt and the output so far, not its whole
    # length (vLLM allocates blocks as tokens come); the time-weighted average context
    in_flight_tokens: float = 0.0
    per_rank_in_flight: int = 0
    # a layout with window groups (DeepSeek-V4, sliding window), in words, and how many
    groups_text: str = ""
    window_groups: int = 0
    blocks_overridden: bool = False  # --num-gpu-blocks-override: the cache is that many blocks
    # what the growing and the window groups hold, in words (the dry-run's, not plan.json's)
    block_words: tuple[str, str] = field(default=("attention", ""), compare=False)
    pp: int = 1  # pipeline stages: blocks/rank are every stage's (the fewest of them)

    @property
    def endpoint_at_max_length(self) -> int:
        return self.per_rank_at_max_length * self.dp

    @property
    def endpoint_at_mean_length(self) -> int:
        return self.per_rank_at_mean_length * self.dp

    def describe(self) -> str:
        """The dry-run's lines: the numbers, how they follow (pages, page size, state pages
        per request with and without prefix caching), then what they rest on."""
        lines = [self._headline(), self._pages(), self._per_request()]
        if self.per_rank_in_flight:
            n = self.lengths
            lines.append(
                f"  at steady state a running request holds {self.in_flight_tokens:,.0f} "
                f"tokens on average (its prompt and the output so far): about "
                f"{self.per_rank_in_flight * self.dp:,} in flight before requests wait; "
                f"{self.endpoint_at_max_length:,} if every one held its longest "
                f"({n.max_total:,} tokens)")
        if self.mamba_groups:
            lines.append(self._prefix_caching())
        lines.append(self._rests_on())
        return "\n".join(lines)

    def _headline(self) -> str:
        n = self.lengths
        return (
            f"KV capacity {self.name} (DP{self.dp} x TP{self.tp}"
            f"{f' x PP{self.pp}' if self.pp > 1 else ''}): about "
            f"{self.endpoint_at_mean_length:,} concurrent requests for the sweep's length mix "
            f"(mean {n.mean_total:,.0f} tokens), {self.endpoint_at_max_length:,} if all reach "
            f"{n.max_total:,}; {self.num_gpu_blocks:,} blocks/rank of {self.block_size} tokens "
            + (f"in {_size(self.num_gpu_blocks * self.bytes_per_block)}/GPU, as "
               f"--num-gpu-blocks-override sets (the memory left would hold "
               f"{self.kv_cache_bytes / GIB:.1f} GiB; weights {self.weights_bytes / GIB:.1f})"
               if self.blocks_overridden else
               f"in {self.kv_cache_bytes / GIB:.1f} GiB/GPU (weights "
               f"{self.weights_bytes / GIB:.1f})"))

    def _pages(self) -> str:
        size = f"{self.bytes_per_block / MIB:.1f} MiB" if self.bytes_per_block >= MIB \
            else f"{self.bytes_per_block / 1024:.0f} KiB"
        blocks = (f"{self.num_gpu_blocks:,} blocks/rank, "
                  f"{max(0, self.num_gpu_blocks - 1):,} usable")
        if self.groups_text:  # a block id spans every group
            return (f"  groups: {self.groups_text}; a block id is the widest group's pages "
                    f"({size}): {blocks}")
        page = (f"  pages: {self.block_size:,} tokens x {self.attention_bytes_per_token:,} B = "
                f"{self.page_size_bytes:,} B per layer")
        if self.mamba_groups:
            page += (f", the GDN state ({self.mamba_state_bytes:,} B) padded "
                     f"{self.mamba_padding_pct:g} % to it ({self.alignment}-token grid)")
        layers = f"{self.layers_per_group} layer{'s' if self.layers_per_group != 1 else ''}"
        return page + f"; a block is a page in each of {layers} ({size}): {blocks}"

    def _per_request(self) -> str:
        grows, window = self.block_words
        held = self.blocks_per_request_at_max - self.state_blocks_per_request
        attn = self.blocks_per_request_at_mean - self.state_blocks_per_request
        per = f"  per request: {attn:.2f} {grows} blocks on average ({held} at most)"
        if self.mamba_groups:
            per += (f" + {self.state_blocks_per_request} GDN state blocks "
                    f"({self.state_blocks_per_request // self.mamba_groups} per group x "
                    f"{self.mamba_groups} groups)")
        if self.window_groups:
            per += (f" + {self.state_blocks_per_request} blocks in the {self.window_groups} "
                    f"{window} groups, whatever its length")
        per += (f" = {self.blocks_per_request_at_mean:.2f} -> {self.per_rank_at_mean_length:,}"
                f"/rank x {self.dp} = {self.endpoint_at_mean_length:,}")
        if self.per_rank_at_mean_length == self.max_num_seqs:
            per += f" (max-num-seqs {self.max_num_seqs} binds)"
        return per

    def _prefix_caching(self) -> str:
        state = self.state_blocks_per_request
        text = (f"  prefix caching {'on' if self.prefix_caching else 'off'} "
                f"({self.prefix_caching_why}): mamba_cache_mode {self.mamba_cache_mode}; a "
                f"running request holds {state} state blocks "
                + (f"(+{self.state_blocks_at_boundary} for the step after each block boundary)"
                   if self.state_blocks_at_boundary else "whatever its length"))
        o = self.other_prefix_caching
        if o:
            text += (f"; prefix caching {'on' if o['prefix_caching'] else 'off'} would give "
                     f"{o['block_size']:,}-token pages, {o['num_gpu_blocks']:,} blocks/rank, "
                     f"the same {o['state_blocks_per_request']} state blocks, "
                     f"{o['endpoint_at_mean_length']:,} requests")
        return text

    def _rests_on(self) -> str:
        kv = self.kv_cache_dtype if self.kv_cache_dtype != "auto" else "model dtype"
        state = f", SSM state {self.ssm_dtype}" if self.ssm_dtype else ""
        given = sorted(k for k, v in self.sources.items() if v == "recipe" and k != "weights")
        known = {v for k, v in self.sources.items() if v.startswith(KNOWN_FACTS_SOURCE)}
        return (
            f"  rests on: KV {kv}{state}, "
            f"{self.overhead_bytes / GIB:.1f} GiB/GPU of activations+graphs+buffers assumed; "
            f"vLLM would log {self.vllm_log_max_concurrency:.2f}x for "
            f"{self.max_model_len:,} tokens per request"
            + (f"; model facts given by the recipe (model.facts: {', '.join(given)}), no "
               "config.json read" if given else "")
            + (f"; model facts as {min(known)} records them (the checkpoint's published "
               "config.json), no config.json read here" if known and not given else ""))

    def to_json(self) -> dict:
        d = asdict(self)
        del d["block_words"]
        if self.pp == 1:  # only a pipelined engine's records say its stages
            del d["pp"]
        d["endpoint_at_max_length"] = self.endpoint_at_max_length
        d["endpoint_at_mean_length"] = self.endpoint_at_mean_length
        d["lengths"]["mean_total"] = self.lengths.mean_total
        d["lengths"]["max_total"] = self.lengths.max_total
        return d

