"""KV-capacity arithmetic against cases worked by hand in docs/kv-capacity.md.

Every expected number here was computed by hand (the doc shows the steps), not by
calling the module.
"""

import json

import pytest

from launcher.planning import kv
from launcher.planning.kv import grouping, specs
from launcher.planning.kv.archs import gdn_hybrid
from launcher.schema.sections import DeclaredFacts

QWEN35_TEXT = {
    "hidden_size": 4096,
    "vocab_size": 248320,
    "num_hidden_layers": 60,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 15,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 64,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "mamba_ssm_dtype": "float32",
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 1024,
    "shared_expert_intermediate_size": 1024,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 1,
}
QWEN35 = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": QWEN35_TEXT}
TINY = {
    "architectures": ["Qwen3NextForCausalLM"],
    "hidden_size": 256,
    "vocab_size": 512,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
DENSE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


def modelopt(kv_algo):
    return {"producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": kv_algo}}  # fmt: skip


SEED_WEIGHTS = kv.WeightFacts(dense_params=9_799_293_696, expert_params=386_547_056_640,
                              expert_format="nvfp4", mtp_params=6_595_568_128)  # fmt: skip
SEED_FLAGS = {"mamba-ssm-cache-dtype": "bfloat16", "language-model-only": True,
              "gdn-prefill-backend": "flashinfer"}  # fmt: skip
DEP8 = kv.Parallelism(tp=1, dp=8, expert_parallel=True)
SWEEP = kv.Workload(8192, 1024, 0.8)
MIB64 = 64 * 2**20


# The published decode (srt-slurm-recipes' Qwen3.5 GB200 8k1k disagg): prefix caching off,
# no --gdn-prefill-backend (auto: FlashInfer on Blackwell), the rest as the seed.
PUBLISHED_FLAGS = {"mamba-ssm-cache-dtype": "bfloat16", "language-model-only": True,
                   "no-enable-prefix-caching": True, "async-scheduling": True}  # fmt: skip


def seed(kv_algo="FP8", flags=SEED_FLAGS, **kw):
    model = kv.ModelFacts.from_config(QWEN35, modelopt(kv_algo), weights=SEED_WEIGHTS)
    engine = kv.EngineArgs.from_flags(flags)
    return kv.estimate(model, engine, DEP8, kv.Device(184, "gb200"), SWEEP, name="decode-0", **kw)


def qwen35_block(tp, kv_dtype, prefix_caching=False, backend="auto", config=QWEN35):
    model = kv.ModelFacts.from_config(config)
    engine = kv.EngineArgs(kv_cache_dtype=kv_dtype, enable_prefix_caching=prefix_caching,
                           gdn_prefill_backend=backend)  # fmt: skip
    return kv.estimate(model, engine, kv.Parallelism(tp=tp), kv.Device(184), SWEEP)


# ----- page unification ---------------------------------------------------------------------


def test_page_unification_reproduces_1056_with_qwen35_numbers():
    # TP=8, fp8 KV, fp32 SSM (config's mamba_ssm_dtype), alignment 16:
    # GDN page = 1536 ch x 3 x 2 B + 8 x 128 x 128 x 4 B = 9,216 + 524,288 = 533,504 B;
    # attention = 2 x max(1, 2 // 8) x 256 x 1 B = 512 B/token;
    # 16 x ceil(533,504 / 8,192) = 16 x ceil(65.125) = 1056.
    r = qwen35_block(8, "fp8")
    assert (r.mamba_state_bytes, r.attention_bytes_per_token) == (533_504, 512)
    assert (r.block_size, r.page_size_bytes) == (1056, 540_672)
    assert r.mamba_padding_pct == 1.34  # (540,672 - 533,504) / 533,504
    # TP=4 with bf16 KV: both sides double, same block.
    r = qwen35_block(4, "auto")
    assert (r.mamba_state_bytes, r.attention_bytes_per_token, r.block_size) == (
        1_067_008,
        1024,
        1056,
    )
    # Align mode without FlashInfer GDN keeps alignment 16 ...
    assert qwen35_block(8, "fp8", prefix_caching=True, backend="triton").block_size == 1056
    # ... with it, lcm(16, 64) = 64: 64 x ceil(533,504 / 32,768) = 64 x 17 = 1088.
    assert qwen35_block(8, "fp8", prefix_caching=True, backend="flashinfer").block_size == 1088


def test_wrong_32_value_heads_also_gives_1056_at_tp1_bf16():
    # 32 heads: 8,192 ch x 3 x 2 B + 32 x 128 x 128 x 4 B = 2,146,304 B over 2,048 B/token
    # = 1048 -> 16 x 66 = 1056. The real model (64 heads) at TP=1 gives 4176 instead.
    wrong = {**QWEN35, "text_config": {**QWEN35_TEXT, "linear_num_value_heads": 32}}
    assert qwen35_block(1, "auto", config=wrong).block_size == 1056
    r = qwen35_block(1, "fp8")
    assert (r.mamba_state_bytes, r.block_size) == (4_268_032, 4176)  # 4,168 -> 16 x 261


def test_groups_follow_the_layer_ratio():
    def groups(attn, state):  # (layers per group, attention groups, state groups)
        a = specs.FullAttentionSpec(16, 1024)
        m = specs.MambaSpec(16 * 1024, "bfloat16", "bfloat16", "none", 16, 16)
        layout = grouping.plan([a] * attn + [m] * state)
        return layout.layers_per_group, len(layout.growing), len(layout.state_groups)

    assert groups(15, 45) == (15, 1, 3)  # Qwen3.5-397B: 4 groups of 15
    assert groups(1, 3) == (1, 1, 3)  # the tiny model
    assert groups(12, 13) == (13, 1, 1)  # under 1.5x: the larger count
    assert groups(2, 0) == (2, 1, 0)  # attention only: one group


