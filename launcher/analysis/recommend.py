"""How many prefill endpoints per decode endpoint: a recommendation from one measured run.

    python -m launcher.analysis.recommend RUN_DIR [--target-tok-s-user X] [--target-ttft-ms MS]
        [--format text|json]

The method works from first principles on what one run measured (docs/recommend.md says
it plainly, with its limits). Per sweep point we know the request rate, the prompt and
output tokens, the client's TTFT and TPOT, and from telemetry the engine-side parts of
TTFT (the dashboard's `launcher.analysis.derive.window_evidence`), the decode side's running
requests and KV usage, and each engine's KV capacity (`vllm:cache_config_info`).

1. **Prefill capacity per endpoint** = the prompt tokens/s one prefill endpoint delivers
   at its knee: the first point where the prefill queue dominates TTFT (queue >= 25 % of
   the client's TTFT and >= half the prefill compute time, the dashboard's "prefill-bound"
   rule), or where prompt throughput stops growing while concurrency and TTFT do. Points
   where the decode side was full are not prefill knees. Above the knee the prefill side
   is busy all the time, so tokens / (window - the last requests' decode tail) is its
   steady-state rate. When no point reaches the knee the figure is a floor: what the run
   delivered, or dp x ISL / prefill compute time at the lightest point if that is more.
2. **Decode capacity per endpoint** = running requests and output tokens/s at the load
   whose tokens/s per user meets the target. A decode step costs a fixed part plus a part
   per running sequence, so TPOT = a + b * running (least squares over the run's points);
   the target's TPOT (1000 / target ms) gives the running requests it allows. That is
   capped by KV capacity (a request holds about `fp` KV tokens, measured as KV usage x
   capacity / running; a new request is admitted only when its whole prompt fits, so about
   one prompt per engine stays free) and by --max-num-seqs. A request holds its KV for its
   transfer plus OSL decode steps, so request rate = running / (OSL x TPOT + transfer)
   (Little's law) and output tokens/s = request rate x OSL.
3. **The balanced ratio**: prefill endpoints needed = the decode side's request rate x
   mean ISL / prefill tokens/s per endpoint. For each whole count P the served rate is
   min(decode rate, P x prefill rate / ISL); total tokens/s per GPU divides it by
   P x prefill GPUs + D x decode GPUs (from plan.json's endpoints). The recommendation is
   the P with the most total tokens/s per GPU at tokens/s per user >= the target, as a
   sweep point of the recipe's size measures it (a finite point loses its fill and drain,
   about one unloaded request latency; the steady-state figure is reported beside it).

Pure analysis: reads the run directory (and, for a node-count note, the recipe's cluster
profile) and writes nothing. pandas and numpy are imported inside the
functions that need them (the CLI's start-up stays light). `launcher.analysis.derive` (pure, no
Streamlit) supplies the per-window telemetry numbers, so the dashboard and this module read
telemetry the same way.
"""

from __future__ import annotations

import math
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.analysis.diagnose import Thresholds
from launcher.run.plandoc import option_value

# --- thresholds (printed in the evidence where they decide something) ----------------------

_T = Thresholds()  # the verdicts' own table: one set of numbers
QUEUE_SHARE = _T.share                  # prefill queue >= this share of client TTFT
QUEUE_VS_COMPUTE = _T.queue_vs_compute  # ... and >= this fraction of the prefill compute
MIN_QUEUE_S = _T.min_queue_s            # ... and at least this long (s)
PLATEAU_GAIN = _T.plateau_gain
KV_FULL = _T.kv_full
WAITING_CAPACITY = _T.waiting_capacity
PREFILL_KV_FULL = _T.prefill_kv_full
TRIM = _T.trim
TOP_MARGIN = _T.top_margin
MAX_PREFILL_ENDPOINTS = 64  # the most prefill endpoints a TTFT target may ask for

NEEDS = (
    "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_count",
    "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
    "vllm:nixl_xfer_time_seconds_sum", "vllm:nixl_xfer_time_seconds_count",
    "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason", "vllm:num_requests_running",
    "vllm:num_preemptions_total", "vllm:nixl_num_failed_transfers_total",
    "vllm:nixl_num_kv_expired_reqs_total", "vllm:cache_config_info",
    "vllm:prompt_tokens_total",
)  # fmt: skip


class NoRecommendation(Exception):
    """The run cannot support a recommendation; the message is one sentence saying why."""


# --- what one sweep point says ---------------------------------------------------------------


@dataclass
class Point:
    """One ok sweep point: client figures plus the telemetry numbers the method uses.
    Times in seconds, rates per second; NaN where telemetry has no value."""

    concurrency: float
    prompts: float                 # requests measured (completed)
    duration_s: float
    request_rate: float            # req/s over the window
    input_tok_s: float             # prompt tokens/s, whole prefill side
    output_tok_s: float
    isl: float                     # mean prompt tokens per request
    osl: float                     # mean output tokens per request
    ttft_s: float                  # client mean TTFT
    tpot_s: float                  # client median TPOT
    decode_tail_s: float           # mean (e2e latency - TTFT): a request's time on decode
    total_tok_s_gpu: float
    tok_s_user: float
    prefill_queue_s: float = math.nan
    prefill_compute_s: float = math.nan
    kv_transfer_s: float = math.nan
    decode_admission_s: float = math.nan
    prefill_waiting: float = math.nan
    prefill_kv_max: float = math.nan
    decode_running: float = math.nan   # steady part of the window, all decode engines
    decode_kv: float = math.nan        # steady part, mean over decode engines (0-1)
    decode_kv_max: float = math.nan
    decode_waiting_capacity: float = math.nan
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or f"c={self.concurrency:g}"


@dataclass
class Topology:
    """The run's shape (plan.json) and what the decode engines can hold."""

    prefill_endpoints: int
    prefill_gpus: int              # per endpoint
    prefill_shape: str
    decode_endpoints: int
    decode_gpus: int               # per endpoint
    decode_shape: str
    prefill_dp: int = 1            # engines per prefill endpoint
    decode_engines: int = 1        # DP ranks over all decode endpoints
    decode_kv_tokens: list[float] = field(default_factory=list)  # per decode engine
    max_num_seqs: int | None = None  # per decode engine, when the argv says
    simulated: bool = False

    def gpus(self, prefill_endpoints: int | None = None) -> int:
        p = self.prefill_endpoints if prefill_endpoints is None else prefill_endpoints
        return p * self.prefill_gpus + self.decode_endpoints * self.decode_gpus


def _ok(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if _ok(x)]
    return statistics.median(xs) if xs else math.nan


# --- 1. prefill ------------------------------------------------------------------------------


def _decode_full(p: Point) -> bool:
    return (_ok(p.decode_kv_max) and p.decode_kv_max >= KV_FULL
            and _ok(p.decode_waiting_capacity) and p.decode_waiting_capacity >= WAITING_CAPACITY)


