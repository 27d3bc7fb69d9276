"""Bottleneck verdicts per sweep point, with the numbers that triggered them.

Pure: takes the rows of `derive.point_table` (dicts) and returns verdicts. No Streamlit, no
I/O, so the rules are unit-tested on synthetic runs. The rules follow the decision table
in docs/figures.md (TTFT bottleneck decision table); every threshold is in `Thresholds` and printed in the
evidence so a reader can disagree with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class VerdictKind(StrEnum):
    HEALTHY = "healthy"
    FAILED = "failed"
    UNKNOWN = "unknown"
    PREFILL = "prefill-bound"
    KV_CAPACITY = "decode-kv-capacity"
    KV_TRANSFER = "kv-transfer"
    DECODE_COMPUTE = "decode-compute"
    CLIENT = "client-router"
    IMBALANCE = "dp-imbalance"
    KV_CLIFF = "kv-capacity-cliff"


# the kinds by their short names, as the rules below use them
(HEALTHY, FAILED, UNKNOWN, PREFILL, KV_CAPACITY, KV_TRANSFER, DECODE_COMPUTE, CLIENT,
 IMBALANCE, KV_CLIFF) = VerdictKind

# kind -> (short label, what to do); the title is "label: advice"
_WORDS = {
    HEALTHY: ("healthy", ""),
    FAILED: ("failed point", ""),
    UNKNOWN: ("no engine telemetry", ""),
    PREFILL: ("prefill-bound", "add prefill endpoints"),
    KV_CAPACITY: ("decode KV capacity", "add decode GPUs or lower concurrency"),
    KV_TRANSFER: ("KV transfer", "check the NIXL/UCX path (NVLink/IB), descriptor counts"),
    DECODE_COMPUTE: ("decode compute",
                     "decode batch-bound (a trade-off; read it on the Pareto)"),
    CLIENT: ("client/router", "time is spent outside the engines"),
    IMBALANCE: ("DP imbalance", "one decode engine is much fuller than the rest (routing)"),
    KV_CLIFF: ("KV capacity cliff",
               "the sessions' prefixes do not fit the KV: fewer live sessions or more KV"),
}
LABELS = {k: label for k, (label, _) in _WORDS.items()}
TITLES = {k: f"{label}: {advice}" if advice else label for k, (label, advice) in _WORDS.items()}


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the verdicts and of the P:D recommendation (launcher.analysis.
    recommend), in one table (docs/figures.md, docs/recommend.md)."""

    kv_full: float = 0.90            # decode KV usage (fraction) that counts as full
    waiting_capacity: float = 1.0    # mean requests waiting for KV room on decode
    share: float = 0.25              # a TTFT part this large a share of client TTFT matters
    min_part_s: float = 0.10         # ... and at least this long (s): ignore tiny TTFTs
    queue_vs_compute: float = 0.5    # prefill queue >= this fraction of the prefill compute
    min_queue_s: float = 0.02        # recommend: a prefill queue at least this long (s)
    prefill_kv_full: float = 0.90    # recommend: prefill KV full of un-pulled blocks
    plateau_gain: float = 0.10       # recommend: prompt tok/s grew less than this while
                                     # concurrency grew >= 1.5x
    trim: float = 0.2                # recommend: steady part of a window (drop this share
                                     # at each end: ramp, drain)
    top_margin: float = 1.5          # recommend: the next sweep goes this far past the knee
    remainder_share: float = 0.50    # unexplained share of TTFT that points at client/router
    min_remainder_s: float = 0.20
    tpot_growth: float = 1.5         # TPOT vs the run's best point: decode slowed by batching
    imbalance_gap: float = 0.35      # hottest decode engine's KV minus the mean KV (fraction)
    failed_share: float = 0.01       # failed requests / all requests at a point
    hit_gap: float = 0.10            # agentic: prefix hit rate achieved this far (fraction)
                                     # below the trace's theoretical one
    store_full_used: float = 0.99    # KV store: master capacity used (fraction) that is full
                                     # (it evicts at its watermark; past it, eviction lags)
    store_slower: float = 1.0        # KV store/offload: load time per hit token this many
                                     # times the prefill time per computed token is slower


@dataclass
class Verdict:
    point: str
    concurrency: float
    kind: VerdictKind
    title: str
    evidence: list[str] = field(default_factory=list)
    also: list[str] = field(default_factory=list)   # other rules that fired, weaker

    @property
    def label(self) -> str:
        """The verdict's short name (its title without the advice)."""
        return LABELS.get(self.kind, self.title)


