"""Headline figures per sweep point, computed here once; the CLI summary and the dashboard
both call these functions.

Definitions (docs/figures.md; every per-GPU figure names its denominator):

- total tokens/s per GPU          = (input + output tokens) / duration / working GPUs, i.e.
                                    the GPUs of the endpoints (P + D): the published metric
- total tokens/s per allocated GPU = the same / allocated GPUs (plan.json's nodes x their
                                    GPUs): what the allocation costs. They differ where a
                                    node has idle GPUs (5 x DEP2 prefill: 18 working of 20)
- output tokens/s per decode GPU  = output tokens / duration / decode GPUs   (disagg only)
- input tokens/s per prefill GPU  = input tokens / duration / prefill GPUs   (disagg only)
- output tokens/s per GPU         = output tokens / duration / all GPUs (srt-slurm's figure)
- tokens/s per user               = 1000 / median TPOT (ms); TPOT excludes the first token
- TTFT and TPOT p50/p90/p99 (ms), request throughput (req/s)

GPU counts are plan.json's `gpu_count` (working GPUs) and `nodes[].gpus` (allocated;
`allocated_gpus`) (docs/contracts.md). In aggregated mode every GPU
does both phases, so the per-prefill and per-decode figures are None, with the reason in
`not_applicable`.

    python -m launcher.run.figures RUN_DIR [--write]   # the table; --write also writes summary.json
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from launcher.run.plandoc import CPU_LABEL, PlanDoc, PlanError, engine_label, read_plan
from launcher.run.results import load_results, percentile
from launcher.run.rundir import (
    ACCURACY,
    CUSTOM_BENCH,
    RunDir,
    concurrency_of,
    read_json,
    shape_problem,
    write_json,
)
from launcher.run.vocab import Kind, State

PERCENTILES = (50, 90, 99)
# What summary.json keeps of the accuracy gate's file.
ACCURACY_KEYS = (
    "task", "harness", "accuracy", "threshold", "passed", "metric", "scores", "num_questions",
    "num_shots", "chat", "invalid_rate", "requests", "comparable_with_lm_eval",
    "comparability", "status", "failure_reason", "repeat", "spread", "runs", "file",
)
# The published result's GSM8K figure and the harness it comes from: vLLM's own
# tests/evals/gsm8k/gsm8k_eval.py, 5-shot, all 1,319 questions, run 5 times (docs/gsm8k.md).
# It is shown beside a figure of that harness only: another harness scores the same
# outputs differently.
PUBLISHED_GSM8K = 0.88
PUBLISHED_GSM8K_HARNESS = "vllm"
LM_EVAL = "lm-eval"  # the harness of a result file that names none (written before harnesses)
NOT_AGG = "aggregated mode: every GPU runs prefill and decode, so there is no such split"
# What each per-GPU figure divides by, as every place that shows one names it.
WORKING = "per working GPU"
ALLOCATED = "per allocated GPU"
PER_GPU = {
    "total_tokens_per_s_per_gpu": f"{WORKING}: (input + output tok/s) / GPUs of the prefill "
                                  "and decode endpoints (gpus_total; the published metric)",
    "total_tokens_per_s_per_allocated_gpu": f"{ALLOCATED}: (input + output tok/s) / nodes x "
                                            "GPUs per node of the allocation (gpus_allocated)",
    "output_tokens_per_s_per_decode_gpu": "per decode GPU: output tok/s / decode GPUs",
    "input_tokens_per_s_per_prefill_gpu": "per prefill GPU: input tok/s / prefill GPUs",
    "output_tokens_per_s_per_gpu": f"{WORKING}: output tok/s / gpus_total (srt-slurm's)",
}


def gpu_denominators(plan: PlanDoc | None) -> dict[str, int]:
    """{"gpus_total", "gpus_prefill", "gpus_decode", "gpus_agg"} from plan.json's gpu_count
    (all 0 without a plan: per-GPU figures are then None, never divided by a guess)."""
    return {f"gpus_{k}": plan.gpus(k) if plan else 0 for k in ("total", "prefill", "decode", "agg")}


def allocated_gpus(plan: PlanDoc | None) -> int:
    """GPUs of the allocation: the plan's nodes x the GPUs of each (0 without a plan). More
    than gpus_total where a node has idle GPUs (an odd number of DEP2 prefill endpoints on
    4-GPU nodes)."""
    return sum(n.gpus for n in plan.nodes) if plan else 0


def _per(value: float | None, gpus: int) -> float | None:
    return value / gpus if value is not None and gpus > 0 else None


def _stat(result: dict[str, Any], metric: str, p: int) -> tuple[float | None, str | None]:
    """p-th percentile of ttft/tpot in ms: the file's key, else the per-request arrays of a
    --save-detailed file, else None with the reason."""
    key = f"p{p}_{metric}_ms"
    if result.get(key) is not None:
        return float(result[key]), None
    if p == 50 and result.get(f"median_{metric}_ms") is not None:
        return float(result[f"median_{metric}_ms"]), None
    values = _per_request(result, metric)
    if values:
        return percentile(values, p) * 1000, None
    return None, f"{key} is not in the result (run with --metric-percentiles 50,90,99)"


def _per_request(result: dict[str, Any], metric: str) -> list[float]:
    ttfts, lats, outs = result.get("ttfts"), result.get("latencies"), result.get("output_lens")
    errors = result.get("errors") or []
    if not ttfts:
        return []
    ok = [i for i in range(len(ttfts)) if not (i < len(errors) and errors[i])]
    if metric == "ttft":
        return [ttfts[i] for i in ok]
    if metric == "tpot" and lats and outs:
        return [(lats[i] - ttfts[i]) / (outs[i] - 1) for i in ok if outs[i] > 1]
    return []


def point_figures(result: dict[str, Any], denominators: dict[str, int],
                  mode: str = "disagg", allocated: int | None = None) -> dict[str, Any]:
    """The headline figures of one sweep point (a `load_results` entry). `allocated`: the
    allocation's GPUs (`allocated_gpus`); None (not given) leaves the per-allocated-GPU
    figure None without a reason, 0 gives the reason."""
    na: dict[str, str] = {}
    duration = float(result.get("duration") or 0.0)
    total_in = result.get("total_input_tokens") or 0
    total_out = result.get("total_output_tokens") or 0
    if duration > 0:
        in_tps = total_in / duration
        out_tps = total_out / duration
        tot_tps = (total_in + total_out) / duration
        req_tps = (result.get("completed") or 0) / duration
    else:
        in_tps = out_tps = tot_tps = req_tps = None
        na["throughput"] = "the result has no duration"

    gpus_total = denominators.get("gpus_total", 0)
    gpus_p = denominators.get("gpus_prefill", 0)
    gpus_d = denominators.get("gpus_decode", 0)
    if mode == "agg":
        den = {"gpus_total": gpus_total}
        per_decode = per_prefill = None
        na["output_tokens_per_s_per_decode_gpu"] = NOT_AGG
        na["input_tokens_per_s_per_prefill_gpu"] = NOT_AGG
    else:
        den = {"gpus_total": gpus_total, "gpus_prefill": gpus_p, "gpus_decode": gpus_d}
        per_decode = _per(out_tps, gpus_d)
        per_prefill = _per(in_tps, gpus_p)
        if gpus_d <= 0:
            na["output_tokens_per_s_per_decode_gpu"] = "the plan has no decode GPUs"
        if gpus_p <= 0:
            na["input_tokens_per_s_per_prefill_gpu"] = "the plan has no prefill GPUs"
    if gpus_total <= 0:
        na["total_tokens_per_s_per_gpu"] = "the plan has no GPU count"

    fig: dict[str, Any] = {
        "max_concurrency": result.get("max_concurrency"),
        "file": result.get("file"),
        "driver": result.get("driver"),
        "status": result.get("status"),
        "failure_reason": result.get("failure_reason"),
        "window_start": result.get("window_start"),
        "window_end": result.get("window_end"),
        "duration_s": duration,
        "num_prompts": result.get("num_prompts"),
        "completed": result.get("completed"),
        "failed": result.get("failed"),
        "request_throughput": req_tps,
        "input_throughput": in_tps,
        "output_throughput": out_tps,
        "total_token_throughput": tot_tps,
        "total_tokens_per_s_per_gpu": _per(tot_tps, gpus_total),
        "output_tokens_per_s_per_decode_gpu": per_decode,
        "input_tokens_per_s_per_prefill_gpu": per_prefill,
        "output_tokens_per_s_per_gpu": _per(out_tps, gpus_total),
        "total_tokens_per_s_per_allocated_gpu": _per(tot_tps, allocated or 0),
        "gpus_allocated": allocated,
        "lengths": realized_lengths(result),
    }
    if allocated is not None and allocated <= 0:
        na["total_tokens_per_s_per_allocated_gpu"] = "the plan has no nodes with GPUs"
    for metric in ("ttft", "tpot"):
        for p in PERCENTILES:
            value, why = _stat(result, metric, p)
            fig[f"{metric}_p{p}_ms"] = value
            if why:
                na[f"{metric}_p{p}_ms"] = why
    tpot50 = fig["tpot_p50_ms"]
    if tpot50 and tpot50 > 0 and math.isfinite(tpot50):
        fig["tokens_per_s_per_user"] = 1000.0 / tpot50
    else:
        fig["tokens_per_s_per_user"] = None
        na["tokens_per_s_per_user"] = "no median TPOT (every request made at most one token)"
    fig["denominators"] = den
    fig["not_applicable"] = na
    ag = result.get("agentic")
    if isinstance(ag, dict):  # an AIPerf session replay's own figures (docs/agentic.md)
        fig["agentic"] = {k: ag.get(k) for k in (
            "sessions", "prefix_hit_rate", "tier_hit_rate", "trace_hit_rate",
            "interactivity_tok_s",
            "error_rate",
            "context_overflow_rate", "submission_valid", "invalid_reasons")}
        fig["agentic"]["offered_hit_rate"] = offered_hit_rate(ag)
    return fig


def offered_hit_rate(ag: dict) -> float | None:
    """The prefix-cache hit rate an agentic point's trace offers (an unbounded cache), a
    fraction: the launcher's count for a mooncake_trace (`trace_hit_rate`), else AIPerf's
    `theoretical_prefix_cache_hit` for a Weka corpus, which AIPerf gives in percent
    (aiperf 0.13.0 `metrics/theoretical_prefix_cache.py`, unit PERCENT)."""
    v = ag.get("trace_hit_rate")
    if isinstance(v, (int, float)):
        return float(v)
    v = ag.get("theoretical_prefix_hit")
    return float(v) / 100.0 if isinstance(v, (int, float)) else None


def realized_lengths(result: dict) -> dict | None:
    """The lengths the point's requests had (min, mean, max of input and output, successful
    requests only), from the file's per-request arrays; None when it has none."""
    ins, outs = result.get("input_lens"), result.get("output_lens")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
        return None
    pairs = [(i, o) for i, o in zip(ins, outs, strict=True)
             if isinstance(i, int) and isinstance(o, int) and o > 0]
    if not pairs:
        return None
    out: dict = {"requests": len(pairs)}
    for key, xs in (("input", [i for i, _ in pairs]), ("output", [o for _, o in pairs])):
        out[key] = {"min": min(xs), "mean": round(sum(xs) / len(xs), 1), "max": max(xs)}
    return out


