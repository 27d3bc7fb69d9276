"""KV-capacity estimate: hand-computed bytes, and facts read from a checkpoint's config.json."""

import json

from launcher import capacity
from launcher.planning import plan
from launcher.spec import cluster, recipe

SEED = "qwen3.5-397b-gb200-disagg"
NODES = cluster.expand_nodelist("n[1-6]")


def decode_estimate(*sets):
    p = plan.make_plan(recipe.load(SEED, list(sets)), cluster.load("gb200-nvl72"), NODES)
    (cap,) = capacity.estimates(p)
    return cap


def test_seed_estimate_by_hand():
    cap = decode_estimate()
    # Full attention: 2 (K,V) x 2 KV heads x 256 dim x 15 layers x 2 bytes (bf16 KV).
    assert cap.kv_bytes_per_token == 2 * 2 * 256 * 15 * 2
    # GDN: 45 layers x 32 value heads x 128 x 128 x 2 bytes (bf16 SSM cache), plus conv
    # state 45 x (2 x 16 x 128 + 32 x 128) channels x 3 x 2 bytes.
    assert cap.state_bytes_per_request == 45 * 32 * 128 * 128 * 2 + 45 * (4096 + 4096) * 3 * 2
    # Weights per GPU with EP over 8: dense 10e9 x 4.5/8 B replicated + experts / 8.
    weights = (10e9 * 0.5625 + 387e9 * 0.5625 / 8) / 2**30
    assert abs(cap.weights_gib_per_gpu - round(weights, 1)) < 0.05
    per_request = cap.kv_bytes_per_token * (8192 + 1024) + cap.state_bytes_per_request
    cache = 184 * 0.9 - weights - capacity.RESERVE_GIB
    assert cap.max_concurrency == int(cache * 2**30 // per_request) * 8
    assert cap.facts_from == "recipe"


def test_fp8_kv_and_more_memory_raise_capacity():
    base = decode_estimate().max_concurrency
    assert decode_estimate("vllm_args.kv-cache-dtype=fp8").max_concurrency > base
    assert decode_estimate("decode.args.gpu-memory-utilization=0.95").max_concurrency > base


def test_config_json_wins_over_recipe_facts(tmp_path):
    types = (["linear_attention"] * 3 + ["full_attention"]) * 15
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5_moe",
        "text_config": {
            "num_hidden_layers": 60, "layer_types": types, "num_key_value_heads": 2,
            "head_dim": 256, "linear_num_value_heads": 64, "linear_num_key_heads": 16,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
        },
    }))  # fmt: skip
    cap = decode_estimate(f"model.path={tmp_path}")
    assert cap.facts_from == f"{tmp_path}/config.json + recipe"
    # 64 value heads from config.json, not the recipe's 32: twice the SSM state.
    assert cap.state_bytes_per_request == 45 * 64 * 128 * 128 * 2 + 45 * (4096 + 8192) * 3 * 2
    assert cap.max_concurrency < decode_estimate().max_concurrency


def test_no_facts_no_estimate():
    r = recipe.load("local-sim")
    p = plan.make_plan(r, cluster.load("local"), ["a", "b", "c"])
    assert capacity.estimates(p) == []