def prefill_capacity(points: list[Point], topo: Topology) -> dict[str, Any]:
    """Prompt tokens/s one prefill endpoint carries at its knee (see the module docstring).

    Returns {"tokens_per_s": steady-state rate per endpoint, "measured_tokens_per_s": the
    window's rate, "saturated": bool (False: a lower bound), "knee": label or None,
    "why": sentence, "per_point": [(label, tok/s per endpoint, saturated, reason)]}."""
    n = max(topo.prefill_endpoints, 1)
    rows = []
    prev: Point | None = None
    for p in sorted(points, key=lambda q: q.concurrency):
        per_ep = p.input_tok_s / n
        reason = ""
        if _decode_full(p):
            reason = "decode full (not a prefill knee)"
        elif _ok(p.prefill_kv_max) and p.prefill_kv_max >= PREFILL_KV_FULL:
            reason = "prefill KV full of un-pulled blocks (the decode side sets the pace)"
        else:
            pq, pc, ttft = p.prefill_queue_s, p.prefill_compute_s, p.ttft_s
            if (_ok(pq) and _ok(ttft) and ttft > 0 and pq >= MIN_QUEUE_S
                    and pq >= QUEUE_SHARE * ttft and (not _ok(pc) or pq >= QUEUE_VS_COMPUTE * pc)):
                comp = f", compute {_ms(pc)}" if _ok(pc) else ""
                reason = (f"prefill queue {_ms(pq)} = {pq / ttft:.0%} of TTFT {_ms(ttft)}"
                          f"{comp}")
            elif prev is not None and p.concurrency >= 1.5 * prev.concurrency and \
                    p.input_tok_s < (1 + PLATEAU_GAIN) * prev.input_tok_s and \
                    p.ttft_s >= 1.5 * prev.ttft_s and not (
                        _ok(p.decode_admission_s) and _ok(pq) and p.decode_admission_s > pq):
                # (a queue in front of the decode instead is the decode's plateau)
                reason = (f"prompt tok/s grew {p.input_tok_s / prev.input_tok_s - 1:+.0%} from "
                          f"{prev.label} while TTFT grew {p.ttft_s / prev.ttft_s:.1f}x")
        saturated = bool(reason) and not reason.startswith(("decode full", "prefill KV"))
        steady = per_ep
        if saturated:
            # Busy from the first request to the last prefill; the last requests' decode
            # (their tail) is window time in which the prefill side had nothing left to do.
            busy = p.duration_s - (p.decode_tail_s if _ok(p.decode_tail_s) else 0.0)
            if busy > 0.5 * p.duration_s:
                steady = per_ep * p.duration_s / busy
        rows.append({"label": p.label, "concurrency": p.concurrency,
                     "tokens_per_s": per_ep, "steady_tokens_per_s": steady,
                     "saturated": saturated, "reason": reason})
        prev = p
    sat = [r for r in rows if r["saturated"]]
    if sat:
        best = max(sat, key=lambda r: r["steady_tokens_per_s"])
        return {"tokens_per_s": best["steady_tokens_per_s"],
                "measured_tokens_per_s": best["tokens_per_s"], "saturated": True,
                "knee": sat[0]["label"], "knee_concurrency": sat[0]["concurrency"],
                "why": sat[0]["reason"], "basis": "measured", "per_point": rows}
    best = max(rows, key=lambda r: r["tokens_per_s"])
    out = {"tokens_per_s": best["tokens_per_s"], "measured_tokens_per_s": best["tokens_per_s"],
           "saturated": False, "knee": None, "knee_concurrency": None,
           "why": f"no point reached the prefill knee; {best['label']} delivered the most",
           "basis": "lower bound", "per_point": rows}
    # Unsaturated: one engine computes one prompt in prefill-compute seconds at light load;
    # batching only adds to that, so dp x ISL / compute is a floor on what it can carry.
    light = [p for p in points if _ok(p.prefill_compute_s) and p.prefill_compute_s > 0]
    if light:
        p0 = min(light, key=lambda q: q.concurrency)
        est = topo.prefill_dp * p0.isl / p0.prefill_compute_s
        if est > out["tokens_per_s"]:
            out.update(tokens_per_s=est, basis="estimate",
                       why=f"{out['why']}; {topo.prefill_dp} engine(s) x {p0.isl:,.0f} prompt "
                           f"tokens / {_ms(p0.prefill_compute_s)} prefill compute at "
                           f"{p0.label} = {est:,.0f} tok/s")
    return out


# --- 2. decode -------------------------------------------------------------------------------


def fit_tpot(points: list[Point]) -> dict[str, Any]:
    """TPOT (s) = a + b x decode running requests, least squares over the points.

    A decode step costs a fixed part (weights, launches, all-to-all) plus a part per running
    sequence (its KV reads, sampling), and each running request gets one token per step.
    b < 0 (noise on a flat curve) is taken as 0. Needs decode running from telemetry."""
    xy = [(p.decode_running, p.tpot_s) for p in points
          if _ok(p.decode_running) and _ok(p.tpot_s) and p.tpot_s > 0]
    if not xy:
        raise NoRecommendation("no sweep point has both a median TPOT and the decode side's "
                               "running requests (vllm:num_requests_running) in its window")
    xs, ys = [x for x, _ in xy], [y for _, y in xy]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in xy) / sxx if sxx > 0 else 0.0
    flat = b <= 0
    if flat:
        b = 0.0
        a = my
    else:
        a = my - b * mx
        if a <= 0:  # a steep fit through a few points: keep it through the lightest point
            x0, y0 = min(xy)
            b = max((y - y0) / (x - x0) for x, y in xy if x > x0) if len(set(xs)) > 1 else 0.0
            a = y0 - b * x0
            if a <= 0:  # nothing sensible to extrapolate: flat at the mean
                a, b, flat = my, 0.0, True
    return {"a_s": a, "b_s": b, "flat": flat, "points": len(xy),
            "running_range": (min(xs), max(xs)), "tpot_range_s": (min(ys), max(ys))}


def kv_footprint(points: list[Point], topo: Topology) -> tuple[float | None, str]:
    """KV tokens one running request holds on decode: KV usage x capacity / running, the
    median over points with load; else prompt + half the output."""
    cap = sum(topo.decode_kv_tokens)
    fps = [p.decode_kv * cap / p.decode_running for p in points
           if cap > 0 and _ok(p.decode_kv) and _ok(p.decode_running)
           and p.decode_running >= 0.5 * max(topo.decode_engines, 1) and p.decode_kv > 0]
    if fps:
        return _median(fps), "measured"
    isl = _median([p.isl for p in points])
    osl = _median([p.osl for p in points])
    if _ok(isl) and _ok(osl):
        return isl + osl / 2, "prompt + half the output"
    return None, "unknown"


def decode_model(points: list[Point], topo: Topology) -> dict[str, Any]:
    """Everything the decode side's capacity rests on: the TPOT fit, the KV bound, the
    sequence bound, the KV transfer time and, when the run filled the decode, what it
    measured there."""
    tp = fit_tpot(points)
    fp, fp_how = kv_footprint(points, topo)
    isl = _median([p.isl for p in points])
    osl = _median([p.osl for p in points])
    n_kv = None
    if fp and topo.decode_kv_tokens:
        # Admission needs the whole prompt free: about one prompt per engine stays empty.
        slack = isl / (isl + osl / 2) if _ok(isl) and _ok(osl) and isl + osl > 0 else 1.0
        n_kv = sum(max(0.0, c / fp - slack) for c in topo.decode_kv_tokens)
    n_seqs = topo.max_num_seqs * topo.decode_engines if topo.max_num_seqs else None
    full = [p for p in points if _decode_full(p) and _ok(p.decode_running)]
    measured_full = max((p.decode_running for p in full), default=None)
    xfer = _median([p.kv_transfer_s for p in points])
    return {"tpot": tp, "kv_tokens_per_request": fp, "kv_footprint_basis": fp_how,
            "kv_capacity_tokens": sum(topo.decode_kv_tokens) or None,
            "running_at_kv_limit": n_kv, "running_limit_max_num_seqs": n_seqs,
            "running_measured_full": measured_full,
            "measured_full_at": [p.label for p in full],
            "kv_transfer_s": xfer if _ok(xfer) else 0.0, "isl": isl, "osl": osl}


def tpot_at(model: dict[str, Any], running: float) -> float:
    return model["tpot"]["a_s"] + model["tpot"]["b_s"] * running


def running_for_rate(model: dict[str, Any], rate: float) -> float:
    """Decode running requests when `rate` req/s flow through it (below its capacity):
    n = rate x (OSL x TPOT(n) + transfer), solved for n."""
    a, b = model["tpot"]["a_s"], model["tpot"]["b_s"]
    osl, x = model["osl"], model["kv_transfer_s"]
    den = 1.0 - rate * osl * b
    return rate * (osl * a + x) / den if den > 0 else math.inf


