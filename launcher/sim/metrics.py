"""vLLM 0.33 /metrics for simulated engines: same families, HELP text, labels and buckets.

State is kept in plain floats and bucket arrays (one bisect per observation, and one
observation with a count for a whole decode batch), and rendered in prometheus_client's
text format 0.0.4 layout: single-process mode (``_created`` gauge families, python/process
collectors first) with one API server, multiprocess mode (no ``_created``, families grouped
histograms/gauges/counters) with ``--api-server-count`` > 1, as vLLM does.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import lru_cache
from math import copysign
from typing import Any, Protocol

# Bucket bounds of vllm/v1/metrics/buckets.py and nixl/stats.py (0.33), as in the fixtures.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
PREEMPTION_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
NIXL_XFER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
NIXL_POST_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0,
                     5.0]
NIXL_BYTES_BUCKETS = [2048, 8192, 32768, 131072, 524288, 2097152, 8388608, 33554432,
                      134217728, 536870912, 2147483648, 8589934592]
NIXL_DESC_BUCKETS = [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000]


def buckets_1_2_5(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to and including max_value (vLLM's request_tokens)."""
    out: list[float] = []
    mantissa = [1, 2, 5]
    exp = 0
    while True:
        for m in mantissa:
            v = m * 10 ** exp
            if v > max_value:
                return out
            out.append(float(v))
        exp += 1


