"""The plan's KV-capacity estimate: the seed's numbers (docs/kv-capacity.md, worked example
a), the checkpoint's config.json over the recipe's facts, and the simulator given the same
capacity."""

import json

from launcher.planning import capacity, plan, render
from launcher.schema import cluster, recipe

SEED = "qwen3.5-397b-gb200-disagg"
NODES = cluster.expand_nodelist("n[1-6]")


def seed_plan(*sets):
    return plan.make_plan(recipe.load(SEED, list(sets)), cluster.load("gb200-nvl72"), NODES)


def test_seed_decode_estimate_matches_the_worked_example():
    # FP8 KV (the recipe's assumption), bf16 SSM state, prefix caching on (vLLM's default
    # once the published --no-enable-prefix-caching is removed): a 2,176-token block, 3,717
    # blocks per rank, 480 requests per rank for the sweep's mix, 337 at the longest length.
    # The worked example's lengths are vLLM's rule (range ratio 0.8: up to 16,590 tokens).
    vllm_rule = "benchmark.length_rule=vllm"
    (cap,) = capacity.estimates(seed_plan("vllm_args.no-enable-prefix-caching=null", vllm_rule))
    assert (cap.block_size, cap.num_gpu_blocks) == (2176, 3717)
    assert (cap.endpoint_at_mean_length, cap.endpoint_at_max_length) == (3840, 2696)
    assert round(cap.vllm_log_max_concurrency, 2) == 28.59
    # as published (prefix caching off): the GDN block is max_model_len, the page 2,128
    (cap,) = capacity.estimates(seed_plan(vllm_rule))
    assert (cap.block_size, cap.num_gpu_blocks) == (2128, 3801)
    assert (cap.endpoint_at_mean_length, cap.endpoint_at_max_length) == (3880, 2760)
    assert round(cap.vllm_log_max_concurrency, 2) == 29.93
    # the published workload (sa-bench's rule, worked example (c)): mean 8,294, at most 9,216
    (cap,) = capacity.estimates(seed_plan())
    assert (cap.lengths.mean_total, cap.lengths.max_total) == (8294, 9216)
    assert (cap.endpoint_at_mean_length, cap.endpoint_at_max_length) == (4120, 3800)
    assert cap.per_rank_in_flight * cap.dp == 4232  # at steady state, the output half made


def test_flags_move_the_estimate_the_way_vllm_would():
    (base,) = capacity.estimates(seed_plan())
    (fp32,) = capacity.estimates(seed_plan("vllm_args.mamba-ssm-cache-dtype=float32"))
    (more,) = capacity.estimates(seed_plan("decode.args.gpu-memory-utilization=0.95"))
    assert fp32.endpoint_at_mean_length == 2832 < base.endpoint_at_mean_length
    assert more.endpoint_at_mean_length > base.endpoint_at_mean_length


def test_config_json_wins_over_recipe_facts(tmp_path):
    types = (["linear_attention"] * 3 + ["full_attention"]) * 15
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "text_config": {
            "num_hidden_layers": 60, "layer_types": types, "num_key_value_heads": 2,
            "head_dim": 256, "linear_num_value_heads": 32, "linear_num_key_heads": 16,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
            "max_position_embeddings": 262144,
        },
    }))  # fmt: skip
    (cap,) = capacity.estimates(seed_plan(f"model.path={tmp_path}"))
    assert any(str(tmp_path) in s for s in cap.sources.values())
    # 32 value heads in this config.json (the recipe says 64): half the GDN state, so a
    # smaller page and a different block than the seed's.
    assert cap.block_size != 2176


def test_no_facts_no_estimate():
    # local-sim declares its toy model's facts; without them there is nothing to estimate from
    assert capacity.estimates(plan.make_plan(
        recipe.load("local-sim", ["model.facts=null"]), cluster.load("local"),
        ["a", "b", "c"])) == []


def test_the_simulator_gets_the_estimated_capacity():
    p = seed_plan("engine=sim")
    (cap,) = capacity.estimates(p)
    decode = next(ep for ep in p.endpoints if ep.name == "decode-0")
    env = render.sim_env(p, decode)
    from launcher.planning.kv import simulator_kv_blocks

    block, blocks, state = simulator_kv_blocks(cap)
    assert env["SIM_DEFAULT_BLOCK_SIZE"] == str(block) == "2128"
    assert env["SIM_KV_CAPACITY_TOKENS"] == str(block * blocks)
    assert env["SIM_STATE_BLOCKS_PER_REQUEST"] == str(state) == "3"


def test_an_endpoint_that_cannot_hold_one_request_is_said_at_dry_run():
    p = seed_plan("decode.data_parallel=1")
    (warning, *_) = capacity.warnings(p, capacity.estimates(p))
    assert warning.startswith("decode-0 cannot hold one request of 9,216 tokens")
    assert "vLLM would refuse to start" in warning


def test_a_missing_estimate_says_why():
    p = seed_plan()
    assert capacity.missing(p, capacity.estimates(p)) is None
    bad = seed_plan("vllm_args.kv-cache-memory-bytes=64Q")  # not a size vLLM reads
    gap = capacity.missing(bad, capacity.estimates(bad))
    assert gap.startswith("no KV-capacity estimate for decode-0: ValueError") and "64Q" in gap
    sim = plan.make_plan(recipe.load("local-sim", ["model.facts=null"]), cluster.load("local"),
                         cluster.expand_nodelist("local-[1-4]"))
    gap = capacity.missing(sim, capacity.estimates(sim))
    assert "no config.json under model.path" in gap and "model.facts" in gap


def test_a_sweep_past_the_decode_says_whether_kv_or_max_num_seqs_is_the_limit():
    """DeepSeek-V4-Pro's DEP8 decode runs out of KV (about 3,960 of the 4,096 its client
    sends); Kimi-K2.5's 1k/1k DEP16 decode has KV for more than its max-num-seqs x 16 = 4,096
    and its client goes to 6,144: that one waits for a slot, not for KV."""
    nodes = [f"n{i}" for i in range(24)]
    p = plan.make_plan(recipe.load("deepseek-v4-pro-gb200-8k1k-max-tpt-megamoe"),
                       cluster.load("gb200-nvl72"), nodes)
    said = capacity.sweep_warning(p, capacity.estimates(p))
    assert "4,096 exceeds the predicted KV capacity of about 3,960" in said, said
    k = plan.make_plan(recipe.load("kimi-k2.5-gb200-1k1k-1p1d-dep4-dep16"),
                       cluster.load("gb200-nvl72"), nodes)
    said = capacity.sweep_warning(k, capacity.estimates(k))
    assert "6,144 exceeds what the decode side runs at once: about 4,096 (max-num-seqs " \
           "binds; its KV cache would hold about " in said, said
