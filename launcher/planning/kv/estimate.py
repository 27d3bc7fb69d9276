"""The one estimate: an architecture's layer specs, vLLM's groups of them, the memory left
for them, and what the sweep's requests hold. Nothing here knows an architecture.

With data-parallel attention (DEP) each DP rank is its own engine with TP=1, so the
numbers are per DP rank; the endpoint holds DP times as many requests.
"""

from __future__ import annotations

import dataclasses
import math

from launcher.planning.kv import archs, grouping
from launcher.planning.kv.cache import Caches
from launcher.planning.kv.engine import (
    Device,
    EngineArgs,
    Parallelism,
    Workload,
    default_batch_limits,
    in_flight_tokens,
    prefix_caching,
    random_dataset_lengths,
)
from launcher.planning.kv.facts import ModelFacts
from launcher.planning.kv.memory import Overheads, kv_memory
from launcher.planning.kv.result import KvCapacity
from launcher.run import lengths as run_lengths


def estimate(model: ModelFacts, engine: EngineArgs, par: Parallelism, device: Device,
             workload: Workload, overheads: Overheads | None = None, name: str = "",
             compare_prefix_caching: bool = True) -> KvCapacity:
    """The capacity vLLM 0.33 would allocate for one DP rank of this endpoint, and what the
    sweep's requests need of it. Raises ValueError for models it does not model. Where
    prefix caching changes the layout (GDN state), the result also carries the same
    estimate with it the other way (`other_prefix_caching`), which is what the flag is worth."""
    reported = archs.caches(model, engine, par.tp, device)
    layout, mem, num_blocks, stage_note = _fewest_blocks(model, engine, par, device, overheads,
                                                         reported)
    assumptions = [*reported.notes, *mem.notes, *stage_note]
    if engine.num_gpu_blocks_override is not None:
        num_blocks = engine.num_gpu_blocks_override
        assumptions.append(f"--num-gpu-blocks-override {num_blocks}")
    lengths = random_dataset_lengths(workload)
    assumptions.append(
        f"lengths uniform in [{lengths.input_low}, {lengths.input_high}] + "
        f"[{lengths.output_low}, {lengths.output_high}] ({run_lengths.RULE_TEXT[workload.rule]})")
    max_len = engine.max_model_len or model.max_position_embeddings or lengths.max_total
    log_conc = num_blocks / layout.at_start_up(max_len, in_flight_tokens(engine, device))
    other = None
    if layout.state_groups and compare_prefix_caching:
        other = _with_prefix_caching_flipped(model, engine, par, device, workload, overheads,
                                             name)
    return KvCapacity(
        name=name, tp=par.tp, dp=par.dp, pp=par.pp, **_layout_fields(layout, reported),
        **_mem_fields(mem),
        num_gpu_blocks=num_blocks, blocks_overridden=engine.num_gpu_blocks_override is not None,
        lengths=lengths, **_requests(layout, engine, device, num_blocks, lengths),
        max_model_len=max_len, vllm_log_max_concurrency=round(log_conc, 2),
        vllm_log_kv_cache_tokens=int(log_conc * max_len), assumptions=tuple(assumptions),
        sources=_sources(model, device, reported), prefix_caching=prefix_caching(engine)[0],
        prefix_caching_why=prefix_caching(engine)[1], other_prefix_caching=other)


def _fewest_blocks(model, engine, par, device, overheads, reported: Caches):
    """(layout, memory, num_gpu_blocks, notes) of the GPU with the fewest blocks: one per
    pipeline stage, each holding its stage's layer caches and its share of the weights;
    vLLM gives every worker the smallest num_blocks of all (v1/core/kv_cache_utils.py
    get_kv_cache_configs). Without pipeline parallelism, the one stage holds every layer."""
    specs = list(reported.specs)
    best = None
    for a, b in par.stages(len(specs)):
        if a == b:
            raise ValueError(f"pipeline_parallel {par.pp} leaves a stage without layers "
                             f"({len(specs)} layer caches)")
        layout = grouping.plan(specs[a:b])
        mem = kv_memory(model, engine, par, device, overheads, (b - a) / len(specs))
        blocks = mem.kv_cache_bytes // layout.bytes_per_block  # kv_cache_planning.py:681
        if best is None or blocks < best[2]:
            best = (layout, mem, blocks, (a, b))
    layout, mem, blocks, (a, b) = best
    note = [] if par.pp == 1 else [
        f"pipeline parallel {par.pp}: layer caches {a}-{b - 1} of {len(specs)} on the stage "
        "with the fewest blocks (weights counted by the same share; vLLM takes every "
        "stage's smallest num_blocks)"]
    return layout, mem, blocks, note