HELP = {
    "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "Accepted tokens per draft position.",
    "vllm:estimated_flops_per_gpu":
        "Estimated number of floating point operations per GPU (for Model Flops "
        "Utilization calculations).",
    "vllm:estimated_read_bytes_per_gpu":
        "Estimated number of bytes read from memory per GPU (for Model Flops Utilization "
        "calculations).",
    "vllm:estimated_write_bytes_per_gpu":
        "Estimated number of bytes written to memory per GPU (for Model Flops Utilization "
        "calculations).",
    # prometheus_fastapi_instrumentator's defaults (vLLM instruments its API server with it)
    "http_requests": "Total number of requests by method, status and handler.",
    "http_request_size_bytes":
        "Content length of incoming requests by handler. Only value of header is respected. "
        "Otherwise ignored. No percentile calculated. ",
    "http_response_size_bytes":
        "Content length of outgoing responses by handler. Only value of header is respected. "
        "Otherwise ignored. No percentile calculated. ",
    "http_request_duration_highr_seconds":
        "Latency with many buckets but no API specific labels. Made for more accurate "
        "percentile calculations. ",
    "http_request_duration_seconds":
        "Latency with only few buckets by handler. Made to be only used if aggregation by "
        "handler is important. ",
    "vllm:nixl_xfer_time_seconds": "Histogram of transfer duration for NIXL KV Cache transfers.",
    "vllm:nixl_post_time_seconds": "Histogram of transfer post time for NIXL KV Cache transfers.",
    "vllm:nixl_bytes_transferred": "Histogram of bytes transferred per NIXL KV Cache transfers.",
    "vllm:nixl_num_descriptors":
        "Histogram of number of descriptors per NIXL  KV Cache transfers.",
    "vllm:nixl_num_failed_transfers":
        "Number of failed NIXL KV Cache transfers, including handshake and notification "
        "failures. NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
    "vllm:nixl_num_failed_notifications":
        "Number of failed NIXL KV Cache notifications. Retained for compatibility; these "
        "failures are also included in vllm:nixl_num_failed_transfers.",
    "vllm:nixl_num_kv_expired_reqs":
        "Number of requests that had their KV expire. NOTE: This metric is tracked on the P "
        "instance.",
    "vllm:nixl_num_notifications_after_expiry":
        "Number of completion notifications for requests that were no longer tracked, usually "
        "because their KV lease expired. The KV blocks may have been reused before the "
        "transfer finished. Counted per notification (one per remote rank), not per request.",
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:num_requests_waiting_by_reason":
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
        "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV "
        "transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    "vllm:num_requests_kv_fetch_by_stage":
        "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' "
        "= needs an async KV load that has not started; 'in_progress' = load started and not "
        "yet reported finished; 'completed_waiting' = load finished, request not running yet.",
    "vllm:engine_sleep_state":
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
        "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:external_prefix_cache_queries":
        "External prefix cache queries from KV connector cross-instance cache sharing, in "
        "terms of number of queried tokens.",
    "vllm:external_prefix_cache_hits":
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms "
        "of number of cached tokens.",
    "vllm:mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "vllm:mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:prompt_tokens_by_source": "Number of prompt tokens by source.",
    "vllm:prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "vllm:prompt_tokens_cached_by_source":
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
        "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
        "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
        "vllm:external_prefix_cache_hits.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:admission_rejections":
        "Number of admission attempts rejected by a queue limit, by reason.",
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "vllm:request_max_num_generation_tokens":
        "Histogram of maximum number of requested generation tokens.",
    "vllm:request_params_n": "Histogram of the n request parameter.",
    "vllm:request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "vllm:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "vllm:request_time_per_output_token_seconds":
        "Histogram of time_per_output_token_seconds per request.",
    "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:request_inference_time_seconds":
        "Histogram of time spent in RUNNING phase for request.",
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "vllm:request_num_preemptions":
        "Histogram of the number of times a request was preempted.",
    "vllm:request_prefill_kv_computed_tokens":
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
    # vLLM 0.33 mooncake/store/metrics.py MooncakeStorePromMetrics
    "vllm:mooncake_store_operation_time_seconds": "Histogram of Mooncake store communication time.",
    "vllm:mooncake_store_operation": "Number of Mooncake store communication operations.",
    "vllm:mooncake_store_operation_keys": "Number of Mooncake store keys touched by operations.",
    "vllm:mooncake_store_operation_bytes":
        "Number of bytes transferred by Mooncake store operations.",
    "vllm:mooncake_store_operation_failed_keys":
        "Number of Mooncake store keys that failed in operations.",
    # offloading/metrics.py (OffloadingConnector, CPU spec): the flat names and the deprecated
    # ones with transfer_type, both kept up to date
    "vllm:kv_offload_load_bytes": "Total bytes loaded from offload storage to GPU.",
    "vllm:kv_offload_load_time": "Total load time from offload storage to GPU, in seconds.",
    "vllm:kv_offload_load_size": "Histogram of KV offload load operation size, in bytes.",
    "vllm:kv_offload_store_bytes": "Total bytes stored from GPU to offload storage.",
    "vllm:kv_offload_store_time": "Total store time from GPU to offload storage, in seconds.",
    "vllm:kv_offload_store_size": "Histogram of KV offload store operation size, in bytes.",
    "vllm:kv_offload_total_bytes": "Number of bytes offloaded by KV connector",
    "vllm:kv_offload_total_time": "Total time measured by all KV offloading operations",
    "vllm:kv_offload_size": "Histogram of KV offload transfer size, in bytes.",
    # v1/simple_kv_offload/metrics.py (SimpleCPUOffloadConnector)
    "vllm:simple_kv_offload_save_outcomes":
        "Store admission decisions in SimpleCPUOffloadConnector, by outcome. Outcomes classify "
        "eager-mode boundary hand-off stores; lazy-mode stores are not classified.",
    "vllm:simple_kv_offload_load_blocks":
        "KV blocks restored to GPU from the offload pool, counted when a load finishes. This "
        "is prefill work avoided through offload cache hits.",
}
STORE_OPERATIONS = ("save_exists", "save_put", "load_get", "lookup_exists")
SAVE_OUTCOMES = ("stored", "dropped_cpu_full", "dropped_request_gone", "dropped_null_block",
                 "dropped_not_hashed", "skipped_already_cached", "skipped_in_flight")

WAITING_REASONS = ("capacity", "deferred")
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
REJECT_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")