def decode_capacity(model: dict[str, Any], target: float | None) -> dict[str, Any]:
    """Running requests, request rate and output tokens/s the whole decode side carries at
    tokens/s per user >= `target` (None: no latency target, the KV/sequence limit decides)."""
    tp = model["tpot"]
    limits: dict[str, float] = {}
    if target:
        tpot_target = 1.0 / target
        if tpot_target <= tp["a_s"]:
            raise NoRecommendation(
                f"the decode side's TPOT is {tp['a_s'] * 1000:.1f} ms even unloaded, so "
                f"{target:g} tok/s/user (TPOT {tpot_target * 1000:.1f} ms) cannot be met "
                "by any ratio: lower the target or change the decode endpoint")
        if tp["b_s"] > 0:
            limits["target"] = (tpot_target - tp["a_s"]) / tp["b_s"]
    if model["running_at_kv_limit"] is not None:
        limits["kv-capacity"] = model["running_at_kv_limit"]
    if model["running_limit_max_num_seqs"]:
        limits["max-num-seqs"] = float(model["running_limit_max_num_seqs"])
    full = model["running_measured_full"]
    if full is not None and full > 0:
        # The run filled the decode: what it held there is a measurement, not a model.
        limits["kv-capacity"] = full
    if not limits:
        raise NoRecommendation(
            "nothing bounds the decode side in this run: TPOT did not grow with load, no "
            "tokens/s/user target was given and the KV capacity is unknown (no "
            "vllm:cache_config_info): pass --target-tok-s-user")
    bound = min(limits, key=lambda k: limits[k])
    n = limits[bound]
    tpot = tpot_at(model, n)
    rate = n / (model["osl"] * tpot + model["kv_transfer_s"])
    return {"running": n, "bound": bound, "limits": limits, "tpot_s": tpot,
            "tokens_per_s_per_user": 1.0 / tpot, "request_rate": rate,
            "output_tokens_per_s": rate * model["osl"]}


# --- 3. the ratio ------------------------------------------------------------------------------


def nice_up(x: float) -> int:
    """Round a concurrency up to a quarter of the power of two below it: 23 -> 24,
    100 -> 112, 4500 -> 5120."""
    if x <= 8:
        return max(1, math.ceil(x))
    step = 2 ** (int(math.floor(math.log2(x))) - 2)
    return int(math.ceil(x / step) * step)


def predict(p: int, prefill: dict[str, Any], model: dict[str, Any], dcap: dict[str, Any],
            topo: Topology, ttft0_s: float, prompts: tuple[str, float],
            top: int | None = None) -> dict[str, Any]:
    """Predicted figures with `p` prefill endpoints (the decode side as in the run).

    Steady state: rate = min(decode rate, p x prefill tok/s / ISL). A sweep point of N
    requests measures N / (N / rate + lost), where `lost` is its fill and drain:
    prefill-bound, the last requests' decode (OSL x TPOT + transfer); decode-bound, the
    first prefill (TTFT0) plus half of each ramp: the decode fills at the prefill side's
    rate (running x ISL / (p x prefill tok/s)) and drains over one decode lifetime. N comes from `prompts` ("fixed", N) or ("per_concurrency", m) at
    `top` (default: the top concurrency this topology needs)."""
    isl, osl = model["isl"], model["osl"]
    k = prefill["tokens_per_s"]
    p_rate = p * k / isl
    if p_rate < dcap["request_rate"]:
        rate, bound = p_rate, "prefill"
        n = min(running_for_rate(model, rate), dcap["running"])
        tpot = tpot_at(model, n)
        lost = osl * tpot + model["kv_transfer_s"]
    else:
        rate, bound = dcap["request_rate"], "decode"
        n, tpot = dcap["running"], dcap["tpot_s"]
        lost = ttft0_s + n * isl / (2 * p * k) + osl * tpot / 2
    in_flight = rate * (ttft0_s + model["kv_transfer_s"] + osl * tpot)
    rho, ttft = ttft_at(p, prefill, model, dcap, ttft0_s)
    top = top or nice_up(TOP_MARGIN * in_flight)
    n_prompts = prompts[1] if prompts[0] == "fixed" else prompts[1] * top
    measured_rate = n_prompts / (n_prompts / rate + lost) if rate > 0 else 0.0
    gpus = topo.gpus(p)
    return {
        "prefill_endpoints": p, "gpus": gpus, "bound": bound,
        "request_rate": measured_rate, "steady_request_rate": rate,
        "total_tokens_per_s_per_gpu": measured_rate * (isl + osl) / gpus,
        "steady_total_tokens_per_s_per_gpu": rate * (isl + osl) / gpus,
        "tokens_per_s_per_user": 1.0 / tpot, "decode_running": n,
        "concurrency_at_capacity": in_flight, "top_concurrency": top,
        "prompts_at_top": n_prompts, "prefill_utilisation": rho, "ttft_s": ttft,
    }


def ttft_at(p: int, prefill: dict[str, Any], model: dict[str, Any], dcap: dict[str, Any],
            ttft0_s: float) -> tuple[float, float]:
    """(prefill utilisation, TTFT s) with `p` prefill endpoints: the lowest TTFT the run
    measured plus M/D/1 queueing at the decode side's request rate, Wq = rho s / (2 (1 - rho))
    with s one prompt's prefill (ISL / prompt tok/s per endpoint); unbounded at rho >= 1."""
    k = prefill["tokens_per_s"]
    rho = dcap["request_rate"] * model["isl"] / (p * k)
    service = model["isl"] / k
    return rho, ttft0_s + (rho * service / (2 * (1 - rho)) if rho < 1 else math.inf)


def endpoints_for_ttft(prefill: dict[str, Any], model: dict[str, Any], dcap: dict[str, Any],
                       ttft0_s: float, ttft_target_s: float) -> int | None:
    """The fewest prefill endpoints whose predicted TTFT meets the target (the inverse of
    `ttft_at`: rho <= 2m / (s + 2m) for m = target - TTFT0); None when TTFT0 is above it."""
    m = ttft_target_s - ttft0_s
    if m <= 0:
        return None
    service = model["isl"] / prefill["tokens_per_s"]
    need = dcap["request_rate"] * model["isl"] / prefill["tokens_per_s"]
    return max(1, math.ceil(need * (service + 2 * m) / (2 * m) - 1e-9))


def candidates(prefill: dict[str, Any], model: dict[str, Any], dcap: dict[str, Any],
               topo: Topology, ttft0_s: float, prompts: tuple[str, float],
               max_endpoints: int | None = None,
               ttft_target_s: float | None = None) -> list[dict[str, Any]]:
    """`predict` for 1 .. a couple past the balanced count of prefill endpoints, or past the
    count a TTFT target needs."""
    need = dcap["request_rate"] * model["isl"] / prefill["tokens_per_s"]
    top_p = max_endpoints or max(math.ceil(need) + 2, topo.prefill_endpoints + 1)
    if ttft_target_s and not max_endpoints:
        for_ttft = endpoints_for_ttft(prefill, model, dcap, ttft0_s, ttft_target_s)
        if for_ttft is not None:  # a target far below the queueing needs many: cap it
            top_p = max(top_p, min(for_ttft + 1, MAX_PREFILL_ENDPOINTS))
    return [predict(p, prefill, model, dcap, topo, ttft0_s, prompts)
            for p in range(1, top_p + 1)]


def choose(cands: list[dict[str, Any]], target: float | None,
           ttft_target_s: float | None = None) -> dict[str, Any]:
    """The count with the most total tok/s/GPU among those meeting the targets (tokens/s per
    user, TTFT); a tie (within 0.5 %) goes to fewer GPUs."""
    ok = [c for c in cands if not target or c["tokens_per_s_per_user"] >= target * 0.999]
    if not ok:
        raise NoRecommendation("no prefill endpoint count meets the tokens/s/user target")
    if ttft_target_s:
        fast = [c for c in ok if c["ttft_s"] <= ttft_target_s * 1.001]
        if not fast:
            low = min(ok, key=lambda c: c["ttft_s"])
            raise NoRecommendation(
                f"no prefill endpoint count up to {max(c['prefill_endpoints'] for c in ok)} "
                f"meets the TTFT target of {ttft_target_s * 1000:,.0f} ms: the lowest "
                f"predicted is {_ttft_words(low['ttft_s'])} (this run's lowest TTFT plus "
                "prefill queueing); raise the target")
        ok = fast
    best = max(c["total_tokens_per_s_per_gpu"] for c in ok)
    return min((c for c in ok if c["total_tokens_per_s_per_gpu"] >= best * 0.995),
               key=lambda c: c["gpus"])


# --- measured: a run's figure at the target ----------------------------------------------------


