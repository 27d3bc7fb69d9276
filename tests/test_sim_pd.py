"""P/D through the real vllm-router: 2 prefill sims + 1 decode sim (DP 2) on loopback.

Checks what a user of the launcher would notice: every streamed completion arrives with the
requested number of tokens, the traffic shows on the right side of /metrics, /metrics and
the stats log lines look like vLLM 0.33's (fixtures), and a broken side channel fails
requests instead of hanging them.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from helpers import FIXTURES, in_fixture_scope, wait_for
from prometheus_client.parser import text_string_to_metric_families
from simprocs import (
    LOOPBACK,
    SimProc,
    free_ports,
    http_json,
    kv_config,
    sample,
    scrape,
    sim_env,
    start_sim,
)

from launcher.telemetry import statslog

MODEL = "nvidia/Qwen3.5-397B-A17B-NVFP4"
ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
# max-model-len of the fixtures: the request_tokens buckets (1-2-5 up to it) must match
COMMON = ("--max-model-len", "32768", "--block-size", "16", "--max-num-batched-tokens", "8192",
          "--api-server-count", "1")
SPEED = "20"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    logs = tmp_path_factory.mktemp("pd")
    procs: list[SimProc] = []
    try:
        p_base = [free_ports(1), free_ports(1)]
        d_base = free_ports(2)
        prefills = [
            start_sim(logs, f"prefill-{i}", MODEL, "--kv-transfer-config",
                      kv_config("kv_producer"), *COMMON,
                      VLLM_NIXL_SIDE_CHANNEL_PORT=str(p_base[i]), VLLM_LOG_STATS_INTERVAL="1",
                      SIM_SPEED=SPEED)
            for i in range(2)
        ]
        decode = start_sim(logs, "decode-0", MODEL, "--data-parallel-size", "2",
                           "--kv-transfer-config", kv_config("kv_consumer"), *COMMON,
                           "--stream-interval", "4",
                           VLLM_NIXL_SIDE_CHANNEL_PORT=str(d_base), VLLM_LOG_STATS_INTERVAL="1",
                           SIM_SPEED=SPEED)
        procs += [*prefills, decode]
        for p in procs:
            p.wait_healthy(20)
        rport, mport = free_ports(1), free_ports(1)
        router = SimProc(
            [ROUTER, "--host", LOOPBACK, "--port", str(rport), "--vllm-pd-disaggregation",
             "--prefill", prefills[0].url, "--prefill", prefills[1].url,
             "--decode", decode.url, "--kv-connector", "nixl",
             "--prometheus-port", str(mport)],
            sim_env(), logs / "router.log", port=rport).start()
        procs.append(router)
        router.wait_healthy(30)
        yield {"prefills": prefills, "decode": decode, "router": router}
    finally:
        for p in reversed(procs):
            p.stop()


def _prompt(i: int) -> str:
    return f"Request {i}: " + " ".join(f"word{j}" for j in range(60 + 7 * i))


async def _stream_one(session: aiohttp.ClientSession, url: str, i: int, max_tokens: int,
                      chat: bool = False) -> dict:
    body: dict = {"model": MODEL, "max_tokens": max_tokens, "stream": True,
                  "ignore_eos": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": _prompt(i)}]
    else:
        body["prompt"] = _prompt(i)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    text, usage, finish, t0, ttft = "", None, None, time.monotonic(), None
    async with session.post(url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                piece = c["delta"].get("content") if chat else c["text"]
                if piece:
                    ttft = ttft if ttft is not None else time.monotonic() - t0
                    text += piece
                finish = c["finish_reason"] or finish
    return {"text": text, "usage": usage, "finish": finish, "ttft": ttft}


def test_50_concurrent_streams_through_router_complete(pd):
    router = pd["router"]
    wanted = [8 + (i * 7) % 40 for i in range(50)]

    async def run() -> list[dict]:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            return await asyncio.gather(*(
                _stream_one(s, router.url, i, n, chat=(i % 5 == 0))
                for i, n in enumerate(wanted)))

    t0 = time.monotonic()
    results = asyncio.run(run())
    assert time.monotonic() - t0 < 30
    for n, r in zip(wanted, results, strict=True):
        assert r["usage"]["completion_tokens"] == n
        assert r["finish"] == "length"
        assert len(r["text"].split()) == n  # one word per token

    p_texts = [scrape(p.url) for p in pd["prefills"]]
    d_text = scrape(pd["decode"].url)
    # prompt tokens are computed on the prefills; the decode gets them by KV transfer
    p_local = sum(sample(t, "vllm:prompt_tokens_by_source_total", source="local_compute")
                  for t in p_texts)
    d_ext = sample(d_text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    d_local = sample(d_text, "vllm:prompt_tokens_by_source_total", source="local_compute")
    d_hit = sample(d_text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    assert p_local > 50 * 60
    # a dense model's decode counts every prompt token as pulled or hit in its own prefix
    # cache, none computed (it recomputes the last one uncounted), as real vLLM's does
    # (docs/sim-prefix-cache.md); this sim is dense (no state blocks)
    p_prompt = sum(sample(t, "vllm:prompt_tokens_total") for t in p_texts)
    assert d_ext + d_hit == p_prompt == sample(d_text, "vllm:prompt_tokens_total")
    assert d_local == 0 and d_ext > 0
    assert sum(sample(t, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") for t in p_texts) == 0
    # NIXL pulls are counted on the decode side, with bytes
    assert sample(d_text, "vllm:nixl_bytes_transferred_count") >= 50
    assert sample(d_text, "vllm:nixl_bytes_transferred_sum") > 50 * 47e6
    assert sum(sample(t, "vllm:nixl_bytes_transferred_count") for t in p_texts) == 0
    assert sample(d_text, "vllm:nixl_num_failed_transfers_total") == 0
    assert sample(d_text, "vllm:generation_tokens_total") == sum(wanted)
    assert sum(sample(t, "vllm:request_success_total", finished_reason="length")
               for t in p_texts) >= 50  # max_tokens=1 on the prefill leg
    # the decodes' notifications freed the prefills' blocks
    for t in p_texts:
        assert sample(t, "vllm:kv_cache_usage_perc") == 0.0
    assert sample(d_text, "vllm:time_to_first_token_seconds_count") >= 50


def _shape(text: str) -> dict:
    """Family (name, type, HELP), sample names with label keys, histogram bucket bounds."""
    fams, samples, buckets = set(), set(), {}
    for fam in text_string_to_metric_families(text):
        if not in_fixture_scope(fam.name):
            continue
        fams.add((fam.name, fam.type, fam.documentation))
        for s in fam.samples:
            keys = frozenset(k for k in s.labels if k != "le")
            samples.add((s.name, keys))
            if s.name.endswith("_bucket"):
                buckets.setdefault(s.name, set()).add(s.labels["le"])
    return {"families": fams, "samples": samples, "buckets": buckets}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_metrics_match_vllm_fixture_per_role(pd, role):
    fixture = (FIXTURES / f"vllm_metrics_v0.33.0_generated_{role}_dp2_nixl.prom").read_text()
    proc = pd["prefills"][0] if role == "prefill" else pd["decode"]
    sim, want = _shape(scrape(proc.url)), _shape(fixture)
    assert sim["families"] == want["families"]
    assert sim["samples"] == want["samples"]
    assert sim["buckets"] == want["buckets"]
    # no simulator-only metric names
    assert {n for n, _ in sim["samples"]} == {n for n, _ in want["samples"]}


def test_render_endpoint_is_forbidden_without_scale_out(pd):
    """vLLM 0.33 answers render with 403 unless --enable-scale-out; the router carries on (the
    other tests here go through it). With the flag: test_sim_vllm_argv."""
    status, body = http_json(pd["decode"].url + "/v1/completions/render",
                             {"model": MODEL, "prompt": "Hello there, how are you?"})
    assert status == 403
    assert body["error"]["type"] == "PermissionDeniedError" and body["error"]["code"] == 403


# Strict layout of the periodic lines (field order as in vLLM 0.33's LoggingStatLogger).
STRICT_ENGINE = re.compile(
    r"^Engine \d{3}: Avg prompt throughput: \d+\.\d tokens/s, Avg generation throughput: "
    r"\d+\.\d tokens/s, Running: \d+ reqs, Waiting: \d+ reqs(, Deferred: \d+ reqs)?"
    r"(, KV fetch: \d+ waiting to start, \d+ in progress, \d+ completed waiting)?"
    r"(, Preemptions: \d+)?, GPU KV cache usage: \d+\.\d%(, Prefix cache hit rate: \d+\.\d%)?"
    r"(, External prefix cache hit rate: \d+\.\d%)?$")
KV_KEYS = ["Num successful transfers", "Avg xfer time (ms)", "P90 xfer time (ms)",
           "Avg post time (ms)", "P90 post time (ms)", "Avg MB per transfer",
           "Throughput (MB/s)", "Avg number of descriptors", "Num failed transfers",
           "Num KV expired reqs", "Num notifs after expiry"]


def _check_lines(text: str) -> tuple[int, int]:
    """Stats/KV lines of a log, checked with the telemetry parser's and the strict regexes."""
    engines = kv = 0
    lines = text.splitlines()
    if not text.endswith("\n"):
        lines = lines[:-1]  # a line the engine is still writing is not a line yet
    for line in lines:
        rec = statslog.parse_prefix(line)
        if rec is None or not ("[loggers.py:" in line or "[metrics.py:" in line):
            continue
        if statslog.STATS_HEAD_RE.match(rec.msg):
            assert rec.proc == "APIServer" and rec.level == "INFO"
            assert STRICT_ENGINE.match(rec.msg), rec.msg
            engines += 1
        elif m := statslog.KV_TRANSFER_RE.match(rec.msg):
            assert [p.rpartition("=")[0] for p in m.group("body").split(", ")] == KV_KEYS
            kv += 1
    return engines, kv