# The types readers rely on in a GSM8K result (accuracy/<task>.json, summary.json's
# "accuracy"); a file with another type in one of them is damaged.
ACCURACY_TYPES = {
    "task": "str | None", "harness": "str | None", "accuracy": "float | None",
    "threshold": "float | None", "passed": "bool | None", "metric": "str | None",
    "scores": "dict[str, dict] | None", "num_questions": "int | None", "num_shots": "int | None",
    "chat": "bool | None", "invalid_rate": "float | None", "status": "str | None",
    "failure_reason": "str | None", "repeat": "int | None", "spread": "dict | None",
    "comparable_with_lm_eval": "bool | None", "timestamp": "float | None",
}  # fmt: skip
_NUMBER = "float | None"
POINT_TYPES = {
    "max_concurrency": "int | None", "file": "str | None", "driver": "str | None",
    "status": "str | None", "failure_reason": "str | None", "num_prompts": "int | None",
    "completed": "int | None", "failed": "int | None", "labels": "list[str]",
    "gpus_allocated": "int | None", "lengths": "dict | None",
    "denominators": "dict", "not_applicable": "dict",
    **{k: _NUMBER for k in (
        "window_start", "window_end", "duration_s", "request_throughput", "input_throughput",
        "output_throughput", "total_token_throughput", "total_tokens_per_s_per_gpu",
        "output_tokens_per_s_per_decode_gpu", "input_tokens_per_s_per_prefill_gpu",
        "output_tokens_per_s_per_gpu", "tokens_per_s_per_user",
        "total_tokens_per_s_per_allocated_gpu",
        *(f"{m}_p{p}_ms" for m in ("ttft", "tpot") for p in PERCENTILES))},
}  # fmt: skip
SUMMARY_TYPES = {
    **{k: "str | None" for k in ("run_id", "recipe", "engine", "engine_platform",
                                 "engine_label", "mode", "model", "state", "verdict")},
    "simulated": "bool", "vllm_cpu": "bool", "denominators": "dict[str, int]",
    "points": "list[dict]", "planned_concurrency": "list[int]", "headline": "dict | None",
    "accuracy": "dict | None", "custom_benchmark": "dict | None",
    "verdict_reasons": "list[str]", "notes": "list[str]",
    "generated": _NUMBER, "gpus_allocated": "int | None", "per_gpu": "dict[str, str]",
}  # fmt: skip