# ----- the seed's decode endpoint (docs section 9) ------------------------------------------


def test_seed_decode_endpoint_by_hand():
    r = seed()
    assert r.kv_cache_dtype == "fp8_e4m3" and r.ssm_dtype == "bfloat16"
    assert (r.attention_bytes_per_token, r.mamba_state_bytes) == (1024, 2_170_880)
    # align mode + FlashInfer GDN: 64 x ceil(2,170,880 / 65,536) = 64 x 34 = 2176.
    assert (r.mamba_cache_mode, r.block_size, r.page_size_bytes) == ("align", 2176, 2_228_224)
    assert r.bytes_per_block == 15 * 2_228_224 == 33_423_360
    assert r.weights_bytes == 19_598_587_392 + 27_179_089_920 == 46_777_677_312
    assert r.requested_bytes == 181_763_015_967  # ceil(184 GiB x 0.92)
    assert r.kv_cache_bytes == 181_763_015_967 - 46_777_677_312 - 10 * 2**30
    assert r.num_gpu_blocks == 3717  # floor(124,247,920,415 / 33,423,360)
    assert (r.lengths.max_total, r.lengths.mean_total) == (16_590, 9_216)
    assert r.blocks_per_request_at_max == 8 + 3
    assert r.blocks_per_request_at_mean == pytest.approx(3 + 1 + 80_354_880 / 21_511_869, abs=1e-4)
    assert (r.per_rank_at_max_length, r.per_rank_at_mean_length) == (337, 480)
    assert (r.endpoint_at_max_length, r.endpoint_at_mean_length) == (2696, 3840)
    # vLLM's line: 3,717 / (ceil(262,144 / 2,176) + 3 GDN groups x 3) = 3,717 / 130.
    assert r.vllm_log_max_concurrency == 28.59
    assert r.vllm_log_kv_cache_tokens == 7_495_301
    assert kv.kv_blocks_per_dp_rank(r) == 3717
    assert kv.simulator_kv_blocks(r) == (2176, 3716, 3)


# ----- prefix caching on/off (docs section 5) ---------------------------------------------


def test_prefix_caching_follows_the_flags_as_vllms_parser_reads_them():
    def on(flags):
        return kv.prefix_caching(kv.EngineArgs.from_flags(flags))

    # No flag: vLLM's default for a generative (hybrid) model is on.
    assert on({}) == (True, "vLLM's default for a generative model")
    assert on({"no-enable-prefix-caching": True}) == (False, "--no-enable-prefix-caching")
    assert on({"enable-prefix-caching": False}) == (False, "--no-enable-prefix-caching")
    assert on({"disable-prefix-caching": True}) == (False, "--disable-prefix-caching")
    assert on({"enable_prefix_caching": True}) == (True, "--enable-prefix-caching")
    # The last switch on the command line wins (argparse), None removes one.
    assert on({"no-enable-prefix-caching": True, "enable-prefix-caching": True})[0] is True
    assert on({"enable-prefix-caching": True, "disable-prefix-caching": True})[0] is False
    assert on({"no-enable-prefix-caching": None})[0] is True
    with pytest.raises(ValueError, match="--no-no-enable-prefix-caching"):
        kv.EngineArgs.from_flags({"no-enable-prefix-caching": False})


def test_published_decode_without_prefix_caching_by_hand():
    r = seed(flags=PUBLISHED_FLAGS)
    assert (r.prefix_caching, r.mamba_cache_mode, r.alignment) == (False, "none", 16)
    # No 64-token grid: 16 x ceil(2,170,880 / (16 x 1,024)) = 16 x ceil(132.5) = 2128.
    assert (r.block_size, r.page_size_bytes, r.mamba_padding_pct) == (2128, 2_179_072, 0.38)
    assert r.bytes_per_block == 15 * 2_179_072 == 32_686_080
    assert r.kv_cache_bytes == 124_247_920_415  # the same memory as with prefix caching
    assert r.num_gpu_blocks == 3801  # floor(124,247,920,415 / 32,686,080) = floor(3801.25)
    # E[ceil(T/2128)] = 1 + (21,470,541 + 1,641 x 36,290 + 1,434,234) / 21,511,869
    assert r.blocks_per_request_at_mean == pytest.approx(
        3 + 1 + (21_470_541 + 1641 * 36_290 + 1_434_234) / 21_511_869, abs=1e-4
    )
    assert r.blocks_per_request_at_max == 8 + 3  # ceil(16,590 / 2,128) = 8
    assert (r.state_blocks_per_request, r.state_blocks_at_boundary) == (3, 0)
    # 3,800 usable / 7.8331 = 485.1; 3,800 // 11 = 345.
    assert (r.per_rank_at_mean_length, r.per_rank_at_max_length) == (485, 345)
    assert (r.endpoint_at_mean_length, r.endpoint_at_max_length) == (3880, 2760)
    # vLLM's line: 3,801 / (ceil(262,144 / 2,128) + 3 GDN groups x 1) = 3,801 / 127.
    assert r.vllm_log_max_concurrency == 29.93
    assert kv.simulator_kv_blocks(r) == (2128, 3800, 3)