def test_stats_log_lines_parse_like_the_fixtures(pd):
    # the telemetry parser and the strict regexes accept the fixtures ...
    for name in ("decode_dp4_nixl", "prefill_dp2_nixl"):
        text = (FIXTURES / f"vllm_server_v0.33.0_generated_{name}.log").read_text()
        engines, kv = _check_lines(text)
        assert engines > 0 and kv > 0
    # ... and the simulator's lines (traffic ran in the previous tests; interval is 1 s)
    wait_for(lambda: all(_check_lines(pd["decode"].log_text()))
             and _check_lines(pd["prefills"][0].log_text())[0], 10, "both engines' stats lines")
    d_log = pd["decode"].log_text()
    engines, kv = _check_lines(d_log)
    assert engines > 0 and kv > 0
    samples = statslog.parse_log_text(d_log)
    names = {s.name for s in samples}
    assert {"log:generation_throughput_tok_s", "log:kv_num_successful_transfers",
            "log:external_prefix_cache_hit_rate_pct"} <= names
    assert {s.engine for s in samples} <= {"0", "1"}
    p_log = pd["prefills"][0].log_text()
    assert _check_lines(p_log)[0] > 0
    assert "SIMULATED engine" in p_log.splitlines()[0]


def test_wrong_side_channel_port_fails_fast_and_counts(pd):
    decode, prefill = pd["decode"], pd["prefills"][0]
    # a real prefill leg gives valid kv_transfer_params ...
    status, p_resp = http_json(prefill.url + "/v1/completions", {
        "model": MODEL, "prompt": _prompt(1), "max_tokens": 1, "kv_transfer_params": {
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}})
    assert status == 200
    params = p_resp["kv_transfer_params"]
    assert params["remote_engine_id"].endswith("_dp0") and params["do_remote_prefill"]
    assert params["remote_host"] == LOOPBACK
    # ... which the decode is then given with a port nobody listens on
    bad = dict(params, remote_port=free_ports(1))
    before = sample(scrape(decode.url), "vllm:nixl_num_failed_transfers_total")
    t0 = time.monotonic()
    status, body = http_json(decode.url + "/v1/completions", {
        "model": MODEL, "prompt": _prompt(1), "max_tokens": 5, "kv_transfer_params": bad},
        timeout=15)
    assert status == 500 and "KV transfer failed" in body["error"]["message"]

    async def streamed() -> str:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as s:
            async with s.post(decode.url + "/v1/completions", json={
                    "model": MODEL, "prompt": _prompt(1), "max_tokens": 5, "stream": True,
                    "kv_transfer_params": bad}) as r:
                return await r.text()

    text = asyncio.run(streamed())
    assert '"error"' in text and "data: [DONE]" in text
    assert time.monotonic() - t0 < 10
    after = sample(scrape(decode.url), "vllm:nixl_num_failed_transfers_total")
    assert after == before + 2
    assert sample(scrape(decode.url), "vllm:request_success_total",
                  finished_reason="error") >= 2
