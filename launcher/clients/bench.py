"""The built-in benchmark client, a stand-in for `vllm bench serve` with the same flags and file.

    python -m launcher.clients.bench --backend openai --base-url http://router:8000 --model M \
        --dataset-name random --random-input-len 8192 --random-output-len 1024 \
        --random-range-ratio 0.8 --num-prompts 640 --max-concurrency 64 --num-warmups 64 \
        --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el \
        --metric-percentiles 50,90,99 --save-result --result-dir bench --result-filename c64.json

The renderer emits one argv and swaps only the executable between `vllm bench serve` and
`python -m launcher.clients.bench`, so every flag here is spelled as vLLM 0.33 spells it.

What differs from vLLM, on purpose:
- `--length-rule sa-bench` draws lengths as srt-slurm's sa-bench does ([r x L, L], not vLLM's
  [L(1-r), L(1+r)]; launcher.run.lengths), `--use-chat-template` wraps each prompt in the
  served model's chat template with its tokens inside the input length (sa-bench's prompts,
  built with the `--tokenizer` to the exact length), and `--sa-bench-warmup` sends the warmups
  as sa-bench does (distinct prompts of the rule's lengths at 250 requests/s; docs/workload.md);
- without the chat template prompts are token ids (consecutive ids from a random offset, like
  vLLM's random dataset), so no tokenizer is loaded and `--tokenizer` is only recorded;
- otherwise the ready check and the warmups send the first prompt with at most 16 output
  tokens: they open connections and exercise prefill and KV transfer;
- `start_times` are unix seconds (vLLM writes its monotonic clock, which no reader can join);
- the file adds `window_start`/`window_end` (unix s of the measured window, warmups excluded),
  `driver` ("builtin"), `status` ("ok" | "failed"), `failure_reason` and `workload` (the rule,
  its bounds, the chat template), and keeps every request's `input_lens`/`output_lens` (the
  engine's own prompt-token count from the usage chunk) without `--save-detailed`.

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

from launcher.run import lengths as rule_lengths
from launcher.run.results import percentile, point_status

# Prompt token ids come from [TOKEN_ID_LOW, TOKEN_ID_LOW + TOKEN_ID_SPAN): above the special
# and byte tokens most vocabularies put first, below every vocabulary size in use (>= 32000).
TOKEN_ID_LOW = 1000
TOKEN_ID_SPAN = 30000
# Output tokens of the ready-check and warmup requests (see the module docstring).
WARMUP_OUTPUT_TOKENS = 16
# sa-bench's warm-up run: its own request rate (bench.sh), Poisson arrivals.
SA_BENCH_WARMUP_RATE = 250.0
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
ALLOWED_PERCENTILE_METRICS = (
    "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue",
)
# Per-request arrays dropped from the file without --save-detailed (latencies, queue_times
# and, unlike vLLM, input_lens/output_lens stay: the lengths sent are the workload's record).
DETAILED_KEYS = ("start_times", "ttfts", "itls", "generated_texts", "errors")


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
    tokenizer_mode: str = "auto"
    tokenizer_revision: str | None = None
    trust_remote_code: bool = False
    dataset_name: str = "random"
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    length_rule: str = "vllm"
    use_chat_template: bool = False
    sa_bench_warmup: bool = False
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
    p.add_argument("--tokenizer", default=None,
                   help="the served model's tokenizer (loaded only for --use-chat-template)")
    p.add_argument("--tokenizer-mode", default="auto",
                   help="as vLLM's: auto/hf load it with transformers; another mode (deepseek_v4, "
                   "...) is vLLM's own tokenizer of that name (vLLM must be importable)")
    p.add_argument("--tokenizer-revision", default=None,
                   help="the hub revision of --tokenizer (offline caches hold only the pinned one)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run a tokenizer's own code (as the engine does with the same flag)")
    p.add_argument("--dataset-name", default="random", choices=["random"])
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--random-prefix-len", type=int, default=0)
    p.add_argument("--length-rule", default="vllm", choices=list(rule_lengths.RULES),
                   help="what --random-range-ratio means: vLLM's [L(1-r), L(1+r)] or "
                   "sa-bench's [r x L, L]")
    p.add_argument("--use-chat-template", action="store_true",
                   help="wrap prompts in the tokenizer's chat template, inside the input length")
    p.add_argument("--sa-bench-warmup", action="store_true",
                   help="warmups of distinct prompts at the rule's lengths, 250 requests/s")
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
    if cfg.length_rule == "vllm" and not 0.0 <= cfg.random_range_ratio < 1.0:
        raise BenchError("--random-range-ratio must be in [0, 1) with --length-rule vllm.")
    if not 0.0 <= cfg.random_range_ratio <= 1.0:
        raise BenchError("--random-range-ratio must be in [0, 1].")
    if cfg.use_chat_template and not cfg.tokenizer:
        raise BenchError("--use-chat-template needs --tokenizer (the served model's).")
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
class PromptSet:
    """Lengths and prompts per request. Id prompts are generated when the request is sent
    (5120 prompts of 8192 ids as Python lists would cost gigabytes); chat-template prompts
    are texts built before the run, each exactly its input length in the tokenizer's count."""

    input_lens: list[int]
    output_lens: list[int]
    offsets: list[int]
    prefix: str  # JSON text of the shared prefix ids, "" when there is none
    prefix_len: int
    bounds: rule_lengths.Lengths
    texts: list[str] | None = None  # JSON-encoded prompt strings (chat template)
    template_len: int = 0

    def prompt_json(self, i: int, input_len: int | None = None) -> str:
        if self.texts is not None:
            return self.texts[i]
        n = self.input_lens[i] if input_len is None else input_len
        start = (self.offsets[i] + i) % TOKEN_ID_SPAN
        inner = _id_run(start, n)
        if self.prefix and inner:
            return f"[{self.prefix},{inner}]"
        return f"[{self.prefix or inner}]"

    def prompt_len(self, i: int) -> int:
        return self.input_lens[i] if self.texts is not None else self.prefix_len + self.input_lens[i]

    def describe(self) -> dict[str, Any]:
        """What the result file records of the workload's rule."""
        b = self.bounds
        return {"length_rule_bounds": {"input": [b.input_low, b.input_high],
                                       "output": [b.output_low, b.output_high]},
                "chat_template": self.texts is not None, "template_len": self.template_len}


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