def summary_problem(doc: Any) -> str | None:
    """What is wrong with the shape of a summary.json, in words, or None."""
    why = shape_problem(doc, SUMMARY_TYPES)
    if why is None:
        for i, p in enumerate(doc.get("points") or []):
            why = why or shape_problem(p, POINT_TYPES, f"points[{i}].")
        why = why or shape_problem(doc.get("headline") or {}, POINT_TYPES, "headline.")
        why = why or shape_problem(doc.get("accuracy") or {}, ACCURACY_TYPES, "accuracy.")
    return why


def load_accuracy(run_dir: str | Path, problems: list | None = None) -> dict[str, Any] | None:
    """The newest GSM8K result in `<run_dir>/accuracy/` (launcher.accuracy's file), or None.
    A damaged file is left out; (file name, why) goes to `problems` when given."""
    best: dict[str, Any] | None = None
    for path in sorted((Path(run_dir) / "accuracy").glob("*.json")):
        obj = read_json(path)
        why = (f"{ACCURACY}/{path.name} is damaged (not valid JSON)" if obj is None
               else None if not isinstance(obj, dict) or "accuracy" not in obj
               else shape_problem(obj, ACCURACY_TYPES))
        if why and obj is not None:
            why = f"{ACCURACY}/{path.name} is damaged ({why})"
        if why and problems is not None:
            problems.append((f"{ACCURACY}/{path.name}", why))
        if why or not isinstance(obj, dict) or "accuracy" not in obj:
            continue
        obj = dict(obj, file=path.name)
        if best is None or (obj.get("timestamp") or 0) >= (best.get("timestamp") or 0):
            best = obj
    return best