def test_prefix_caching_changes_the_block_not_the_state_blocks():
    on, off = seed(), seed(flags={**SEED_FLAGS, "no-enable-prefix-caching": True})
    # A running request holds one state block per GDN group either way; align mode holds a
    # second one per group only for the step after it crosses a block boundary.
    assert on.state_blocks_per_request == off.state_blocks_per_request == 3
    assert (on.state_blocks_at_boundary, off.state_blocks_at_boundary) == (3, 0)
    assert (on.block_size, off.block_size) == (2176, 2128)
    assert (on.endpoint_at_mean_length, off.endpoint_at_mean_length) == (3840, 3880)
    assert on.other_prefix_caching["endpoint_at_mean_length"] == 3880
    assert off.other_prefix_caching["block_size"] == 2176
    # The published flags (no --gdn-prefill-backend) give the same as the seed's without it.
    assert seed(flags=PUBLISHED_FLAGS).block_size == off.block_size
    # With NVFP4 KV both settings land on 3776 (= 16 x 236 = 64 x 59): nothing to gain.
    assert seed("NVFP4").block_size == seed("NVFP4", flags=PUBLISHED_FLAGS).block_size == 3776
    # With speculative decoding each group holds 1 + num_speculative_tokens blocks.
    spec = {**PUBLISHED_FLAGS, "speculative-config": {"num_speculative_tokens": 1}}
    assert seed(flags=spec).state_blocks_per_request == 6


def test_kv_dtype_moves_the_block_not_the_page():
    fp8, bf16, fp4 = seed("FP8"), seed(None), seed("NVFP4")
    assert (fp8.attention_bytes_per_token, bf16.attention_bytes_per_token) == (1024, 2048)
    assert fp4.attention_bytes_per_token == 2 * 2 * (128 + 16)  # fp4 data + fp8 scales
    assert (fp8.block_size, bf16.block_size, fp4.block_size) == (2176, 1088, 3776)
    assert fp8.page_size_bytes == bf16.page_size_bytes == 2_228_224
    assert fp4.page_size_bytes == 3776 * 576 == 2_174_976
    assert bf16.kv_cache_dtype == "auto" and "bfloat16" in bf16.assumptions[0]
    assert (bf16.endpoint_at_mean_length, fp4.endpoint_at_mean_length) == (2480, 5128)
    # --kv-cache-dtype wins over the checkpoint.
    assert seed("NVFP4", flags={**SEED_FLAGS, "kv-cache-dtype": "fp8"}).block_size == 2176


def test_without_bf16_ssm_flag_qwen35_keeps_fp32_state():
    flags = {k: v for k, v in SEED_FLAGS.items() if k != "mamba-ssm-cache-dtype"}
    r = seed(flags=flags)
    assert r.ssm_dtype == "float32" and r.mamba_state_bytes == 4_268_032
    assert r.block_size == 64 * 66 == 4224
    assert r.num_gpu_blocks == 124_247_920_415 // (15 * 4224 * 1024) == 1915
    # Qwen3-Next has no such hook: auto is the model dtype.
    tiny = kv.ModelFacts.from_config(TINY)
    assert gdn_hybrid.mamba_dtypes(tiny, kv.EngineArgs())[:2] == ("bfloat16", "bfloat16")


def test_num_gpu_blocks_override_and_explicit_cache_size():
    r = seed(flags={**SEED_FLAGS, "num-gpu-blocks-override": 1000})
    assert r.num_gpu_blocks == 1000 and r.per_rank_at_max_length == 999 // 11 == 90
    r = seed(flags={**SEED_FLAGS, "kv-cache-memory-bytes": 33_423_360 * 100})
    assert (r.num_gpu_blocks, r.overhead_bytes) == (100, 0)


def test_tp_splits_gdn_heads_and_replicates_kv_heads():
    r = qwen35_block(4, "auto")
    assert r.attention_bytes_per_token == 2 * 1 * 256 * 2  # 2 KV heads // 4 -> 1, replicated
    assert r.mamba_state_bytes == 3072 * 3 * 2 + 16 * 128 * 128 * 4
    with pytest.raises(ValueError):
        qwen35_block(3, "auto")  # 64 value heads do not divide by 3 (vLLM asserts)


def test_weights_per_gpu():
    # Qwen3.5-397B counted from its architecture (docs section 7).
    w = gdn_hybrid.count_weights(QWEN35_TEXT, "nvfp4")
    assert (w.dense_params, w.expert_params) == (9_799_293_696, 386_547_056_640)
    lean = kv.EngineArgs(language_model_only=True)
    assert kv.weight_bytes_per_gpu(w, DEP8, "bfloat16", lean) == 46_777_677_312
    # MTP loads only with speculative decoding; the vision tower unless language-model-only.
    spec = kv.EngineArgs(language_model_only=True, num_speculative_tokens=1)
    assert kv.weight_bytes_per_gpu(w, DEP8, "bfloat16", spec) == 46_777_677_312 + 2 * w.mtp_params
    seen = kv.WeightFacts(0, 0, vision_params=1000)
    assert kv.weight_bytes_per_gpu(seen, DEP8, "bfloat16", kv.EngineArgs()) == 2000
    assert kv.weight_bytes_per_gpu(seen, DEP8, "bfloat16", lean) == 0
    # Without expert parallelism the experts split over TP only.
    assert kv.Parallelism(tp=2, dp=4).ep == 2 and kv.Parallelism(2, 4, True).ep == 8


# ----- the tiny CI models (docs section 10) -------------------------------------------------


def tiny(device, model=TINY, weights=None, **engine):
    facts = kv.ModelFacts.from_config(model, weights=weights)
    flags = {"mamba_ssm_cache_dtype": "bfloat16", "kv_cache_memory_bytes": MIB64, **engine}
    return kv.estimate(facts, kv.EngineArgs(**flags), kv.Parallelism(), device,
                       kv.Workload(128, 16))  # fmt: skip