class Hist:
    """A histogram child: per-bucket counts (last = +Inf), sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = [float(b) for b in bounds]
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n


# (name, buckets key) of the per-request/iteration histograms in vLLM's registration order.
_REQUEST_HISTS = (
    ("vllm:request_prompt_tokens", "tokens"),
    ("vllm:request_generation_tokens", "tokens"),
    ("vllm:iteration_tokens_total", "iteration"),
    ("vllm:request_max_num_generation_tokens", "tokens"),
    ("vllm:request_params_n", "n"),
    ("vllm:request_params_max_tokens", "tokens"),
    ("vllm:time_to_first_token_seconds", "ttft"),
    ("vllm:inter_token_latency_seconds", "itl"),
    ("vllm:request_time_per_output_token_seconds", "itl"),
    ("vllm:e2e_request_latency_seconds", "latency"),
    ("vllm:request_queue_time_seconds", "latency"),
    ("vllm:request_inference_time_seconds", "latency"),
    ("vllm:request_prefill_time_seconds", "latency"),
    ("vllm:request_decode_time_seconds", "latency"),
    ("vllm:request_num_preemptions", "preempt"),
    ("vllm:request_prefill_kv_computed_tokens", "tokens"),
)
_NIXL_HISTS = (
    ("vllm:nixl_xfer_time_seconds", NIXL_XFER_BUCKETS),
    ("vllm:nixl_post_time_seconds", NIXL_POST_BUCKETS),
    ("vllm:nixl_bytes_transferred", NIXL_BYTES_BUCKETS),
    ("vllm:nixl_num_descriptors", NIXL_DESC_BUCKETS),
)
# vllm/v1/metrics/perf.py PerfMetricsProm: registered whatever --enable-mfu-metrics says
# (they stay 0 without it), right after the KV connector's metrics.
_PERF_COUNTERS = ("vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
                  "vllm:estimated_write_bytes_per_gpu")
_NIXL_COUNTERS = ("vllm:nixl_num_failed_transfers", "vllm:nixl_num_failed_notifications",
                  "vllm:nixl_num_kv_expired_reqs", "vllm:nixl_num_notifications_after_expiry")
# Counters with an engine label, in registration order: (name, extra label, its values).
_COUNTERS: tuple[tuple[str, str | None, tuple[str, ...]], ...] = (
    ("vllm:prefix_cache_queries", None, ()),
    ("vllm:prefix_cache_hits", None, ()),
    ("vllm:external_prefix_cache_queries", None, ()),
    ("vllm:external_prefix_cache_hits", None, ()),
    ("vllm:mm_cache_queries", None, ()),
    ("vllm:mm_cache_hits", None, ()),
    ("vllm:num_preemptions", None, ()),
    ("vllm:prompt_tokens", None, ()),
    ("vllm:prompt_tokens_by_source", "source", PROMPT_SOURCES),
    ("vllm:prompt_tokens_cached", None, ()),
    ("vllm:prompt_tokens_cached_by_source", "source", CACHED_SOURCES),
    ("vllm:generation_tokens", None, ()),
    ("vllm:request_success", "finished_reason", FINISH_REASONS),
)


@dataclass
class EngineStats:
    """Cumulative Prometheus state of one engine (DP rank)."""

    max_model_len: int
    created: float = field(default_factory=time.time)
    counters: dict[str, float] = field(default_factory=dict)
    hists: dict[str, Hist] = field(default_factory=dict)
    # KV tiers (launcher.sim.tiers): the Mooncake store's (operation, status) series, created
    # when first observed as vLLM's are, and the CPU offload tier's counters
    store_ops: dict[tuple[str, str], Any] = field(default_factory=dict)
    offload: Any = None

    def __post_init__(self) -> None:
        keys = {
            "tokens": buckets_1_2_5(self.max_model_len), "iteration": ITERATION_BUCKETS,
            "n": PARAMS_N_BUCKETS, "ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS,
            "latency": LATENCY_BUCKETS, "preempt": PREEMPTION_BUCKETS,
        }
        for name, key in _REQUEST_HISTS:
            self.hists[name] = Hist(keys[key])
        for name, bounds in _NIXL_HISTS:
            self.hists[name] = Hist(bounds)
        for name in _NIXL_COUNTERS + _PERF_COUNTERS:
            self.counters[name] = 0.0
        for name, label, values in _COUNTERS:
            if label is None:
                self.counters[name] = 0.0
            else:
                for v in values:
                    self.counters[f"{name}|{v}"] = 0.0

    def inc(self, name: str, n: float = 1.0) -> None:
        self.counters[name] += n


# prometheus_fastapi_instrumentator as vLLM sets it up (vllm/entrypoints/serve/instrumentator/
# metrics.py, 0.32 and 0.33): these paths are not counted, status codes are grouped (2xx).
HTTP_EXCLUDED = frozenset({"/metrics", "/health", "/load", "/ping", "/version", "/server_info"})
HTTP_HIGHR_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0,
                      3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0]
HTTP_BUCKETS = [0.1, 0.5, 1.0]


@dataclass
class HttpStats:
    """The API server's own request metrics (the instrumentator's five families)."""

    created: float = field(default_factory=time.time)
    requests: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    request_size: dict[str, list[float]] = field(default_factory=dict)  # count, sum, created
    response_size: dict[str, list[float]] = field(default_factory=dict)
    highr: Hist = field(default_factory=lambda: Hist(HTTP_HIGHR_BUCKETS))
    durations: dict[tuple[str, str], tuple[Hist, float]] = field(default_factory=dict)

    def observe(self, handler: str, method: str, status: int, request_bytes: int,
                response_bytes: int, seconds: float) -> None:
        if handler in HTTP_EXCLUDED:
            return
        now = time.time()
        key = (handler, method, f"{status // 100}xx")
        self.requests.setdefault(key, [0.0, now])[0] += 1
        for table, n in ((self.request_size, request_bytes), (self.response_size, response_bytes)):
            row = table.setdefault(handler, [0.0, 0.0, now])
            row[0] += 1
            row[1] += n
        self.highr.observe(seconds)
        self.durations.setdefault((handler, method), (Hist(HTTP_BUCKETS), now))[0].observe(seconds)

    def families(self, with_created: bool) -> list[str]:
        out: list[str] = []

        def head(name: str, help_name: str, kind: str) -> None:
            out.append(f"# HELP {name} {HELP[help_name]}")
            out.append(f"# TYPE {name} {kind}")

        def hist_lines(name: str, h: Hist, lab: dict[str, str]) -> None:
            acc = 0
            for bound, c in zip(h.bounds, h.counts, strict=False):
                acc += c
                out.append(f"{name}_bucket{_labels({**lab, 'le': _fmt(bound)})} {_fmt(acc)}")
            out.append(f"{name}_bucket{_labels({**lab, 'le': '+Inf'})} {_fmt(acc + h.counts[-1])}")
            out.append(f"{name}_count{_labels(lab) if lab else ''} {_fmt(h.count)}")
            out.append(f"{name}_sum{_labels(lab) if lab else ''} {_fmt(h.sum)}")

        head("http_requests_total", "http_requests", "counter")
        labs = [({"handler": h, "method": m, "status": st}, v)
                for (h, m, st), v in self.requests.items()]
        out += [f"http_requests_total{_labels(lab)} {_fmt(v[0])}" for lab, v in labs]
        if with_created:
            head("http_requests_created", "http_requests", "gauge")
            out += [f"http_requests_created{_labels(lab)} {_fmt(v[1])}" for lab, v in labs]
        for name, table in (("http_request_size_bytes", self.request_size),
                            ("http_response_size_bytes", self.response_size)):
            head(name, name, "summary")
            for h, (count, total, _) in table.items():
                out.append(f"{name}_count{_labels({'handler': h})} {_fmt(count)}")
                out.append(f"{name}_sum{_labels({'handler': h})} {_fmt(total)}")
            if with_created:
                head(f"{name}_created", name, "gauge")
                out += [f"{name}_created{_labels({'handler': h})} {_fmt(row[2])}"
                        for h, row in table.items()]
        name = "http_request_duration_highr_seconds"
        head(name, name, "histogram")
        hist_lines(name, self.highr, {})
        if with_created:
            head(f"{name}_created", name, "gauge")
            out.append(f"{name}_created {_fmt(self.created)}")
        name = "http_request_duration_seconds"
        head(name, name, "histogram")
        for (h, m), (hist_, _) in self.durations.items():
            hist_lines(name, hist_, {"handler": h, "method": m})
        if with_created:
            head(f"{name}_created", name, "gauge")
            out += [f"{name}_created{_labels({'handler': h, 'method': m})} {_fmt(c)}"
                    for (h, m), (_, c) in self.durations.items()]
        return out


class GaugeSource(Protocol):
    rank: int
    stats: EngineStats

    def gauges(self) -> dict[str, Any]: ...

    def cache_config(self) -> dict[str, str]: ...


# Every scrape renders every series (a DP-2 page is ~80 KB, ~900 lines), and the agent asks
# every 0.5-1 s: the same label sets and mostly the same values come back each time, so both
# are formatted once and looked up after (6.5 ms a page before, most of it here).
def _fmt(v: float) -> str:
    if v == 0:  # 0.0 and -0.0 are one key to a cache
        return "-0.0" if copysign(1.0, v) < 0 else "0.0"
    return _go_float(v)


@lru_cache(maxsize=1 << 16)
def _go_float(v: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(v)


def _esc(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@lru_cache(maxsize=1 << 16)  # a DP-64 page has ~30,000 label sets
def _label_text(items: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(items)) + "}"


def _labels(d: dict[str, str]) -> str:
    return _label_text(tuple(d.items()))


class _Family:
    def __init__(self, name: str, kind: str, help_name: str | None = None) -> None:
        self.name = name
        self.kind = kind
        self.help = HELP[help_name or name]
        self.lines: list[str] = []
        self.created: list[str] = []


def _tier_families(engines: list[GaugeSource], base: list[dict[str, str]], names: set[str],
                   hist_fams: list[_Family], counter_fams: list[_Family],
                   ordered: list[_Family]) -> None:
    """The KV tiers' families (launcher.sim.tiers), after the P->D connector's as vLLM's
    MultiConnector registers its children's. A store series exists once observed (vLLM binds
    its labels on first use)."""
    from launcher.sim.connectors import OFFLOADING, SIMPLE_OFFLOAD, STORE

    def hist_series(fam: _Family, name: str, h: Hist, lab: dict[str, str], created: float):
        acc = 0
        for bound, c in zip(h.bounds, h.counts, strict=False):
            acc += c
            fam.lines.append(f"{name}_bucket{_labels({**lab, 'le': _fmt(bound)})} {_fmt(acc)}")
        fam.lines.append(f"{name}_bucket{_labels({**lab, 'le': '+Inf'})} "
                         f"{_fmt(acc + h.counts[-1])}")
        fam.lines.append(f"{name}_count{_labels(lab)} {_fmt(h.count)}")
        fam.lines.append(f"{name}_sum{_labels(lab)} {_fmt(h.sum)}")
        fam.created.append(f"{name}_created{_labels(lab)} {_fmt(created)}")

    def counter_fam(name: str, rows: list[tuple[dict[str, str], float, float]]) -> None:
        fam = _Family(name + "_total", "counter", name)
        for lab, value, created in rows:
            fam.lines.append(f"{name}_total{_labels(lab)} {_fmt(value)}")
            fam.created.append(f"{name}_created{_labels(lab)} {_fmt(created)}")
        counter_fams.append(fam)
        ordered.append(fam)

    if STORE in names:
        series = [({**lab, "operation": op, "status": st}, ops, e.stats.created)
                  for e, lab in zip(engines, base, strict=True)
                  for (op, st), ops in e.stats.store_ops.items()]
        name = "vllm:mooncake_store_operation_time_seconds"
        fam = _Family(name, "histogram")
        for lab, ops, created in series:
            hist_series(fam, name, ops.hist, lab, created)
        hist_fams.append(fam)
        ordered.append(fam)
        for suffix, attr in (("", "calls"), ("_keys", "keys"), ("_bytes", "bytes"),
                             ("_failed_keys", "failed_keys")):
            counter_fam(f"vllm:mooncake_store_operation{suffix}",
                        [(lab, getattr(ops, attr), c) for lab, ops, c in series])
    offloads = [e for e in engines if e.stats.offload is not None]
    if OFFLOADING in names and offloads:
        rows = [(lab, e.stats.offload, e.stats.created)
                for e, lab in zip(engines, base, strict=True) if e.stats.offload is not None]
        for kind in ("load", "store"):
            name = f"vllm:kv_offload_{kind}_size"
            fam = _Family(name, "histogram")
            for lab, c, created in rows:
                hist_series(fam, name, getattr(c, f"{kind}_hist"), lab, created)
            hist_fams.append(fam)
            ordered.append(fam)
            for what in ("bytes", "time"):
                counter_fam(f"vllm:kv_offload_{kind}_{what}",
                            [(lab, getattr(c, f"{kind}_{what}"), t) for lab, c, t in rows])
        directions = (("CPU_to_GPU", "load"), ("GPU_to_CPU", "store"))
        for what in ("bytes", "time"):
            counter_fam(f"vllm:kv_offload_total_{what}",
                        [({**lab, "transfer_type": tt}, getattr(c, f"{kind}_{what}"), t)
                         for lab, c, t in rows for tt, kind in directions])
        name = "vllm:kv_offload_size"
        fam = _Family(name, "histogram")
        for lab, c, created in rows:
            for tt, kind in directions:
                hist_series(fam, name, getattr(c, f"{kind}_hist"),
                            {**lab, "transfer_type": tt}, created)
        hist_fams.append(fam)
        ordered.append(fam)
    if SIMPLE_OFFLOAD in names and offloads:
        rows = [(lab, e.stats.offload, e.stats.created)
                for e, lab in zip(engines, base, strict=True) if e.stats.offload is not None]
        counter_fam("vllm:simple_kv_offload_save_outcomes",
                    [({**lab, "outcome": o}, c.outcomes.get(o, 0), t)
                     for lab, c, t in rows for o in SAVE_OUTCOMES])
        counter_fam("vllm:simple_kv_offload_load_blocks",
                    [(lab, c.load_blocks, t) for lab, c, t in rows])


def render(engines: list[GaugeSource], model_name: str, *, nixl: bool, consumer: bool,
           multiproc: bool, http: HttpStats | None = None) -> str:
    """The /metrics body for ``engines`` (all engines the API server fronts), with the API
    server's own HTTP families last (``http``), where vLLM's instrumentator puts them."""
    base = [{"engine": str(e.rank), "model_name": model_name} for e in engines]
    gauges = [e.gauges() for e in engines]
    hist_fams: list[_Family] = []
    gauge_fams: list[_Family] = []
    counter_fams: list[_Family] = []
    ordered: list[_Family] = []

    def hist(name: str) -> None:
        fam = _Family(name, "histogram")
        for e, lab in zip(engines, base, strict=True):
            h = e.stats.hists[name]
            acc = 0
            for bound, c in zip(h.bounds, h.counts, strict=False):
                acc += c
                fam.lines.append(f"{name}_bucket{_labels({**lab, 'le': _fmt(bound)})} "
                                 f"{_fmt(acc)}")
            acc += h.counts[-1]
            fam.lines.append(f"{name}_bucket{_labels({**lab, 'le': '+Inf'})} {_fmt(acc)}")
            fam.lines.append(f"{name}_count{_labels(lab)} {_fmt(h.count)}")
            fam.lines.append(f"{name}_sum{_labels(lab)} {_fmt(h.sum)}")
            fam.created.append(f"{name}_created{_labels(lab)} {_fmt(e.stats.created)}")
        hist_fams.append(fam)
        ordered.append(fam)

    def counter(name: str, label: str | None = None, values: tuple[str, ...] = ()) -> None:
        fam = _Family(name + "_total", "counter", name)
        fam.help = HELP[name]
        for v in values or (None,):
            for e, lab in zip(engines, base, strict=True):
                full = lab if label is None else {**lab, label: v}
                key = name if label is None else f"{name}|{v}"
                fam.lines.append(f"{name}_total{_labels(full)} {_fmt(e.stats.counters[key])}")
                fam.created.append(f"{name}_created{_labels(full)} {_fmt(e.stats.created)}")
        counter_fams.append(fam)
        ordered.append(fam)

    def gauge(name: str, key: str, label: str | None = None,
              values: tuple[str, ...] = ()) -> None:
        fam = _Family(name, "gauge")
        for v in values or (None,):
            for g, lab in zip(gauges, base, strict=True):
                full = lab if label is None else {**lab, label: v}
                val = g[key] if label is None else g[key][v]
                fam.lines.append(f"{name}{_labels(full)} {_fmt(val)}")
        gauge_fams.append(fam)
        ordered.append(fam)

    cfg = getattr(engines[0], "cfg", None) if engines else None
    spec = getattr(cfg, "num_spec_tokens", 0)
    if spec:  # registered before the KV connector's (PrometheusStatLogger.__init__)
        from launcher.sim.engine import SPEC_COUNTERS, SPEC_PER_POS

        for name in SPEC_COUNTERS:
            counter(name)
        fam = _Family(SPEC_PER_POS + "_total", "counter", SPEC_PER_POS)
        fam.help = HELP[SPEC_PER_POS]
        for e, lab in zip(engines, base, strict=True):  # each engine's positions together
            for pos in range(spec):
                full = {**lab, "position": str(pos)}
                fam.lines.append(f"{SPEC_PER_POS}_total{_labels(full)} "
                                 f"{_fmt(e.stats.counters[f'{SPEC_PER_POS}|{pos}'])}")
                fam.created.append(f"{SPEC_PER_POS}_created{_labels(full)} "
                                   f"{_fmt(e.stats.created)}")
        counter_fams.append(fam)
        ordered.append(fam)
    if nixl:
        for name, _ in _NIXL_HISTS:
            hist(name)
        for name in _NIXL_COUNTERS:
            counter(name)
    tier_names = {t.name for t in getattr(engines[0], "tiers", ())} if engines else set()
    if tier_names:
        _tier_families(engines, base, tier_names, hist_fams, counter_fams, ordered)
    for name in _PERF_COUNTERS:
        counter(name)
    gauge("vllm:num_requests_running", "running")
    gauge("vllm:num_requests_waiting", "waiting")
    gauge("vllm:num_requests_waiting_by_reason", "waiting_by_reason", "reason", WAITING_REASONS)
    if consumer:
        gauge("vllm:num_requests_kv_fetch_by_stage", "kv_fetch", "stage", KV_FETCH_STAGES)
    gauge("vllm:engine_sleep_state", "sleep", "sleep_state", SLEEP_STATES)
    gauge("vllm:kv_cache_usage_perc", "kv_usage")
    for name, label, values in _COUNTERS:
        counter(name, label, values)
    # admission_rejections has no engine label (one series per reason for the process).
    rej = _Family("vllm:admission_rejections_total", "counter", "vllm:admission_rejections")
    created0 = engines[0].stats.created if engines else time.time()
    for reason in REJECT_REASONS:
        lab = _labels({"model_name": model_name, "reason": reason})
        rej.lines.append(f"vllm:admission_rejections_total{lab} 0.0")
        rej.created.append(f"vllm:admission_rejections_created{lab} {_fmt(created0)}")
    counter_fams.append(rej)
    ordered.append(rej)
    for name, _ in _REQUEST_HISTS:
        hist(name)
    info = _Family("vllm:cache_config_info", "gauge")
    for e in engines:
        info.lines.append(f"vllm:cache_config_info{_labels(e.cache_config())} 1.0")
    gauge_fams.append(info)
    ordered.append(info)

    out: list[str] = []

    def emit(fam: _Family, with_created: bool) -> None:
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        out.extend(fam.lines)
        if with_created and fam.created:
            cname = fam.name[:-6] if fam.kind == "counter" else fam.name
            out.append(f"# HELP {cname}_created {fam.help}")
            out.append(f"# TYPE {cname}_created gauge")
            out.extend(fam.created)

    if multiproc:
        for fam in hist_fams + gauge_fams + counter_fams:
            emit(fam, False)
        if http is not None:  # (their place in multiprocess mode is not checked against vLLM)
            out.extend(http.families(False))
        return "\n".join(out) + "\n"
    from prometheus_client import REGISTRY, generate_latest

    head = generate_latest(REGISTRY).decode()
    for fam in ordered:
        emit(fam, True)
    if http is not None:
        out.extend(http.families(True))
    return head + "\n".join(out) + "\n"
