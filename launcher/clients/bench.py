"""The built-in benchmark client, a stand-in for `vllm bench serve` with the same flags and file.

    python -m launcher.clients.bench --backend openai --base-url http://router:8000 --model M \
        --dataset-name random --random-input-len 8192 --random-output-len 1024 \
        --random-range-ratio 0.8 --num-prompts 640 --max-concurrency 64 --num-warmups 64 \
        --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el \
        --metric-percentiles 50,90,99 --save-result --result-dir bench --result-filename c64.json

The renderer emits one argv and swaps only the executable between `vllm bench serve` and
`python -m launcher.clients.bench`, so every flag here is spelled as vLLM 0.33 spells it.

What differs from vLLM, on purpose:
- prompts are token ids (random ids from a fixed range, like vLLM's random dataset draws
  consecutive ids from a random offset), so no tokenizer is loaded; `--tokenizer` is accepted
  and only recorded as `tokenizer_id`;
- the ready check and the warmups send the first prompt with at most 16 output tokens: they
  open connections and exercise prefill and KV transfer; full-length warmups only add time;
- `start_times` are unix seconds (vLLM writes its monotonic clock, which no reader can join);
- the file adds `window_start`/`window_end` (unix s of the measured window, warmups excluded),
  `driver` ("builtin"), `status` ("ok" | "failed") and `failure_reason`.

The reader of result files is `launcher.run.results`. Start-up stays light: stdlib and
aiohttp only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import math
import random
import sys
import time
import uuid
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from launcher.run.results import percentile, point_status

# Prompt token ids come from [TOKEN_ID_LOW, TOKEN_ID_LOW + TOKEN_ID_SPAN): above the special
# and byte tokens most vocabularies put first, below every vocabulary size in use (>= 32000).
TOKEN_ID_LOW = 1000
TOKEN_ID_SPAN = 30000
# Output tokens of the ready-check and warmup requests (see the module docstring).
WARMUP_OUTPUT_TOKENS = 16
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
ALLOWED_PERCENTILE_METRICS = (
    "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue",
)
# Per-request arrays vLLM drops from the file without --save-detailed (latencies and
# queue_times stay).
DETAILED_KEYS = (
    "input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors",
)


class BenchError(Exception):
    """The benchmark could not run (bad flags, endpoint never ready): one sentence."""


@dataclass
class BenchConfig:
    """One sweep point; field names are the CLI flags with '-' as '_'."""

    model: str
    base_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    backend: str = "openai"
    endpoint: str = "/v1/completions"
    tokenizer: str | None = None
    dataset_name: str = "random"
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    num_prompts: int = 1000
    max_concurrency: int | None = None
    request_rate: float = float("inf")
    burstiness: float = 1.0
    num_warmups: int = 0
    ignore_eos: bool = False
    temperature: float | None = None
    percentile_metrics: str | None = None
    metric_percentiles: str = "99"
    save_result: bool = False
    save_detailed: bool = False
    result_dir: str | None = None
    result_filename: str | None = None
    metadata: list[str] = field(default_factory=list)
    label: str | None = None
    ready_check_timeout_sec: int = 0
    seed: int = 0

    @property
    def api_url(self) -> str:
        return f"{self.root_url}{self.endpoint}"

    @property
    def root_url(self) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        """The flags that reproduce this config, valid for both drivers (defaults left out)."""
        out: list[str] = []
        defaults = BenchConfig(model=self.model)
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if f.name != "model" and value == getattr(defaults, f.name):
                continue
            if isinstance(value, bool):
                if value:
                    out.append(flag)
            elif isinstance(value, list):
                if value:
                    out += [flag, *value]
            elif value is not None:
                out += [flag, _fmt_number(value)]
        return out


def _fmt_number(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


# --- CLI ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher.clients.bench",
        description="Built-in benchmark client; flags and result file as `vllm bench serve`.",
    )
    p.add_argument("--backend", default="openai", choices=["openai", "vllm"])
    p.add_argument("--base-url", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None, help="accepted and recorded; prompts are ids")
    p.add_argument("--dataset-name", default="random", choices=["random"])
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--random-prefix-len", type=int, default=0)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--num-warmups", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--percentile-metrics", default=None)
    p.add_argument("--metric-percentiles", default="99")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--save-detailed", action="store_true")
    p.add_argument("--result-dir", default=None)
    p.add_argument("--result-filename", default=None)
    p.add_argument("--metadata", metavar="KEY=VALUE", nargs="*", default=[])
    p.add_argument("--label", default=None)
    p.add_argument("--ready-check-timeout-sec", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    ns = build_parser().parse_args(argv)
    return BenchConfig(**vars(ns))


def _validate(cfg: BenchConfig) -> tuple[list[str], list[float]]:
    if cfg.backend not in ("openai", "vllm"):
        raise BenchError(f"--backend {cfg.backend} is not supported; use openai.")
    if not cfg.endpoint.endswith("completions") or cfg.endpoint.endswith("chat/completions"):
        raise BenchError(f"--endpoint {cfg.endpoint} is not supported; use /v1/completions.")
    if cfg.dataset_name != "random":
        raise BenchError(f"--dataset-name {cfg.dataset_name} is not supported; use random.")
    if not 0.0 <= cfg.random_range_ratio < 1.0:
        raise BenchError("--random-range-ratio must be in [0, 1).")
    if cfg.max_concurrency is not None and cfg.max_concurrency <= 0:
        raise BenchError("--max-concurrency must be greater than 0.")
    if cfg.num_prompts <= 0:
        raise BenchError("--num-prompts must be greater than 0.")
    if cfg.burstiness <= 0:
        raise BenchError("--burstiness must be greater than 0.")
    for item in cfg.metadata:
        if "=" not in item:
            raise BenchError(f"--metadata {item!r} is not KEY=VALUE.")
    metrics = (cfg.percentile_metrics or DEFAULT_PERCENTILE_METRICS).split(",")
    for m in metrics:
        if m not in ALLOWED_PERCENTILE_METRICS:
            raise BenchError(
                f"--percentile-metrics {m!r} is unknown; use {','.join(ALLOWED_PERCENTILE_METRICS)}."
            )
    try:
        percentiles = [float(p) for p in cfg.metric_percentiles.split(",")]
    except ValueError:
        raise BenchError(
            f"--metric-percentiles {cfg.metric_percentiles!r} is not a comma list of numbers."
        ) from None
    return metrics, percentiles


# --- workload ----------------------------------------------------------------------------


@dataclass
class Workload:
    """Lengths and id offsets per request; prompt ids are generated when the request is sent
    (5120 prompts of 8192 ids as Python lists would cost gigabytes)."""

    input_lens: list[int]
    output_lens: list[int]
    offsets: list[int]
    prefix: str  # JSON text of the shared prefix ids, "" when there is none
    prefix_len: int

    def prompt_json(self, i: int, input_len: int | None = None) -> str:
        n = self.input_lens[i] if input_len is None else input_len
        start = (self.offsets[i] + i) % TOKEN_ID_SPAN
        inner = _id_run(start, n)
        if self.prefix and inner:
            return f"[{self.prefix},{inner}]"
        return f"[{self.prefix or inner}]"

    def prompt_len(self, i: int) -> int:
        return self.prefix_len + self.input_lens[i]


@functools.cache
def _id_text() -> list[str]:
    """Every id of the range as text, twice, so any run of up to a span is one slice."""
    one = [str(TOKEN_ID_LOW + j) for j in range(TOKEN_ID_SPAN)]
    return one + one


def _id_run(start: int, n: int) -> str:
    """Comma-joined consecutive ids from `start`, wrapping within the id range (C-speed join)."""
    text = _id_text()
    parts = []
    while n > 0:
        take = min(n, TOKEN_ID_SPAN)
        parts.append(",".join(text[start:start + take]))
        n -= take
        start = (start + take) % TOKEN_ID_SPAN
    return ",".join(parts)


def sample_workload(cfg: BenchConfig) -> Workload:
    """Lengths as vLLM's random dataset draws them: integer-uniform in
    [floor(L*(1-r)), ceil(L*(1+r))], outputs at least 1; total input = prefix + sampled."""
    rng = random.Random(cfg.seed)
    r = cfg.random_range_ratio
    in_lo = math.floor(cfg.random_input_len * (1 - r))
    in_hi = math.ceil(cfg.random_input_len * (1 + r))
    out_lo = max(math.floor(cfg.random_output_len * (1 - r)), 1)
    out_hi = max(math.ceil(cfg.random_output_len * (1 + r)), 1)
    if cfg.random_prefix_len + in_lo < 1:
        raise BenchError("--random-input-len is too small: prompts could be empty.")
    n = cfg.num_prompts
    input_lens = [rng.randint(in_lo, in_hi) for _ in range(n)]
    output_lens = [rng.randint(out_lo, out_hi) for _ in range(n)]
    offsets = [rng.randrange(TOKEN_ID_SPAN) for _ in range(n)]
    prefix_ids = [TOKEN_ID_LOW + rng.randrange(TOKEN_ID_SPAN) for _ in range(cfg.random_prefix_len)]
    return Workload(input_lens, output_lens, offsets, ",".join(map(str, prefix_ids)),
                    cfg.random_prefix_len)


# --- one request ---------------------------------------------------------------------------


@dataclass
class RequestOutput:
    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0  # perf_counter; converted to unix seconds in the file
    queue_time: float = 0.0
    generated_text: str = ""
    error: str = ""
    chunks: int = 0


def _payload_tail(cfg: BenchConfig, max_tokens: int) -> str:
    """Everything in the JSON body after the prompt, encoded once per request shape."""
    body: dict[str, Any] = {
        "model": cfg.model,
        "repetition_penalty": 1.0,
        "max_tokens": max_tokens,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    return json.dumps(body, separators=(",", ":"))[1:]  # drop "{": the prompt goes first


async def send_request(
    session: Any, url: str, prompt_json: str, prompt_len: int, tail: str, request_id: str,
) -> RequestOutput:
    """POST one streaming completion and time it the way `vllm bench serve` does: TTFT at the
    first chunk with choices, one ITL per further chunk, latency at the last chunk with
    choices; output tokens from the final usage chunk."""
    import aiohttp  # cached after the first call; keeps `load_results` users free of it

    out = RequestOutput(prompt_len=prompt_len)
    body = ('{"prompt":' + prompt_json + "," + tail).encode()
    headers = {"Content-Type": "application/json", "x-request-id": request_id}
    texts: list[str] = []
    usage_tokens: int | None = None
    st = time.perf_counter()
    out.start_time = st
    last = st
    first = True
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                detail = (await resp.text())[:200]
                out.error = f"HTTP {resp.status} {resp.reason}: {detail}"
                return out
            buf = b""
            done = False
            async for data in resp.content.iter_any():
                buf += data
                # SSE events are "data: <json>" lines; a partial last line waits for more bytes.
                while True:
                    nl = buf.find(b"\n")
                    if nl < 0:
                        break
                    line = buf[:nl].strip()
                    buf = buf[nl + 1:]
                    if not line or line.startswith(b":"):
                        continue
                    if line.startswith(b"data:"):
                        line = line[5:].strip()
                    if line == b"[DONE]":
                        done = True
                        break
                    msg = json.loads(line)
                    if msg.get("choices"):
                        now = time.perf_counter()
                        if first:
                            out.ttft = now - st
                            first = False
                        else:
                            out.itl.append(now - last)
                        last = now
                        out.chunks += 1
                        text = msg["choices"][0].get("text")
                        if text:
                            texts.append(text)
                    if msg.get("usage"):
                        u = msg["usage"]
                        usage_tokens = u.get("completion_tokens")
                        if u.get("prompt_tokens") is not None:
                            out.prompt_len = u["prompt_tokens"]
                    if "error" in msg and not msg.get("choices"):
                        out.error = f"server error in stream: {str(msg['error'])[:200]}"
                if done:
                    break
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as e:
        # A broken stream is a failed request, not a crashed benchmark.
        out.error = f"{type(e).__name__}: {e}"[:300]
        return out
    if out.error:
        return out
    if first:
        out.error = "Never received a valid chunk to calculate TTFT."
        return out
    out.success = True
    out.latency = last - st
    out.generated_text = "".join(texts)
    # Without a usage chunk (server ignored include_usage) a chunk count is the only count
    # there is; with --stream-interval > 1 it undercounts, so the server should send usage.
    out.output_tokens = usage_tokens if usage_tokens is not None else out.chunks
    return out


# --- statistics (numpy semantics, no numpy import at start-up) ------------------------------


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: list[float]) -> float:
    if not xs:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


# --- one point ----------------------------------------------------------------------------


async def _arrivals(n: int, rate: float, burstiness: float, rng: random.Random):
    """Request i's turn: all at once for rate inf, else gamma-distributed gaps (Poisson at
    burstiness 1), as vLLM's get_request."""
    for i in range(n):
        yield i
        if math.isinf(rate) or i == n - 1:
            continue
        theta = 1.0 / (rate * burstiness)
        await asyncio.sleep(rng.gammavariate(burstiness, theta))


