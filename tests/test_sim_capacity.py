"""The speed and capacity model makes TTFT bottlenecks appear for the right reasons.

Light load: TTFT is the chunked prefill time of the speed model. Beyond the KV capacity:
requests queue ("capacity"), kv_cache_usage_perc sits near 1 and TTFT grows. A cache that
fills up during decode preempts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import threading
import time

import aiohttp
import pytest
from simprocs import sample, scrape, start_sim

from launcher.sim.knobs import Knobs
from launcher.telemetry import statslog

pytestmark = pytest.mark.timeout(90)

SPEED = 2.0  # slow enough that CPU jitter of a busy 2-core machine stays small
STEP_MS = 100.0  # a large fixed step cost makes the number of prefill chunks visible
PROMPT = 8000
BATCH = 2048  # --max-num-batched-tokens: 8000 tokens -> 4 chunks (steps)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    # 1100 blocks x 16 = 17600 tokens: two 8000-token requests fit, a third must wait.
    p = start_sim(tmp_path_factory.mktemp("cap"), "agg-0", "m", "--block-size", "16",
                  "--num-gpu-blocks-override", "1100", "--max-num-batched-tokens", str(BATCH),
                  "--api-server-count", "1", SIM_SPEED=str(SPEED), SIM_STEP_BASE_MS=str(STEP_MS),
                  VLLM_LOG_STATS_INTERVAL="0.5")
    try:
        p.wait_healthy(20)
        yield p
    finally:
        p.stop()


_PROMPT_STARTS = itertools.count(1)


async def _ttft(session: aiohttp.ClientSession, url: str, prompt_len: int,
                max_tokens: int) -> tuple[float, int]:
    # distinct prompts, as the benchmark sends (consecutive ids from its own offset): a
    # repeated prompt would be served from the prefix cache
    start = next(_PROMPT_STARTS)
    body = {"prompt": list(range(start, start + prompt_len)), "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    ttft = None
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"] and ttft is None:
                ttft = time.monotonic() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    assert ttft is not None
    return ttft, tokens


def _expected_prefill_s() -> float:
    k = Knobs()
    chunks = -(-PROMPT // BATCH)
    return (chunks * STEP_MS + PROMPT * 1000 / k.prefill_tokens_per_s) / 1000 / SPEED


def test_light_load_ttft_is_the_chunked_prefill_time(sim):
    async def run() -> list[float]:
        async with aiohttp.ClientSession() as s:
            return [(await _ttft(s, sim.url, PROMPT, 4))[0] for _ in range(5)]

    ttfts = asyncio.run(run())
    expected = _expected_prefill_s()  # 4 chunks: ~0.34 s at SIM_SPEED 2
    unchunked = (STEP_MS + PROMPT * 1000 / Knobs().prefill_tokens_per_s) / 1000 / SPEED
    med = statistics.median(ttfts)
    assert expected * 0.9 <= med <= expected * 1.5 + 0.03, (ttfts, expected)
    assert med > unchunked * 1.4  # chunking by --max-num-batched-tokens shows
    text = scrape(sim.url)
    assert sample(text, "vllm:kv_cache_usage_perc") == 0.0
    # the server-side TTFT histogram agrees with the client
    n = sample(text, "vllm:time_to_first_token_seconds_count")
    mean = sample(text, "vllm:time_to_first_token_seconds_sum") / n
    assert expected * 0.9 <= mean <= expected * 1.5 + 0.03, (mean, expected)


def test_beyond_capacity_requests_wait_and_ttft_rises(sim):
    peaks = {"waiting": 0.0, "capacity": 0.0, "usage": 0.0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            text = scrape(sim.url)
            peaks["waiting"] = max(peaks["waiting"], sample(text, "vllm:num_requests_waiting"))
            peaks["capacity"] = max(peaks["capacity"], sample(
                text, "vllm:num_requests_waiting_by_reason", reason="capacity"))
            peaks["usage"] = max(peaks["usage"], sample(text, "vllm:kv_cache_usage_perc"))
            time.sleep(0.05)

    async def run() -> list[tuple[float, int]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            return await asyncio.gather(*(_ttft(s, sim.url, PROMPT, 8) for _ in range(10)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        results = asyncio.run(run())
    finally:
        stop.set()
        watcher.join(5)
    assert all(tokens == 8 for _, tokens in results)
    ttfts = sorted(t for t, _ in results)
    light = _expected_prefill_s()
    assert peaks["waiting"] >= 5 and peaks["capacity"] >= 5, peaks
    assert peaks["usage"] >= 0.9, peaks  # two 8000-token requests fill 1100 blocks
    assert ttfts[-1] > 4 * light, ttfts  # the last ones queued behind the cache
    assert statistics.median(ttfts) > 2 * light
    text = scrape(sim.url)
    assert sample(text, "vllm:request_queue_time_seconds_sum") > 1.0
    time.sleep(0.6)
    lines = [s for s in statslog.parse_log_text(sim.log_text())]
    usage = [s.value for s in lines if s.name == "log:kv_cache_usage_pct"]
    waiting = [s.value for s in lines if s.name == "log:waiting_reqs"]
    assert max(usage) >= 80 and max(waiting) >= 1, (usage, waiting)


def test_full_cache_during_decode_preempts(tmp_path):
    # 3 x 5800 prompt tokens fit at admission (1089 of 1100 blocks), growing by 100 does not.
    sim = start_sim(tmp_path, "agg-1", "m", "--block-size", "16", "--num-gpu-blocks-override",
                    "1100", "--max-num-batched-tokens", "8192", SIM_SPEED="20")
    try:
        sim.wait_healthy(20)

        async def run() -> list[tuple[float, int]]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                return await asyncio.gather(*(_ttft(s, sim.url, 5800, 100) for _ in range(3)))

        results = asyncio.run(run())
        assert [tokens for _, tokens in results] == [100] * 3
        text = scrape(sim.url)
        assert sample(text, "vllm:num_preemptions_total") > 0
        assert sample(text, "vllm:request_num_preemptions_sum") > 0
        assert sample(text, "vllm:kv_cache_usage_perc") == 0.0
    finally:
        sim.stop()