def test_tiny_hybrid_on_gpu_and_cpu():
    gpu, cpu = tiny(kv.Device(80, "h100")), tiny(kv.Device(24, "cpu"))
    for r in (gpu, cpu):
        assert (r.attention_bytes_per_token, r.mamba_state_bytes) == (512, 3072 + 32_768)
        assert (r.layers_per_group, r.attention_groups, r.mamba_groups) == (1, 1, 3)
    assert (gpu.block_size, gpu.page_size_bytes, gpu.mamba_padding_pct) == (80, 40_960, 14.29)
    assert (cpu.block_size, cpu.page_size_bytes, cpu.mamba_padding_pct) == (128, 65_536, 82.86)
    assert (gpu.num_gpu_blocks, cpu.num_gpu_blocks) == (1638, 1024)
    assert gpu.blocks_per_request_at_max == cpu.blocks_per_request_at_max == 2 + 3
    assert (gpu.per_rank_at_max_length, cpu.per_rank_at_max_length) == (327, 204)
    # align mode, no FlashInfer GDN (key dim 64): 2 blocks per GDN group in vLLM's line.
    assert (gpu.vllm_log_max_concurrency, cpu.vllm_log_max_concurrency) == (51.19, 46.55)
    # Prefix caching off: the same blocks (no 64 grid to lose), 1 per GDN group in the line:
    # GPU 1,638 / (26 + 3) = 56.48x, CPU 1,024 / (16 + 3) = 53.89x; requests the same.
    gpu_off = tiny(kv.Device(80, "h100"), enable_prefix_caching=False)
    cpu_off = tiny(kv.Device(24, "cpu"), enable_prefix_caching=False)
    assert (gpu_off.block_size, cpu_off.block_size) == (80, 128)
    assert (gpu_off.vllm_log_max_concurrency, cpu_off.vllm_log_max_concurrency) == (56.48, 53.89)
    assert (gpu_off.per_rank_at_max_length, cpu_off.per_rank_at_max_length) == (327, 204)


def test_tiny_parameter_count():
    w = gdn_hybrid.count_weights(TINY)
    assert (w.dense_params, w.expert_params) == (1_728_088, 3_145_728)


def test_dense_model_uses_the_backend_block():
    r = tiny(kv.Device(80, "h100"), model=DENSE)
    assert (r.block_size, r.bytes_per_block, r.mamba_groups) == (16, 2 * 16 * 512, 0)
    assert r.num_gpu_blocks == 4096 and r.blocks_per_request_at_max == 9
    assert r.per_rank_at_max_length == 4095 // 9 == 455
    assert r.vllm_log_max_concurrency == 32.0  # 4096 / (2048 / 16)
    assert tiny(kv.Device(80, "h100"), model=DENSE, block_size=32).block_size == 32


# ----- the random dataset (docs section 8) --------------------------------------------------


def test_random_dataset_lengths():
    seed_lengths = kv.random_dataset_lengths(SWEEP)
    assert seed_lengths == kv.Lengths(1638, 14746, 204, 1844)
    # 10/4 at r=0.5: inputs 5..15, outputs 2..6; T = 7..21. With blocks of 8:
    # E[ceil(T/8)] = 1 + P(T>8) + P(T>16) = 1 + 52/55 + 15/55 = 122/55.
    small = kv.random_dataset_lengths(kv.Workload(10, 4, 0.5))
    assert small == kv.Lengths(5, 15, 2, 6)
    assert small.expected_blocks(8) == pytest.approx(122 / 55)
    assert (small.mean_total, small.max_total) == (14.0, 21)
    # Per-side ratios, special tokens and a prefix.
    mixed = kv.Workload(100, 10, {"input": 0.5, "output": 0.0}, num_special_tokens=1, prefix_len=7)
    assert kv.random_dataset_lengths(mixed) == kv.Lengths(7 + 49, 7 + 149, 10, 10)
    assert kv.random_dataset_lengths(kv.Workload(10, 1, 0.9)).output_low == 1
    with pytest.raises(ValueError):
        kv.random_dataset_lengths(kv.Workload(10, 4, 1.0))


# ----- reading a checkpoint -----------------------------------------------------------------


def test_kv_dtype_from_modelopt_configs():
    assert kv.kv_dtype_from_quant_config(modelopt("FP8"))[0] == "fp8_e4m3"
    assert kv.kv_dtype_from_quant_config(modelopt("NVFP4"))[0] == "nvfp4"
    assert kv.kv_dtype_from_quant_config(modelopt(None)) == (None, "")
    assert kv.kv_dtype_from_quant_config(modelopt("INT4"))[0] == "auto"
    scheme = {"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": False, "num_bits": 8,
                                                              "type": "float"}}  # fmt: skip
    assert kv.kv_dtype_from_quant_config(scheme)[0] == "fp8_e4m3"
    # Not ModelOpt: vLLM does not read the KV scheme on this path.
    other = {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8}}
    assert kv.kv_dtype_from_quant_config(other) == (None, "")


def test_read_checkpoint(tmp_path):
    assert kv.read_checkpoint(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps(QWEN35))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(modelopt("FP8")))
    facts = kv.read_checkpoint(tmp_path)
    assert (facts.full_attention_layers, facts.linear_attention_layers) == (15, 45)
    assert (facts.linear_num_value_heads, facts.mamba_ssm_dtype) == (64, "float32")
    assert facts.kv_cache_quant_algo == "fp8_e4m3"
    assert facts.sources["kv_cache_quant_algo"].startswith(f"{tmp_path}/hf_quant_config.json")
    assert facts.sources["linear_num_value_heads"].endswith("text_config.linear_num_value_heads")
    assert facts.weights.dense_params == 9_799_293_696
    assert facts.weights.expert_format == "nvfp4"
    # config.json's quantization_config wins over hf_quant_config.json.
    (tmp_path / "config.json").write_text(
        json.dumps({**QWEN35, "quantization_config": modelopt(None)})
    )
    assert kv.read_checkpoint(tmp_path).kv_cache_quant_algo is None


