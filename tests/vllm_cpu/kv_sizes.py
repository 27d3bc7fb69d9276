"""The KV estimate against real vLLM's own KV-cache size, one tiny random-weight model per
architecture: `.venv/bin/python tests/vllm_cpu/kv_sizes.py` (after tests/vllm_cpu/setup.sh).

For each case it writes a config.json (with tiny-dense's tokenizer), starts real vLLM for CPU
(`--load-format dummy`, `--kv-cache-memory-bytes 64M`, `--max-model-len 2048`), reads its
start-up line "CPU KV cache size: N tokens, Maximum concurrency for 2,048 tokens per
request: X x", stops it, and prints N and X beside launcher.planning.kv.s estimate for
the same config and flags. About a minute per case on two cores; not part of `make test`
(tests/test_kv_cache.py pins the numbers this printed, docs/kv-architectures.md section 5).
Exits non-zero when a case disagrees.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = Path("/var/tmp/pd-vllm-cpu")
VLLM = ROOT / "venv" / "bin" / "vllm"
TOKENIZER = ROOT / "models" / "tiny-dense"
LINE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for [\d,]+ tokens per "
                  r"request: ([\d.]+)x")
COMMON = {"bos_token_id": 0, "eos_token_id": 1, "vocab_size": 512, "torch_dtype": "bfloat16",
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
          "tie_word_embeddings": False, "hidden_act": "silu"}
MLA = {**COMMON, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
       "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
       "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
       "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
       "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
       "norm_topk_prob": True, "routed_scaling_factor": 1.0, "scoring_func": "sigmoid",
       "topk_method": "noaux_tc", "kv_lora_rank": 512, "q_lora_rank": None,
       "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
       "num_nextn_predict_layers": 0}
GQA = {**COMMON, "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
       "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 64, "hidden_size": 256, "intermediate_size": 128, "num_local_experts": 4,
       "num_experts_per_tok": 2, "scoring_func": "softmax", "use_routing_bias": True,
       "rotary_dim": 32, "use_qk_norm": True, "qk_norm_type": "per_layer",
       "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
# DeepSeek-V4: two HCA and two CSA layers (head 512, indexer head 128, window 128); vLLM for
# CPU logs its start-up line, then its first forward needs Triton's CPU backend or AMX
V4 = {**COMMON, "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
      "num_hidden_layers": 4, "compress_ratios": [128, 4, 128, 4], "sliding_window": 128,
      "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 128, "index_n_heads": 4,
      "index_topk": 64, "num_attention_heads": 8, "num_key_value_heads": 1, "hidden_size": 256,
      "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 64, "moe_intermediate_size": 128,
      "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "hc_mult": 2,
      "num_nextn_predict_layers": 0, "scoring_func": "sqrtsoftplus", "num_hash_layers": 0,
      "hc_eps": 1e-6, "hc_sinkhorn_iters": 3, "compress_rope_theta": 10000.0,
      "swiglu_limit": 10.0, "norm_topk_prob": True}
CASES = [  # (name, config, extra flags); --kv-cache-memory-bytes 64M unless given
    ("MLA (DeepSeek-V3), bf16", MLA, []),
    ("MLA (DeepSeek-V3), fp8", MLA, ["--kv-cache-dtype", "fp8"]),
    ("GQA (MiniMax-M2), bf16", GQA, []),
    ("GQA (MiniMax-M2), fp8, block 64", GQA, ["--kv-cache-dtype", "fp8", "--block-size", "64"]),
    ("DeepSeek-V4, fp8 -> fp8_ds_mla, 512M", V4,
     ["--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "512M"]),
    ("DeepSeek-V4, 6 layers 2 HCA 3 CSA 1 SWA", {**V4, "num_hidden_layers": 6,
                                                "compress_ratios": [128, 4, 4, 128, 4, 0]},
     ["--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "512M"]),
]


def vllm_line(model: Path, flags: list[str], port: int) -> tuple[int, float] | str:
    log = model / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(VLLM), "serve", str(model), "--load-format", "dummy", "--kv-cache-memory-bytes",
             "64M", "--max-model-len", "2048", "--port", str(port), "--trust-remote-code",
             *flags],  # a later --kv-cache-memory-bytes in flags wins
            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            m = LINE.search(log.read_text(errors="replace"))
            if m:
                return int(m.group(1).replace(",", "")), float(m.group(2))
            if proc.poll() is not None:
                return f"exited {proc.returncode} before its KV line (see {log})"
            time.sleep(1)
        return "no KV line in 600 s"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def estimate(cfg: dict, flags: list[str]) -> tuple[int, float]:
    from launcher.planning import kv

    args = {"kv-cache-memory-bytes": "64M", "max-model-len": 2048}
    for k, v in zip(flags[::2], flags[1::2], strict=True):
        args[k.lstrip("-")] = v
    e = kv.estimate(kv.ModelFacts.from_config(cfg), kv.EngineArgs.from_flags(args),
                    kv.Parallelism(1, 1), kv.Device(64.0, "cpu"), kv.Workload(1024, 1024, 0.8))
    return e.vllm_log_kv_cache_tokens, e.vllm_log_max_concurrency


def main() -> int:
    sys.path.insert(0, str(REPO))
    only = sys.argv[1:]  # substrings of case names, to run a few
    if not VLLM.exists():
        print(f"{VLLM} is missing: run bash tests/vllm_cpu/setup.sh first")
        return 2
    bad = 0
    print(f"{'case':36} {'vLLM tokens':>12} {'estimate':>9} {'vLLM x':>8} {'estimate x':>10}")
    for i, (name, cfg, flags) in enumerate(CASES):
        if only and not any(o in name for o in only):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp)
            (model / "config.json").write_text(json.dumps(cfg))
            for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
                shutil.copy(TOKENIZER / f, model / f)
            got = vllm_line(model, flags, 28990 + i)
            want = estimate(cfg, flags)
            if isinstance(got, str):
                print(f"{name:36} {got}")
                bad += 1
                continue
            same = got[0] == want[0] and abs(got[1] - want[1]) < 0.01
            bad += not same
            print(f"{name:36} {got[0]:>12,} {want[0]:>9,} {got[1]:>8.2f} {want[1]:>10.2f}"
                  + ("" if same else "  DIFFERENT"), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