def custom_outcome(rd: RunDir) -> dict[str, Any]:
    """benchmark.custom's record (custom-bench.json): command, exit_code (None: it did not
    end), seconds, log."""
    got = read_json(rd.custom_result)
    got = got if isinstance(got, dict) else {}
    return {k: got.get(k) for k in ("command", "exit_code", "seconds", "log")}


def summary(
    run_dir: str | Path, state: State | None = None, error: str | None = None,
    notes: list[str] | None = None, log_signals: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """summary.json's content: per point the figures and status; per run accuracy, verdict.

    The verdict follows the run: "passed" only when the run succeeded, every planned point
    has an ok result and the accuracy gate (when planned) ran and passed; otherwise
    "failed" / "cancelled" (the run's own end), "partial" (points missing or failed) or
    "incomplete" (the gate never ran). `state`/`error` default to what the run directory says;
    the run's notes (a dead agent, partial telemetry, what could not be written) default to
    run.json's and are kept in the summary's notes.
    """
    rd = RunDir(Path(run_dir))
    damaged: list = []  # record files left out: (name, why)
    if state is None or notes is None:
        st = rd.status()
        damaged += st.damaged.items()
        if state is None:
            state, error = st.state, st.error
        if notes is None:
            notes = list(st.record.notes) if st.record else []
    try:
        plan: PlanDoc | None = read_plan(rd.plan)
    except PlanError:
        plan = None
    mode = plan.mode if plan else "disagg"
    den = gpu_denominators(plan)
    engine = plan.engine if plan else None
    platform = plan.engine_platform if plan else None
    kind = plan.engine_kind if plan else None
    alloc = allocated_gpus(plan) if plan else None
    points = [point_figures(r, den, mode, alloc) for r in load_results(rd.path, damaged)]

    reasons: list[str] = []
    run_notes, notes = list(notes or []), []
    if state in (State.FAILED, State.CANCELLED):
        reasons.append(f"the run {state}: {(error or 'no reason recorded').splitlines()[0]}")
    elif state is not None and state.live:
        reasons.append(f"the run is still {state}")
    benches = plan.processes_of_kind(Kind.BENCH) if plan else []
    planned = sorted(concurrency_of(p.result) for p in benches
                     if p.result and p.result != CUSTOM_BENCH)
    custom = custom_outcome(rd) if any(p.result == CUSTOM_BENCH for p in benches) else None
    have = {p["max_concurrency"] for p in points}
    missing = [c for c in planned if c not in have]
    # an SLO search (docs/slo.md) measures the points it needs, and its failing points are
    # its answer's upper bracket, not failures of the run
    search = next((e for e in reversed(rd.events()) if e.get("event") == "slo_search"), None)
    if search is not None:
        missing = []
        notes.append(f"an SLO search ({search.get('limits')}): {search.get('outcome')}")
    if custom is not None:  # benchmark.custom: its exit status, no sweep points
        if custom.get("exit_code") is None:
            reasons.append("the custom benchmark did not run to its end")
        elif custom["exit_code"]:
            reasons.append(f"the custom benchmark exited with status {custom['exit_code']}")
    elif missing:
        reasons.append(f"no result for concurrency {', '.join(map(str, missing))}")
    elif not points:
        reasons.append("no sweep results in bench/")
    for p in points:
        if p["status"] != "ok" and search is None:
            reasons.append(f"point max_concurrency={p['max_concurrency']} failed: "
                           f"{p['failure_reason']}")
    bench_damaged = len(damaged)
    acc = load_accuracy(rd.path, damaged)
    gate_planned = bool(plan and plan.processes_of_kind(Kind.ACCURACY))
    accuracy = None
    reasons += [f"{why}: left out" for _, why in damaged]
    if acc is None:
        if gate_planned and len(damaged) == bench_damaged:
            reasons.append("the accuracy gate did not run")
        else:
            notes.append("accuracy was not checked (accuracy.enabled is false)")
    else:
        accuracy = {k: acc.get(k) for k in ACCURACY_KEYS if k in acc}
        accuracy["harness"] = harness_of(acc)
        if not acc.get("passed"):
            reasons.append(acc.get("failure_reason") or
                           f"GSM8K ({harness_of(acc)} harness) accuracy "
                           f"{acc.get('accuracy') or 0:.3f} is below the "
                           f"threshold {acc.get('threshold')}")
    notes += [n for n in run_notes if n not in notes]
    labels = list(kind.point_labels) if kind else []
    if kind and kind.figures_note:
        notes.append(kind.figures_note)
    if acc is not None and not acc.get("passed"):
        labels.append("accuracy-gate-failed")
    for p in points:
        p["labels"] = list(labels)

    ok = [p for p in points if p["status"] == "ok" and p["total_tokens_per_s_per_gpu"]]
    headline = None
    if ok:
        best = max(ok, key=lambda p: p["total_tokens_per_s_per_gpu"])
        headline = {k: best[k] for k in ("max_concurrency", "total_tokens_per_s_per_gpu",
                                         "total_tokens_per_s_per_allocated_gpu",
                                         "output_tokens_per_s_per_decode_gpu",
                                         "tokens_per_s_per_user", "ttft_p99_ms",
                                         "tpot_p50_ms")}
    gate_failed = acc is not None and not acc.get("passed")
    if state == State.CANCELLED:
        verdict = "cancelled"
    elif state == State.FAILED or gate_failed:
        verdict = "failed"
    elif custom is not None and custom.get("exit_code") != 0:
        verdict = "partial" if custom.get("exit_code") is None else "failed"
    elif custom is None and (missing or not points or any(p["status"] != "ok" for p in points)):
        verdict = "partial"
    elif (gate_planned and acc is None) or (state is not None and state.live):
        verdict = "incomplete"
    else:
        verdict = "passed"
    return {
        "schema_version": 2,
        "run_id": plan.run_id if plan else rd.run_id,
        "recipe": plan.recipe if plan else None,
        "engine": engine,
        "engine_platform": platform,
        "engine_label": engine_label(engine, platform) if engine else None,
        # the summary's own record of what its figures are (readers take it, not plan.json)
        "simulated": bool(kind and kind.speed_modelled),
        "vllm_cpu": bool(kind and kind.on_host_cpu),
        "mode": mode,
        "model": plan.served_name if plan else None,
        "state": str(state) if state else None,
        "denominators": ({"gpus_total": den["gpus_total"]} if mode == "agg" else
                         {k: den[k] for k in ("gpus_total", "gpus_prefill", "gpus_decode")}),
        "gpus_allocated": alloc,
        "per_gpu": dict(PER_GPU),
        "points": points,
        "planned_concurrency": planned,
        "custom_benchmark": custom,
        "lifecycle": lifecycle(rd, plan, alloc,
                               load_s=(log_signals or {}).get("model_load_s")),
        "log_signals": log_signals,  # launcher.telemetry.signals.scan_run (None: not read)
        "headline": headline,
        "accuracy": accuracy,
        "verdict": verdict,
        "verdict_reasons": reasons,
        "notes": notes,
        "generated": time.time(),
    }


# What each stage's time was spent on, for the allocation's cost split.
PHASE_OF_STAGE = {
    "plan": "preflight", "preflight": "preflight",
    "agents": "loading", "endpoints": "loading", "health": "loading", "router": "loading",
    "sweep": "measuring", "accuracy": "measuring", "restart": "loading",
    "hold": "holding", "teardown": "teardown", "report": "teardown",
}
PHASES = ("preflight", "loading", "measuring", "holding", "teardown")


def lifecycle(rd: RunDir, plan: PlanDoc | None, gpus: int | None,
              now: float | None = None, load_s: dict[str, float] | None = None,
              ) -> dict[str, Any] | None:
    """Where the allocation's time went, from events.jsonl: seconds and GPU-hours per phase
    (they add up to the orchestrator's time in the allocation), each engine's time from its
    start to its first healthy answer and, from its log (`load_s`, vLLM's "Model loading
    took"), the part of it spent loading weights. None without events."""
    events = [e for e in rd.events() if isinstance(e.get("ts"), int | float)]
    if not events:
        return None
    rec = rd.read_record()
    start = min(e["ts"] for e in events)
    if rec and isinstance(rec.started, int | float):
        start = min(start, rec.started)
    end = max(e["ts"] for e in events)
    if rec and isinstance(rec.ended, int | float):
        end = max(end, rec.ended)
    elif rec and rec.state in {str(x) for x in State if not x.final}:
        end = max(end, now or time.time())  # still running: up to now
    seconds = dict.fromkeys(PHASES, 0.0)
    phase: str | None = "preflight"
    since = start
    for e in events:
        # a study's configuration visited several times: the time between its visits is
        # other configurations', not its own
        if e.get("event") == "visit_end" and phase is not None:
            seconds[phase] += e["ts"] - since
            phase = None
        elif e.get("event") == "visit_start" and phase is None:
            phase, since = "preflight", e["ts"]
        elif e.get("event") == "stage" and e.get("stage") in PHASE_OF_STAGE:
            if phase is not None:
                seconds[phase] += e["ts"] - since
            phase, since = PHASE_OF_STAGE[e["stage"]], e["ts"]
    if phase is not None:
        seconds[phase] += end - since
    if any(e.get("event") == "visit_end" for e in events):
        end = start + sum(seconds.values())  # its own time, its visits added up
    started = {e["process"]: e["ts"] for e in events if e.get("event") == "process_started"}
    engines = {p.name for p in plan.processes_of_kind(Kind.ENGINE)} if plan else set()
    ready = {e["process"]: round(e["ts"] - started[e["process"]], 2) for e in events
             if e.get("event") == "ready" and e.get("process") in engines
             and e["process"] in started}
    hours = (lambda s: round(gpus * s / 3600.0, 4)) if gpus else (lambda s: None)
    return {
        "seconds": round(end - start, 2),
        "gpus_allocated": gpus,
        "gpu_hours": hours(end - start),
        "phases": {k: {"seconds": round(v, 2), "gpu_hours": hours(v)} for k, v in seconds.items()},
        "engine_ready_s": ready,
        "engine_load_s": {k: v for k, v in (load_s or {}).items() if k in engines},
    }


# the packages whose versions decide a P/D run's speed, named in the fingerprint's one line
KEY_PACKAGES = ("vllm", "vllm-cpu", "torch", "nixl", "ucx-py", "flashinfer-python", "triton",
                "deep-ep", "deep-gemm", "nvidia-nccl-cu12", "nvidia-nccl-cu13")


def fingerprint_lines(ident: dict[str, Any] | None, launcher: str | None = None,
                      ) -> list[tuple[str, str]]:
    """(label, text) per fact of what ran, as run.json's identity recorded it where it ran:
    for the Overview and the report, one place for both."""
    ident = ident or {}
    out: list[tuple[str, str]] = []

    def one(v: Any) -> str:
        return ", ".join(map(str, v)) if isinstance(v, list) else str(v)

    if ident.get("image"):
        pin = "" if ident.get("image_pinned") else " (a tag, not pinned by digest)"
        out.append(("image", f"{ident['image']}{pin}"))
    if ident.get("engine_version"):
        commit = ident.get("engine_commit")
        out.append(("engine", one(ident["engine_version"])
                    + (f", commit {one(commit)}" if commit else "")))
    pkgs = ident.get("packages") or {}
    if pkgs:
        key = [f"{k} {pkgs[k]}" for k in KEY_PACKAGES if k in pkgs]
        differ = ident.get("packages_differ_on") or []
        out.append(("packages", f"{len(pkgs)} in the engine's environment"
                    + (f" ({', '.join(key)})" if key else "")
                    + (f"; a different list on {', '.join(differ)}" if differ else "")))
    if ident.get("torch_cuda"):
        out.append(("torch CUDA", str(ident["torch_cuda"])))
    if ident.get("driver") or ident.get("gpu_models"):
        out.append(("GPUs", f"{one(ident.get('gpu_models') or '?')}, driver "
                            f"{one(ident.get('driver') or '?')}"))
    imex = ident.get("imex_channel")
    if imex is not None:
        out.append(("IMEX channel", "on every node" if imex is True else
                    "on no node" if imex is False else f"only on {one(imex)}"))
    if ident.get("model_revision"):
        out.append(("model revision", one(ident["model_revision"])))
    if launcher:
        out.append(("launcher", launcher))
    return out


def _dur(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.2f} h"


def lifecycle_line(lc: dict[str, Any] | None) -> str | None:
    """'16 GPUs for 30.2 s = 0.134 GPU-hours: preflight 16.1 s (53 %), loading ...': the
    summary's lifecycle in one sentence (None without one)."""
    if not lc or not lc.get("seconds"):
        return None
    total = lc["seconds"]
    head = (f"{lc['gpus_allocated']} GPUs for {_dur(total)} = {lc['gpu_hours']:.3g} GPU-hours"
            if lc.get("gpu_hours") is not None else f"{_dur(total)} in the allocation")
    parts = [f"{k} {_dur(v['seconds'])} ({100 * v['seconds'] / total:.0f} %)"
             for k, v in lc["phases"].items() if v["seconds"] > 0]
    ready = lc.get("engine_ready_s") or {}
    if ready:
        slow = max(ready, key=ready.get)
        loaded = (lc.get("engine_load_s") or {}).get(slow)
        parts.append(f"engines healthy {_dur(ready[slow])} after their start (slowest {slow}"
                     + (f", {_dur(loaded)} of it loading weights)" if loaded is not None
                        else ")"))
    return f"{head}: " + ", ".join(parts)


def signals_line(sig: dict[str, Any] | None) -> str | None:
    """'engine crashes 0, CUDA out of memory 0, ..., Python tracebacks 1 (agg-0@n1)': every
    log signal of a summary, zeros kept, with the processes that had one (None: not read)."""
    if not isinstance(sig, dict) or not isinstance(sig.get("totals"), dict):
        return None
    labels, per = sig.get("labels") or {}, sig.get("processes") or {}
    parts = []
    for key, n in sig["totals"].items():
        text = f"{labels.get(key, key)} {'-' if n is None else n}"
        who = [p for p, c in per.items() if (c or {}).get(key)]
        parts.append(text + (f" ({', '.join(who[:3])}{', ...' if len(who) > 3 else ''})"
                             if n and who else ""))
    return ", ".join(parts)


def write_summary(
    run_dir: str | Path, state: State | None = None, error: str | None = None,
    log_signals: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compute and write `<run_dir>/summary.json` (write-then-rename); return it."""
    s = summary(run_dir, state, error, log_signals=log_signals)
    write_json(RunDir(Path(run_dir)).summary, s)
    return s


def harness_of(acc: dict[str, Any]) -> str:
    """The harness that scored a GSM8K result: its `harness`, else lm-eval (the only one
    before results named theirs)."""
    return acc.get("harness") or LM_EVAL


def accuracy_line(acc: dict[str, Any], markup: bool = False) -> str:
    """'GSM8K 5-shot strict-match 0.778 (flexible-extract 0.800), lm-eval harness, 30
    questions, completions; threshold 0.7: passed; ...': which harness and figure the verdict
    used, with the published figure beside it only when it comes from the same harness."""
    ok = acc.get("passed")
    mark = ("[green]passed[/]" if ok else "[red]FAILED[/]") if markup else (
        "passed" if ok else "FAILED")
    harness = harness_of(acc)
    value = acc.get("accuracy")
    shown = f"{value:.3f}" if isinstance(value, int | float) else "not scored"
    if harness == "vllm":
        text = f"GSM8K {acc.get('num_shots')}-shot, vllm harness, {shown}"
        spread = (acc.get("spread") or {}).get("accuracy") or {}
        inv = acc.get("invalid_rate")
        extra = []
        if (acc.get("repeat") or 1) > 1 and isinstance(spread.get("stdev"), int | float):
            extra.append(f"mean of {acc['repeat']} runs: min {spread['min']:.3f}, max "
                         f"{spread['max']:.3f}, stdev {spread['stdev']:.3f}")
        if isinstance(inv, int | float):
            extra.append(f"invalid {inv:.3f}")
        text += f" ({'; '.join(extra)})" if extra else ""
    else:
        metric = acc.get("metric") or "strict-match"
        scores = acc.get("scores") or {}
        other = next((m for m in scores if m != metric), None)
        text = f"GSM8K {acc.get('num_shots')}-shot {metric} {shown}"
        if other and isinstance(scores[other], dict):
            text += f" ({other} {scores[other].get('accuracy', 0):.3f})"
        text += f", {harness} harness"
    text += f", {acc.get('num_questions')} questions, {'chat' if acc.get('chat') else 'completions'}"
    text += f"; threshold {acc.get('threshold')}: {mark}"
    if acc.get("failure_reason"):
        text += f" ({acc['failure_reason']})"
    if harness == LM_EVAL and acc.get("comparable_with_lm_eval") is False:
        text += "; NOT comparable with lm-eval (few-shot examples from the test file)"
    if harness == PUBLISHED_GSM8K_HARNESS:
        return text + (f"; published {PUBLISHED_GSM8K:.2f} (the same harness, 5-shot, 1,319 "
                       "questions, 5 runs)")
    return text + (f"; no published figure for this harness (the published GSM8K figure is "
                   f"the {PUBLISHED_GSM8K_HARNESS} harness's)")


def _f(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def render_table(s: dict[str, Any], console: Any = None) -> None:
    """The summary as a rich table on the terminal (rich imported here, not at start-up)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    den = s.get("denominators") or {}
    den_text = ", ".join(f"{k.removeprefix('gpus_')} {v}" for k, v in den.items())
    sim = " [bold yellow](SIMULATED)[/]" if s.get("simulated") else ""
    if s.get("vllm_cpu"):
        sim = f" [bold yellow]({CPU_LABEL}: not a GPU measurement)[/]"
    alloc = s.get("gpus_allocated")
    both = isinstance(alloc, int) and alloc > 0 and alloc != den.get("gpus_total")
    if isinstance(alloc, int) and alloc > 0:
        den_text += f"; allocated {alloc}"
    table = Table(title=f"{s.get('run_id')}{sim} - GPUs: {den_text}", title_justify="left")
    agg = s.get("mode") == "agg"
    cols = [("conc", "right"), ("status", "left"), ("tok/s/GPU\n(working)", "right")]
    if both:
        cols.append(("tok/s/GPU\n(allocated)", "right"))
    if not agg:
        cols += [("out tok/s/\ndecode GPU", "right"), ("in tok/s/\nprefill GPU", "right")]
    cols += [("tok/s/user", "right"), ("TTFT ms\np50/p90/p99", "right"),
             ("TPOT ms\np50/p90/p99", "right"), ("req/s", "right")]
    for name, justify in cols:
        table.add_column(name, justify=justify)
    for p in s.get("points", []):
        failed = p.get("status") != "ok"
        status = "[red]FAILED[/]" if failed else "[green]ok[/]"
        row = [str(p.get("max_concurrency")), status, _f(p["total_tokens_per_s_per_gpu"])]
        if both:
            row.append(_f(p.get("total_tokens_per_s_per_allocated_gpu")))
        if not agg:
            row += [_f(p["output_tokens_per_s_per_decode_gpu"]),
                    _f(p["input_tokens_per_s_per_prefill_gpu"])]
        row += [_f(p["tokens_per_s_per_user"], 1),
                "/".join(_f(p[f"ttft_p{q}_ms"]) for q in PERCENTILES),
                "/".join(_f(p[f"tpot_p{q}_ms"], 1) for q in PERCENTILES),
                _f(p["request_throughput"], 2)]
        table.add_row(*row, style="dim" if failed else None)
    custom = s.get("custom_benchmark")
    if custom:  # benchmark.custom: no sweep points, its command's outcome
        code = custom.get("exit_code")
        ended = ("did not run to its end" if code is None else
                 f"exited with status {code} after {custom.get('seconds')} s")
        color = "green" if code == 0 else "red"
        console.print(f"{s.get('run_id')}{sim}: custom benchmark (benchmark.custom) "
                      f"[{color}]{ended}[/]; its output: {custom.get('log')}")
    else:
        console.print(table)
        console.print("tok/s/GPU (working): ÷ the GPUs of the prefill and decode endpoints "
                      "(the published metric)"
                      + ("; (allocated): ÷ nodes x GPUs per node, idle GPUs "
                         f"included ({alloc} vs {den.get('gpus_total')})" if both else ""))
    agentic = [p for p in s.get("points", []) if isinstance(p.get("agentic"), dict)]
    if agentic:
        console.print(
            "agentic points (AIPerf, conc = live sessions): tok/s counts input as the server "
            "counts it, its cached prefix included (InferenceX's AgentX figure), not "
            "comparable with sa-bench's; prefill prefix-cache hit rate "
            + ", ".join(f"c={p['max_concurrency']} {_pct(p['agentic'].get('prefix_hit_rate'))}"
                        + (f" (the trace offers {_pct(offered_hit_rate(p['agentic']))})"
                           if offered_hit_rate(p["agentic"]) is not None else "")
                        for p in agentic)
            + "; interactivity (1000 ÷ ITL p90) "
            + ", ".join(f"c={p['max_concurrency']} "
                        f"{_f(p['agentic'].get('interactivity_tok_s'), 1)} tok/s"
                        for p in agentic))
    for p in s.get("points", []):
        if p.get("status") != "ok":
            console.print(f"[red]point {p.get('max_concurrency')} failed:[/] "
                          f"{p.get('failure_reason')}")
    acc = s.get("accuracy")
    if acc:
        console.print(accuracy_line(acc, markup=True))
    for note in s.get("notes", []):
        console.print(f"note: {note}")
    verdict = s.get("verdict")
    color = "green" if verdict == "passed" else "red"
    console.print(f"verdict: [bold {color}]{verdict}[/]")
    for r in s.get("verdict_reasons", []):
        console.print(f"  - {r}")


def _pct(x) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x * 100:.1f} %"


def summary_table(s: dict[str, Any], width: int = 140) -> str:
    """The table as plain text (no colour codes), for logs and the orchestrator's output."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    render_table(s, Console(file=buf, width=width, color_system=None, force_terminal=False))
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m launcher.run.figures",
                                 description="Headline figures of a run directory.")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--write", action="store_true", help="also write summary.json")
    a = ap.parse_args(argv)
    if not a.run_dir.is_dir():
        print(f"error: {a.run_dir} is not a run directory; pass runs/<run-id>.", file=sys.stderr)
        return 2
    s = write_summary(a.run_dir) if a.write else summary(a.run_dir)
    from rich.console import Console

    # Piped into a file or log there is no terminal width: do not squeeze the table to 80.
    render_table(s, Console(width=None if sys.stdout.isatty() else 140))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