def sample_workload(cfg: BenchConfig, n: int | None = None, seed: int | None = None,
                    tokenizer: Any = None) -> PromptSet:
    """`n` requests (default --num-prompts) with lengths integer-uniform within the rule's
    bounds (launcher.run.lengths): a shared prefix counts in the input; with the chat
    template its tokens do too, as sa-bench counts them."""
    rng = random.Random(cfg.seed if seed is None else seed)
    n = cfg.num_prompts if n is None else n
    template_len = _template_len(tokenizer) if tokenizer is not None else 0
    bounds = rule_lengths.lengths(cfg.length_rule, cfg.random_input_len, cfg.random_output_len,
                                  cfg.random_range_ratio, template_len=template_len,
                                  prefix_len=cfg.random_prefix_len)
    in_lo, in_hi = bounds.input_low - cfg.random_prefix_len, bounds.input_high - cfg.random_prefix_len
    if cfg.random_prefix_len + in_lo < 1:
        raise BenchError("--random-input-len is too small: prompts could be empty.")
    input_lens = [rng.randint(in_lo, in_hi) for _ in range(n)]
    output_lens = [rng.randint(bounds.output_low, bounds.output_high) for _ in range(n)]
    offsets = [rng.randrange(TOKEN_ID_SPAN) for _ in range(n)]
    prefix_ids = [TOKEN_ID_LOW + rng.randrange(TOKEN_ID_SPAN) for _ in range(cfg.random_prefix_len)]
    wl = PromptSet(input_lens, output_lens, offsets, ",".join(map(str, prefix_ids)),
                  cfg.random_prefix_len, bounds, template_len=template_len)
    if tokenizer is not None:
        if cfg.random_prefix_len:
            raise BenchError("--random-prefix-len with --use-chat-template is not supported.")
        wl.texts, wl.input_lens = chat_prompts(tokenizer, input_lens, offsets, template_len)
    return wl


