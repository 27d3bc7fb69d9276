"""The sim takes `vllm serve`'s argv unchanged; knobs come from SIM_* env or --sim-* flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from simprocs import sim_env

from launcher.sim import knobs
from launcher.sim.argv import VllmArgError
from launcher.sim.cli import UsageError, parse
from launcher.sim.engine import Interval
from launcher.sim.statslog import kv_message

KV_P = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer"})


def test_renderer_argv_is_accepted_and_unmodelled_flags_listed():
    cfg = parse([
        "serve", "nvidia/Qwen3.5-397B-A17B-NVFP4", "--host", "10.0.0.1", "--port", "8100",
        "--served-model-name", "qwen", "--data-parallel-size", "8",
        "--data-parallel-size-local", "4", "--data-parallel-address", "10.0.0.1",
        "--data-parallel-rpc-port", "29550", "--tensor-parallel-size", "1",
        "--enable-expert-parallel", "--all2all-backend", "deepep_low_latency",
        "--kv-transfer-config", KV_P, "--block-size", "1056", "--num-gpu-blocks-override",
        "2731", "--max-num-seqs", "512", "--max-num-batched-tokens", "16384",
        "--max-model-len", "32768", "--stream-interval", "100", "--api-server-count", "1",
        "--async-scheduling", "--mamba-ssm-cache-dtype", "bfloat16", "--language-model-only",
        "--gdn-prefill-backend", "flashinfer", "--gpu-memory-utilization", "0.85",
        "--trust-remote-code", "--kv-cache-dtype", "fp8", "--enforce-eager",
        "--disable-log-requests", "--disable-auto-tool-choice",
    ], env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5700",
            "VLLM_LOG_STATS_INTERVAL": "5"})
    assert cfg.served_model_name == "qwen" and cfg.port == 8100
    assert (cfg.dp_size, cfg.dp_size_local, cfg.dp_start_rank) == (8, 4, 0)
    assert cfg.is_producer and not cfg.is_consumer
    assert (cfg.block_size, cfg.num_gpu_blocks, cfg.stream_interval) == (1056, 2731, 100)
    assert cfg.side_channel_host == "10.0.0.1" and cfg.side_channel_port == 5700
    assert cfg.log_stats_interval == 5.0 and cfg.stats_logging
    assert cfg.engine_id and cfg.kv_lease_s == 30.0
    assert "--all2all-backend" in cfg.ignored_flags and "--enforce-eager" in cfg.ignored_flags
    # listed once, under the flag's first name (--disable-auto-tool-choice is
    # --enable-auto-tool-choice's negative form in vLLM 0.33); --enable-log-requests is
    # modelled (the sim's per-request line, docs/agentic.md)
    assert "--enable-auto-tool-choice" in cfg.ignored_flags
    assert "--enable-log-requests" not in cfg.ignored_flags and not cfg.log_requests
    assert len(cfg.ignored_flags) == len(set(cfg.ignored_flags))
    assert "--block-size" not in cfg.ignored_flags


def test_api_server_count_defaults_like_vllm():
    assert parse(["serve", "m", "-dp", "4"], env={}).api_server_count == 4
    assert not parse(["serve", "m", "-dp", "4"], env={}).stats_logging
    headless = parse(["serve", "m", "-dp", "4", "-dpl", "2", "-dpr", "2", "--headless"], env={})
    assert headless.api_server_count == 0 and not headless.stats_logging
    assert headless.local_ranks == [2, 3]
    with pytest.raises(UsageError, match="api-server-count"):
        parse(["serve", "m", "--headless", "--api-server-count", "2"], env={})
    with pytest.raises(VllmArgError, match="Please specify kv_role when kv_connector is set"):
        parse(["serve", "m", "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'],
              env={})
    with pytest.raises(UsageError, match="do not fit"):
        parse(["serve", "m", "-dp", "2", "-dpl", "2", "-dpr", "1"], env={})


def test_knobs_from_env_and_flags():
    cfg = parse(["serve", "m", "--sim-speed", "8", "--sim-zero-tokens", "1"],
                env={"SIM_SPEED": "2", "SIM_KV_FAIL_FRACTION": "0.25", "SIM_CRASH_AFTER_S": "3"})
    assert cfg.knobs.speed == 8.0  # the flag wins over the env
    assert cfg.knobs.zero_tokens is True
    assert cfg.knobs.kv_fail_fraction == 0.25 and cfg.knobs.crash_after_s == 3.0
    with pytest.raises(UsageError, match="SIM_SPEED"):
        parse(["serve", "m"], env={"SIM_SPEED": "fast"})
    for name in knobs.Knobs.names():
        assert knobs.Knobs.doc(name), f"knob {name} has no doc"
    assert "SIM_KV_FAIL_FRACTION" in knobs.describe()


def test_usage_errors_are_vllms_argparse_errors_without_traceback():
    p = subprocess.run([sys.executable, "-m", "launcher.sim", "serve", "m",
                        "--kv-transfer-config", "{not json"],
                       capture_output=True, text=True, timeout=30, env=sim_env())
    assert p.returncode == 2
    assert p.stderr.startswith(
        "usage: vllm serve [model_tag] [options]\nvllm serve: error: argument "
        "--kv-transfer-config: 1 validation error for KVTransferConfig\n  Invalid JSON: ")
    assert "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-m", "launcher.sim", "serve", "m", "--sim-speed", "x"],
                       capture_output=True, text=True, timeout=30, env=sim_env())
    assert p.returncode == 2 and p.stderr.startswith("error: SIM_SPEED")


def test_kv_transfer_line_prints_zeros_as_ints_without_successes():
    iv = Interval()
    iv.expired = 3
    assert kv_message(iv) == (
        "KV Transfer metrics: Num successful transfers=0, Avg xfer time (ms)=0, P90 xfer time "
        "(ms)=0, Avg post time (ms)=0, P90 post time (ms)=0, Avg MB per transfer=0, "
        "Throughput (MB/s)=0, Avg number of descriptors=0, Num failed transfers=0, "
        "Num KV expired reqs=3, Num notifs after expiry=0")
    assert kv_message(Interval()) is None
    iv = Interval(xfer_s=[0.03, 0.04], post_s=[0.002, 0.003], bytes=[2**20 * 150, 2**20 * 170],
                  descs=[2000, 2400])
    msg = kv_message(iv)
    assert msg is not None
    assert "Num successful transfers=2, Avg xfer time (ms)=35.0, P90 xfer time (ms)=39.0" in msg
    assert "Avg MB per transfer=160.0, Throughput (MB/s)=4571.429" in msg
    assert "Avg number of descriptors=2200.0" in msg


def test_a_kv_cache_smaller_than_one_request_stops_the_engine_like_vllm():
    p = subprocess.run([sys.executable, "-m", "launcher.sim", "serve", "m", "--port", "1",
                        "--max-model-len", "4096"],
                       capture_output=True, text=True, timeout=30,
                       env=sim_env(SIM_KV_CAPACITY_TOKENS="1024"))  # fmt: skip
    assert p.returncode == 1
    assert "To serve at least one request with the models's max seq len (4096)" in p.stderr
    assert "estimated maximum model length is 1024" in p.stderr
