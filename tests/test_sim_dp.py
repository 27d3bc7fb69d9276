"""Multi-node DP: a head (API server, ranks 0-1) and a headless part (ranks 2-3); and the
hybrid-LB layout, one front per node, each serving only its own ranks.

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

from launcher.sim.argv import VllmStartupError
from launcher.sim.cli import parse

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


# ----- hybrid LB: one front per node (--data-parallel-hybrid-lb) ------------------------------


def _hybrid(rpc: int, start: int, role: str) -> tuple[str, ...]:
    return ("--data-parallel-size", "4", "--data-parallel-size-local", "2",
            "--data-parallel-start-rank", str(start), "--data-parallel-address", "127.0.0.1",
            "--data-parallel-rpc-port", str(rpc), "--data-parallel-hybrid-lb",
            "--api-server-count", "1", "--kv-transfer-config", kv_config(role),
            "--max-model-len", "32768")


def _engines(text: str) -> set[str]:
    return {line.split('engine="')[1].split('"')[0]
            for line in text.splitlines() if line.startswith("vllm:num_requests_running")}


def _wait_exit(p, timeout: float = 10) -> int | None:
    deadline = time.monotonic() + timeout
    while p.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return p.proc.poll()


def test_hybrid_fronts_serve_their_own_ranks_and_decode_reads_prefill_kv(tmp_path):
    """Decode endpoint DP 4 as two fronts (ranks 0-1, 2-3); a prefill sim hands over to the
    second front, which pulls the KV; killing the second front stops the head."""
    rpc, base = free_ports(1), free_ports(4)
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(base), "VLLM_LOG_STATS_INTERVAL": "1",
           "SIM_SPEED": "20"}
    head = start_sim(tmp_path, "decode-0@node0", "m", *_hybrid(rpc, 0, "kv_consumer"), **env)
    procs = [head]
    try:
        time.sleep(1.5)
        assert head.proc.poll() is None and not head.healthy()  # waiting for ranks 2-3
        front = start_sim(tmp_path, "decode-0@node1", "m", *_hybrid(rpc, 2, "kv_consumer"),
                          **env)
        procs.append(front)
        head.wait_healthy(20)
        front.wait_healthy(20)
        assert _engines(scrape(head.url)) == {"0", "1"}
        assert _engines(scrape(front.url)) == {"2", "3"}

        prefill = start_sim(tmp_path, "prefill-0", "m", "--kv-transfer-config",
                            kv_config("kv_producer"), "--max-model-len", "32768",
                            VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)), SIM_SPEED="20")
        procs.append(prefill)
        prefill.wait_healthy(20)
        prompt = "Question: which front? " * 40
        for p in (head, front):
            status, out = http_json(p.url + "/v1/completions",
                                    {"prompt": prompt, "max_tokens": 5, "ignore_eos": True})
            assert status == 200, out
            assert out["usage"]["completion_tokens"] == 5
        # the header indexes this front's own engines: 1 is global rank 3 here
        status, p = http_json(prefill.url + "/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        assert status == 200, p
        status, d = http_json(front.url + "/v1/completions", {
            "prompt": prompt, "max_tokens": 6, "kv_transfer_params": p["kv_transfer_params"]},
            headers={"X-data-parallel-rank": "1"}, timeout=20)
        assert status == 200, d
        assert d["usage"]["completion_tokens"] == 6
        text = scrape(front.url)
        assert sample(text, "vllm:nixl_bytes_transferred_count", engine="3") == 1
        assert sample(text, "vllm:prompt_tokens_by_source_total", engine="3",
                      source="external_kv_transfer") > 0
        assert sample(scrape(head.url), "vllm:nixl_bytes_transferred_count") == 0
        assert sample(scrape(prefill.url), "vllm:kv_cache_usage_perc") == 0.0  # released
        status, err = http_json(front.url + "/v1/completions", {"prompt": "x", "max_tokens": 1},
                                headers={"X-data-parallel-rank": "2"})
        assert status == 400 and "is out of range [0, 2)" in err["error"]["message"]

        wait_for(lambda: "Engine 003: Avg prompt throughput" in front.log_text(), 10,
                 "rank 3's stats line on the second front")
        assert "Engine 002" not in head.log_text() and "Engine 003" not in head.log_text()
        assert "Engine 000" not in front.log_text()
        assert "SIMULATED engine" in front.log_text().splitlines()[0]
        assert "All engine subscriptions received by DP coordinator" in head.log_text()

        front.proc.send_signal(signal.SIGKILL)
        assert _wait_exit(head) not in (None, 0)
        assert "engine core exited unexpectedly" in head.log_text()
    finally:
        for p in reversed(procs):
            p.stop()


def test_hybrid_prefill_front_advertises_its_own_side_channel_and_dies_with_head(tmp_path):
    """Prefill endpoint DP 4 as two fronts: the second front's KV params name its own host,
    port base + global rank and engine id; a decode reads them; the front exits when the
    head goes away."""
    rpc, base = free_ports(1), free_ports(4)
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(base), "SIM_SPEED": "20"}
    front = start_sim(tmp_path, "prefill-0@node1", "m", *_hybrid(rpc, 2, "kv_producer"), **env)
    procs = [front]
    try:
        time.sleep(1.5)  # a front started before its head waits for it
        assert front.proc.poll() is None and not front.healthy()
        head = start_sim(tmp_path, "prefill-0@node0", "m", *_hybrid(rpc, 0, "kv_producer"),
                         **env)
        procs.append(head)
        head.wait_healthy(20)
        front.wait_healthy(20)
        decode = start_sim(tmp_path, "decode-0", "m", "--kv-transfer-config",
                           kv_config("kv_consumer"), "--max-model-len", "32768",
                           VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)), SIM_SPEED="20")
        procs.append(decode)
        decode.wait_healthy(20)
        prompt = "Question: where is the KV? " * 40
        for local, rank in ((0, 2), (1, 3)):
            status, p = http_json(front.url + "/v1/completions", {
                "prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}},
                headers={"X-data-parallel-rank": str(local)})
            assert status == 200, p
            params = p["kv_transfer_params"]
            assert params["remote_engine_id"].endswith(f"_dp{rank}")
            assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", base + rank)
            status, d = http_json(decode.url + "/v1/completions", {
                "prompt": prompt, "max_tokens": 4, "kv_transfer_params": params}, timeout=20)
            assert status == 200, d
        text = scrape(front.url)
        for rank in ("2", "3"):
            assert sample(text, "vllm:request_success_total", engine=rank,
                          finished_reason="length") == 1
            assert sample(text, "vllm:kv_cache_usage_perc", engine=rank) == 0.0  # read, freed
        assert sample(scrape(decode.url), "vllm:nixl_bytes_transferred_count") == 2

        head.proc.send_signal(signal.SIGKILL)
        assert _wait_exit(front) not in (None, 0)
        assert "DP head connection lost" in front.log_text()
    finally:
        for p in reversed(procs):
            p.stop()


def test_hybrid_head_refuses_a_headless_part_like_vllm(tmp_path):
    """vLLM 0.33: remote engines must not be headless in hybrid LB mode; the head fails."""
    rpc = free_ports(1)
    head = start_sim(tmp_path, "decode-0@node0", "m", *_hybrid(rpc, 0, "kv_consumer"),
                     VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(4)))
    part = start_sim(tmp_path, "decode-0@node1", "m", "--data-parallel-size", "4",
                     "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2",
                     "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port",
                     str(rpc), "--headless", headless=True)
    try:
        assert _wait_exit(head, 20) not in (None, 0)
        assert "Remote engine 2 must not use --headless" in head.log_text()
        assert _wait_exit(part, 10) not in (None, 0)
    finally:
        part.stop()
        head.stop()


def _dp(*flags: str):
    return parse(["serve", "m", "--data-parallel-size", "4", *flags], env={})


def test_hybrid_lb_is_inferred_like_vllm():
    """engine/arg_utils.py:2488-2505: a start rank without --headless means hybrid LB (with
    --data-parallel-size-local); one local rank switches to external LB (still only local
    engines); all ranks on one node turns it off."""
    assert _dp("--data-parallel-size-local", "2", "--data-parallel-start-rank", "2").hybrid_lb
    flag = _dp("--data-parallel-size-local", "2", "--data-parallel-hybrid-lb")
    assert flag.hybrid_lb and "--data-parallel-hybrid-lb" not in flag.ignored_flags
    assert not _dp("--data-parallel-size-local", "2").hybrid_lb
    assert not _dp("--data-parallel-size-local", "2", "--data-parallel-start-rank", "2",
                   "--headless").hybrid_lb
    assert not _dp("--data-parallel-size-local", "4", "--data-parallel-hybrid-lb").hybrid_lb
    one = _dp("--data-parallel-size-local", "1", "--data-parallel-start-rank", "3")
    assert one.hybrid_lb and one.local_ranks == [3]
    assert any("autoswitch to data_parallel_external_lb" in m for _, m in one.argv_warnings)
    with pytest.raises(VllmStartupError, match="requires `--data-parallel-size-local`"):
        _dp("--data-parallel-hybrid-lb")
    with pytest.raises(VllmStartupError, match="not applicable in headless mode"):
        _dp("--data-parallel-size-local", "2", "--data-parallel-start-rank", "2",
            "--data-parallel-hybrid-lb", "--headless")


# ----- one engine over nodes (--nnodes/--node-rank, TP4 x PP2 on two 4-GPU trays) ------------


def test_an_engine_over_two_nodes_serves_once_both_joined_and_dies_with_either(tmp_path):
    """World size 8 (TP4 x PP2, vLLM's world_size): four workers a node."""
    master = free_ports(1)
    tp = ("--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--nnodes", "2",
          "--master-addr", "127.0.0.1",
          "--master-port", str(master), "--kv-transfer-config", kv_config("kv_consumer"),
          "--max-model-len", "32768")
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_ports(1)), "SIM_SPEED": "20"}
    head = start_sim(tmp_path, "decode-0@node0", "m", *tp, "--node-rank", "0",
                     "--api-server-count", "1", **env)
    procs = [head]
    try:
        time.sleep(1.5)
        assert head.proc.poll() is None and not head.healthy()  # waiting for node rank 1
        other = start_sim(tmp_path, "decode-0@node1", "m", *tp, "--node-rank", "1",
                          "--headless", headless=True, **env)
        procs.append(other)
        head.wait_healthy(20)
        assert _engines(scrape(head.url)) == {"0"}  # one engine: TP and PP are inside it
        assert "Node rank 1 joined" in head.log_text()
        assert "worker ranks 4-7 running" in other.log_text()
        code, out = http_json(f"{head.url}/v1/completions",
                              {"model": "m", "prompt": "hello", "max_tokens": 4})
        assert code == 200 and out["usage"]["completion_tokens"] == 4, out
        assert "-tp4-pp2-" in out["system_fingerprint"]
        other.proc.send_signal(signal.SIGKILL)
        assert _wait_exit(head) not in (None, 0)
        assert "Node rank 1 of the tensor parallel group died" in head.log_text()
    finally:
        for p in reversed(procs):
            p.stop()


def test_a_tp_node_rank_past_nnodes_is_refused():
    from launcher.sim.cli import UsageError

    with pytest.raises(UsageError, match="--node-rank 2 does not fit --nnodes 2"):
        parse(["serve", "m", "--tensor-parallel-size", "8", "--nnodes", "2", "--node-rank", "2"])
    with pytest.raises(UsageError, match="--pipeline-parallel-size 3 does not split over "
                                         "--nnodes 2"):
        parse(["serve", "m", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "3",
               "--nnodes", "2"])
    assert parse(["serve", "m", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "2",
                  "--nnodes", "2"]).world_size == 2