def test_full_attention_interval_and_recipe_facts():
    no_list = {**QWEN35_TEXT, "layer_types": None, "full_attention_interval": 4}
    facts = kv.ModelFacts.from_config(no_list)
    assert (facts.full_attention_layers, facts.linear_attention_layers) == (15, 45)
    recipe = {"total_params_b": 397, "dense_params_b": 10, "weight_bits": 4.5,
              "full_attention_layers": 15, "num_kv_heads": 2, "head_dim": 256, "gdn_layers": 45,
              "gdn_key_heads": 16, "gdn_value_heads": 64, "gdn_key_head_dim": 128,
              "gdn_value_head_dim": 128, "conv_kernel": 4, "ssm_state_dtype": "float32"}  # fmt: skip
    from launcher.schema.sections import DeclaredFacts

    facts = kv.ModelFacts.from_declared(DeclaredFacts(**recipe))
    assert facts.weights.expert_params == 387_000_000_000
    assert facts.weights.expert_format == "nvfp4" and facts.sources["head_dim"] == "recipe"
    engine = kv.EngineArgs.from_flags(SEED_FLAGS)
    r = kv.estimate(facts, engine, DEP8, kv.Device(184), SWEEP)
    assert r.block_size == 1088 and r.mamba_state_bytes == 2_170_880  # no KV algo: bf16
    facts = kv.ModelFacts.from_declared(DeclaredFacts(**recipe, kv_cache_quant_algo="FP8"))
    assert kv.estimate(facts, engine, DEP8, kv.Device(184), SWEEP).block_size == 2176
    # one fact, not two that could disagree: `hybrid` follows from the GDN layer count
    assert kv.ModelFacts.from_declared(DeclaredFacts(**recipe)).hybrid
    with pytest.raises(ValueError, match="hybrid: true but gdn_layers is 0"):
        DeclaredFacts(**{**recipe, "gdn_layers": 0}, hybrid=True)


def test_unmodelled_layers_are_refused():
    swa = {**DENSE, "layer_types": ["sliding_attention", "full_attention"]}
    with pytest.raises(ValueError):
        kv.estimate(kv.ModelFacts.from_config(swa), kv.EngineArgs(), kv.Parallelism(),
                    kv.Device(80), kv.Workload(10, 1))  # fmt: skip


def test_describe_prints_the_reasoning_and_the_assumptions():
    first, pages, per, steady, prefix, rests = seed().describe().splitlines()
    # a running request holds its prompt and the output so far: more fit than at full length
    assert "at steady state a running request holds" in steady and "2,696 if every one" in steady
    assert "3,840" in first and "2,696" in first and "2176 tokens" in first
    assert "2,176 tokens x 1,024 B = 2,228,224 B" in pages and "2.64 %" in pages
    assert "64-token grid" in pages and "3,717 blocks/rank, 3,716 usable" in pages
    assert "4.74 attention blocks" in per and "+ 3 GDN state blocks" in per
    assert "= 7.74 -> 480/rank x 8 = 3,840" in per
    assert "prefix caching on (vLLM's default for a generative model)" in prefix
    assert "mamba_cache_mode align" in prefix and "holds 3 state blocks (+3 for the step" in prefix
    assert "prefix caching off would give 2,128-token pages, 3,801 blocks/rank" in prefix
    assert "the same 3 state blocks, 3,880 requests" in prefix
    assert "fp8_e4m3" in rests and "10.0 GiB" in rests and "28.59x" in rests
    off = seed(flags=PUBLISHED_FLAGS).describe().splitlines()
    assert "prefix caching off (--no-enable-prefix-caching): mamba_cache_mode none" in off[4]
    assert "holds 3 state blocks whatever its length" in off[4] and "16-token grid" in off[1]
    assert "prefix caching on would give 2,176-token pages, 3,717 blocks/rank" in off[4]
    doc = seed().to_json()
    assert doc["endpoint_at_mean_length"] == 3840
    assert doc["other_prefix_caching"]["endpoint_at_mean_length"] == 3880
    # A dense model has no state and no prefix-caching line; small blocks in KiB.
    dense = tiny(kv.Device(80, "h100"), model=DENSE).describe().splitlines()
    assert len(dense) == 5 and "each of 2 layers (16 KiB)" in dense[1]
    assert "each of 1 layer (40 KiB)" in tiny(kv.Device(80, "h100")).describe()


def test_sizes_are_read_as_vllms_parser_reads_them():
    """vLLM takes human-readable sizes for these flags ("64M" = 64 MiB, "32k" = 32,000);
    the estimate must read them the same way, not give up on them."""
    a = kv.EngineArgs.from_flags({"kv-cache-memory-bytes": "64M", "max-model-len": "32k",
                                        "max-num-batched-tokens": "8K"})
    assert (a.kv_cache_memory_bytes, a.max_model_len, a.max_num_batched_tokens) == (
        64 * 2**20, 32_000, 8 * 1024)
    b = kv.EngineArgs.from_flags({"max-model-len": "auto", "kv-cache-memory-bytes": 1000})
    assert (b.max_model_len, b.kv_cache_memory_bytes) == (None, 1000)
    assert kv.EngineArgs.from_flags({"max-model-len": -1}).max_model_len is None