async def _wait_ready(session: Any, cfg: BenchConfig, wl: Workload) -> None:
    deadline = time.monotonic() + cfg.ready_check_timeout_sec
    tail = _payload_tail(cfg, min(WARMUP_OUTPUT_TOKENS, wl.output_lens[0]))
    last_error = ""
    while True:
        out = await send_request(session, cfg.api_url, wl.prompt_json(0), wl.prompt_len(0),
                                 tail, f"bench-ready-{uuid.uuid4().hex[:8]}")
        if out.success:
            return
        last_error = out.error
        if time.monotonic() + 1.0 > deadline:
            raise BenchError(
                f"{cfg.api_url} was not ready within {cfg.ready_check_timeout_sec} s "
                f"(last error: {last_error.splitlines()[0] if last_error else 'none'})."
            )
        await asyncio.sleep(1.0)


async def _run(
    cfg: BenchConfig, wl: Workload,
) -> tuple[list[RequestOutput], float, float, float]:
    """Ready check, warmups, then the measured requests: (outputs, duration, window_start,
    window_end); window times are unix seconds around the measured requests only."""
    import aiohttp  # here, not at import time: readers of results never need it

    _raise_fd_limit()
    limit = cfg.max_concurrency or 0
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=60,
                                     force_close=False)
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     trust_env=False) as session:
        if cfg.ready_check_timeout_sec > 0:
            await _wait_ready(session, cfg, wl)
        # --max-concurrency caps requests in flight (warmups too), as in vLLM.
        gate: Any = (asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency
                     else contextlib.nullcontext())
        run_id = uuid.uuid4().hex[:8]

        if cfg.num_warmups > 0:
            warm_tail = _payload_tail(cfg, min(WARMUP_OUTPUT_TOKENS, wl.output_lens[0]))
            prompt0 = wl.prompt_json(0)

            async def warm(k: int) -> RequestOutput:
                async with gate:
                    return await send_request(session, cfg.api_url, prompt0, wl.prompt_len(0),
                                              warm_tail, f"bench-{run_id}-warmup-{k}")

            await asyncio.gather(*(warm(k) for k in range(cfg.num_warmups)))

        tails: dict[int, str] = {}

        async def one(i: int, arrival: float) -> RequestOutput:
            n_out = wl.output_lens[i]
            tail = tails.get(n_out)
            if tail is None:
                tail = tails[n_out] = _payload_tail(cfg, n_out)
            async with gate:
                out = await send_request(session, cfg.api_url, wl.prompt_json(i),
                                         wl.prompt_len(i), tail, f"bench-{run_id}-{i}")
            out.queue_time = out.start_time - arrival
            return out

        # Static data is frozen out of the collector: fewer pauses while streams are open.
        gc.collect()
        gc.freeze()
        rng = random.Random(cfg.seed + 1)
        tasks = []
        window_start = time.time()
        t0 = time.perf_counter()
        async for i in _arrivals(cfg.num_prompts, cfg.request_rate, cfg.burstiness, rng):
            tasks.append(asyncio.create_task(one(i, time.perf_counter())))
        outputs = await asyncio.gather(*tasks)
        t1 = time.perf_counter()
        window_end = time.time()
        gc.unfreeze()
    return outputs, t1 - t0, window_start, window_end