# --- chat-template prompts (sa-bench's, to the exact length) --------------------------------


HF_MODES = ("auto", "hf")
CHECK_FLAG = "--check-tokenizer"  # preflight: load the tokenizer and template, say, exit


def load_tokenizer(path: str, mode: str = "auto", trust_remote_code: bool = False,
                   revision: str | None = None) -> Any:
    """The served model's tokenizer as the engine loads it (transformers' AutoTokenizer with
    the engine's trust_remote_code, or vLLM's own tokenizer of a named mode, as sa-bench's
    custom_tokenizer does), with its chat template rendered once. Imported only here."""
    where = f"--tokenizer {path}" + (f" (revision {revision})" if revision else "")
    try:
        if mode in HF_MODES:
            from transformers import AutoTokenizer
        else:
            from vllm.tokenizers import get_tokenizer
    except ImportError:
        need = "transformers" if mode in HF_MODES else f"vLLM (--tokenizer-mode {mode})"
        raise BenchError(f"--use-chat-template needs {need} in the client's environment "
                         "(vLLM's images have it).") from None
    try:
        if mode in HF_MODES:
            tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                revision=revision)
        else:
            tok = get_tokenizer(path, tokenizer_mode=mode, trust_remote_code=trust_remote_code,
                                revision=revision)
    except Exception as e:  # transformers, hub and the tokenizer's own code raise anything
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        hint = ("; it runs its own code: the engine's trust-remote-code gives the client "
                "--trust-remote-code" if "trust_remote_code" in str(e) and not trust_remote_code
                else "")
        raise BenchError(f"{where}: cannot load it ({first}){hint}.") from None
    if mode in HF_MODES and not getattr(tok, "chat_template", None):
        raise BenchError(f"{where} has no chat template; drop --use-chat-template.")
    try:
        _render(tok, "a")
    except Exception as e:  # a template or a renderer of the model's own
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise BenchError(f"{where}: its chat template does not render ({first}).") from None
    return tok


def _encode(tok: Any, texts: list[str], special: bool) -> list[list[int]]:
    """Token ids of each text, on the Rust side for a fast tokenizer, else one by one with
    the tokenizer's own code (a TikToken tokenizer such as Kimi-K2.5's)."""
    if bt := getattr(tok, "backend_tokenizer", None):
        return [e.ids for e in bt.encode_batch(texts, add_special_tokens=special)]
    return [tok.encode(t, add_special_tokens=special) for t in texts]


def _decode(tok: Any, ids: list[list[int]]) -> list[str]:
    if bt := getattr(tok, "backend_tokenizer", None):
        return bt.decode_batch(ids, skip_special_tokens=False)
    return [tok.decode(x, skip_special_tokens=False) for x in ids]


def _render(tok: Any, body: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": body}],
                                   add_generation_prompt=True, tokenize=False)


def _template_len(tok: Any) -> int:
    """sa-bench's count of the template's own tokens: the template around a one-character
    message, less that character."""
    return len(_encode(tok, [_render(tok, "a")], True)[0]) - 1