def tok_s_gpu_at_target(points: list[dict[str, Any]], target: float | None) -> float | None:
    """The most total tok/s/GPU a run reached at tokens/s per user >= `target`, reading its
    sweep as a curve: the best qualifying point, or the value interpolated (linearly in
    tok/s/user) where the curve between two adjacent points crosses the target.
    `points` are `launcher.run.figures.point_figures` dicts (failed points are skipped)."""
    pts = sorted((p for p in points if p.get("status") == "ok"
                  and _ok(p.get("total_tokens_per_s_per_gpu"))
                  and _ok(p.get("tokens_per_s_per_user"))),
                 key=lambda p: p.get("max_concurrency") or 0)
    if not pts:
        return None
    if not target:
        return max(p["total_tokens_per_s_per_gpu"] for p in pts)
    best = None
    for p in pts:
        if p["tokens_per_s_per_user"] >= target:
            best = max(best or 0.0, p["total_tokens_per_s_per_gpu"])
    for p, q in zip(pts, pts[1:], strict=False):
        u1, u2 = p["tokens_per_s_per_user"], q["tokens_per_s_per_user"]
        if (u1 - target) * (u2 - target) < 0:
            f = (u1 - target) / (u1 - u2)
            v = p["total_tokens_per_s_per_gpu"] + f * (
                q["total_tokens_per_s_per_gpu"] - p["total_tokens_per_s_per_gpu"])
            best = max(best or 0.0, v)
    return best


# --- reading a run ---------------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if abs(x) < 10 else f"{x:.1f} s"


def _ttft_ms(x: float | None) -> str:
    return f"{x * 1000:,.0f}" if _ok(x) else "unbounded"


def _ttft_words(x: float) -> str:
    return f"{x * 1000:,.0f} ms" if math.isfinite(x) else "unbounded"


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def topology_of(plan: Any) -> Topology:
    """The run's shape from plan.json (PlanDoc): endpoints, GPUs per endpoint, decode
    engines and --max-num-seqs / --num-gpu-blocks-override x --block-size from the argv."""
    from launcher.run.vocab import Kind, Role

    pre = [e for e in plan.endpoints if e.role == Role.PREFILL]
    dec = [e for e in plan.endpoints if e.role == Role.DECODE]
    if not pre or not dec:
        raise NoRecommendation("the plan has no prefill or no decode endpoints")
    for eps, role in ((pre, "prefill"), (dec, "decode")):
        if len({(e.gpus, e.shape) for e in eps}) > 1:
            raise NoRecommendation(f"the {role} endpoints differ in shape "
                                   f"({', '.join(sorted({e.shape for e in eps}))}); the "
                                   "method needs identical endpoints per role")
    heads = [p for p in plan.processes_of_kind(Kind.ENGINE) if p.role == Role.DECODE and p.url]
    seqs = None
    kv: list[float] = []
    for p in heads:
        s = option_value(p.argv, "--max-num-seqs")
        if s and s.isdigit():
            seqs = int(s)
        blocks = option_value(p.argv, "--num-gpu-blocks-override")
        bs = option_value(p.argv, "--block-size")
        if blocks and bs and blocks.isdigit() and bs.isdigit():
            ep = next(e for e in dec if e.name == p.endpoint)
            kv += [float(int(blocks) * int(bs))] * ep.dp_size
    return Topology(
        prefill_endpoints=len(pre), prefill_gpus=pre[0].gpus, prefill_shape=pre[0].shape,
        prefill_dp=pre[0].dp_size,
        decode_endpoints=len(dec), decode_gpus=dec[0].gpus, decode_shape=dec[0].shape,
        decode_engines=sum(e.dp_size for e in dec), decode_kv_tokens=kv, max_num_seqs=seqs,
        simulated=plan.engine_kind.speed_modelled)


def _steady_mean(ss: Any, ids: Any, a: float, b: float, step: float, how: str) -> float:
    import numpy as np

    if len(ids) == 0:
        return math.nan
    lo, hi = a + TRIM * (b - a), b - TRIM * (b - a)
    grid = np.arange(lo, hi + 1e-9, max(step, (hi - lo) / 400))
    m = ss.values_at(ids, grid)
    if np.isnan(m).all():
        return math.nan
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if how == "sum":
            return float(np.nanmean(np.nansum(m, axis=0)))
        return float(np.nanmean(m))


def observe(run_dir: Path, plan: Any, topo: Topology) -> tuple[list[Point], list[str], list]:
    """The run's ok points with their telemetry numbers, notes on what was left out, and
    the diagnosis of every point (`launcher.analysis.diagnose`, as the TTFT page has it)."""
    from launcher.analysis import derive, diagnose, load
    from launcher.run import figures
    from launcher.run.results import load_results
    from launcher.telemetry import store

    results = load_results(run_dir)
    if not results:
        raise NoRecommendation(f"{run_dir} has no sweep results in bench/")
    den = figures.gpu_denominators(plan)
    notes: list[str] = []
    ok = []
    for r in results:
        fig = figures.point_figures(r, den, plan.mode)
        if fig["status"] != "ok" or not (fig["completed"] or 0) > 0:
            notes.append(f"point c={fig['max_concurrency']} failed and was left out")
            continue
        if not _ok(_num(fig["max_concurrency"])):
            notes.append(f"point {fig['file']} has no max_concurrency (a request-rate point): "
                         "left out")
            continue
        if not _ok(fig["tokens_per_s_per_user"]) or not _ok(fig["input_throughput"]):
            notes.append(f"point c={fig['max_concurrency']} has no TPOT or duration: left out")
            continue
        ok.append((r, fig))
    if not ok:
        raise NoRecommendation("no sweep point of this run is ok")
    try:
        df = store.read_samples(run_dir, names=tuple(dict.fromkeys(NEEDS + load.TTFT_NAMES)))
    except Exception as e:  # unreadable telemetry is a reason, not a crash
        raise NoRecommendation(f"the run's telemetry could not be read ({e})") from None
    if df.empty:
        raise NoRecommendation("the run has no vLLM telemetry (telemetry/ is empty or "
                               "missing): the method needs the engines' /metrics")
    ss = derive.SeriesSet(df, plan)
    step = max(plan.telemetry_interval_s, 0.05)
    cap = derive.kv_capacity(ss)
    dcap = cap[cap["role"] == "decode"]
    if len(dcap):
        topo.decode_kv_tokens = [float(x) for x in dcap["capacity_tokens"] if _ok(float(x))]
    run_ids = ss.select("vllm:num_requests_running", "decode").index
    kv_ids = ss.select("vllm:kv_cache_usage_perc", "decode").index
    # the TTFT page's table of every point: its window evidence, read once, and its verdicts
    table = derive.point_table(load.load_bench(run_dir), plan, ss, step_s=step)
    by_window = {(row["window_start"], row["window_end"]): row
                 for row in table.to_dict("records")}
    points = []
    for r, fig in ok:
        w = derive.window_of(r)
        ev = by_window.get((w.start, w.end), {}) if w else {}
        done = float(r.get("completed") or 0)
        e2e, ttft = _num(r.get("mean_e2el_ms")), _num(r.get("mean_ttft_ms"))
        tpot_mean = _num(r.get("mean_tpot_ms"))
        osl = (r.get("total_output_tokens") or 0) / done
        tail = (e2e - ttft) / 1000 if _ok(e2e) and _ok(ttft) else \
            (osl - 1) * tpot_mean / 1000 if _ok(tpot_mean) else math.nan
        running = kvm = math.nan
        if w is not None:
            running = _steady_mean(ss, run_ids, w.start, w.end, step, "sum")
            kvm = _steady_mean(ss, kv_ids, w.start, w.end, step, "mean")
        points.append(Point(
            concurrency=_num(fig["max_concurrency"]), prompts=done,
            duration_s=fig["duration_s"], request_rate=fig["request_throughput"],
            input_tok_s=fig["input_throughput"], output_tok_s=fig["output_throughput"],
            isl=(r.get("total_input_tokens") or 0) / done, osl=osl,
            ttft_s=ttft / 1000 if _ok(ttft) else _num(fig["ttft_p50_ms"]) / 1000,
            tpot_s=fig["tpot_p50_ms"] / 1000, decode_tail_s=tail,
            total_tok_s_gpu=_num(fig["total_tokens_per_s_per_gpu"]),
            tok_s_user=fig["tokens_per_s_per_user"],
            prefill_queue_s=ev.get("prefill_queue_s", math.nan),
            prefill_compute_s=ev.get("prefill_compute_s", math.nan),
            kv_transfer_s=ev.get("kv_transfer_s", math.nan),
            decode_admission_s=ev.get("decode_admission_s", math.nan),
            prefill_waiting=ev.get("prefill_waiting", math.nan),
            prefill_kv_max=ev.get("prefill_kv_max", math.nan),
            decode_running=running, decode_kv=kvm,
            decode_kv_max=ev.get("decode_kv_max", math.nan),
            decode_waiting_capacity=ev.get("decode_waiting_capacity", math.nan)))
    if not any(_ok(p.decode_running) for p in points):
        raise NoRecommendation("no sweep window has decode telemetry "
                               "(vllm:num_requests_running on the decode endpoints)")
    verdicts = diagnose.diagnose(table.to_dict("records")) if not table.empty else []
    return points, notes, verdicts


