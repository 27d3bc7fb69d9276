"""A simulated decode rank of a shipped MLA recipe (Kimi-K2.5 8k1k 6p1d: DEP16, FP8 latent,
64-token blocks), of a shipped GQA recipe (MiniMax-M2.5 8k1k 1p1d: TP4, FP8 KV) and of a
shipped DeepSeek-V4 recipe (max-tpt: DEP8, fp8_ds_mla, packed groups) meets its
KV limit where the dry-run's estimate says, within 10 %: the renderer gives the simulator
the estimate's block size and capacity (docs/kv-architectures.md), and the recipe's own
workload (sa-bench 8192/1024 at ratio 0.8) fills it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from simprocs import fill_to_capacity, start_sim

from launcher.planning import capacity, plan, render
from launcher.schema import cluster, recipe

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, block", [
    ("kimi-k2.5-gb200-8k1k-6p1d-dep4-dep16", 64),   # MLA: the recipe's --block-size
    ("minimax-m2.5-gb200-8k1k-1p1d-tp4", 16),        # GQA: FlashInfer's default on GB200
    # DeepSeek-V4: 256-token compressed blocks + 26 window blocks per request (DEP8)
    ("deepseek-v4-pro-gb200-8k1k-max-tpt-megamoe", 256),
])
def test_a_decode_rank_fills_up_where_the_estimate_says(tmp_path, name, block):
    r = recipe.load(name, ["engine=sim", "container=null", "decode.args.max-num-seqs=4096"])
    p = plan.make_plan(r, cluster.load("gb200-nvl72"), [f"n{i}" for i in range(12)])
    cap = next(c for c in capacity.estimates(p) if c.name == "decode-0")
    assert cap.block_size == block
    expected = cap.per_rank_at_mean_length
    decode = next(ep for ep in p.endpoints if ep.name == "decode-0")
    env = render.sim_env(p, decode)
    given = plan.engine_args(r, decode.pool).get("block-size")
    sim = start_sim(tmp_path, "decode-rank", "m", "--stream-interval", "100",
                    "--max-num-seqs", "4096", "--api-server-count", "1",
                    "--no-enable-prefix-caching", "--max-model-len", "10240",
                    *(["--block-size", str(given)] if given else []),
                    SIM_SPEED="200", **{k: v for k, v in env.items() if k.startswith(
                        ("SIM_KV", "SIM_DEFAULT_BLOCK_SIZE", "SIM_STATE_BLOCKS"))})
    try:
        sim.wait_healthy(30)
        n = int(expected * 1.4)  # more than fit: the rest wait for capacity
        peak, full = fill_to_capacity(sim, render.workload_flags(p), n, REPO)
    finally:
        sim.stop()
    assert peak["usage"] > 0.95 and peak["capacity_waits"] > 0 and len(full) >= 5, (peak, full)
    held = sorted(full)[len(full) // 2]
    print(f"\n{name} decode rank holds {held:.0f} requests while full, the estimate "
          f"{expected}", file=sys.stderr)
    assert abs(held - expected) <= 0.1 * expected, (held, expected, peak, full)
