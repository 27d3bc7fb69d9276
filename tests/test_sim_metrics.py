"""/metrics and stats-log modes beyond the single-API-server case, and KV lease expiry."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from helpers import FIXTURES, in_fixture_scope, wait_for
from prometheus_client.parser import text_string_to_metric_families
from simprocs import free_ports, http_json, kv_config, sample, scrape, start_sim

from launcher.telemetry import statslog

pytestmark = pytest.mark.timeout(60)


def _families(text: str) -> list[tuple[str, str, str]]:
    return [(f.name, f.type, f.documentation) for f in text_string_to_metric_families(text)
            if in_fixture_scope(f.name)]


def test_multi_api_server_mode_like_vllm(tmp_path):
    # DP 2 without --api-server-count: vLLM runs 2 API servers -> prometheus multiprocess
    # mode for /metrics, and one warning per API server instead of stats lines.
    p = start_sim(tmp_path, "decode-0", "m", "--data-parallel-size", "2",
                  "--kv-transfer-config", kv_config("kv_consumer"), "--max-model-len", "32768",
                  VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(2)), VLLM_LOG_STATS_INTERVAL="0.5",
                  SIM_SPEED="20")
    try:
        p.wait_healthy(10)

        async def burst() -> list[int]:
            async with aiohttp.ClientSession() as s:
                async def one() -> int:
                    async with s.post(p.url + "/v1/completions",
                                      json={"prompt": "hi " * 50, "max_tokens": 16}) as r:
                        await r.read()
                        return r.status
                return await asyncio.gather(*(one() for _ in range(8)))

        assert asyncio.run(burst()) == [200] * 8
        text = scrape(p.url)
        for engine in ("0", "1"):  # the internal load balancer spreads over DP ranks
            assert sample(text, "vllm:request_success_total", engine=engine) >= 2
        fixture = (FIXTURES / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl_multiproc.prom"
                   ).read_text()
        text = scrape(p.url)
        assert _families(text) == _families(fixture)  # same families in the same order
        assert "_created" not in text and "python_gc" not in text
        time.sleep(1.2)
        log = p.log_text()
        warnings = [statslog.parse_prefix(line) for line in log.splitlines()
                    if statslog.STATS_DISABLED_RE.search(line)]
        assert [w.proc for w in warnings if w] == ["ApiServer_0", "ApiServer_1"]
        assert "Avg prompt throughput" not in log
    finally:
        p.stop()


def test_aggregated_engine_logging(tmp_path):
    p = start_sim(tmp_path, "agg-0", "m", "--data-parallel-size", "2", "--api-server-count",
                  "1", "--aggregate-engine-logging", "--num-gpu-blocks-override", "2731",
                  VLLM_LOG_STATS_INTERVAL="0.5", SIM_SPEED="20")
    try:
        p.wait_healthy(10)
        for _ in range(4):
            assert http_json(p.url + "/v1/completions", {"prompt": "hi " * 50,
                                                         "max_tokens": 8})[0] == 200
        time.sleep(1.2)
        samples = statslog.parse_log_text(p.log_text())
        names = {s.name for s in samples}
        assert "log:num_gpu_blocks" in names and "log:generation_throughput_tok_s" in names
        assert all(s.labels == {"aggregated_engines": "2"} for s in samples)
        assert [s.value for s in samples if s.name == "log:num_gpu_blocks"] == [2731.0]
    finally:
        p.stop()


def test_unread_kv_expires_on_the_prefill_and_late_pull_fails(tmp_path):
    # a lease of 3 s: the stats intervals (0.5 s) around its expiry are idle ones even when a
    # loaded machine delays a tick (a 1 s lease's expiry once fell in the interval after the
    # request's, which vLLM logs at INFO)
    cfg = kv_config("kv_producer").replace('"backends"', '"kv_lease_duration": 3, "backends"')
    prefill = start_sim(tmp_path, "prefill-0", "m", "--kv-transfer-config", cfg,
                        "--api-server-count", "1", SIM_SPEED="20",
                        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)),
                        VLLM_LOG_STATS_INTERVAL="0.5", VLLM_LOGGING_LEVEL="DEBUG")
    decode = start_sim(tmp_path, "decode-0", "m", "--kv-transfer-config",
                       kv_config("kv_consumer"), SIM_SPEED="20",
                       VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)))
    try:
        prefill.wait_healthy(10)
        decode.wait_healthy(10)
        status, p = http_json(prefill.url + "/v1/completions", {
            "prompt": "x " * 400, "max_tokens": 1, "kv_transfer_params": {
                "do_remote_decode": True}})
        assert status == 200
        assert sample(scrape(prefill.url), "vllm:kv_cache_usage_perc") > 0  # held for D
        wait_for(lambda: "Num KV expired reqs=1" in prefill.log_text(), 10,
                 "the lease to expire and its stats line")
        text = scrape(prefill.url)
        assert sample(text, "vllm:kv_cache_usage_perc") == 0.0
        assert sample(text, "vllm:nixl_num_kv_expired_reqs_total") == 1
        # the engine was idle by then, so vLLM logs the line at DEBUG, like its stats line
        expired = [ln for ln in prefill.log_text().splitlines() if "Num KV expired reqs=1" in ln]
        assert expired and " DEBUG " in expired[0]
        status, body = http_json(decode.url + "/v1/completions", {
            "prompt": "x " * 400, "max_tokens": 3,
            "kv_transfer_params": p["kv_transfer_params"]}, timeout=15)
        assert status == 500 and "no held KV blocks" in body["error"]["message"]
        assert sample(scrape(decode.url), "vllm:nixl_num_failed_transfers_total") == 1
    finally:
        prefill.stop()
        decode.stop()


def test_client_disconnect_aborts_and_frees_blocks(tmp_path):
    p = start_sim(tmp_path, "agg-0", "m", "--enable-request-id-headers", SIM_SPEED="1")
    try:
        p.wait_healthy(10)

        async def go() -> str:
            async with aiohttp.ClientSession() as s:
                async with s.post(p.url + "/v1/completions", headers={"X-Request-Id": "abc"},
                                  json={"prompt": "hi " * 100, "max_tokens": 5000,
                                        "stream": True, "ignore_eos": True}) as r:
                    assert r.headers["x-simulated-engine"] == "launcher.sim"
                    assert r.headers["X-Request-Id"] == "abc"
                    first = await r.content.readline()
                    return first.decode()

        assert asyncio.run(go()).startswith("data: ")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            text = scrape(p.url)
            if sample(text, "vllm:request_success_total", finished_reason="abort") == 1:
                break
            time.sleep(0.1)
        assert sample(text, "vllm:request_success_total", finished_reason="abort") == 1
        assert sample(text, "vllm:num_requests_running") == 0
        assert sample(text, "vllm:kv_cache_usage_perc") == 0.0
    finally:
        p.stop()


def test_slow_kv_transfer_shows_as_deferred_fetch_and_in_decode_ttft(tmp_path):
    # 0.2 GB/s: a ~48 MB pull (SSM state + KV) takes ~0.24 s of a decode's TTFT.
    env = {"SIM_SPEED": "1", "SIM_KV_BANDWIDTH_GBPS": "0.2"}
    prefill = start_sim(tmp_path, "prefill-0", "m", "--kv-transfer-config",
                        kv_config("kv_producer"), VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)),
                        **env)
    decode = start_sim(tmp_path, "decode-0", "m", "--kv-transfer-config",
                       kv_config("kv_consumer"), "--api-server-count", "1",
                       VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_ports(1)), **env)
    try:
        prefill.wait_healthy(10)
        decode.wait_healthy(10)
        prompt = "tokens " * 200
        params = []
        for _ in range(4):
            status, p = http_json(prefill.url + "/v1/completions", {
                "prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}})
            assert status == 200
            params.append(p["kv_transfer_params"])

        seen = {"in_progress": 0.0, "deferred": 0.0}

        async def run() -> None:
            async with aiohttp.ClientSession() as s:
                async def one(kvp: dict) -> None:
                    async with s.post(decode.url + "/v1/completions", json={
                            "prompt": prompt, "max_tokens": 4, "kv_transfer_params": kvp}) as r:
                        assert r.status == 200
                        await r.read()

                async def watch() -> None:
                    for _ in range(8):
                        await asyncio.sleep(0.05)
                        text = await (await s.get(decode.url + "/metrics")).text()
                        seen["in_progress"] = max(seen["in_progress"], sample(
                            text, "vllm:num_requests_kv_fetch_by_stage", stage="in_progress"))
                        seen["deferred"] = max(seen["deferred"], sample(
                            text, "vllm:num_requests_waiting_by_reason", reason="deferred"))

                await asyncio.gather(watch(), *(one(k) for k in params))

        asyncio.run(run())
        assert seen["in_progress"] >= 1 and seen["deferred"] >= 1, seen
        text = scrape(decode.url)
        xfer = sample(text, "vllm:nixl_xfer_time_seconds_sum") / 4
        assert 0.2 <= xfer <= 0.4  # ~48 MB at 0.2 GB/s
        ttft = sample(text, "vllm:time_to_first_token_seconds_sum") / 4
        assert ttft >= xfer  # the decode's TTFT includes the KV pull
        assert sample(scrape(prefill.url), "vllm:kv_cache_usage_perc") == 0.0
    finally:
        prefill.stop()
        decode.stop()


def test_speculative_decoding_counts_drafts_and_accepted_tokens_like_vllm(tmp_path):
    """--speculative-config (MTP, 3 draft tokens): vLLM 0.33's spec_decode counters per engine
    and per draft position, its 'SpecDecoding metrics' log line after the stats line, and
    fewer decode steps than tokens (each step: the target's token + the accepted drafts)."""
    spec = '{"method": "mtp", "num_speculative_tokens": 3}'
    sim = start_sim(tmp_path, "decode-0", "m", "--speculative-config", spec,
                    "--max-model-len", "8192", SIM_SPEC_ACCEPT="0.6", SIM_SPEED="20",
                    VLLM_LOG_STATS_INTERVAL="1")
    try:
        sim.wait_healthy(20)
        for _ in range(4):
            status, body = http_json(sim.url + "/v1/completions",
                                     {"prompt": "tell me " * 20, "max_tokens": 200})
            assert status == 200 and body["usage"]["completion_tokens"] == 200
        text = scrape(sim.url)
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                     "vllm:spec_decode_num_accepted_tokens",
                     "vllm:spec_decode_num_accepted_tokens_per_pos"):
            assert fams[name].type == "counter", name
        per_pos = [s for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
                   if s.name.endswith("_total")]
        assert [s.labels["position"] for s in per_pos] == ["0", "1", "2"]
        assert set(per_pos[0].labels) == {"model_name", "engine", "position"}
        drafts = sample(text, "vllm:spec_decode_num_drafts_total")
        drafted = sample(text, "vllm:spec_decode_num_draft_tokens_total")
        accepted = sample(text, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafted == 3 * drafts
        # every decode step after the first token drafts once: 4 x 199 tokens in fewer steps
        assert drafts + accepted == 4 * 199
        assert 0.6 * 0.85 < per_pos[0].value / drafts < 0.6 * 1.15
        assert 0.36 * 0.8 < per_pos[1].value / drafts < 0.36 * 1.2
        wait_for(lambda: "SpecDecoding metrics: Mean acceptance length:" in sim.log_text(), 10,
                 "the spec decoding log line")
        line = next(x for x in sim.log_text().splitlines() if "SpecDecoding metrics" in x)
        assert "[metrics.py:120]" in line and "Per-position acceptance rate: " in line
        assert line.rstrip().endswith("%") and "Avg Draft acceptance rate: " in line
        got = statslog.parse_spec(line.split("SpecDecoding metrics: ", 1)[1])
        assert 1 < got["spec_mean_acceptance_length"] < 4
        assert 0 < got["spec_avg_draft_acceptance_rate_pct"] < 100
    finally:
        sim.stop()
