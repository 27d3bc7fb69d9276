"""Latency limits (an SLO) on a sweep's points, and the search for the highest concurrency
that meets them all (docs/slo.md).

Pure and light: the recipe's check, the orchestrator's search, the study's answer, the
report and the dashboard all read the grammar, the verdict of a point and the next
concurrency to measure from here. The search reads only what every benchmark kind writes
for a point: its latency percentiles, its throughput and why it failed, if it did.

Grammar: limits joined by commas, each `<metric>_<statistic><op><number><unit>`:
metric ttft | tpot | itl | e2el; statistic p50 | p90 | p99 | mean | median; op <= | <;
unit ms | s. E.g. `ttft_p99<=2s,itl_p90<=30ms`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# What the sweep's clients write for a point (launcher.planning.render's flags for both
# drivers: --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99; vLLM's
# bench serve adds mean_ and median_ of each).
METRICS = {"ttft": "time to first token", "tpot": "time per output token (first excluded)",
           "itl": "inter-token latency", "e2el": "end-to-end request latency"}
PERCENTILES = (50, 90, 99)
STATISTICS = (*(f"p{p}" for p in PERCENTILES), "mean", "median")
UNITS = {"ms": 1.0, "s": 1000.0}
DEFAULT_PRECISION = 0.1
EXAMPLE = "ttft_p99<=2s,itl_p90<=30ms"

_LIMIT = re.compile(r"^\s*([A-Za-z0-9]+)_([A-Za-z0-9.]+)\s*(<=|<|>=|>|==|=|!=)?\s*"
                    r"([-+0-9.eE]*)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class Limit:
    metric: str  # ttft | tpot | itl | e2el
    stat: str  # p50 | p90 | p99 | mean | median
    op: str  # <= | <
    value_ms: float
    text: str  # as written, spaces removed

    @property
    def name(self) -> str:
        return f"{self.metric}_{self.stat}"

    def holds(self, measured_ms: float) -> bool:
        return measured_ms <= self.value_ms if self.op == "<=" else measured_ms < self.value_ms

    def to_json(self) -> dict:
        return {"metric": self.metric, "stat": self.stat, "op": self.op,
                "value_ms": self.value_ms, "text": self.text}


def _one(raw: str) -> Limit:
    text = "".join(raw.split())
    m = _LIMIT.match(raw)
    if not text:
        raise ValueError(f"an empty limit in the list: write limits joined by commas, e.g. "
                         f"{EXAMPLE}")
    if m is None:
        raise ValueError(f"{text!r} is not a limit: write <metric>_<statistic><=<number><unit>, "
                         f"e.g. {EXAMPLE}")
    metric, stat, op, number, unit = m.groups()
    metric, stat = metric.lower(), stat.lower()
    if metric not in METRICS:
        raise ValueError(f"{text!r}: {metric!r} is not a metric the sweep reports; use one of "
                         f"{', '.join(METRICS)}")
    if stat not in STATISTICS:
        raise ValueError(f"{text!r}: {stat!r} is not reported for {metric} (the sweep reports "
                         f"{', '.join(STATISTICS)}: --metric-percentiles "
                         f"{','.join(map(str, PERCENTILES))}); use one of those")
    if op not in ("<=", "<"):
        raise ValueError(f"{text!r}: a latency limit is an upper bound: write "
                         f"{metric}_{stat}<={number or 'N'}{unit or 'ms'} (or <)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r}: {number or 'nothing'!r} is not a number: write e.g. "
                         f"{metric}_{stat}{op}30ms") from None
    if not unit:
        raise ValueError(f"{text!r} has no unit: write {metric}_{stat}{op}{number}ms or "
                         f"{metric}_{stat}{op}{number}s")
    if unit.lower() not in UNITS:
        raise ValueError(f"{text!r}: {unit!r} is not a unit of time here; use ms or s")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r}: the limit must be a positive time")
    return Limit(metric, stat, op, value * UNITS[unit.lower()], text)


def parse(text: str) -> list[Limit]:
    """The limits of `text`; ValueError, one sentence naming what to fix, for the first
    problem."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"no limits given: write them joined by commas, e.g. {EXAMPLE}")
    limits = [_one(part) for part in text.split(",")]
    names = [lim.name for lim in limits]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise ValueError(f"{twice} is limited twice: keep one limit per metric and statistic")
    return limits


def text_of(limits: list[Limit]) -> str:
    return ", ".join(lim.text for lim in limits)


# --- one point ---------------------------------------------------------------------------