def _f(row: dict, key: str) -> float:
    v = row.get(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return float("nan")


def _ok(x: float) -> bool:
    return not math.isnan(x)


def _s(x: float) -> str:
    return f"{x * 1000:.0f} ms" if abs(x) < 10 else f"{x:.1f} s"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def diagnose(rows: Iterable[dict[str, Any]], th: Thresholds | None = None) -> list[Verdict]:
    th = th or Thresholds()
    rows = list(rows)
    tpots = [_f(r, "tpot_mean_s") for r in rows if r.get("status") == "ok"]
    tpots = [t for t in tpots if _ok(t) and t > 0]
    tpot_ref = min(tpots) if tpots else float("nan")
    return [diagnose_point(r, th, tpot_ref) for r in rows]


def diagnose_point(row: dict[str, Any], th: Thresholds, tpot_ref: float) -> Verdict:
    point, conc = str(row.get("point", "?")), _f(row, "concurrency")
    if row.get("status") != "ok":
        reason = row.get("failure_reason") or "the bench client reported no completed requests"
        return Verdict(point, conc, FAILED, TITLES[FAILED], [f"status {row.get('status')}: "
                                                             f"{reason}"])
    ttft = _f(row, "ttft_mean_s")
    pq, pc = _f(row, "prefill_queue_s"), _f(row, "prefill_compute_s")
    kvt, da = _f(row, "kv_transfer_s"), _f(row, "decode_admission_s")
    rem = _f(row, "remainder_s")
    kv_max, wcap = _f(row, "decode_kv_max"), _f(row, "decode_waiting_capacity")
    pre, wdef = _f(row, "preemptions"), _f(row, "decode_waiting_deferred")
    fails, tpot = _f(row, "nixl_failed"), _f(row, "tpot_mean_s")
    completed, failed = _f(row, "completed"), _f(row, "failed")

    def share(x: float) -> float:
        return x / ttft if _ok(x) and _ok(ttft) and ttft > 0 else float("nan")

    def big(x: float) -> bool:
        return _ok(x) and x >= th.min_part_s and share(x) >= th.share

    found: list[tuple[float, str, list[str]]] = []  # (strength, kind, evidence)
    base = f"client TTFT mean {_s(ttft)}" if _ok(ttft) else "client TTFT unknown"

    # Decode KV capacity: full cache plus requests held back for room (or preempted).
    if _ok(kv_max) and kv_max >= th.kv_full and (
            (_ok(pre) and pre > 0) or (_ok(wcap) and wcap >= th.waiting_capacity)):
        ev = [f"decode KV usage max {_pct(kv_max)} (≥ {_pct(th.kv_full)})"]
        if _ok(wcap):
            ev.append(f"requests waiting for capacity on decode: {wcap:.1f} mean "
                      f"(≥ {th.waiting_capacity:g} counts)")
        if _ok(pre):
            ev.append(f"decode preemptions in the window: {pre:.0f}")
        if _ok(da):
            ev.append(f"decode admission {_s(da)} = {_pct(share(da))} of {base}")
        if _ok(tpot) and _ok(tpot_ref):
            ev.append(f"TPOT mean {_s(tpot)} vs best point {_s(tpot_ref)}")
        # Preemptions hurt TTFT and TPOT at once: rank above any single TTFT share.
        strength = 1.0 + (share(da) if _ok(share(da)) else 0.0)
        found.append((strength, KV_CAPACITY, ev))

    # Agentic KV capacity cliff: returning sessions find their prefix evicted (hits fall
    # below what the trace offers) while the KV that holds the prefixes is full.
    hit, offered = _f(row, "hit_achieved"), _f(row, "hit_theoretical")
    held = _f(row, "prefix_kv_max")
    if _ok(hit) and _ok(offered) and _ok(held) and offered - hit > th.hit_gap and \
            held >= th.kv_full:
        found.append((1.5, KV_CLIFF, [
            f"GPU prefix-cache hit rate {_pct(hit)} achieved vs {_pct(offered)} the trace offers "
            f"(gap > {_pct(th.hit_gap)})",
            f"KV usage max {_pct(held)} on the engines holding the prefixes "
            f"(≥ {_pct(th.kv_full)})"] + ([
            f"a KV store or CPU offload served another {_pct(_f(row, 'hit_tiers'))} of the "
            "prompt tokens, not computed again (the KV tiers page)"]
            if _ok(_f(row, "hit_tiers")) and _f(row, "hit_tiers") > 0 else [])))

    if big(pq) and (not _ok(pc) or pq >= th.queue_vs_compute * pc):
        ev = [f"prefill queue {_s(pq)} = {_pct(share(pq))} of {base} "
              f"(≥ {_pct(th.share)} and ≥ {_s(th.min_part_s)})"]
        if _ok(pc):
            ev.append(f"prefill compute {_s(pc)} per request")
        pw = _f(row, "prefill_waiting")
        if _ok(pw):
            ev.append(f"requests waiting on prefill endpoints: {pw:.1f} mean")
        found.append((share(pq), PREFILL, ev))

    kv_reason = big(kvt) or (_ok(fails) and fails > 0)
    if kv_reason:
        ev = []
        if _ok(kvt):
            ev.append(f"NIXL transfer mean {_s(kvt)} = {_pct(share(kvt))} of {base}")
        p99 = _f(row, "kv_transfer_p99_s")
        if _ok(p99):
            ev.append(f"NIXL transfer p99 {_s(p99)}")
        if _ok(wdef):
            ev.append(f"requests deferred on decode (waiting for KV): {wdef:.1f} mean")
        if _ok(fails) and fails > 0:
            ev.append(f"failed NIXL transfers in the window: {fails:.0f}")
        strength = share(kvt) if _ok(share(kvt)) else 0.5
        found.append((strength, KV_TRANSFER, ev))

    parts_known = any(_ok(x) for x in (pq, pc, kvt, da))
    if parts_known and _ok(rem) and rem >= th.min_remainder_s and share(rem) >= \
            th.remainder_share:
        found.append((share(rem), CLIENT, [
            f"{_s(rem)} = {_pct(share(rem))} of {base} is not explained by prefill queue, "
            f"prefill compute, KV transfer or decode admission (≥ {_pct(th.remainder_share)})"]))
    if _ok(failed) and _ok(completed) and completed + failed > 0 and \
            failed / (completed + failed) >= th.failed_share:
        found.append((0.9, CLIENT, [f"{failed:.0f} of {completed + failed:.0f} requests failed "
                                    f"(≥ {_pct(th.failed_share)})"]))

    if _ok(tpot) and _ok(tpot_ref) and tpot >= th.tpot_growth * tpot_ref and \
            not (_ok(kv_max) and kv_max >= th.kv_full) and not (_ok(pre) and pre > 0):
        ev = [f"TPOT mean {_s(tpot)} = {tpot / tpot_ref:.1f}× the run's best {_s(tpot_ref)} "
              f"(≥ {th.tpot_growth:g}×)"]
        if _ok(kv_max):
            ev.append(f"decode KV usage max {_pct(kv_max)} (< {_pct(th.kv_full)}), "
                      f"no preemptions")
        dr = _f(row, "decode_running")
        if _ok(dr):
            ev.append(f"requests running on decode: {dr:.0f} mean")
        found.append((0.1, DECODE_COMPUTE, ev))

    kv_mean = _f(row, "decode_kv_mean")
    if _ok(kv_max) and _ok(kv_mean) and kv_max - kv_mean >= th.imbalance_gap:
        found.append((0.15, IMBALANCE, [
            f"decode KV usage: hottest engine {_pct(kv_max)} vs mean {_pct(kv_mean)} "
            f"(gap ≥ {_pct(th.imbalance_gap)})"]))

    if not found:
        if not parts_known and not _ok(kv_max):
            return Verdict(point, conc, UNKNOWN, TITLES[UNKNOWN],
                           ["no vLLM metrics in this point's window; only client figures"])
        ev = [base]
        for name, x in (("prefill queue", pq), ("prefill compute", pc), ("KV transfer", kvt),
                        ("decode admission", da)):
            if _ok(x):
                ev.append(f"{name} {_s(x)}")
        if _ok(kv_max):
            ev.append(f"decode KV usage max {_pct(kv_max)}")
        return Verdict(point, conc, HEALTHY, TITLES[HEALTHY], ev)

    found.sort(key=lambda f: f[0], reverse=True)
    _, kind, ev = found[0]
    also = [TITLES[k] for _, k, _ in found[1:] if k != kind]
    return Verdict(point, conc, kind, TITLES[kind], ev, also)
