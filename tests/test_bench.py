"""The built-in bench client against a real HTTP server, and one reader for both drivers.

The server here is a small OpenAI-compatible aiohttp app that streams like vLLM does
(`data: {...}` events, one chunk per `stream_interval` tokens after the first, a usage chunk
with `choices: []`, then `data: [DONE]`). It is also runnable as a process for the load test
and the sweep benchmark: `python tests/test_bench.py serve --port 0 [--stream-interval N ...]`
prints `PORT <n>` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launcher.clients import bench
from launcher.run import results

ROOT = Path(__file__).resolve().parents[1]

# --- the server ------------------------------------------------------------------------------


@dataclass
class ServerConfig:
    model: str = "toy-model"
    prefill_tok_s: float = 1e6  # prompt tokens per second: TTFT = ttft_base + len / this
    ttft_base: float = 0.005
    decode_tok_s: float = 2000.0  # per request
    stream_interval: int = 1
    zero_tokens: bool = False  # finish at once with no text and completion_tokens 0
    fail_every: int = 0  # every n-th request answers HTTP 500
    no_usage: bool = False  # ignore stream_options.include_usage
    answer_key: dict[str, str] = field(default_factory=dict)  # question -> GSM8K answer text
    wrong_answers: bool = False


@dataclass
class ServerLog:
    requests: list[dict] = field(default_factory=list)  # arrival, request id, body fields


def _question_of(prompt: str) -> str | None:
    m = re.findall(r"Question: (.*?)\nAnswer:", prompt, flags=re.DOTALL)
    return m[-1].strip() if m else None


def _answer_text(cfg: ServerConfig, prompt: str) -> str:
    q = _question_of(prompt)
    answer = cfg.answer_key.get(q or "")
    if answer is None:
        return " I do not know."
    if cfg.wrong_answers:
        n = answer.split("####")[-1].strip().replace(",", "")
        return f" Let me think. The total is {int(n) + 1}.\n#### {int(n) + 1}"
    return " " + answer


def make_app(cfg: ServerConfig, log: ServerLog):
    from aiohttp import web

    counter = {"n": 0}

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": cfg.model, "object": "model", "root": cfg.model}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        counter["n"] += 1
        log.requests.append({"t": time.time(), "id": request.headers.get("x-request-id", ""),
                             "max_tokens": body.get("max_tokens"),
                             "ignore_eos": body.get("ignore_eos"), "stop": body.get("stop"),
                             "temperature": body.get("temperature"),
                             "seed": body.get("seed"), "stream": body.get("stream"),
                             "prompt": body.get("prompt") if isinstance(body.get("prompt"), str)
                             else None})
        if cfg.fail_every and counter["n"] % cfg.fail_every == 0:
            return web.json_response({"error": "injected"}, status=500)
        prompt = body.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        max_tokens = int(body.get("max_tokens") or 16)
        await asyncio.sleep(cfg.ttft_base + n_prompt / cfg.prefill_tok_s)
        created = int(time.time())
        if not body.get("stream"):
            text = _answer_text(cfg, str(prompt))
            n_out = 0 if cfg.zero_tokens else min(max_tokens, len(text.split()) + 1)
            return web.json_response({
                "id": "cmpl-1", "object": "text_completion", "created": created,
                "model": cfg.model,
                "choices": [{"index": 0, "text": "" if cfg.zero_tokens else text,
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        def chunk(text: str, finish: str | None) -> bytes:
            return b"data: " + json.dumps({
                "id": "cmpl-1", "object": "text_completion", "created": created,
                "model": cfg.model,
                "choices": [{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": finish, "stop_reason": None}]}).encode() + b"\n\n"

        n_out = 0 if cfg.zero_tokens else max_tokens
        if n_out == 0:
            await resp.write(chunk("", "length"))
        else:
            sent = 0
            # vLLM sends the first token at once, then one chunk per stream_interval tokens.
            step = 1
            while sent < n_out:
                k = min(step, n_out - sent)
                if sent:
                    await asyncio.sleep(k / cfg.decode_tok_s)
                sent += k
                await resp.write(chunk(" tok" * k, "length" if sent == n_out else None))
                step = cfg.stream_interval
        opts = body.get("stream_options") or {}
        if opts.get("include_usage") and not cfg.no_usage:
            await resp.write(b"data: " + json.dumps({
                "id": "cmpl-1", "object": "text_completion", "created": created,
                "model": cfg.model, "choices": [],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


@contextmanager
def serve_in_thread(cfg: ServerConfig) -> Iterator[tuple[str, ServerLog]]:
    """The server on 127.0.0.1:<free port> in a thread with its own loop; yields (url, log)."""
    from helpers import aiohttp_in_thread

    log = ServerLog()
    with aiohttp_in_thread(lambda: make_app(cfg, log), backlog=4096) as url:
        yield url, log


@contextmanager
def serve_in_process(*args: str) -> Iterator[str]:
    """The server as its own process (so client CPU can be measured alone); yields its URL."""
    proc = subprocess.Popen([sys.executable, __file__, "serve", "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def sim_server(env: dict[str, str], *flags: str, model: str = "toy-model") -> Iterator[str]:
    """`python -m launcher.sim serve` (the simulated vLLM) on 127.0.0.1; yields its URL."""
    import urllib.request

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.sim", "serve", model, "--host", "127.0.0.1",
         "--port", str(port), *flags],
        env={**os.environ, "SIM_SPEED": "200", **env}, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sim did not start: {proc.stderr.read()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _serve_main(argv: list[str]) -> None:
    from aiohttp import web

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--decode-tok-s", type=float, default=2000.0)
    p.add_argument("--prefill-tok-s", type=float, default=1e6)
    p.add_argument("--ttft-base", type=float, default=0.005)
    p.add_argument("--stream-interval", type=int, default=1)
    a = p.parse_args(argv)
    cfg = ServerConfig(decode_tok_s=a.decode_tok_s, prefill_tok_s=a.prefill_tok_s,
                       ttft_base=a.ttft_base, stream_interval=a.stream_interval)

    async def main() -> None:
        runner = web.AppRunner(make_app(cfg, ServerLog()), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", a.port, backlog=4096)
        await site.start()
        print(f"PORT {runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    import contextlib

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


# --- tests -----------------------------------------------------------------------------------


def _cfg(url: str, tmp_path: Path, **kw) -> bench.BenchConfig:
    base = {"model": "toy-model", "base_url": url, "random_input_len": 64,
            "random_output_len": 20, "num_prompts": 12, "max_concurrency": 4,
            "temperature": 0.0, "percentile_metrics": "ttft,tpot,itl,e2el",
            "metric_percentiles": "50,90,99", "save_result": True,
            "result_dir": str(tmp_path / "bench")}
    base.update(kw)
    return bench.BenchConfig(**base)


def test_workload_lengths_follow_vllm_random_dataset() -> None:
    cfg = bench.BenchConfig(model="m", random_input_len=8192, random_output_len=1024,
                            random_range_ratio=0.8, random_prefix_len=7, num_prompts=500, seed=3)
    wl = bench.sample_workload(cfg)
    # [floor(L*(1-r)), ceil(L*(1+r))]: 1638..14746 and 204..1844 (float rounding included)
    assert min(wl.input_lens) >= math.floor(8192 * 0.2) and max(wl.input_lens) <= 14746
    assert min(wl.output_lens) >= 204 and max(wl.output_lens) <= 1844
    assert max(wl.input_lens) - min(wl.input_lens) > 10000  # really spread over the range
    ids = json.loads(wl.prompt_json(5))
    assert len(ids) == wl.prompt_len(5) == 7 + wl.input_lens[5]
    assert all(bench.TOKEN_ID_LOW <= t < bench.TOKEN_ID_LOW + bench.TOKEN_ID_SPAN for t in ids)
    assert json.loads(wl.prompt_json(9))[:7] == ids[:7]  # the prefix is shared
    # the same seed gives the same workload; another seed does not
    assert bench.sample_workload(cfg).input_lens == wl.input_lens
    cfg.seed = 4
    assert bench.sample_workload(cfg).input_lens != wl.input_lens
    # output length is never drawn as 0
    tiny = bench.BenchConfig(model="m", random_output_len=1, random_range_ratio=0.9,
                             num_prompts=50)
    assert min(bench.sample_workload(tiny).output_lens) == 1


def test_percentile_is_numpy_linear() -> None:
    assert results.percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert results.percentile([5.0], 99) == 5.0
    assert results.percentile([], 50) == 0.0
    assert results.percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_point_end_to_end_file_schema_and_window(tmp_path: Path) -> None:
    with serve_in_thread(ServerConfig(stream_interval=5, decode_tok_s=4000)) as (url, log):
        cfg = _cfg(url, tmp_path, num_warmups=4, metadata=["recipe=toy", "point=c4"],
                   result_filename="c4.json", save_detailed=True)
        res = bench.run_point(cfg)
    path = tmp_path / "bench" / "c4.json"
    on_disk = json.loads(path.read_text())
    assert on_disk == json.loads(json.dumps(res))
    keys = list(on_disk)
    # vLLM's order: setup, metadata, traffic, results, per-request arrays, peaks, metrics
    head = ["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
            "num_prompts", "recipe", "point", "request_rate", "burstiness", "max_concurrency",
            "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
            "request_throughput", "request_goodput", "output_throughput",
            "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "latencies",
            "start_times", "queue_times", "generated_texts", "errors", "max_output_tokens_per_s",
            "max_concurrent_requests", "rtfx", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
            "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms"]
    assert keys[:len(head)] == head
    assert keys[-6:] == ["window_start", "window_end", "driver", "status", "failure_reason",
                         "workload"]
    assert res["request_rate"] == "inf" and res["driver"] == "builtin"
    assert res["status"] == "ok" and res["failure_reason"] is None
    assert res["completed"] == 12 and res["failed"] == 0
    # usage is the count: 20 +-0 tokens each (range ratio 0) although chunks carry 5 tokens
    assert res["output_lens"] == [20] * 12 and res["total_output_tokens"] == 240
    assert all(len(itl) == 4 for itl in res["itls"])  # 1 + 5 + 5 + 5 + 4 tokens: 5 chunks
    assert res["total_input_tokens"] == sum(res["input_lens"]) == 12 * 64
    assert res["max_concurrent_requests"] <= 4
    # units: ttfts in s, *_ms in ms
    assert res["mean_ttft_ms"] == pytest.approx(1000 * sum(res["ttfts"]) / 12)
    # TPOT excludes the first token: (latency - ttft) / (tokens - 1)
    tpots = [(lat - t) / 19 for lat, t in zip(res["latencies"], res["ttfts"], strict=True)]
    assert res["median_tpot_ms"] == pytest.approx(1000 * results.percentile(tpots, 50))
    # the window is the measured part only: every warmup request arrived before it
    warm = [r for r in log.requests if "warmup" in r["id"]]
    measured = [r for r in log.requests if "warmup" not in r["id"]]
    assert len(warm) == 4 and len(measured) == 12
    assert all(r["max_tokens"] <= bench.WARMUP_OUTPUT_TOKENS for r in warm)
    assert max(r["t"] for r in warm) < res["window_start"] <= min(r["t"] for r in measured)
    assert res["window_end"] - res["window_start"] == pytest.approx(res["duration"], abs=0.05)
    assert min(res["start_times"]) == pytest.approx(res["window_start"], abs=0.05)
    # ignore_eos is always sent for the random dataset (as vLLM forces it)
    assert all(r["ignore_eos"] is True for r in measured)


def test_without_save_detailed_the_arrays_are_dropped_like_vllm(tmp_path: Path) -> None:
    with serve_in_thread(ServerConfig()) as (url, _):
        res = bench.run_point(_cfg(url, tmp_path, num_prompts=4, result_filename="x.json"))
    for k in bench.DETAILED_KEYS:
        assert k not in res
    assert len(res["latencies"]) == 4 and len(res["queue_times"]) == 4


def test_finite_request_rate_paces_arrivals(tmp_path: Path) -> None:
    # burstiness 1000: gamma gaps with almost no spread, i.e. one request every 1/rate s
    queue = "ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue"
    with serve_in_thread(ServerConfig()) as (url, _):
        res = bench.run_point(_cfg(url, tmp_path, num_prompts=10, max_concurrency=None,
                                   request_rate=20.0, burstiness=1000.0, save_detailed=True,
                                   percentile_metrics=queue, result_filename="rate.json"))
        capped = bench.run_point(_cfg(url, tmp_path, num_prompts=4, max_concurrency=2,
                                      request_rate=50.0, percentile_metrics=queue,
                                      result_filename="capped.json"))
    gaps = [b - a for a, b in zip(res["start_times"], res["start_times"][1:], strict=False)]
    assert all(0.035 < g < 0.08 for g in gaps), gaps
    assert res["request_rate"] == 20.0 and res["max_concurrency"] is None
    # client-queue metrics exist only with --max-concurrency (and a finite rate), as in vLLM
    assert "mean_client_queue_time_ms" not in res
    assert "p99_client_queue_time_ms" in capped and "p99_e2el_including_client_queue_ms" in capped


def test_failed_points_say_why(tmp_path: Path) -> None:
    with serve_in_thread(ServerConfig(zero_tokens=True)) as (url, _):
        res = bench.run_point(_cfg(url, tmp_path, result_filename="zero.json"))
    assert res["status"] == "failed" and "zero output tokens" in res["failure_reason"]
    assert res["total_output_tokens"] == 0

    with serve_in_thread(ServerConfig(fail_every=3)) as (url, _):
        res = bench.run_point(_cfg(url, tmp_path, result_filename="err.json"))
    assert res["status"] == "failed"
    assert res["failed"] == 4 and res["completed"] == 8
    assert "4 request(s) failed" in res["failure_reason"] and "HTTP 500" in res["failure_reason"]
    assert "completed 8 of 12" in res["failure_reason"]


def test_endpoint_that_never_answers_is_an_error_not_a_hang(tmp_path: Path) -> None:
    cfg = _cfg("http://127.0.0.1:9", tmp_path, ready_check_timeout_sec=2)
    t0 = time.monotonic()
    with pytest.raises(bench.BenchError, match="not ready within 2 s"):
        bench.run_point(cfg)
    assert time.monotonic() - t0 < 10


def test_cli_takes_the_vllm_argv_and_writes_the_file(tmp_path: Path) -> None:
    with serve_in_thread(ServerConfig(stream_interval=100)) as (url, _):
        cfg = _cfg(url, tmp_path, num_prompts=6, max_concurrency=3, random_output_len=250,
                   random_range_ratio=0.5, num_warmups=2, ignore_eos=True, label="sim",
                   ready_check_timeout_sec=5, tokenizer="Qwen/Qwen3.5")
        argv = cfg.argv()
        assert bench.parse_args(argv) == cfg  # one argv, both drivers
        for flag in ("--base-url", "--max-concurrency", "--random-range-ratio",
                     "--percentile-metrics", "--metric-percentiles", "--save-result",
                     "--result-dir", "--ignore-eos", "--label", "--num-warmups"):
            assert flag in argv
        proc = subprocess.run([sys.executable, "-m", "launcher.clients.bench", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Serving Benchmark Result" in proc.stdout and "Median TTFT (ms):" in proc.stdout
    files = list((tmp_path / "bench").glob("sim-infqps-concurrency3-toy-model-*.json"))
    assert len(files) == 1
    res = json.loads(files[0].read_text())
    assert res["status"] == "ok" and res["tokenizer_id"] == "Qwen/Qwen3.5"
    # one chunk per 100 tokens; the output count is still exact (from usage)
    assert 6 * 125 <= res["total_output_tokens"] <= 6 * 375


def test_cli_without_a_server_exits_non_zero_with_one_sentence(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "launcher.clients.bench", "--model", "m",
                           "--base-url", "http://127.0.0.1:9", "--ready-check-timeout-sec", "1",
                           "--num-prompts", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and "Traceback" not in proc.stderr


def _real_vllm_file(max_concurrency: int, failed: int) -> dict:
    """A result in the exact layout `vllm bench serve --save-result` writes (vLLM 0.33, no
    --save-detailed, --metric-percentiles 50,90,99, --percentile-metrics ttft,tpot,itl,e2el),
    written by hand from the documented key list: no window, status or driver keys."""
    completed = 640 - failed
    d = {"date": "20261129-101500", "endpoint_type": "openai", "backend": "openai",
         "label": None, "model_id": "nvidia/Qwen3.5-397B-A17B-NVFP4",
         "tokenizer_id": "nvidia/Qwen3.5-397B-A17B-NVFP4", "num_prompts": 640,
         "recipe": "qwen35-gb200", "request_rate": "inf", "burstiness": 1.0,
         "max_concurrency": max_concurrency, "duration": 120.0, "completed": completed,
         "failed": failed, "total_input_tokens": completed * 8192,
         "total_output_tokens": completed * 1024, "request_throughput": completed / 120.0,
         "request_goodput": None, "output_throughput": completed * 1024 / 120.0,
         "total_token_throughput": completed * 9216 / 120.0,
         "latencies": [10.0] * 640, "queue_times": [0.0] * 640,
         "max_output_tokens_per_s": 9000.0, "max_concurrent_requests": max_concurrency,
         "rtfx": 0.0}
    for m, base in (("ttft", 900.0), ("tpot", 20.0), ("itl", 19.0), ("e2el", 21000.0)):
        d.update({f"mean_{m}_ms": base, f"median_{m}_ms": base, f"std_{m}_ms": base / 10,
                  f"p50_{m}_ms": base, f"p90_{m}_ms": base * 1.5, f"p99_{m}_ms": base * 2})
    return d


def test_both_drivers_load_through_one_reader(tmp_path: Path) -> None:
    run = tmp_path / "run"
    bench_dir = run / "bench"
    bench_dir.mkdir(parents=True)
    (bench_dir / "vllm-c256.json").write_text(json.dumps(_real_vllm_file(256, 0)))
    (bench_dir / "vllm-c256.window.json").write_text(
        json.dumps({"window_start": 1000.0, "window_end": 1120.0}))
    (bench_dir / "vllm-c1024.json").write_text(json.dumps(_real_vllm_file(1024, 3)))
    (bench_dir / "vllm-c1024.pytorch.json").write_text("[]")  # vLLM's side file: not a point
    # --append-result writes one object per line: the last complete one is the point
    (bench_dir / "vllm-c64.json").write_text(
        json.dumps(_real_vllm_file(64, 5)) + "\n" + json.dumps(_real_vllm_file(64, 0)) + "\n")
    with serve_in_thread(ServerConfig()) as (url, _):
        bench.run_point(_cfg(url, run, num_prompts=4, max_concurrency=4,
                             result_filename="builtin-c4.json"))

    points = results.load_results(run)
    assert [p["max_concurrency"] for p in points] == [4, 64, 256, 1024]
    builtin, appended, real_ok, real_failed = points
    assert appended["failed"] == 0 and appended["status"] == "ok"
    assert builtin["driver"] == "builtin" and builtin["status"] == "ok"
    assert real_ok["driver"] == "vllm" and real_ok["status"] == "ok"
    assert (real_ok["window_start"], real_ok["window_end"]) == (1000.0, 1120.0)
    assert real_failed["status"] == "failed"
    assert "3 request(s) failed" in real_failed["failure_reason"]
    assert real_failed["window_start"] is None  # no sidecar: unknown, not invented
    for p in points:  # the fields every consumer reads are there for both drivers
        for k in ("completed", "total_output_tokens", "median_ttft_ms", "p99_tpot_ms",
                  "window_start", "status", "driver", "file"):
            assert k in p
    assert results.load_results(tmp_path / "no-such-run") == []


def test_point_against_the_simulated_vllm(tmp_path: Path) -> None:
    """The client against `launcher.sim` (vLLM's HTTP API, stream-interval 100)."""
    with sim_server({}, "--stream-interval", "100") as url:
        cfg = _cfg(url, tmp_path, num_prompts=32, max_concurrency=8, random_input_len=512,
                   random_output_len=300, random_range_ratio=0.5, num_warmups=8,
                   result_filename="sim.json", save_detailed=True)
        res = bench.run_point(cfg)
    assert res["status"] == "ok", res["failure_reason"]
    # the usage chunk is the count (chunks carry up to 100 tokens each): every request made
    # exactly the length drawn for it, and the server saw the prompt lengths sent
    wl = bench.sample_workload(cfg)
    assert res["output_lens"] == wl.output_lens
    assert res["input_lens"] == [wl.prompt_len(i) for i in range(32)]
    assert all(len(itl) <= math.ceil(n / 100) for itl, n in
               zip(res["itls"], res["output_lens"], strict=True))
    assert res["median_tpot_ms"] > 0 and res["p99_ttft_ms"] >= res["p50_ttft_ms"]


def test_zero_token_fault_of_the_sim_fails_the_point(tmp_path: Path) -> None:
    with sim_server({"SIM_ZERO_TOKENS": "1"}) as url:
        res = bench.run_point(_cfg(url, tmp_path, num_prompts=8, result_filename="z.json"))
    assert res["status"] == "failed" and "zero output tokens" in res["failure_reason"]
    failure = results.point_failure(tmp_path / "bench" / "z.json", 0)
    assert failure is not None and "zero output tokens" in failure
    assert "no result file" in results.point_failure(tmp_path / "bench" / "none.json", 2)


@pytest.mark.alone
def test_a_thousand_concurrent_streams_from_one_process(tmp_path: Path) -> None:
    """1000 streams at once, server in its own process: all overlap, and the client's CPU
    stays well below the wall time (it is not what limits the point)."""
    n = 1000
    with serve_in_process("--stream-interval", "100", "--decode-tok-s", "100",
                          "--ttft-base", "0.2") as url:
        cfg = _cfg(url, tmp_path, num_prompts=n, max_concurrency=n, random_input_len=256,
                   random_output_len=300, result_filename="load.json")
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        res = bench.run_point(cfg)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    assert res["status"] == "ok", res["failure_reason"]
    assert res["total_output_tokens"] == n * 300
    assert res["max_concurrent_requests"] >= 0.95 * n
    # each request needs ~3.2 s of server time (0.2 s + 300 tok at 100 tok/s); all in parallel
    assert res["duration"] < 3.2 * 2, res["duration"]
    assert cpu < 0.5 * res["duration"], (cpu, res["duration"])
    print(f"\n1000 streams: duration {res['duration']:.2f} s, client CPU {cpu:.2f} s, "
          f"median TTFT {res['median_ttft_ms']:.0f} ms")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        _serve_main(sys.argv[2:])