def prompts_rule(points: list[Point]) -> tuple[str, float]:
    """How the recipe sizes a point: ("fixed", N) or ("per_concurrency", N / concurrency)."""
    ns = [p.prompts for p in points]
    if len(points) > 1 and max(ns) - min(ns) <= 1:
        return "fixed", ns[0]
    return "per_concurrency", _median([p.prompts / p.concurrency for p in points
                                       if p.concurrency > 0])


def concurrency_list(start: float, top: int) -> list[int]:
    """Doubling from the run's lowest concurrency to below `top`, then `top` (<= 8 values)."""
    c = max(1, int(start))
    if c >= top:
        c = max(1, top // 8)
    out = []
    while c < top:
        out.append(c)
        c *= 2
    out.append(top)
    if out[-2:-1] and top < out[-2] * 1.2 and len(out) > 2:
        out.pop(-2)  # 16, 18: keep the top only
    return out[-8:]


# --- the recommendation ----------------------------------------------------------------------


def analyse(run_dir: str | Path, target_tokens_per_s_per_user: float | None = None,
            target_ttft_ms: float | None = None,
            ) -> tuple[dict[str, Any] | None, str | None]:
    """(recommendation, None), or (None, the one-sentence reason there is none)."""
    under = slo_of(Path(run_dir))
    taken = []  # the targets the SLO gives where none was asked
    if under is not None:
        from launcher.run import slo

        for lim in slo.parse(under["limits"]):
            if target_tokens_per_s_per_user is None and lim.metric in ("tpot", "itl"):
                target_tokens_per_s_per_user = round(1000.0 / lim.value_ms, 2)
                taken.append(f"{target_tokens_per_s_per_user:g} tok/s/user from {lim.text}")
            elif target_ttft_ms is None and lim.metric == "ttft":
                target_ttft_ms = lim.value_ms
                taken.append(f"a mean TTFT of {target_ttft_ms:g} ms from {lim.text}")
    try:
        rec = _recommend(Path(run_dir), target_tokens_per_s_per_user, target_ttft_ms)
    except NoRecommendation as e:
        return None, str(e)
    if under is not None:
        rec["slo"] = under
        if taken:
            rec["assumptions"].append(
                "targets taken from the SLO: " + " and ".join(taken) + " (the recommender's "
                "targets are the median TPOT and the mean TTFT, which a percentile limit "
                "bounds from above: the SLO search's measured points are the stricter test)")
        if under["concurrency"] is not None and under["this_run"]:
            rec["assumptions"].append(
                f"the SLO search measured {under['concurrency']} as this configuration's "
                f"largest concurrency meeting {under['limits']}: serve it there")
    return rec, None


def slo_of(run_dir: Path) -> dict[str, Any] | None:
    """Under benchmark.slo: its study's answer (or the run's own, outside a study), which
    configuration it names, at which concurrency, and whether that is this run; None
    without an SLO (launcher.run.slo_answer)."""
    from launcher.run import listing, slo_answer
    from launcher.run.rundir import RunDir

    study = listing.study_of(RunDir(run_dir))
    configs = study.configurations() if study is not None else [(RunDir(run_dir).run_id,
                                                                 run_dir)]
    ans = slo_answer.answer(configs)
    if ans is None:
        return None
    best = next((f for f in ans.frontiers if f.label == ans.best), None)
    return {"limits": ans.limits, "sentence": ans.sentence, "best": ans.best,
            "best_run": best.run if best else None,
            "concurrency": best.passing if best else None,
            "this_run": best is not None and best.run == Path(run_dir).name}


def recommend(run_dir: Path, target_tokens_per_s_per_user: float | None = None,
              target_ttft_ms: float | None = None) -> dict[str, Any] | None:
    """The prefill:decode endpoint ratio for this run's recipe, ISL/OSL, a tokens/s per user
    target (None: no latency target, the decode side's KV or sequence limit decides) and a
    mean TTFT target in ms (None: none), with the evidence, the caveats and the command to
    run next; None when the run cannot support one (`why_not` says why). Keys:
    prefill_endpoints, decode_endpoints, ratio, top_concurrency,
    target_tokens_per_s_per_user, target_ttft_ms, capacities, evidence, next_command,
    predicted, assumptions, confidence, caveats; also candidates, run, recipe, simulated."""
    return analyse(run_dir, target_tokens_per_s_per_user, target_ttft_ms)[0]


def why_not(run_dir: str | Path, target_tokens_per_s_per_user: float | None = None,
            target_ttft_ms: float | None = None) -> str | None:
    """Why `recommend` returns None for this run (None when it does not)."""
    return analyse(run_dir, target_tokens_per_s_per_user, target_ttft_ms)[1]


# the side of the run each verdict puts the bottleneck on (None: none, or outside the method)
_SIDE = {"prefill-bound": "prefill", "decode-kv-capacity": "decode",
         "decode-compute": "decode", "dp-imbalance": "decode"}


def diagnosis_caveat(verdict: Any, run_p: int, this_bound: str, best_p: int,
                     best_bound: str) -> str | None:
    """A sentence when this run's own diagnosis (the TTFT page's verdict at its heaviest
    point) does not agree with how the method reads the run or the advice; else None."""
    if verdict is None:
        return None
    kind, where = str(verdict.kind), f"{verdict.label} at {verdict.point}"
    if kind in ("kv-transfer", "client-router"):
        return (f"This run's diagnosis (TTFT page) is {where}: the method assumes KV "
                "transfer and the router are not limits, so its figures may not hold.")
    side = _SIDE.get(kind)
    if side is None:
        return None
    if side != this_bound:
        return (f"The method reads this run ({run_p} prefill endpoint(s)) as "
                f"{this_bound}-bound, but its diagnosis (TTFT page) is {where}.")
    if best_p != run_p and side != best_bound:
        return (f"This run ({run_p} prefill endpoint(s)) was {where} (TTFT page); the advice "
                f"({best_p}) is predicted {best_bound}-bound, which no point of this run "
                "measured.")
    return None


def _recommend(run_dir: Path, target: float | None,
               target_ttft_ms: float | None = None) -> dict[str, Any]:
    ttft_target = _checked_targets(target, target_ttft_ms)
    plan = _disagg_plan(run_dir)
    topo = topology_of(plan)
    points, notes, verdicts = observe(run_dir, plan, topo)
    if len(points) < 2:
        raise NoRecommendation("the run has one ok sweep point; the method needs at least "
                               "two concurrencies to see how each side responds to load")
    pre = prefill_capacity(points, topo)
    if not pre["tokens_per_s"] > 0:
        raise NoRecommendation("the prefill side delivered no prompt tokens in any window")
    model = decode_model(points, topo)
    dcap = decode_capacity(model, target)
    ttft0 = min(p.ttft_s for p in points)
    rule = prompts_rule(points)
    if ttft_target and ttft_target <= ttft0:
        raise NoRecommendation(
            f"the TTFT target of {target_ttft_ms:,.0f} ms is below this run's lowest TTFT "
            f"({ttft0 * 1000:,.0f} ms, at its lightest point): no prefill count can meet it")
    cands = candidates(pre, model, dcap, topo, ttft0, rule, ttft_target_s=ttft_target)
    best = choose(cands, target, ttft_target)
    P, D = best["prefill_endpoints"], topo.decode_endpoints
    g = math.gcd(P, D)
    need = dcap["request_rate"] * model["isl"] / pre["tokens_per_s"]
    top_pt, this, measured = _model_check(points, pre, model, dcap, topo, ttft0, target)

    ev = _capacity_evidence(pre, model, dcap, topo, target, need)
    ev += _choice_evidence(topo, top_pt, this, measured, target, target_ttft_ms, ttft_target,
                           cands, best)
    fit = nodes_for(run_dir / "recipe.yaml", P)
    if fit:
        ev.append(fit)
    ev += notes

    hi = model["tpot"]["running_range"][1]
    reach = dcap["running"] / hi if hi > 0 else math.inf
    confidence, confidence_why = _confidence(pre, model, dcap, reach)
    caveats = _caveats(confidence, confidence_why, best, verdicts, topo, this["bound"])
    assumptions = _assumptions(topo, model, dcap, best, reach)
    next_command, concs, study_note, study_counts = _next_command(run_dir, points, best)
    if study_note:
        assumptions.append(study_note)
    # the study's measured counts, as before the split (the run's measured tok/s/GPU was
    # meant): kept so the output does not change
    predicted = _predicted(best, need, study_counts, ttft0)
    return {
        "run": str(run_dir), "run_id": plan.run_id, "recipe": plan.recipe,
        "simulated": topo.simulated,
        "prefill_endpoints": P, "decode_endpoints": D, "ratio": f"{P // g}:{D // g}",
        "top_concurrency": best["top_concurrency"],
        "target_tokens_per_s_per_user": target, "target_ttft_ms": target_ttft_ms,
        "isl": model["isl"], "osl": model["osl"],
        "capacities": _capacities(topo, pre, model, dcap, reach), "evidence": ev,
        "next_command": next_command,
        "next_concurrency": concs, "predicted": predicted, "assumptions": assumptions,
        "candidates": cands, "confidence": confidence, "confidence_why": confidence_why,
        "caveats": caveats,
        "points": [asdict(p) for p in points],
    }


def _checked_targets(target: float | None, target_ttft_ms: float | None) -> float | None:
    """The TTFT target in seconds (None: none), once both targets are positive numbers."""
    if target is not None and not (_ok(target) and target > 0):
        raise NoRecommendation(f"the tokens/s per user target must be a positive number, "
                               f"not {target!r}")
    if target_ttft_ms is not None and not (_ok(target_ttft_ms) and target_ttft_ms > 0):
        raise NoRecommendation(f"the TTFT target must be a positive number of milliseconds, "
                               f"not {target_ttft_ms!r}")
    return target_ttft_ms / 1000 if target_ttft_ms else None


def _disagg_plan(run_dir: Path) -> Any:
    """The run's plan, when it is a readable disaggregated run; else why not."""
    from launcher.run.plandoc import PlanError, read_plan

    if not run_dir.is_dir():
        raise NoRecommendation(f"{run_dir} is not a run directory")
    try:
        plan = read_plan(run_dir)
    except PlanError as e:
        raise NoRecommendation(f"{e}") from None
    if plan.mode != "disagg":
        raise NoRecommendation("the run is in aggregated mode: every GPU does prefill and "
                               "decode, so there is no prefill:decode ratio to recommend")
    return plan


def _model_check(points: list[Point], pre: dict[str, Any], model: dict[str, Any],
                 dcap: dict[str, Any], topo: Topology, ttft0: float, target: float | None,
                 ) -> tuple[Point, dict[str, Any], float | None]:
    """(this run's top point, the method's prediction for this run's own topology there,
    the tok/s/GPU the run measured at the target): the method checked against the run."""
    top_pt = max(points, key=lambda q: q.concurrency)
    this = predict(topo.prefill_endpoints, pre, model, dcap, topo, ttft0,
                   ("fixed", top_pt.prompts), top=int(top_pt.concurrency))
    measured = tok_s_gpu_at_target([{"status": "ok", "max_concurrency": q.concurrency,
                                     "total_tokens_per_s_per_gpu": q.total_tok_s_gpu,
                                     "tokens_per_s_per_user": q.tok_s_user} for q in points],
                                   target)
    return top_pt, this, measured


def _target_text(target: float | None) -> str:
    return f">= {target:g} tok/s/user" if target else "no tok/s/user target"


def _capacity_evidence(pre: dict[str, Any], model: dict[str, Any], dcap: dict[str, Any],
                       topo: Topology, target: float | None, need: float) -> list[str]:
    """The evidence for each side's capacity and the prefill count that balances them."""
    isl, tp = model["isl"], model["tpot"]
    ev: list[str] = []
    k = pre["tokens_per_s"]
    if pre["saturated"]:
        ev.append(f"Prefill knee at {pre['knee']}: {pre['why']}; above it one prefill endpoint "
                  f"({topo.prefill_shape}) delivered {pre['measured_tokens_per_s']:,.0f} prompt "
                  f"tok/s ({k:,.0f} steady state, without the last requests' decode tail).")
    elif pre["basis"] == "estimate":
        ev.append(f"The prefill side never reached its knee ({pre['why']}): {k:,.0f} prompt "
                  "tok/s per endpoint is an estimate from one prompt's compute time (a floor: "
                  "batching only adds), so the prefill count below is an upper bound.")
    else:
        ev.append(f"The prefill side never reached its knee ({pre['why']}): "
                  f"{k:,.0f} prompt tok/s per endpoint is a lower bound, so the prefill "
                  "count below is an upper bound.")
    lo, hi = tp["running_range"]
    if tp["flat"]:
        ev.append(f"Decode TPOT did not grow with load over {lo:.1f}-{hi:.1f} running "
                  f"requests (median {tp['a_s'] * 1000:.2f} ms): taken as flat.")
    else:
        ev.append(f"Decode TPOT = {tp['a_s'] * 1000:.2f} ms + {tp['b_s'] * 1000:.3f} ms x "
                  f"running requests (fit on {tp['points']} points, {lo:.1f}-{hi:.1f} running, "
                  f"TPOT {tp['tpot_range_s'][0] * 1000:.2f}-{tp['tpot_range_s'][1] * 1000:.2f} ms).")
    if model["running_at_kv_limit"] is not None:
        ev.append(f"Decode KV: {len(topo.decode_kv_tokens)} engine(s) x "
                  f"{_median(topo.decode_kv_tokens):,.0f} tokens; a running request holds "
                  f"{model['kv_tokens_per_request']:,.0f} ({model['kv_footprint_basis']}), so "
                  f"about {model['running_at_kv_limit']:.1f} requests fit.")
    if model["running_measured_full"] is not None:
        modelled = model["running_at_kv_limit"]
        ev.append(f"The decode KV was full at {', '.join(model['measured_full_at'])} with "
                  f"{model['running_measured_full']:.1f} requests running"
                  + (f": that measurement, not the {modelled:.1f} modelled above, is the "
                     "KV limit used below." if modelled is not None else "."))
    limit_text = ", ".join(f"{name} {v:.1f}" for name, v in sorted(dcap["limits"].items(),
                                                                 key=lambda kv: kv[1]))
    ev.append(f"At {_target_text(target)} the decode side carries {dcap['running']:.1f} "
              f"running requests (limits: {limit_text}) at TPOT {dcap['tpot_s'] * 1000:.2f} "
              f"ms = {dcap['output_tokens_per_s']:,.0f} output tok/s = "
              f"{dcap['request_rate']:.2f} req/s.")
    ev.append(f"{dcap['request_rate']:.2f} req/s x {isl:,.0f} prompt tokens = "
              f"{dcap['request_rate'] * isl:,.0f} prompt tok/s = {need:.2f} prefill endpoints "
              f"of {k:,.0f} tok/s.")
    return ev


def _choice_evidence(topo: Topology, top_pt: Point, this: dict[str, Any],
                     measured: float | None, target: float | None,
                     target_ttft_ms: float | None, ttft_target: float | None,
                     cands: list[dict[str, Any]], best: dict[str, Any]) -> list[str]:
    """The evidence for the pick: the model checked on this run, then the pick against the
    other counts."""
    ev: list[str] = []
    tgt = _target_text(target)
    if measured:
        ev.append(f"Model check on this run ({topo.prefill_endpoints} prefill endpoint(s), "
                  f"{top_pt.label}, {top_pt.prompts:.0f} requests): predicted "
                  f"{this['total_tokens_per_s_per_gpu']:,.0f} tok/s/GPU, measured "
                  f"{measured:,.0f} at {tgt if target else 'its best point'}.")
    P, D = best["prefill_endpoints"], topo.decode_endpoints
    ttft_tgt = f" and TTFT <= {target_ttft_ms:,.0f} ms" if target_ttft_ms else ""
    ev.append(f"Recommended {P} prefill endpoint(s) per {D} decode: "
              f"{best['total_tokens_per_s_per_gpu']:,.0f} tok/s/GPU predicted "
              f"({best['bound']}-bound) vs " + ", ".join(
                  f"{c['prefill_endpoints']}: {c['total_tokens_per_s_per_gpu']:,.0f}"
                  for c in cands if c is not best) + "."
              + (f" Every count below {P} misses the TTFT target." if ttft_tgt and any(
                  c["ttft_s"] > ttft_target * 1.001 for c in cands
                  if c["prefill_endpoints"] < P) else ""))
    return ev


def _confidence(pre: dict[str, Any], model: dict[str, Any], dcap: dict[str, Any],
                reach: float) -> tuple[str, list[str]]:
    """(high, medium or low; what keeps it from high, in the order it matters). `reach`:
    the decode load advised over the most this run held."""
    if pre["saturated"] and (model["running_measured_full"] is not None or reach <= 1.2):
        confidence = "high"
    elif pre["saturated"] and (dcap["bound"] != "target" or reach <= 3):
        confidence = "medium"
    else:
        confidence = "low"
    why = []
    if not pre["saturated"]:
        why.append("the prefill side never reached its knee in this run, so its "
                   "capacity is a bound, not a measurement")
    if model["running_measured_full"] is None and reach > 1.2:
        why.append(f"the decode side is extrapolated to {reach:.1f}x the most "
                   "requests this run held")
    if model["kv_footprint_basis"] != "measured":
        why.append("KV per request is estimated, not measured")
    return confidence, why


def _caveats(confidence: str, confidence_why: list[str], best: dict[str, Any],
             verdicts: list, topo: Topology, this_bound: str) -> list[str]:
    """What a reader must see wherever the advice is shown (CLI, Study page, report)."""
    # TTFT: the lowest this run measured plus M/D/1 queueing at the predicted prefill load
    rho, ttft_pred = best["prefill_utilisation"], best["ttft_s"]
    caveats = []
    if confidence != "high":
        caveats.append(f"Confidence {confidence}" + (
            f": {'; '.join(confidence_why)}." if confidence_why else "."))
    if not math.isfinite(ttft_pred):
        caveats.append(f"TTFT unbounded: at the predicted rate the prefill side is "
                       f"{rho:.0%} utilised, so prompts queue for prefill without limit "
                       "(set a TTFT target, --target-ttft-ms, to size the prefill side).")
    heaviest = max((v for v in verdicts if str(v.kind) != "failed"),
                   key=lambda v: v.concurrency if _ok(v.concurrency) else -1, default=None)
    said = diagnosis_caveat(heaviest, topo.prefill_endpoints, this_bound,
                            best["prefill_endpoints"], best["bound"])
    if said:
        caveats.append(said)
    return caveats


def _assumptions(topo: Topology, model: dict[str, Any], dcap: dict[str, Any],
                 best: dict[str, Any], reach: float) -> list[str]:
    """What the advice takes for granted about the next run."""
    assumptions = [
        "Prefill capacity grows linearly with prefill endpoints (the router spreads prompts "
        "evenly; the figure is this run's mean per endpoint).",
        "Decode TPOT grows linearly with running requests (fixed step cost + per-sequence "
        f"cost), fitted on this run; the recommendation extrapolates it to {dcap['running']:.1f} "
        f"running requests ({reach:.1f}x the most this run held).",
        "A decode request holds its KV for its transfer plus OSL decode steps, and about one "
        "prompt's worth of KV per engine stays free (a request is admitted only when its "
        "whole prompt fits).",
        f"Same recipe otherwise: ISL/OSL {model['isl']:,.0f}/{model['osl']:,.0f} as measured, "
        f"the same engine flags, {topo.decode_endpoints} decode endpoint(s) "
        f"{topo.decode_shape}, prefill endpoints {topo.prefill_shape}.",
        "Predicted figures are what a sweep point of "
        f"{best['prompts_at_top']:.0f} requests measures (its fill and drain included); "
        "steady-state figures are given beside them.",
        "KV transfer (NIXL) and the router are not limits; check the TTFT page if the next "
        "run disagrees.",
    ]
    if topo.simulated:
        assumptions.append("SIMULATED run: the capacities are the simulator's speed model, "
                           "not a GPU's.")
    if model["kv_footprint_basis"] != "measured":
        assumptions.append("KV per request is estimated as prompt + half the output "
                           "(no point had decode KV usage with running requests).")
    return assumptions


def _next_command(run_dir: Path, points: list[Point], best: dict[str, Any],
                  ) -> tuple[str, list[int], str | None, Any]:
    """(the submit command to run next, its concurrencies, a sentence when the run's study
    measured the counts around the pick already, the counts that study measured): the
    counts around the pick as a sweep, or only the pick when its study has the others."""
    from launcher.run import listing
    from launcher.run.rundir import RunDir

    P = best["prefill_endpoints"]
    start = min(p.concurrency for p in points)
    concs = concurrency_list(start, best["top_concurrency"])
    recipe = run_dir / "recipe.yaml"
    values = list(range(max(1, P - 1), P + 2))
    study = listing.study_of(RunDir(run_dir))
    runs_root = (study.path if study else run_dir).parent
    cmd = ["python", "-m", "launcher", "submit", str(recipe),
           "--set", f"benchmark.concurrency=[{','.join(map(str, concs))}]"]
    measured = study.axes.get("prefill.endpoints") if study else None
    note = None
    if isinstance(measured, list) and set(values) <= set(measured):
        # the study this run belongs to measured those counts already: one run of the pick
        cmd += ["--set", f"prefill.endpoints={P}"]
        note = (f"Study {study.name} already measured prefill.endpoints="
                f"{','.join(map(str, measured))}: compare them on its Study page; "
                f"the command runs only the recommended {P}, at the concurrencies "
                "that reach the target.")
    else:
        cmd += ["--sweep", f"prefill.endpoints={','.join(map(str, values))}"]
    cmd += ["--runs-dir", str(runs_root)]
    return " ".join(shlex.quote(a) for a in cmd), concs, note, measured


def _capacities(topo: Topology, pre: dict[str, Any], model: dict[str, Any],
                dcap: dict[str, Any], reach: float) -> dict[str, Any]:
    """Each side's capacity per endpoint and per GPU, with its basis and units."""
    k, isl, tp = pre["tokens_per_s"], model["isl"], model["tpot"]
    D = topo.decode_endpoints
    return {
        "prefill": {
            "endpoints_in_run": topo.prefill_endpoints, "shape": topo.prefill_shape,
            "gpus_per_endpoint": topo.prefill_gpus,
            "prompt_tokens_per_s_per_endpoint": k,
            "prompt_tokens_per_s_per_endpoint_measured": pre["measured_tokens_per_s"],
            "prompt_tokens_per_s_per_gpu": k / topo.prefill_gpus,
            "requests_per_s_per_endpoint": k / isl,
            "knee": pre["knee"], "knee_concurrency": pre["knee_concurrency"],
            "basis": "measured at the knee" if pre["saturated"] else
                     "estimate from one prompt's compute time (no knee in this run)"
                     if pre["basis"] == "estimate" else
                     "lower bound (the run never reached the prefill knee)",
        },
        "decode": {
            "endpoints_in_run": D, "shape": topo.decode_shape,
            "gpus_per_endpoint": topo.decode_gpus,
            "running_requests_per_endpoint": dcap["running"] / D,
            "output_tokens_per_s_per_endpoint": dcap["output_tokens_per_s"] / D,
            "output_tokens_per_s_per_gpu": dcap["output_tokens_per_s"] / (D * topo.decode_gpus),
            "requests_per_s_per_endpoint": dcap["request_rate"] / D,
            "tokens_per_s_per_user": dcap["tokens_per_s_per_user"],
            "tpot_ms": dcap["tpot_s"] * 1000,
            "bound": dcap["bound"],
            "limits_running_requests": {k2: v / D for k2, v in dcap["limits"].items()},
            "kv_capacity_tokens_per_endpoint": (model["kv_capacity_tokens"] / D
                                                if model["kv_capacity_tokens"] else None),
            "kv_tokens_per_request": model["kv_tokens_per_request"],
            "tpot_model_ms": {"base": tp["a_s"] * 1000, "per_running_request": tp["b_s"] * 1000},
            "basis": "measured (the run filled the decode)"
                     if dcap["bound"] == "kv-capacity" and model["running_measured_full"]
                     is not None else "within the load this run measured" if reach <= 1.05
                     else f"extrapolated {reach:.1f}x past the most this run held",
        },
        "units": {"prompt_tokens_per_s_*": "prompt tokens per second",
                  "output_tokens_per_s_*": "generated tokens per second",
                  "requests_per_s_*": "requests per second",
                  "running_requests_*": "requests decoding at once",
                  "tokens_per_s_per_user": "1000 / median TPOT ms", "*_ms": "milliseconds",
                  "kv_*tokens*": "KV-cache tokens (num_gpu_blocks x block_size)"},
    }


def _predicted(best: dict[str, Any], need: float, this_run_measured: Any,
               ttft0: float) -> dict[str, Any]:
    """The pick's predicted figures, with the TTFT floor they rest on."""
    return {
        "total_tokens_per_s_per_gpu": best["total_tokens_per_s_per_gpu"],
        "steady_total_tokens_per_s_per_gpu": best["steady_total_tokens_per_s_per_gpu"],
        "tokens_per_s_per_user": best["tokens_per_s_per_user"],
        "request_rate": best["request_rate"], "bound": best["bound"], "gpus": best["gpus"],
        "concurrency_at_capacity": best["concurrency_at_capacity"],
        "prefill_endpoints_needed": need,
        "this_run_measured_total_tokens_per_s_per_gpu": this_run_measured,
        "ttft_s": best["ttft_s"], "prefill_utilisation": best["prefill_utilisation"],
        "ttft_floor_s": ttft0,
    }


def nodes_for(recipe_file: Path, prefill_endpoints: int) -> str | None:
    """Whether the recommended topology plans on the recipe's cluster: a sentence, or None
    when the recipe cannot be read here (the next command's --dry-run says it anyway)."""
    if not recipe_file.is_file():
        return None
    try:
        from launcher.planning.plan import nodes_needed
        from launcher.schema import cluster as cluster_mod
        from launcher.schema import recipe as recipe_mod

        r = recipe_mod.load(str(recipe_file), [f"prefill.endpoints={prefill_endpoints}"])
        c = cluster_mod.load(r.cluster)
        return (f"{prefill_endpoints} prefill endpoint(s) plan on {nodes_needed(r, c)} "
                f"node(s) of {c.gpus_per_node} GPUs on {c.name}.")
    except Exception as e:  # UserError from the planner, or a recipe of another version
        return f"{prefill_endpoints} prefill endpoint(s) do not plan as they are: {e}"


# --- text and CLI ----------------------------------------------------------------------------


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def render_text(rec: dict[str, Any]) -> str:
    c, pr = rec["capacities"], rec["predicted"]
    pf, dc = c["prefill"], c["decode"]
    tgt = targets_text(rec)
    sim = " (SIMULATED)" if rec["simulated"] else ""
    under = rec.get("slo")
    lines = [
        *([f"Under the SLO: {under['sentence']}", ""] if under else []),
        f"Recommendation from {rec['run_id']}{sim}, ISL/OSL {rec['isl']:,.0f}/{rec['osl']:,.0f}, "
        f"{tgt}:",
        f"  {rec['prefill_endpoints']} prefill {pf['shape']} per {rec['decode_endpoints']} decode "
        f"{dc['shape']} (ratio {rec['ratio']}, {pr['gpus']} GPUs), top concurrency "
        f"{rec['top_concurrency']}; confidence {rec['confidence']}"
        + (f" ({'; '.join(rec['confidence_why'])})" if rec.get("confidence_why") else ""),
        f"  predicted {pr['total_tokens_per_s_per_gpu']:,.0f} tok/s/GPU "
        f"({pr['steady_total_tokens_per_s_per_gpu']:,.0f} steady state) at "
        f"{pr['tokens_per_s_per_user']:,.1f} tok/s/user, {pr['bound']}-bound",
        "  " + ttft_text(pr),
        "",
        *(["Caveats:", *[f"  ! {c}" for c in rec["caveats"]], ""] if rec.get("caveats")
          else []),
        "What each side carries:",
        f"  prefill endpoint ({pf['shape']}, {_gpus(pf['gpus_per_endpoint'])}): "
        f"{pf['prompt_tokens_per_s_per_endpoint']:,.0f} prompt tok/s "
        f"= {pf['requests_per_s_per_endpoint']:.2f} req/s ({pf['basis']})",
        f"  decode endpoint ({dc['shape']}, {_gpus(dc['gpus_per_endpoint'])}): "
        f"{dc['running_requests_per_endpoint']:.1f} running requests, "
        f"{dc['output_tokens_per_s_per_endpoint']:,.0f} output tok/s, "
        f"{dc['tokens_per_s_per_user']:.1f} tok/s/user (bound: {dc['bound']}; {dc['basis']})",
        "",
        "Prefill endpoints per decode side:",
        "     P  GPUs  tok/s/GPU  steady  tok/s/user  bound    top conc   TTFT ms",
    ]
    cands = rec["candidates"]
    if len(cands) > 8:  # the neighbourhood of the recommendation and this run's count
        keep = {rec["prefill_endpoints"] + d for d in range(-3, 4)}
        keep.add(rec["capacities"]["prefill"]["endpoints_in_run"])
        cands = [cd for cd in cands if cd["prefill_endpoints"] in keep]
    for cd in cands:
        mark = "*" if cd["prefill_endpoints"] == rec["prefill_endpoints"] else " "
        lines.append(
            f"  {mark}{cd['prefill_endpoints']:>3}  {cd['gpus']:>4}  "
            f"{cd['total_tokens_per_s_per_gpu']:>9,.0f}  "
            f"{cd['steady_total_tokens_per_s_per_gpu']:>6,.0f}  "
            f"{cd['tokens_per_s_per_user']:>10,.1f}  {cd['bound']:<7}  {cd['top_concurrency']:>8}"
            f"  {_ttft_ms(cd.get('ttft_s')):>8}")
    lines += ["", "Evidence:"] + [f"  - {e}" for e in rec["evidence"]]
    lines += ["", "Assumptions:"] + [f"  - {a}" for a in rec["assumptions"]]
    lines += ["", "Next:", f"  {rec['next_command']}"]
    return "\n".join(lines)


def targets_text(rec: dict[str, Any]) -> str:
    """The targets the advice was made for, in words ("no tok/s/user target", ">= 45
    tok/s/user and TTFT <= 800 ms")."""
    u, t = rec.get("target_tokens_per_s_per_user"), rec.get("target_ttft_ms")
    words = [f">= {u:g} tok/s/user"] if u else []
    words += [f"TTFT <= {t:,.0f} ms"] if t else []
    return " and ".join(words) or "no tok/s/user or TTFT target"


def ttft_text(pr: dict[str, Any]) -> str:
    """The predicted TTFT with its basis: the same words on the CLI, the Study page and the
    report."""
    return ("TTFT " + (f"about {pr['ttft_s'] * 1000:,.0f} ms" if _ok(pr.get("ttft_s"))
                       else "unbounded")
            + f" (this run's lowest, {pr['ttft_floor_s'] * 1000:,.0f} ms, plus queueing at "
              f"prefill utilisation {pr['prefill_utilisation']:.0%}, M/D/1)")


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


# the options' help, shared with `python -m launcher recommend`
TARGET_HELP = ("tokens/s per user each request must get (1000 / median TPOT ms); "
               "default: none, the decode side's KV or sequence limit decides")
TTFT_HELP = ("mean time to first token to stay under, in ms: only prefill counts whose "
             "predicted TTFT meets it are advised; default: none")
FORMAT_HELP = "text for people (default), json for scripts"


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(
        prog="python -m launcher.analysis.recommend",
        description="Recommend the prefill:decode endpoint ratio from one measured run.")
    ap.add_argument("run_dir", type=Path, help="the run directory to read")
    ap.add_argument("--target-tok-s-user", type=float, default=None, metavar="X",
                    help=TARGET_HELP)
    ap.add_argument("--target-ttft-ms", type=float, default=None, metavar="MS",
                    help=TTFT_HELP)
    ap.add_argument("--format", choices=("text", "json"), default="text", help=FORMAT_HELP)
    a = ap.parse_args(argv)
    rec, why = analyse(a.run_dir, a.target_tok_s_user, a.target_ttft_ms)
    if rec is None:
        where = "" if not a.run_dir.is_dir() else f"no recommendation from {a.run_dir}: "
        print(f"error: {where}{why}", file=sys.stderr)
        return 2
    if a.format == "json":
        print(json.dumps(_json_safe(rec), indent=2))
    else:
        print(render_text(rec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