def measured(point: dict[str, Any], lim: Limit) -> float | None:
    """The point's value of a limit's statistic in ms: the result's own key
    (`p99_ttft_ms`, `median_ttft_ms`, `mean_ttft_ms`), else the per-request arrays of a
    --save-detailed file (launcher.run.figures), else None."""
    stat = lim.stat
    keys = [f"{stat}_{lim.metric}_ms"] + ([f"median_{lim.metric}_ms"] if stat == "p50" else
                                          [f"p50_{lim.metric}_ms"] if stat == "median" else [])
    for key in keys:
        v = point.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    if stat.startswith("p") or stat == "median":
        from launcher.run.figures import _stat

        p = 50 if stat == "median" else int(stat[1:])
        if lim.metric in ("ttft", "tpot"):
            return _stat(point, lim.metric, p)[0]
    return None


@dataclass(frozen=True)
class Verdict:
    """One point against the limits: passes only when it ran cleanly (no failure of any
    kind) and every limit holds on a measured value."""

    concurrency: int
    passed: bool
    values: dict[str, float | None]  # limit name -> measured ms
    broken: tuple[str, ...]  # limits over, in words
    failure: str | None  # a failure other than latency (errors, zero tokens, the gate, ...)

    @property
    def why(self) -> str:
        if self.failure:
            return self.failure
        return "; ".join(self.broken) if self.broken else "meets every limit"

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "passed": self.passed,
                "values_ms": self.values, "broken": list(self.broken),
                "failure": self.failure}


def judge(point: dict[str, Any], limits: list[Limit], failure: str | None = None) -> Verdict:
    """`point`: a result (launcher.run.results.load_result, or the same fields of another
    benchmark kind); `failure`: why it failed outside its file (the client's exit, the
    accuracy gate), if it did. A point that failed in any way, or lacks a value, fails."""
    c = point.get("max_concurrency")
    conc = int(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else 0
    why = failure or (point.get("failure_reason") or "failed"
                      if point.get("status") not in (None, "ok") else None)
    if why is None and not point.get("total_output_tokens"):
        why = "zero output tokens generated"
    values: dict[str, float | None] = {}
    broken = []
    for lim in limits:
        v = measured(point, lim)
        values[lim.name] = None if v is None else round(v, 3)
        if v is None:
            broken.append(f"{lim.name} is not in the result")
        elif not lim.holds(v):
            broken.append(f"{lim.name} {_ms(v)} over {lim.text}")
    return Verdict(conc, why is None and not broken, values, tuple(broken), why)


def _ms(v: float) -> str:
    return f"{v / 1000:.3g} s" if v >= 1000 else f"{v:.3g} ms"


# --- the search ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bracket:
    """What the points measured so far say: the largest passing concurrency below the
    smallest failing one (None: none of either yet)."""

    passing: int | None
    failing: int | None


def bracket(tried: dict[int, bool]) -> Bracket:
    fails = [c for c, ok in tried.items() if not ok]
    hi = min(fails) if fails else None
    passes = [c for c, ok in tried.items() if ok and (hi is None or c < hi)]
    return Bracket(max(passes) if passes else None, hi)


def step(passing: int | None, precision: float) -> int:
    """How close the first failing concurrency must come to the last passing one: within
    `precision` of it (a fraction), and never closer than 1."""
    return max(1, math.ceil(precision * (passing or 0)))


def next_concurrency(tried: dict[int, bool], first: int, top: int,
                     precision: float = DEFAULT_PRECISION) -> int | None:
    """The next concurrency to measure, or None when the search is done.

    Up from `first`, doubling, to `top`, until a point fails; then halving the interval
    between the last passing point and the first failing one until they are within
    `precision` (a fraction of the passing concurrency, at least 1 apart). A first point
    that fails is bisected down towards 1 the same way. `tried`: concurrency -> passed."""
    if not tried:
        return first
    b = bracket(tried)
    if b.failing is None:
        lo = b.passing or first
        return None if lo >= top else min(2 * lo, top)
    lo = b.passing or 0
    if b.failing - lo <= step(lo, precision):
        return None
    mid = (lo + b.failing) // 2
    return None if mid in tried else mid


def ladder(first: int, top: int) -> list[int]:
    """The probe points before any fails: `first`, doubling, to `top` (the plan's points)."""
    out = [first]
    while out[-1] < top:
        out.append(min(2 * out[-1], top))
    return out


def outcome(tried: dict[int, bool], top: int, precision: float) -> str:
    """The search's result in one sentence."""
    b = bracket(tried)
    if b.passing is None:
        return (f"no concurrency met every limit (down to {b.failing})" if b.failing
                else "nothing was measured")
    if b.failing is None:
        return (f"{b.passing} meets every limit, the top of the search (slo.max_concurrency "
                f"{top}: raise it to search higher)" if b.passing >= top else
                f"{b.passing} meets every limit; the search ended before a point failed")
    return (f"{b.passing} is the largest concurrency that meets every limit ({b.failing} "
            f"fails; within {max(1, math.ceil(precision * b.passing))}, the precision "
            f"{precision:g})")