@pytest.mark.parametrize("arch, extra, words", [
    ("DeepseekV32ForCausalLM", {"kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                "index_topk": 2048}, "sparse attention indexer (index_topk"),
    ("DeepseekV4ForCausalLM", {"compress_ratios": [128, 4, 0], "sliding_window": 128},
     "its compressed sparse attention lacks index_head_dim in config.json"),
    ("DeepseekV4ForCausalLM", {"compress_ratios": [128, 16, 0], "sliding_window": 128,
                               "index_head_dim": 128}, "its compress ratios [16] are not"),
    ("DeepseekV4ForCausalLM", {"compress_ratios": [128, "4", None, True], "sliding_window": 128,
                               "index_head_dim": 128}, "its compress ratios ['4', True] are not"),
    ("DeepseekV4ForCausalLM", {"layer_types": ["hca", ["x"]], "compress_rates": {"hca": 128},
                               "sliding_window": 128, "index_head_dim": 128},
     "its compress ratios [['x']] are not"),
    ("GptOssForCausalLM", {"layer_types": ["sliding_attention", "full_attention"]},
     "its sliding_attention layers"),
    ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 4096},
     "sliding-window attention"),
])
def test_an_architecture_the_estimate_does_not_model_is_named_not_guessed(arch, extra, words):
    """A DeepSeek-V3.2 sparse-MLA, DeepSeek-V4 or sliding-window config.json gets one sentence naming its
    architecture, never a number from the full-attention formula."""
    cfg = {"architectures": [arch], "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 8, "hidden_size": 512, **extra}
    facts = kv.ModelFacts.from_config(cfg)
    assert words in facts.unmodelled
    with pytest.raises(kv.NoEstimate) as e:
        kv.estimate(facts, kv.EngineArgs.from_flags({}), kv.Parallelism(1, 1),
                          kv.Device(184.0), kv.Workload(1024, 1024, 0.8))
    assert str(e.value).startswith(f"no estimate for architecture {arch}: ")


def test_gqa_and_qwen_configs_stay_modelled():
    """MiniMax-M2's grouped-query attention (full attention, 8 KV heads of 128) and a Qwen2
    config whose sliding window is off are what the estimate models."""
    m2 = {"architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 62,
          "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
          "hidden_size": 3072, "attn_type_list": [1] * 62, "sliding_window": None}
    q2 = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 2, "hidden_size": 512, "use_sliding_window": False,
          "sliding_window": 4096}
    for cfg in (m2, q2):
        facts = kv.ModelFacts.from_config(cfg)
        assert facts.unmodelled == "" and facts.full_attention_layers == cfg["num_hidden_layers"]


# vLLM for CPU 0.32's start-up lines for a tiny random-weight DeepSeek-V3 (MLA) model: 3
# layers, kv_lora_rank 512 + qk_rope_head_dim 64, one MTP layer, --kv-cache-memory-bytes
# 64M, max-model-len 2048 (docs/kv-architectures.md section 5: "CPU KV cache size: N tokens,
# Maximum concurrency for 2,048 tokens per request: X x").
MLA_TINY = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 256,
            "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
            "num_nextn_predict_layers": 1, "max_position_embeddings": 2048,
            "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("flags, tokens, concurrency", [
    ({}, 19_408, 9.48),                                   # bf16: 1,213 blocks of 3 pages
    ({"kv-cache-dtype": "fp8"}, 38_832, 18.96),           # 1 byte per latent element
    ({"speculative-config": '{"method": "mtp", "num_speculative_tokens": 1}'},
     14_560, 7.11),                                       # the MTP layer: 4 pages per block
])
def test_mla_matches_vllm_cpu_start_up_lines(flags, tokens, concurrency):
    facts = kv.ModelFacts.from_config(MLA_TINY)
    assert facts.unmodelled == "" and facts.mla_latent_dim == 576
    e = kv.estimate(facts, kv.EngineArgs.from_flags(
        {"kv-cache-memory-bytes": "64M", "max-model-len": 2048, **flags}),
        kv.Parallelism(1, 1), kv.Device(64.0, "cpu"), kv.Workload(1024, 1024, 0.8))
    assert e.block_size == 16  # vLLM for CPU forces 16 for MLA
    assert e.vllm_log_kv_cache_tokens == tokens and e.vllm_log_max_concurrency == concurrency


def test_mla_latent_is_not_split_by_tensor_parallelism_and_follows_the_backend_block():
    """Kimi-K2.5 (DeepSeek-V3's attention, 61 layers of a 576-wide latent): a TP8 decode
    holds the whole latent on every GPU; without --block-size the block is the MLA backend's
    (FLASHINFER_MLA 32 on GB200, FLASHMLA 64, CUTLASS_MLA 128)."""
    cfg = {**MLA_TINY, "num_hidden_layers": 61, "num_nextn_predict_layers": 0}
    facts = kv.ModelFacts.from_config({"architectures": ["KimiK25ForConditionalGeneration"],
                                       "text_config": cfg})
    dev = kv.Device(184.0)

    def geometry(flags, tp):
        return kv.estimate(facts, kv.EngineArgs.from_flags(flags), kv.Parallelism(tp), dev,
                           kv.Workload(1024, 1024))

    geo = {tp: geometry({"kv-cache-dtype": "fp8"}, tp) for tp in (1, 8)}
    assert geo[1].attention_bytes_per_token == geo[8].attention_bytes_per_token == 576
    for backend, block in (("", 32), ("FLASHMLA", 64), ("CUTLASS_MLA", 128)):
        args = {"attention-backend": backend} if backend else {}
        assert geometry(args, 8).block_size == block
    assert geometry({"block-size": 64}, 8).block_size == 64


