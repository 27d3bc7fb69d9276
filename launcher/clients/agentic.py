"""One agentic sweep point: the real AIPerf replays multi-turn sessions through the router at
N live sessions, then every engine is drained, then AIPerf's own export becomes the point's
result file (docs/agentic.md).

    python -m launcher.clients.agentic --aiperf PATH --url ROUTER --model NAME
        --tokenizer T (--input-file F --trace-format mooncake_trace | --public-dataset NAME)
        --sessions N [--duration S | --conversations K] --metrics ROLE=URL ...
        --artifact-dir DIR --output FILE

AIPerf's files stay whole in DIR (profile_export_aiperf.json, profile_export.jsonl,
server_metrics_export.json, its log); FILE is the point in the sweep's result schema
(`driver: aiperf`) with an `agentic` section. Standard library only: AIPerf runs in its own
environment, as a process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

# profile_export_aiperf.json (AIPerf 0.13.0, schema_version 1.4): our name -> its metric
LATENCIES = {"ttft": "time_to_first_token", "itl": "inter_token_latency",
             "tpot": "inter_token_latency", "e2el": "request_latency"}
IDLE_POLLS = 3
TAIL = 12


def aiperf_argv(a: argparse.Namespace) -> list[str]:
    """`aiperf profile` for this point (flags as AIPerf 0.13.0's CLI names them)."""
    argv = [a.aiperf, "profile", "--model", a.model, "--url", a.url,
            "--endpoint-type", "chat", "--endpoint", "/v1/chat/completions", "--streaming",
            "--concurrency", str(a.sessions), "--random-seed", str(a.seed),
            "--failed-request-threshold", f"{a.failed_threshold:g}",
            "--use-server-token-count", "--session-header", a.session_header,
            "--artifact-dir", str(a.artifact_dir), "--ui-type", "none", "--no-gpu-telemetry",
            "--cache-bust", "first_turn_prefix", "--extra-inputs", "ignore_eos:true",
            *a.extra_input]
    if a.tokenizer:
        argv += ["--tokenizer", a.tokenizer]
    if a.public_dataset:
        argv += ["--public-dataset", a.public_dataset]
    else:
        argv += ["--input-file", a.input_file, "--custom-dataset-type", a.trace_format,
                 "--isl-block-size", str(a.block_size)]
    if a.duration:
        argv += ["--benchmark-duration", f"{a.duration:g}"]
    elif a.conversations:
        argv += ["--conversation-num", str(a.conversations)]
    if a.warmup:
        argv += ["--warmup-request-count", str(a.warmup)]
    if a.think_cap is not None:
        argv += ["--inter-turn-delay-cap-seconds", f"{a.think_cap:g}"]
    if a.max_context:
        argv += ["--max-context-length", str(a.max_context)]
    if a.scenario:
        argv += ["--scenario", a.scenario]
    if a.grace_period is not None:
        argv += ["--benchmark-grace-period", f"{a.grace_period:g}"]
    if a.cache_warmup is not None:
        argv += ["--agentic-cache-warmup-duration", f"{a.cache_warmup:g}"]
    urls = [u for _, u in a.metrics]
    if urls:
        argv += ["--server-metrics", *urls]
    return argv


def sessions_in(path: str) -> int | None:
    """Sessions in a mooncake_trace file (lines without a session_id are one each)."""
    try:
        ids, lone = set(), 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    sid = json.loads(line).get("session_id")
                    if sid is None:
                        lone += 1
                    else:
                        ids.add(sid)
        return len(ids) + lone
    except (OSError, ValueError, AttributeError):
        return None


def trace_hit_rate(path: str) -> float | None:
    """The trace's theoretical prefix-cache hit rate: each turn's prompt is its session's
    earlier context (every earlier turn's input and output, which AIPerf resends) plus its
    own input; the earlier context is what an unbounded cache could serve. Repeated tokens
    over all prompt tokens, turns in file order; None where a turn has no input_length."""
    context: dict[object, int] = {}
    repeat = total = 0
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                turn = json.loads(line)
                n = turn.get("input_length")
                if not isinstance(n, int):
                    return None
                sid = turn.get("session_id", ("line", i))
                before = context.get(sid, 0)
                repeat += before
                total += before + n
                context[sid] = before + n + int(turn.get("output_length") or 0)
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return repeat / total if total else None


# --- reading AIPerf's files -----------------------------------------------------------------


def _read_json(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _stat(export: dict, metric: str, key: str) -> float | None:
    m = export.get(metric)
    v = m.get(key) if isinstance(m, dict) else None
    return float(v) if isinstance(v, (int, float)) else None


def per_turn(records: Path) -> list[dict]:
    """TTFT and prompt size by turn index, from AIPerf's per-request records (profiling
    phase only)."""
    by: dict[int, list[tuple[float | None, float | None]]] = defaultdict(list)
    try:
        lines = records.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        meta, metrics = rec.get("metadata") or {}, rec.get("metrics") or {}
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        turn = meta.get("turn_index")
        if not isinstance(turn, int):
            continue
        ttft = (metrics.get("time_to_first_token") or {}).get("value")
        isl = (metrics.get("usage_prompt_tokens") or metrics.get("input_sequence_length")
               or {}).get("value")
        by[turn].append((ttft, isl))
    out = []
    for turn in sorted(by):
        ttfts = [t for t, _ in by[turn] if isinstance(t, (int, float))]
        isls = [i for _, i in by[turn] if isinstance(i, (int, float))]
        out.append({"turn": turn, "requests": len(by[turn]),
                    "mean_ttft_ms": sum(ttfts) / len(ttfts) if ttfts else None,
                    "mean_prompt_tokens": sum(isls) / len(isls) if isls else None})
    return out


def prefix_cache(server: dict | None, roles: dict[str, str]) -> dict[str, dict]:
    """Prefix-cache hits and queries over the profiling phase by role, from the engines'
    own counters as AIPerf recorded them (server_metrics_export.json), never from
    usage.cached_tokens (a P/D proxy leaves it at 0)."""
    out: dict[str, dict] = {}
    metrics = (server or {}).get("metrics") or {}
    # external hits: a KV connector's tokens; on a prefill or an aggregated engine that is a
    # store or CPU offload hit, on a decode the P->D handoff (docs/kv-store.md)
    for what, name in (("hits", "vllm:prefix_cache_hits"), ("queries", "vllm:prefix_cache_queries"),
                       ("external_hits", "vllm:external_prefix_cache_hits")):
        for s in (metrics.get(name) or {}).get("series") or []:
            role = roles.get(s.get("endpoint_url"))
            total = (s.get("stats") or {}).get("total")
            if role is None or not isinstance(total, (int, float)):
                continue
            for r in (role, "all"):
                out.setdefault(r, {"hits": 0.0, "queries": 0.0, "external_hits": 0.0})[what] \
                    += total
    for v in out.values():
        v["hit_rate"] = v["hits"] / v["queries"] if v["queries"] else None
    return out


TIER_METRICS = ("vllm:mooncake_store_", "vllm:kv_offload")  # a store's, CPU offload's


def tier_hit_rate(server: dict | None, cache: dict[str, dict]) -> float | None:
    """The share of the prompt tokens the engines that first see a prompt (the prefills, or
    aggregated engines) found in a KV store or CPU offload rather than in their own KV; None
    where no engine exported a store's or offload's metrics (there is none)."""
    first = cache.get("prefill") or cache.get("agg")
    names = ((server or {}).get("metrics") or {}).keys()
    if not first or not first.get("queries") or not any(
            n.startswith(TIER_METRICS) for n in names):
        return None
    return first["external_hits"] / first["queries"]


def kv_usage_max(server: dict | None, roles: dict[str, str]) -> dict[str, float]:
    """The highest vllm:kv_cache_usage_perc AIPerf sampled over the profiling phase, by
    role (AIPerf scrapes every engine several times a second, finer than the telemetry)."""
    out: dict[str, float] = {}
    gauge = ((server or {}).get("metrics") or {}).get("vllm:kv_cache_usage_perc") or {}
    for s in gauge.get("series") or []:
        role = roles.get(s.get("endpoint_url"))
        top = (s.get("stats") or {}).get("max")
        if role is not None and isinstance(top, (int, float)):
            out[role] = max(out.get(role, 0.0), float(top))
    return out


def window(server: dict | None) -> tuple[float | None, float | None]:
    """The profiling phase in unix seconds (AIPerf's phase_time_ranges)."""
    rng = (((server or {}).get("summary") or {}).get("phase_time_ranges") or {}).get(
        "profiling") or {}
    s, e = rng.get("start_ns"), rng.get("end_ns")
    return (s / 1e9 if isinstance(s, int) else None, e / 1e9 if isinstance(e, int) else None)


def salvaged(art: Path, res: dict, sessions: int, exit_code: int,
             log_tail: list[str]) -> dict[str, Any]:
    """A point whose AIPerf ended before its summary: what its per-request records hold
    (AIPerf streams profile_export.jsonl as requests end) is kept, the point failed with
    AIPerf's own words."""
    ttfts, itls, lat, ok, bad = [], [], [], 0, 0
    try:
        lines = (art / "profile_export.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the line it was writing when it ended
        meta, m = rec.get("metadata") or {}, rec.get("metrics") or {}
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        if rec.get("error"):
            bad += 1
            continue
        ok += 1
        for xs, name in ((ttfts, "time_to_first_token"), (itls, "inter_token_latency"),
                         (lat, "request_latency")):
            v = (m.get(name) or {}).get("value")
            if isinstance(v, (int, float)):
                xs.append(float(v))
    res.update(completed=ok, failed=bad, num_prompts=ok + bad)
    for ours, xs in (("ttft", ttfts), ("itl", itls), ("tpot", itls), ("e2el", lat)):
        if xs:
            res[f"mean_{ours}_ms"] = sum(xs) / len(xs)
            for q in (50, 90, 99):
                res[f"p{q}_{ours}_ms"] = _percentile(xs, q)
            res[f"median_{ours}_ms"] = res[f"p50_{ours}_ms"]
    why = log_tail[-1][:200] if log_tail else "no output"
    kept = (f"; the {ok + bad} request(s) it had recorded are kept (profile_export.jsonl)"
            if ok + bad else "")
    res.update(status="failed", failure_reason=(
        f"AIPerf exited with status {exit_code} before writing profile_export_aiperf.json "
        f"({why}){kept}"))
    res["agentic"] = {"sessions": sessions, "artifacts": art.name, "exit_code": exit_code,
                      "per_turn": per_turn(art / "profile_export.jsonl"), "salvaged": True}
    return res


def _percentile(xs: list[float], p: float) -> float:
    """numpy's default (linear) percentile."""
    s = sorted(xs)
    pos = (len(s) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def to_result(art: Path, sessions: int, roles: dict[str, str], exit_code: int,
              log_tail: list[str]) -> dict[str, Any]:
    """The point's result from AIPerf's files in `art` (what was measured is kept when
    AIPerf ended early)."""
    export = _read_json(art / "profile_export_aiperf.json")
    server = _read_json(art / "server_metrics_export.json")
    res: dict[str, Any] = {"driver": "aiperf", "max_concurrency": sessions,
                           "date": time.strftime("%Y%m%d-%H%M%S")}
    if export is None:
        return salvaged(art, res, sessions, exit_code, log_tail)
    # request_count counts the successes, error_request_count the failures (AIPerf's
    # metrics_json_exporter adds the two for its own totals)
    completed = int(_stat(export, "request_count", "avg") or 0)
    failed = int(_stat(export, "error_request_count", "avg") or 0)
    overflow = int(_stat(export, "context_overflow_count", "avg") or 0)
    errors = [f"{e.get('error_details', {}).get('message') or e.get('error_details')}"
              f" x{e.get('count')}" for e in export.get("error_summary") or []
              if isinstance(e, dict)]
    if not failed and errors:
        failed = sum(int(e.get("count") or 0) for e in export["error_summary"]
                     if isinstance(e, dict))
    res.update(
        completed=completed, failed=failed, num_prompts=completed + failed,
        total_input_tokens=int(_stat(export, "total_usage_prompt_tokens", "avg")
                               or _stat(export, "total_isl", "avg") or 0),
        total_output_tokens=int(_stat(export, "total_usage_completion_tokens", "avg")
                                or _stat(export, "total_output_tokens", "avg") or 0),
        duration=_stat(export, "benchmark_duration", "avg"),
        request_throughput=_stat(export, "request_throughput", "avg"),
        output_throughput=_stat(export, "output_token_throughput", "avg"),
        total_token_throughput=_stat(export, "total_token_throughput", "avg"),
        errors=errors,
    )
    for ours, theirs in LATENCIES.items():
        res[f"mean_{ours}_ms"] = _stat(export, theirs, "avg")
        res[f"median_{ours}_ms"] = _stat(export, theirs, "p50")
        for q in ("p50", "p90", "p99"):
            res[f"{q}_{ours}_ms"] = _stat(export, theirs, q)
    res["window_start"], res["window_end"] = window(server)
    meta = export.get("metadata") if isinstance(export.get("metadata"), dict) else {}
    p90_itl = res.get("p90_itl_ms")
    cache = prefix_cache(server, roles)
    res["agentic"] = {
        "sessions": sessions, "artifacts": art.name, "exit_code": exit_code,
        "aiperf_version": export.get("aiperf_version"),
        "benchmark_id": export.get("benchmark_id"),
        "was_cancelled": export.get("was_cancelled"), "is_complete": export.get("is_complete"),
        "error_rate": (_stat(export, "request_error_rate", "avg") or 0.0) / 100.0,
        "context_overflow_rate": overflow / (completed + failed) if completed + failed else 0.0,
        "interactivity_tok_s": 1000.0 / p90_itl if p90_itl else None,
        "submission_valid": meta.get("submission_valid"),
        "invalid_reasons": meta.get("submission_invalid_reasons") or [],
        "theoretical_prefix_hit": _stat(export, "theoretical_prefix_cache_hit", "avg"),
        "prefix_cache": cache,
        "prefix_hit_rate": (cache.get("prefill") or cache.get("all") or {}).get("hit_rate"),
        "tier_hit_rate": tier_hit_rate(server, cache),
        "kv_usage_max": kv_usage_max(server, roles),
        "per_turn": per_turn(art / "profile_export.jsonl"),
    }
    reasons = []
    if failed:
        reasons.append(f"{failed} request(s) failed" + (f" (first: {errors[0][:160]})"
                                                       if errors else ""))
    if not res["total_output_tokens"]:
        reasons.append("zero output tokens generated")
    if exit_code:
        reasons.append(f"AIPerf exited with status {exit_code}"
                       + (f" ({log_tail[-1][:160]})" if log_tail else ""))
    if meta.get("submission_valid") is False:
        reasons.append("AIPerf marked the run invalid: "
                       + ", ".join(map(str, res["agentic"]["invalid_reasons"])))
    res["status"], res["failure_reason"] = ("failed", "; ".join(reasons)) if reasons else (
        "ok", None)
    return res


def culprit(lines: list[str]) -> list[str]:
    """AIPerf's first ERROR line (its message, without the time and level), else its last
    line: what a failed point is reported with."""
    for line in lines:
        if " ERROR " in line:
            return [line.split(" ERROR ", 1)[1].strip()]
    return lines[-1:]


# --- between points -------------------------------------------------------------------------


def busy(url: str) -> float:
    """Running plus waiting requests an engine's /metrics reports."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode("utf-8", "replace")
    total = 0.0
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def drain(urls: list[str], poll_s: float, timeout_s: float) -> dict:
    """Poll every engine until none holds a running or waiting request for three polls in a
    row, so the next point starts on idle engines (no restart)."""
    t0, idle = time.monotonic(), 0
    while time.monotonic() - t0 < timeout_s:
        try:
            idle = idle + 1 if sum(busy(u) for u in urls) == 0 else 0
        except (OSError, ValueError):
            idle = 0
        if idle >= IDLE_POLLS:
            return {"idle": True, "seconds": round(time.monotonic() - t0, 2)}
        time.sleep(poll_s)
    return {"idle": False, "seconds": round(time.monotonic() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.clients.agentic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--aiperf", default="aiperf")
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer")
    p.add_argument("--input-file")
    p.add_argument("--trace-format", default="mooncake_trace")
    p.add_argument("--public-dataset")
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--sessions", type=int, required=True)
    p.add_argument("--duration", type=float)
    p.add_argument("--conversations", type=int)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--think-cap", type=float)
    p.add_argument("--max-context", type=int)
    p.add_argument("--failed-threshold", type=float, default=0.10)
    p.add_argument("--scenario")
    p.add_argument("--cache-warmup", type=float)
    p.add_argument("--grace-period", type=float)
    p.add_argument("--extra-input", action="append", default=[], metavar="KEY:VALUE")
    p.add_argument("--session-header", default="X-Session-ID")
    p.add_argument("--metrics", action="append", default=[], metavar="ROLE=URL",
                   type=lambda s: tuple(s.split("=", 1)))
    p.add_argument("--drain-poll-s", type=float, default=10.0)
    p.add_argument("--drain-timeout-s", type=float, default=1800.0)
    p.add_argument("--artifact-dir", type=Path, required=True)
    p.add_argument("--output", type=Path, required=True)
    a = p.parse_args(argv)
    if not a.public_dataset and not a.input_file:
        p.error("give --input-file or --public-dataset")
    if not a.duration and not a.conversations and a.input_file:
        a.conversations = sessions_in(a.input_file)
    a.artifact_dir.mkdir(parents=True, exist_ok=True)
    cmd = aiperf_argv(a)
    print("aiperf: " + " ".join(cmd), flush=True)
    log = a.artifact_dir / "aiperf-console.log"
    t0 = time.time()
    try:
        with open(log, "w", encoding="utf-8") as out:
            code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    except OSError as e:
        code = 127
        log.write_text(f"cannot run {a.aiperf}: {e}\n", encoding="utf-8")
    lines = [x for x in log.read_text(encoding="utf-8", errors="replace").splitlines()
             if x.strip()]
    for line in lines[-TAIL:]:
        print(f"  | {line}", flush=True)
    roles = {u: r for r, u in a.metrics}
    res = to_result(a.artifact_dir, a.sessions, roles, code, culprit(lines) if code else [])
    res["agentic"]["command"] = cmd
    if a.input_file and a.trace_format == "mooncake_trace":
        res["agentic"]["trace_hit_rate"] = trace_hit_rate(a.input_file)
    res["agentic"]["seconds"] = round(time.time() - t0, 2)
    res["agentic"]["drain"] = drain(list(roles), a.drain_poll_s, a.drain_timeout_s)
    if not res["agentic"]["drain"]["idle"] and res["status"] == "ok":
        res["status"], res["failure_reason"] = "failed", (
            f"the engines still held requests {a.drain_timeout_s:g} s after the point")
    a.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.output.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1), encoding="utf-8")
    tmp.replace(a.output)
    print(f"agentic point at {a.sessions} sessions: {res['status']}"
          + (f" ({res['failure_reason']})" if res["failure_reason"] else ""), flush=True)
    return 0 if res["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
