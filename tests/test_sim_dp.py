"""Multi-node DP: a head (API server, ranks 0-1) and a headless part (ranks 2-3).

Like vLLM, the head is not healthy until the headless part has registered its ranks; the
head reports engines 0..3; a decode pulls KV of rank 3 from the headless part's own side
channel; the head prints the stats lines, the headless part none; when the headless part
dies the head exits non-zero.
"""

from __future__ import annotations

import signal
import time

import pytest
from helpers import wait_for
from simprocs import free_ports, http_json, kv_config, sample, scrape, start_sim

pytestmark = pytest.mark.timeout(90)


def test_head_waits_for_headless_then_serves_all_ranks(tmp_path):
    rpc = free_ports(1)
    base = free_ports(4)
    dp = ("--data-parallel-size", "4", "--data-parallel-size-local", "2",
          "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc),
          "--kv-transfer-config", kv_config("kv_producer"), "--max-model-len", "32768")
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(base), "VLLM_LOG_STATS_INTERVAL": "1",
           "SIM_SPEED": "20"}
    head = start_sim(tmp_path, "prefill-0@node0", "m", *dp, "--api-server-count", "1", **env)
    procs = [head]
    try:
        time.sleep(1.5)
        assert head.proc.poll() is None and not head.healthy()  # waiting for ranks 2-3
        headless = start_sim(tmp_path, "prefill-0@node1", "m", *dp, "--headless",
                             "--data-parallel-start-rank", "2", headless=True, **env)
        procs.append(headless)
        head.wait_healthy(20)
        text = scrape(head.url)
        engines = {line.split('engine="')[1].split('"')[0]
                   for line in text.splitlines() if line.startswith("vllm:num_requests_running")}
        assert engines == {"0", "1", "2", "3"}

        decode = start_sim(tmp_path, "decode-0", "m", "--kv-transfer-config",
                           kv_config("kv_consumer"), "--max-model-len", "32768",
                           VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)), SIM_SPEED="20")
        procs.append(decode)
        decode.wait_healthy(20)
        prompt = "Question: how many ranks? " * 40
        for rank in range(4):
            status, p = http_json(head.url + "/v1/completions", {
                "prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}},
                headers={"X-data-parallel-rank": str(rank)})
            assert status == 200
            params = p["kv_transfer_params"]
            assert params["remote_engine_id"].endswith(f"_dp{rank}")
            assert params["remote_port"] == base + rank  # rank 2-3: the headless listeners
            status, d = http_json(decode.url + "/v1/completions", {
                "prompt": prompt, "max_tokens": 6, "kv_transfer_params": params}, timeout=20)
            assert status == 200, d
            assert d["usage"]["completion_tokens"] == 6
        text = scrape(head.url)
        for rank in range(4):
            assert sample(text, "vllm:request_success_total", engine=str(rank),
                          finished_reason="length") == 1
            # the decode's notification reached the head through the headless relay
            assert sample(text, "vllm:kv_cache_usage_perc", engine=str(rank)) == 0.0
        assert sample(scrape(decode.url), "vllm:nixl_bytes_transferred_count") == 4

        wait_for(lambda: all(f"Engine {r:03d}: Avg prompt throughput" in head.log_text()
                             for r in range(4)), 10, "every rank's stats line on the head")
        head_log, headless_log = head.log_text(), headless.log_text()
        for rank in range(4):
            assert f"Engine {rank:03d}: Avg prompt throughput" in head_log
        assert "Avg prompt throughput" not in headless_log
        assert "SIMULATED engine" in headless_log

        headless.proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while head.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert head.proc.returncode not in (None, 0)
        assert "died unexpectedly" in head.log_text()
    finally:
        for p in reversed(procs):
            p.stop()


def test_headless_refuses_to_start_without_head_and_says_why(tmp_path):
    rpc = free_ports(1)
    part = start_sim(tmp_path, "decode-0@node1", "m", "--data-parallel-size", "2",
                     "--data-parallel-size-local", "1", "--data-parallel-start-rank", "1",
                     "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port",
                     str(rpc), "--headless", headless=True, SIM_HEADLESS_WAIT_S="1")
    try:
        assert part.proc.wait(10) != 0
        assert f"127.0.0.1:{rpc}" in part.log_text()
    finally:
        part.stop()