def test_pipeline_stages_hold_their_share_of_the_layers_and_the_fewest_blocks_rule():
    """TP8 x PP2 of a 61-layer MLA model: vLLM splits the layers 31 + 30 (the remainder to
    the stages before the last, get_pp_indices), each stage's GPUs hold its layers' pages
    and its share of the weights, and every stage gets the smallest num_blocks (the 31-layer
    stage's)."""
    assert kv.Parallelism(8, pp=2).stages(61) == [(0, 31), (31, 61)]
    assert kv.Parallelism(pp=4).stages(61) == [(0, 15), (15, 30), (30, 46), (46, 61)]
    cfg = {**MLA_TINY, "num_hidden_layers": 61, "num_nextn_predict_layers": 0}
    weights = kv.WeightFacts.from_billions(10, 500, expert_format="nvfp4")
    facts = kv.ModelFacts.from_config({"architectures": ["KimiK25ForConditionalGeneration"],
                                       "text_config": cfg}, weights=weights)
    page = 32 * 576  # FLASHINFER_MLA's 32-token block of an FP8 576-wide latent

    def run(pp, **flags):
        return kv.estimate(facts, kv.EngineArgs(kv_cache_dtype="fp8", **flags),
                           kv.Parallelism(8, pp=pp), kv.Device(184.0), kv.Workload(1024, 1024))

    fixed = {"kv_cache_memory_bytes": 40 * 2**30}
    one, two = run(1, **fixed), run(2, **fixed)
    assert (one.bytes_per_block, two.bytes_per_block) == (61 * page, 31 * page)
    assert two.num_gpu_blocks == 40 * 2**30 // (31 * page) > one.num_gpu_blocks
    assert (two.pp, two.vllm_log_kv_cache_tokens > one.vllm_log_kv_cache_tokens) == (2, True)
    assert "x PP2" in two.describe()
    assert any("layer caches 0-30 of 61" in a for a in two.assumptions)
    profiled_one, profiled_two = run(1), run(2)  # memory left after the stage's weights
    assert profiled_two.weights_bytes == -(-profiled_one.weights_bytes * 31 // 61)
    assert profiled_two.num_gpu_blocks == profiled_two.kv_cache_bytes // (31 * page)
    assert profiled_two.kv_cache_bytes - profiled_one.kv_cache_bytes == \
        profiled_one.weights_bytes - profiled_two.weights_bytes


# The same for a tiny MiniMaxM2 (grouped-query attention: 3 layers, 2 KV heads of 64), whose
# bf16 cache takes vLLM for CPU's default 128-token block (tests/vllm_cpu/kv_sizes.py).
GQA_TINY = {"architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
            "hidden_size": 256, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("flags, tokens, concurrency", [
    ({}, 43_648, 21.31),
    ({"kv-cache-dtype": "fp8", "block-size": 64}, 87_360, 42.66),
])
def test_gqa_matches_vllm_cpu_start_up_lines(flags, tokens, concurrency):
    e = kv.estimate(kv.ModelFacts.from_config(GQA_TINY), kv.EngineArgs.from_flags(
        {"kv-cache-memory-bytes": "64M", "max-model-len": 2048, **flags}),
        kv.Parallelism(1, 1), kv.Device(64.0, "cpu"), kv.Workload(1024, 1024, 0.8))
    assert e.vllm_log_kv_cache_tokens == tokens and e.vllm_log_max_concurrency == concurrency


# DeepSeek-V4 (docs/kv-architectures.md section 4). vLLM for CPU 0.32 logs, for a tiny
# random-weight model of two HCA and two CSA layers (tests/vllm_cpu/kv_sizes.py, 512 MiB,
# max-model-len 2048, --kv-cache-dtype fp8): "kv cache group sizes (64, 64, 256, 8, 4)" and
# "CPU KV cache size: 13,622 tokens, Maximum concurrency for 2,048 tokens per request: 6.65x";
# for six layers (2 HCA, 3 CSA, 1 sliding window only): 9,191 tokens, 4.49x.
V4_TINY = {"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 4,
           "compress_ratios": [128, 4, 128, 4], "sliding_window": 128, "head_dim": 512,
           "qk_rope_head_dim": 64, "index_head_dim": 128, "index_topk": 64,
           "num_key_value_heads": 1, "num_attention_heads": 8, "hidden_size": 256,
           "num_nextn_predict_layers": 0, "max_position_embeddings": 4096}


@pytest.mark.parametrize("ratios, block_bytes, tokens, concurrency", [
    ([128, 4, 128, 4], 95_616, 13_622, 6.65),  # balanced: one compressed group of 6 caches
    ([128, 4, 4, 128, 4, 0], 141_696, 9_191, 4.49),  # 2 HCA, 3 CSA, 1 sliding-window only
])
def test_deepseek_v4_matches_vllm_cpu_start_up_line(ratios, block_bytes, tokens, concurrency):
    facts = kv.ModelFacts.from_config({**V4_TINY, "num_hidden_layers": len(ratios),
                                       "compress_ratios": ratios})
    assert facts.unmodelled == "" and facts.compress_ratios == tuple(max(1, r) for r in ratios)
    e = kv.estimate(facts, kv.EngineArgs.from_flags(
        {"kv-cache-memory-bytes": "512M", "max-model-len": 2048, "kv-cache-dtype": "fp8"}),
        kv.Parallelism(1, 1), kv.Device(64.0, "cpu"), kv.Workload(1024, 1024, 0.8))
    assert (e.kv_cache_dtype, e.block_size, e.bytes_per_block) == ("fp8_ds_mla", 256,
                                                                   block_bytes)
    blocks = [int(x.split(", ")[1].split("-")[0]) for x in e.groups_text.split("; ")]
    assert blocks == [64, 64, 256, 8, 4]  # vLLM's "kv cache group sizes"
    assert e.num_gpu_blocks == 512 * 2**20 // block_bytes
    assert e.vllm_log_kv_cache_tokens == tokens and e.vllm_log_max_concurrency == concurrency


def _v4_pro(**over) -> kv.ModelFacts:
    """DeepSeek-V4-Pro as its config.json says it (the upstream layer_types form)."""
    ratios = [128, 128, *[4, 128] * 29, 4]
    names = {128: "heavily_compressed_attention", 4: "compressed_sparse_attention"}
    cfg = {"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 61,
           "layer_types": [names[r] for r in ratios],
           "compress_rates": {v: k for k, v in names.items()}, "sliding_window": 128,
           "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128, "index_topk": 1024,
           "num_key_value_heads": 1, "num_attention_heads": 128, "hidden_size": 7168,
           "num_nextn_predict_layers": 1, "max_position_embeddings": 1_048_576, **over}
    return kv.ModelFacts.from_config(cfg)


def test_deepseek_v4_pro_groups_and_what_a_request_holds():
    """vLLM 0.33's packed grouping of DeepSeek-V4-Pro's 61 layers: two sliding-window groups
    (31 + 30), the compressed KV with the indexer keys (91 caches, the widest: a block id is
    1,435,968 B), the HCA and the CSA compressor states; a decoding request holds its
    compressed blocks and 26 window blocks whatever its length. With MTP (k = 2) and MXFP4
    indexer keys: 31 + 31 sliding-window caches, 1,315,008 B, 30 window blocks. The
    start-up line of the DEP8 decode (29,154 blocks, 9,280 tokens, 512 batched tokens with
    async scheduling: 1,024 in flight) is 60.86x."""
    facts = _v4_pro()
    assert facts.unmodelled == "" and len(facts.compress_ratios) == 61
    flags = {"kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 9280,
             "max-num-batched-tokens": 512, "kv-cache-memory-bytes": 29_154 * 1_435_968 + 7}
    e = kv.estimate(facts, kv.EngineArgs.from_flags(flags), kv.Parallelism(1, 8, True),
                    kv.Device(184.0), kv.Workload(8192, 1024, 0.8, rule="sa-bench"))
    pages = [int(x.split(": ")[1].removesuffix(" B)").replace(",", ""))
             for x in e.groups_text.split("; ")]
    assert pages == [1_160_640, 1_123_200, 1_435_968, 1_017_792, 1_244_160]
    assert e.bytes_per_block == 1_435_968 and e.num_gpu_blocks == 29_154
    assert e.state_blocks_per_request == 26 and e.blocks_per_request_at_max == 36 + 26
    assert e.vllm_log_max_concurrency == 60.86
    mtp = kv.EngineArgs.from_flags({**flags, "attention-config": '{"use_fp4_indexer_cache":true}',
                                    "speculative-config": {"method": "mtp",
                                                           "num_speculative_tokens": 2}})
    m = kv.estimate(facts, mtp, kv.Parallelism(1, 8, True), kv.Device(184.0),
                    kv.Workload(8192, 1024, 0.8, rule="sa-bench"))
    assert m.bytes_per_block == 1_315_008 and m.state_blocks_per_request == 30
    assert "31 caches, 64-token blocks" in m.groups_text.split("; ")[1]
    # one line of DeclaredFacts gives the same layout as config.json
    declared = kv.ModelFacts.from_declared(DeclaredFacts(
        full_attention_layers=61, num_kv_heads=1, head_dim=512, total_params_b=1,
        compress_ratios=[128, 128, *[4, 128] * 29, 4, 0], sliding_window=128,
        index_head_dim=128, mtp_layers=1))
    assert kv.estimate(declared, mtp, kv.Parallelism(1, 8, True), kv.Device(184.0),
                       kv.Workload(8192, 1024, 0.8)).bytes_per_block == 1_315_008


@pytest.mark.parametrize("facts, words", [
    ({"compress_ratios": [128, 4, 4]}, "without sliding_window and index_head_dim"),
    ({"compress_ratios": [128, 4, 2], "sliding_window": 128, "index_head_dim": 128},
     "compress_ratios has [2]"),
    ({"compress_ratios": [128], "sliding_window": 128, "index_head_dim": 128},
     "has 1 entries for 3 layers"),
])
def test_declared_deepseek_v4_facts_that_do_not_describe_its_cache_are_named(facts, words):
    d = DeclaredFacts(full_attention_layers=3, num_kv_heads=1, head_dim=512, total_params_b=1,
                      **facts)
    with pytest.raises(kv.NoEstimate) as e:
        kv.estimate(kv.ModelFacts.from_declared(d), kv.EngineArgs.from_flags({}),
                    kv.Parallelism(1, 1), kv.Device(184.0), kv.Workload(1024, 1024, 0.8))
    assert words in str(e.value), e.value


def test_deepseek_v4_refuses_what_vllm_refuses():
    facts = kv.ModelFacts.from_config(V4_TINY)
    for flags, words in (({"kv-cache-dtype": "bfloat16"}, "FlashMLA layout takes auto, fp8"),
                         ({"block-size": 64}, "take 256 only"),
                         ({"disable-hybrid-kv-cache-manager": True}, "keeps each window")):
        with pytest.raises(ValueError) as e:
            kv.estimate(facts, kv.EngineArgs.from_flags(flags), kv.Parallelism(1, 1),
                        kv.Device(184.0), kv.Workload(1024, 1024, 0.8))
        assert words in str(e.value)


def test_an_mtp_layer_weighs_one_decoder_layer_when_the_counts_leave_it_out():
    w = kv.WeightFacts.from_billions(25.5, 1547.4, expert_format="nvfp4", expert_bits=4.25,
                                     dense_bits=9.0, layers=61, mtp_layers=1)
    par = kv.Parallelism(1, 8, True)
    plain = kv.weight_bytes_per_gpu(w, par, "bfloat16", kv.EngineArgs())
    assert plain == pytest.approx(25.5e9 * 9 / 8 + 1547.4e9 * 4.25 / 8 / 8, rel=1e-9)
    spec = kv.EngineArgs(num_speculative_tokens=2, speculative_method="mtp")
    assert kv.weight_bytes_per_gpu(w, par, "bfloat16", spec) == pytest.approx(plain * 62 / 61,
                                                                              rel=1e-9)


def test_an_attention_config_that_is_not_an_object_leaves_the_indexer_fp8():
    """An image other than 0.33 has its flags judged by its own parser at preflight; the
    estimate meanwhile reads no indexer dtype from a value that is not a JSON object."""
    for value in ("[1]", "3", [1]):
        assert kv.EngineArgs.from_flags({"attention-config": value}).indexer_fp4 is False
    assert kv.EngineArgs.from_flags(
        {"attention-config": '{"indexer_kv_dtype": "mxfp4"}'}).indexer_fp4 is True