def _layout_fields(layout: grouping.Layout, reported: Caches) -> dict:
    """The groups as KvCapacity records them: the page, the GDN state and its padding, the
    group counts, the window groups in words."""
    state = layout.state_groups[0].spec if layout.state_groups else None
    page, block = layout.page_size_bytes, layout.block_size
    padding = round(100 * (page - state.state_bytes) / state.state_bytes, 2) if state else 0.0
    growing = {g.spec.kind for g in layout.growing}
    return dict(
        kv_cache_dtype=reported.kv_cache_dtype, ssm_dtype=state.ssm_dtype if state else "",
        conv_dtype=state.conv_dtype if state else "", attention_bytes_per_token=page // block,
        mamba_state_bytes=state.state_bytes if state else 0, block_size=block,
        page_size_bytes=page, mamba_padding_pct=padding,
        mamba_cache_mode=state.cache_mode if state else "none",
        layers_per_group=layout.layers_per_group, attention_groups=len(layout.growing),
        mamba_groups=len(layout.state_groups), bytes_per_block=layout.bytes_per_block,
        state_blocks_at_boundary=sum(g.spec.blocks_at_boundary() for g in layout.state_groups),
        alignment=state.alignment if state else block,
        groups_text=layout.describe() if layout.window_groups else "",
        window_groups=len(layout.window_groups),
        block_words=("compressed" if "compressed" in growing else "attention",
                     layout.window_words()))


def _mem_fields(mem) -> dict:
    return dict(weights_bytes=mem.weights_bytes, requested_bytes=mem.requested_bytes,
                overhead_bytes=mem.overhead_bytes, kv_cache_bytes=mem.kv_cache_bytes)


def _requests(layout: grouping.Layout, engine: EngineArgs, device: Device, num_blocks: int,
              lengths) -> dict:
    """What a running request holds: ceil(tokens / block) per growing group, plus the
    blocks of the groups that do not grow (GDN state, sliding windows), prefix caching on
    or off (docs/kv-capacity.md section 5). Speculative decoding adds num_speculative_tokens
    lookahead slots past the tokens held (config/vllm.py:626-651, v1/core/sched/
    scheduler.py:914-918), except beside a GDN state, whose blocks carry them."""
    k = engine.num_speculative_tokens
    ahead = 0 if layout.state_groups else k
    block, grows = layout.block_size, len(layout.growing)
    fixed = layout.fixed_blocks(k, lengths.max_total)
    at_max = grows * math.ceil((lengths.max_total + ahead) / block) + fixed
    at_mean = grows * lengths.expected_blocks(block, ahead) + fixed
    in_flight = grows * lengths.in_flight_blocks(block) + fixed
    max_seqs = engine.max_num_seqs or default_batch_limits(device)[1]
    usable = max(0, num_blocks - 1)  # the block pool keeps one null block (block_pool.py:191)
    return dict(
        state_blocks_per_request=fixed, blocks_per_request_at_max=at_max,
        blocks_per_request_at_mean=round(at_mean, 4), max_num_seqs=max_seqs,
        per_rank_at_max_length=min(max_seqs, usable // at_max),
        per_rank_at_mean_length=min(max_seqs, math.floor(usable / at_mean)),
        in_flight_tokens=round(lengths.in_flight_mean, 1),
        per_rank_in_flight=min(max_seqs, math.floor(usable / in_flight)))


def _sources(model: ModelFacts, device: Device, reported: Caches) -> dict[str, str]:
    sources = {**model.sources, "accounting": f"vLLM 0.33.0, {reported.accounting}",
               "gpu_memory": f"{device.memory_gib:g} GiB ({device.kind})"}
    if model.weights:
        sources["weights"] = model.weights.source
    return sources


def _with_prefix_caching_flipped(model: ModelFacts, engine: EngineArgs, par: Parallelism,
                                 device: Device, workload: Workload,
                                 overheads: Overheads | None, name: str) -> dict:
    """The headline figures of the same estimate with prefix caching the other way."""
    flipped = dataclasses.replace(engine, enable_prefix_caching=not prefix_caching(engine)[0],
                                  prefix_caching_flag="")
    o = estimate(model, flipped, par, device, workload, overheads, name, False)
    return {
        "prefix_caching": o.prefix_caching,
        "mamba_cache_mode": o.mamba_cache_mode,
        "block_size": o.block_size,
        "num_gpu_blocks": o.num_gpu_blocks,
        "state_blocks_per_request": o.state_blocks_per_request,
        "blocks_per_request_at_mean": o.blocks_per_request_at_mean,
        "endpoint_at_mean_length": o.endpoint_at_mean_length,
        "endpoint_at_max_length": o.endpoint_at_max_length,
    }


def kv_blocks_per_dp_rank(result: KvCapacity) -> int:
    """vLLM's num_gpu_blocks for one DP rank (blocks of `result.block_size` tokens)."""
    return result.num_gpu_blocks


def simulator_kv_blocks(result: KvCapacity) -> tuple[int, int, int]:
    """(block_size, num_gpu_blocks, state blocks per request) for the simulator, which charges
    a running request ceil(tokens / block_size) blocks in one attention group plus its state
    blocks, as vLLM does: its usable blocks are vLLM's less the null block. Several attention
    groups are folded into one (blocks and state divided by the group count). The state
    blocks are those of a running request, the same with prefix caching on or off; the
    one-step extra of align mode at a block boundary (`state_blocks_at_boundary`) is left
    out: a request crosses a boundary about once in its decode, for one step."""
    groups = max(1, result.attention_groups)
    blocks = max(1, (result.num_gpu_blocks - 1) // groups)
    return result.block_size, blocks, -(-result.state_blocks_per_request // groups)