def chat_prompts(tok: Any, targets: list[int], offsets: list[int],
                 template_len: int) -> tuple[list[str], list[int]]:
    """Prompt texts whose rendered template is `targets[i]` tokens as the engine counts a
    completion prompt (the tokenizer with its special tokens): sa-bench's construction
    (consecutive vocabulary ids from a random offset, decoded, re-encoded, cut, decoded), then
    the rendered prompt counted and the cut moved until the count matches. Byte-level merges
    at the cut and at the template's edges can step the count by two; such a body is drawn
    again from another offset. Batched on the Rust side for a fast tokenizer. Returns the JSON strings
    and the counts the engine will see."""
    special = set(tok.all_special_ids)
    vocab = [i for i in range(tok.vocab_size) if i not in special]

    def canonical(idx: list[int]) -> list[list[int]]:
        raw = [[vocab[(offsets[i] + j) % len(vocab)] for j in range(t + t // 8 + 16)]
               for i, t in ((i, targets[i]) for i in idx)]
        return _encode(tok, _decode(tok, raw), False)

    offsets = list(offsets)
    n = len(targets)
    canon = canonical(list(range(n)))
    keep = [max(1, t - template_len) for t in targets]
    texts, counts, tries = [""] * n, [0] * n, [0] * n
    todo = list(range(n))
    for _ in range(40):
        if not todo:
            break
        bodies = _decode(tok, [canon[i][:keep[i]] for i in todo])
        rendered = [_render(tok, b) for b in bodies]
        left, redraw = [], []
        for i, text, ids in zip(todo, rendered, _encode(tok, rendered, True), strict=True):
            d = targets[i] - len(ids)
            if not texts[i] or abs(d) < abs(targets[i] - counts[i]):
                texts[i], counts[i] = text, len(ids)
            if not d:
                continue
            tries[i] += 1
            if tries[i] % 3 == 0 or not 1 <= keep[i] + d <= len(canon[i]):
                offsets[i] += 7919  # another body: its merges fall elsewhere
                keep[i] = max(1, targets[i] - template_len)
                redraw.append(i)
            else:
                keep[i] += d
            left.append(i)
        for i, ids in zip(redraw, canonical(redraw), strict=True):
            canon[i] = ids
        todo = left
    return [json.dumps(t) for t in texts], counts


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


async def _wait_ready(session: Any, cfg: BenchConfig, wl: PromptSet) -> None:
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
    cfg: BenchConfig, wl: PromptSet, warm_wl: PromptSet | None = None,
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

        if warm_wl is not None:  # sa-bench's warm-up run: its own prompts, 250 requests/s
            async def warm_one(k: int) -> RequestOutput:
                async with gate:
                    return await send_request(
                        session, cfg.api_url, warm_wl.prompt_json(k), warm_wl.prompt_len(k),
                        _payload_tail(cfg, warm_wl.output_lens[k]), f"bench-{run_id}-warmup-{k}")

            warm_tasks = []
            async for k in _arrivals(len(warm_wl.input_lens), SA_BENCH_WARMUP_RATE, 1.0,
                                     random.Random(cfg.seed + 2)):
                warm_tasks.append(asyncio.create_task(warm_one(k)))
            await asyncio.gather(*warm_tasks)
        elif cfg.num_warmups > 0:
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
    tok = (load_tokenizer(cfg.tokenizer, cfg.tokenizer_mode, cfg.trust_remote_code,
                          cfg.tokenizer_revision) if cfg.use_chat_template else None)
    wl = sample_workload(cfg, tokenizer=tok)
    warm_wl = None
    if cfg.sa_bench_warmup and cfg.num_warmups > 0:  # distinct prompts: none cached for later
        warm_wl = sample_workload(cfg, n=cfg.num_warmups, seed=cfg.seed + 1_000_003, tokenizer=tok)
    outputs, duration, window_start, window_end = await _run(cfg, wl, warm_wl)
    res = build_result(cfg, outputs, duration, window_start, window_end, metrics, percentiles)
    res["workload"] = {"length_rule": cfg.length_rule, "range_ratio": cfg.random_range_ratio,
                       "input_len": cfg.random_input_len, "output_len": cfg.random_output_len,
                       **wl.describe(), "warmups": cfg.num_warmups,
                       "warmup": "sa-bench" if warm_wl is not None else "first prompt",
                       # what the client built, beside input_lens (the engine's own count)
                       "client_input_lens": [wl.prompt_len(i) for i in range(len(outputs))]}
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


def check_tokenizer(cfg: BenchConfig) -> dict[str, Any]:
    """What the preflight asks before any engine loads: the tokenizer and its chat template,
    loaded as this point will load them (one JSON line)."""
    t0 = time.monotonic()
    try:
        tok = load_tokenizer(cfg.tokenizer or cfg.model, cfg.tokenizer_mode,
                             cfg.trust_remote_code, cfg.tokenizer_revision)
        ok, message = True, f"template of {_template_len(tok)} tokens"
    except BenchError as e:
        ok, message = False, str(e)
    return {"ok": ok, "message": message, "seconds": round(time.monotonic() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if CHECK_FLAG in argv:  # the preflight's question, not a sweep point
        argv.remove(CHECK_FLAG)
        print(json.dumps(check_tokenizer(parse_args(argv))), flush=True)
        return 0
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
