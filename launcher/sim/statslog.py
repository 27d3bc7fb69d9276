"""The periodic stats lines of vLLM 0.33's LoggingStatLogger and the NIXL 'KV Transfer' line.

Same message layout, file names and line numbers as the fixtures
(``[loggers.py:335] Engine 000: ...``, ``[metrics.py:108] KV Transfer metrics: ...``).
Idle intervals (no throughput now or in the previous interval) are DEBUG, so they do not
appear at INFO; with more than one API server vLLM prints one warning instead of stats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from launcher.sim import vlog
from launcher.sim.engine import Engine, Interval

STATS_WHERE = "loggers.py:335"
KV_WHERE = "metrics.py:108"
SPEC_WHERE = "metrics.py:120"  # vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log
INIT_WHERE = "loggers.py:425"
MULTI_API_WHERE = "loggers.py:1386"
MULTI_API_MSG = ("AsyncLLM created with api_server_count more than 1; disabling stats logging "
                 "to avoid incomplete stats.")


def _pct(values: list[float], q: float) -> float:
    """Percentile with linear interpolation (numpy's default)."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def kv_message(iv: Interval) -> str | None:
    """'KV Transfer metrics: ...' for an interval, or None when nothing happened."""
    n = len(iv.xfer_s)
    if not n and not iv.failed and not iv.expired and not iv.notifs_after_expiry:
        return None
    if n:
        total_mb = sum(iv.bytes) / 2**20
        total_s = sum(iv.xfer_s)
        fields: list[tuple[str, object]] = [
            ("Num successful transfers", n),
            ("Avg xfer time (ms)", round(sum(iv.xfer_s) / n * 1000, 3)),
            ("P90 xfer time (ms)", round(_pct(iv.xfer_s, 90) * 1000, 3)),
            ("Avg post time (ms)", round(sum(iv.post_s) / n * 1000, 3)),
            ("P90 post time (ms)", round(_pct(iv.post_s, 90) * 1000, 3)),
            ("Avg MB per transfer", round(total_mb / n, 3)),
            ("Throughput (MB/s)", round(total_mb / total_s, 3) if total_s else 0),
            ("Avg number of descriptors", round(sum(iv.descs) / n, 1)),
        ]
    else:
        fields = [("Num successful transfers", 0)] + [
            (k, 0) for k in ("Avg xfer time (ms)", "P90 xfer time (ms)", "Avg post time (ms)",
                             "P90 post time (ms)", "Avg MB per transfer", "Throughput (MB/s)",
                             "Avg number of descriptors")]
    fields += [("Num failed transfers", iv.failed), ("Num KV expired reqs", iv.expired),
               ("Num notifs after expiry", iv.notifs_after_expiry)]
    return "KV Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in fields)


def spec_message(iv: Interval, elapsed: float) -> str | None:
    """'SpecDecoding metrics: ...' for an interval with drafts, as vLLM 0.33 words it."""
    if not iv.spec_drafts:
        return None
    drafted, accepted = iv.spec_draft_tokens, iv.spec_accepted
    rate = accepted / drafted * 100 if drafted else float("nan")
    per_pos = ", ".join(f"{n / iv.spec_drafts:.3f}" for n in iv.spec_accepted_per_pos)
    return ("SpecDecoding metrics: "
            f"Mean acceptance length: {1 + accepted / iv.spec_drafts:.2f}, "
            f"Accepted throughput: {accepted / elapsed:.2f} tokens/s, "
            f"Drafted throughput: {drafted / elapsed:.2f} tokens/s, "
            f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
            f"Per-position acceptance rate: {per_pos}, "
            f"Avg Draft acceptance rate: {rate:.1f}%")


def engine_message(prefix: str, prompt_tp: float, gen_tp: float, running: int, waiting: int,
                   deferred: int, fetch: tuple[int, int, int], preemptions: int,
                   usage: float, prefix_hit: float | None, ext_hit: float | None) -> str:
    parts = [
        f"Avg prompt throughput: {prompt_tp:.1f} tokens/s",
        f"Avg generation throughput: {gen_tp:.1f} tokens/s",
        f"Running: {running} reqs",
        f"Waiting: {waiting} reqs",
    ]
    if deferred:
        parts.append(f"Deferred: {deferred} reqs")
    if any(fetch):
        parts.append(f"KV fetch: {fetch[0]} waiting to start, {fetch[1]} in progress, "
                     f"{fetch[2]} completed waiting")
    if preemptions:
        parts.append(f"Preemptions: {preemptions}")
    parts.append(f"GPU KV cache usage: {usage * 100:.1f}%")
    if prefix_hit is not None:
        parts.append(f"Prefix cache hit rate: {prefix_hit:.1f}%")
    if ext_hit is not None:
        parts.append(f"External prefix cache hit rate: {ext_hit:.1f}%")
    return prefix + ", ".join(parts)


def _snapshot(e: Engine) -> tuple[int, int, int, tuple[int, int, int]]:
    g = e.gauges()
    fetch = g["kv_fetch"]
    return (g["running"], g["waiting"], g["waiting_by_reason"]["deferred"],
            (fetch["waiting_to_start"], fetch["in_progress"], fetch["completed_waiting"]))


def log_interval(engines: Sequence[Engine], aggregate: bool) -> None:
    """Print one interval's lines for ``engines`` (per engine, or aggregated)."""
    taken = [(e, *e.take_interval()) for e in engines]
    if aggregate:
        n = len(taken)
        prompt_tp = sum(iv.prompt_tokens / el for _, iv, el in taken)
        gen_tp = sum(iv.gen_tokens / el for _, iv, el in taken)
        last = sum(iv.last_prompt_tp + iv.last_gen_tp for _, iv, _ in taken)
        snaps = [_snapshot(e) for e, _, _ in taken]
        fetch = tuple(sum(s[3][i] for s in snaps) for i in range(3))
        ext = [e.external_hit_rate() for e, _, _ in taken]
        ext_vals = [x for x in ext if x is not None]
        msg = engine_message(
            f"{n} Engines Aggregated: ", prompt_tp, gen_tp, sum(s[0] for s in snaps),
            sum(s[1] for s in snaps), sum(s[2] for s in snaps),
            (fetch[0], fetch[1], fetch[2]), sum(iv.preemptions for _, iv, _ in taken),
            sum(e.kv_usage() for e, _, _ in taken) / n,
            _prefix_hit(engines), sum(ext_vals) / len(ext_vals) if ext_vals else None)
        level = "INFO" if prompt_tp or gen_tp or last else "DEBUG"
        vlog.log(level, STATS_WHERE, msg)
        merged = Interval()
        for _, iv, _ in taken:
            merged.xfer_s += iv.xfer_s
            merged.post_s += iv.post_s
            merged.bytes += iv.bytes
            merged.descs += iv.descs
            merged.failed += iv.failed
            merged.expired += iv.expired
            merged.notifs_after_expiry += iv.notifs_after_expiry
        kv = kv_message(merged) if engines[0].cfg.nixl else None
        if kv:
            vlog.log(level, KV_WHERE, kv)
        return
    for e, iv, elapsed in taken:
        prompt_tp = iv.prompt_tokens / elapsed
        gen_tp = iv.gen_tokens / elapsed
        running, waiting, deferred, fetch = _snapshot(e)
        msg = engine_message(
            f"Engine {e.rank:03d}: ", prompt_tp, gen_tp, running, waiting, deferred, fetch,
            iv.preemptions, e.kv_usage(), _prefix_hit([e]), e.external_hit_rate())
        idle = not (prompt_tp or gen_tp or iv.last_prompt_tp or iv.last_gen_tp)
        level = "DEBUG" if idle else "INFO"
        vlog.log(level, STATS_WHERE, msg)
        spec = spec_message(iv, elapsed)
        if spec:  # after the stats line, before the KV connector's (loggers.py:340)
            vlog.log(level, SPEC_WHERE, spec)
        kv = kv_message(iv) if e.cfg.nixl else None
        if kv:  # vLLM logs it with the stats line's level: an idle engine's is DEBUG too
            vlog.log(level, KV_WHERE, kv)


def _prefix_hit(engines: Sequence[Engine]) -> float | None:
    """The local prefix cache's hit rate over each engine's most recent 1000 requests
    (vLLM's CachingMetrics); None before any lookup, as vLLM then leaves the part out."""
    windows = [w for w in (e.prefix_hit_window() for e in engines) if w is not None]
    if not windows:
        return None
    queries = sum(q for q, _ in windows)
    return 100.0 * sum(h for _, h in windows) / queries if queries else 0.0


async def run_stats_logger(engines: Sequence[Engine], interval_s: float,
                           aggregate: bool) -> None:
    while True:
        await asyncio.sleep(interval_s)
        log_interval(engines, aggregate)