def _raise_fd_limit() -> None:
    """Thousands of streams need thousands of sockets; lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _metric_block(name: str, values: list[float], percentiles: list[float]) -> dict[str, float]:
    block = {
        f"mean_{name}_ms": _mean(values) * 1000,
        f"median_{name}_ms": percentile(values, 50) * 1000,
        f"std_{name}_ms": _std(values) * 1000,
    }
    for p in percentiles:
        block[f"p{_p_word(p)}_{name}_ms"] = percentile(values, p) * 1000
    return block


def build_result(
    cfg: BenchConfig,
    outputs: list[RequestOutput],
    duration: float,
    window_start: float,
    window_end: float,
    metrics: list[str],
    percentiles: list[float],
) -> dict[str, Any]:
    """The result object, keys in the order `vllm bench serve --save-result` writes them."""
    ok = [o for o in outputs if o.success]
    # perf_counter -> unix seconds: the first request starts at window_start.
    t_first = min((o.start_time for o in outputs), default=0.0)
    clock_offset = window_start - t_first
    output_lens = [o.output_tokens if o.success else 0 for o in outputs]
    total_in = sum(o.prompt_len for o in ok)
    total_out = sum(output_lens)
    ttfts = [o.ttft for o in ok]
    e2els = [o.latency for o in ok]
    itls = [x for o in ok for x in o.itl]
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]

    max_tok_s, peak = _peaks(ok)
    res: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": cfg.backend,
        "backend": cfg.backend,
        "label": cfg.label,
        "model_id": cfg.model,
        "tokenizer_id": cfg.tokenizer or cfg.model,
        "num_prompts": cfg.num_prompts,
    }
    for item in cfg.metadata:
        k, v = item.split("=", 1)
        res[k.strip()] = v.strip()
    res["request_rate"] = "inf" if math.isinf(cfg.request_rate) else cfg.request_rate
    res["burstiness"] = cfg.burstiness
    res["max_concurrency"] = cfg.max_concurrency
    res.update({
        "duration": duration,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "request_goodput": None,
        "output_throughput": total_out / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration > 0 else 0.0,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time + clock_offset for o in outputs],
        "queue_times": [o.queue_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
        "max_output_tokens_per_s": max_tok_s,
        "max_concurrent_requests": peak,
        "rtfx": 0.0,
    })
    series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    if cfg.max_concurrency is not None:
        series["client_queue_time"] = [o.queue_time for o in ok]
        if not math.isinf(cfg.request_rate):
            series["e2el_including_client_queue"] = [o.latency + o.queue_time for o in ok]
    for name in ("ttft", "tpot", "itl", "e2el", "client_queue_time",
                 "e2el_including_client_queue"):
        if name in metrics and name in series:
            res.update(_metric_block(name, series[name], percentiles))
    if not cfg.save_detailed:
        for k in DETAILED_KEYS:
            res.pop(k, None)
    status, reason = point_status(res.get("completed"), res.get("failed"),
                                  res.get("total_output_tokens"), cfg.num_prompts,
                                  first_error=next((o.error for o in outputs if o.error), ""))
    res["window_start"] = window_start
    res["window_end"] = window_end
    res["driver"] = "builtin"
    res["status"] = status
    res["failure_reason"] = reason
    return res


def _peaks(ok: list[RequestOutput]) -> tuple[float, int]:
    """Peak chunks per one-second bucket and peak in-flight requests, as vLLM computes them
    (vLLM counts chunk arrivals as tokens)."""
    if not ok:
        return 0.0, 0
    t0 = min(o.start_time for o in ok)
    t_end = max(o.start_time + o.latency for o in ok)
    buckets = [0] * (math.ceil(t_end - t0) + 1)
    events: list[tuple[float, int]] = []
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for t in times:
            b = int(t - t0)
            if 0 <= b < len(buckets):
                buckets[b] += 1
        events.append((o.start_time, 1))
        events.append((o.start_time + o.latency, -1))
    events.sort()
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return float(max(buckets)), peak


def result_filename(cfg: BenchConfig, date: str) -> str:
    """vLLM's default: {label or backend}-{rate}qps[-concurrency{N}]-{model basename}-{date}."""
    if cfg.result_filename:
        return cfg.result_filename
    conc = f"-concurrency{cfg.max_concurrency}" if cfg.max_concurrency is not None else ""
    return f"{cfg.label or cfg.backend}-{cfg.request_rate}qps{conc}-" \
           f"{cfg.model.split('/')[-1]}-{date}.json"


