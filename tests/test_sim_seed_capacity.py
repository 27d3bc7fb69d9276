"""A simulated rank of the seed's decode endpoint meets its KV limit where the dry-run's
estimate (vLLM 0.33's accounting, docs/kv-capacity.md) says, with prefix caching on (vLLM's
default: 2,176-token pages, 512 requests per rank with FP8 KV) and off (the published
recipes: 2,128-token pages, 515): the renderer gives the simulator the estimate's block
size, capacity and GDN state blocks per request (3 either way), and the published workload
(ISL/OSL 8192/1024 by sa-bench's rule at range ratio 0.8, the seed's own client flags)
fills it at about `per_rank_at_mean_length`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from simprocs import fill_to_capacity, sample, scrape, start_sim

from launcher.planning import capacity, plan, render
from launcher.schema import cluster, recipe

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[1]
# The decode's own args win over vllm_args; null removes a switch the recipe may carry.
PREFIX = {
    True: ["decode.args.enable-prefix-caching=true"],
    False: ["decode.args.enable-prefix-caching=false"],
}
CLEAR = ["decode.args.no-enable-prefix-caching=null", "decode.args.disable-prefix-caching=null"]


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-on", "prefix-off"])
def test_a_seed_decode_rank_fills_up_where_the_estimate_says(tmp_path, prefix_caching):
    seed = plan.make_plan(
        recipe.load("qwen3.5-397b-gb200-disagg", ["engine=sim", *CLEAR, *PREFIX[prefix_caching]]),
        cluster.load("gb200-nvl72"), [f"n{i}" for i in range(6)],
    )  # fmt: skip
    (cap,) = capacity.estimates(seed)
    assert cap.prefix_caching is prefix_caching
    assert cap.block_size == (2176 if prefix_caching else 2128)  # with FP8 KV (the facts')
    decode = next(ep for ep in seed.endpoints if ep.name == "decode-0")
    env = render.sim_env(seed, decode)
    # the simulator holds the estimate's state blocks per request: 3 either way
    assert env["SIM_STATE_BLOCKS_PER_REQUEST"] == str(cap.state_blocks_per_request) == "3"
    expected = cap.per_rank_at_mean_length  # 512 on, 515 off (FP8 KV, bf16 SSM state)
    assert expected == (512 if prefix_caching else 515)
    switch = "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"
    # one DP rank of that decode endpoint, aggregated (no KV transfer), fast speed model
    p = start_sim(tmp_path, "decode-rank", "m", "--stream-interval", "100",
                  "--max-num-seqs", "1024", "--api-server-count", "1", switch,
                  SIM_SPEED="100", **{k: v for k, v in env.items() if k.startswith("SIM_KV")
                                      or k in ("SIM_DEFAULT_BLOCK_SIZE",
                                               "SIM_STATE_BLOCKS_PER_REQUEST")})  # fmt: skip
    try:
        p.wait_healthy(30)
        info = scrape(p.url)
        mode = "align" if prefix_caching else "none"
        assert sample(info, "vllm:cache_config_info", enable_prefix_caching=str(prefix_caching),
                      mamba_cache_mode=mode, block_size=str(cap.block_size)) > 0, info  # fmt: skip
        n = int(expected * 1.4)  # more than fit: the rest wait for capacity
        # `full`: running requests while the cache is full and others wait
        peak, full = fill_to_capacity(p, render.workload_flags(seed), n, REPO)
    finally:
        p.stop()
    assert peak["usage"] > 0.95 and peak["capacity_waits"] > 0 and len(full) >= 5, (peak, full)
    # While the cache is full and requests wait, the batch holds what the estimate says,
    # within 10 %: the estimate charges every request its whole mean length, while a request
    # mid-decode holds its prompt and part of its output (3-5 % more fit at the seed's
    # lengths), and the sampled batch swings as requests finish and others are admitted.
    held = sorted(full)[len(full) // 2]
    print(f"\nseed decode rank, prefix caching {'on' if prefix_caching else 'off'}: holds "
          f"{held:.0f} requests while full, the estimate {expected}", file=sys.stderr)
    assert abs(held - expected) <= 0.1 * expected, (held, expected, peak, full)