def run_point(cfg: BenchConfig) -> dict[str, Any]:
    """Run one sweep point in-process; write the file when `cfg.save_result`; return it.

    Raises BenchError when it cannot run (bad config, endpoint not ready in time)."""
    return asyncio.run(run_point_async(cfg))


async def run_point_async(cfg: BenchConfig) -> dict[str, Any]:
    metrics, percentiles = _validate(cfg)
    if cfg.dataset_name == "random" and cfg.backend in ("openai", "vllm"):
        cfg.ignore_eos = True  # vLLM forces it for the random dataset: the asked length is made
    wl = sample_workload(cfg)
    outputs, duration, window_start, window_end = await _run(cfg, wl)
    res = build_result(cfg, outputs, duration, window_start, window_end, metrics, percentiles)
    if cfg.save_result:
        path = result_path(cfg, res["date"])
        from launcher.run.rundir import write_json

        write_json(path, res)
        res_path = str(path)
        print(f"result written to {res_path}", file=sys.stderr)
    return res


def result_path(cfg: BenchConfig, date: str) -> Path:
    name = result_filename(cfg, date)
    return Path(cfg.result_dir) / name if cfg.result_dir else Path(name)


def print_result(res: dict[str, Any]) -> None:
    """The console block, in `vllm bench serve`'s layout."""
    line = "{:<40} {:<10}".format
    fline = "{:<40} {:<10.2f}".format
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print(line("Successful requests:", res["completed"]))
    print(line("Failed requests:", res["failed"]))
    if res.get("max_concurrency") is not None:
        print(line("Maximum request concurrency:", res["max_concurrency"]))
    print(fline("Benchmark duration (s):", res["duration"]))
    print(line("Total input tokens:", res["total_input_tokens"]))
    print(line("Total generated tokens:", res["total_output_tokens"]))
    print(fline("Request throughput (req/s):", res["request_throughput"]))
    print(fline("Output token throughput (tok/s):", res["output_throughput"]))
    print(fline("Peak output token throughput (tok/s):", res["max_output_tokens_per_s"]))
    print(fline("Peak concurrent requests:", res["max_concurrent_requests"]))
    print(fline("Total token throughput (tok/s):", res["total_token_throughput"]))
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}
    for key, value in res.items():
        for m, label in names.items():
            if key.endswith(f"_{m}_ms") and not key.startswith("std_"):
                stat = key[: -len(f"_{m}_ms")]
                stat = stat.capitalize() if stat in ("mean", "median") else stat.upper()
                print(fline(f"{stat} {label} (ms):", value))
    print(line("Status:", res["status"] + (f" ({res['failure_reason']})"
                                           if res.get("failure_reason") else "")))
    print("=" * 50)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        res = run_point(cfg)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print_result(res)
    # The point's status is in the file (as with vLLM, failed requests do not fail the process).
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
