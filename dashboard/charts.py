"""Chart builders: tidy DataFrame -> altair chart. Pure (no Streamlit), so they are testable
and the pages stay short. Every chart has a title and axis titles with units.

Time axes go through a `Clock`: wall-clock time in this host's local zone (the zone of the
run's events, the dashboard's tables and, on the cluster, of vLLM's log lines), with one tick
format per chart chosen from the span it shows, or seconds since the job started.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

ROLE_COLORS = alt.Scale(domain=["prefill", "decode", "agg", "router", "other", "free"],
                        range=["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d9d9d",
                               "#e8e8e8"])
PART_COLORS = alt.Scale(
    domain=["Prefill queue", "Prefill compute", "KV transfer (NIXL)", "Decode admission",
            "Remainder (router, first decode step, client)"],
    range=["#e45756", "#4c78a8", "#f58518", "#b279a2", "#bab0ac"])

# --- time ----------------------------------------------------------------------------------

# Tick steps a person counts in (seconds): whole seconds, minutes, hours, days.
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
                43200, 86400, 172800, 604800)
MAX_TICKS = 8
WALL = "wall clock"
ELAPSED = "seconds since job start"


def tick_step(span_s: float, max_ticks: int = MAX_TICKS) -> int:
    """The smallest round step (s) that puts at most `max_ticks` ticks on `span_s`."""
    span = max(float(span_s) if math.isfinite(span_s) else 1.0, 1.0)
    for s in TICK_STEPS_S:
        if span / s <= max_ticks:
            return s
    return int(math.ceil(span / max_ticks / 86400.0)) * 86400


def time_format(step_s: int, span_s: float) -> str:
    """d3 time format for ticks `step_s` apart on a `span_s` axis: never a fraction of a
    second, and every label on one axis distinct."""
    if step_s < 60:
        return "%H:%M:%S"
    if step_s < 86400:
        return "%H:%M" if span_s < 86400 else "%b %d %H:%M"
    return "%b %d"


def unix_seconds(values) -> np.ndarray:
    """Unix seconds from datetimes (naive = UTC) or numbers already in seconds."""
    s = pd.Series(values)
    if pd.api.types.is_datetime64_any_dtype(s):
        epoch = pd.Timestamp(0, tz="UTC") if s.dt.tz is not None else pd.Timestamp(0)
        return ((s - epoch) / pd.Timedelta(seconds=1)).to_numpy(dtype="float64")
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype="float64")


def local_offset_s(unix: np.ndarray) -> np.ndarray:
    """This host's UTC offset (s) at each time (time.localtime: the zone fmt_time uses)."""
    unix = np.asarray(unix, dtype="float64")
    ok = np.isfinite(unix)
    if not ok.any():
        return np.zeros(len(unix))
    lo, hi = np.min(unix[ok]), np.max(unix[ok])
    a, b = time.localtime(lo).tm_gmtoff, time.localtime(hi).tm_gmtoff
    if a == b:  # no daylight-saving change inside the range: one offset
        return np.full(len(unix), float(a))
    return np.array([time.localtime(t).tm_gmtoff if f else 0 for t, f in zip(unix, ok,
                                                                               strict=True)],
                    dtype="float64")


def zone_name(ts: float | None = None) -> str:
    t = time.localtime(ts if ts is not None else time.time())
    off = t.tm_gmtoff
    name = t.tm_zone or ""
    sign = "+" if off >= 0 else "-"
    hh, mm = divmod(abs(off) // 60, 60)
    utc = "UTC" if off == 0 else f"UTC{sign}{hh:02d}:{mm:02d}"
    return utc if name in ("", "UTC", "GMT") else f"{name}, {utc}"


@dataclass(frozen=True)
class Clock:
    """How time is drawn. Without `origin`: wall-clock time of this host's zone, drawn on a
    UTC scale so the browser's own zone cannot shift it away from the logs. With `origin`
    (unix s of the job's start): seconds since then."""

    origin: float | None = None

    @property
    def elapsed(self) -> bool:
        return self.origin is not None

    def draw(self, unix: np.ndarray) -> np.ndarray:
        unix = np.asarray(unix, dtype="float64")
        if self.elapsed:
            return unix - float(self.origin)
        return (unix + local_offset_s(unix)) * 1000.0  # ms of the local wall clock, as UTC

    def text(self, unix: np.ndarray) -> list[str]:
        """Tooltip text: the wall-clock time as the logs print it, or +seconds."""
        out = []
        for t in np.asarray(unix, dtype="float64"):
            if not math.isfinite(t):
                out.append("")
            elif self.elapsed:
                out.append(f"+{t - float(self.origin):,.0f} s")
            else:
                out.append(time.strftime("%H:%M:%S", time.localtime(t)))
        return out

    def title(self, unix: np.ndarray | None = None) -> str:
        if self.elapsed:
            return "seconds since job start"
        ok = None if unix is None else np.asarray(unix, dtype="float64")
        ref = float(np.nanmin(ok)) if ok is not None and np.isfinite(ok).any() else None
        return f"time ({zone_name(ref)})"

    def x(self, field: str, span_s: float, title: str, lo: float | None = None) -> alt.X:
        """The x encoding of a time field drawn by `draw`: ticks at multiples of
        `tick_step(span_s)` from `lo` (the lowest drawn value), listed explicitly (Vega's
        own time ticks go down to half seconds, and interval tick counts do not render in
        Streamlit's Vega)."""
        step = tick_step(span_s)
        values = None
        if lo is not None and math.isfinite(lo):
            unit = 1.0 if self.elapsed else 1000.0
            first = math.ceil(lo / (step * unit)) * step * unit
            last = lo + span_s * unit + 1e-6
            values = [v for k in range(int(span_s // step) + 2)
                      if (v := first + k * step * unit) <= last]
        if values and not self.elapsed:  # Vega-Lite takes temporal tick values as DateTimes
            values = [_utc_datetime(v) for v in values]
        extra = {"values": values} if values else {}
        if self.elapsed:
            axis = alt.Axis(title=title, format=",d", tickMinStep=1, labelAngle=0, **extra)
            return alt.X(f"{field}:Q", axis=axis, scale=alt.Scale(zero=False, nice=False))
        axis = alt.Axis(title=title, format=time_format(step, span_s), labelAngle=0,
                        labelOverlap=True, **extra)
        return alt.X(f"{field}:T", axis=axis, scale=alt.Scale(type="utc"))


WALL_CLOCK = Clock()


def _utc_datetime(ms: float) -> dict:
    """A Vega-Lite DateTime for a drawn wall-clock value (ms, local time written as UTC)."""
    t = time.gmtime(ms / 1000.0)
    return {"year": t.tm_year, "month": t.tm_mon, "date": t.tm_mday, "hours": t.tm_hour,
            "minutes": t.tm_min, "seconds": t.tm_sec, "utc": True}


class _Timed:
    """A frame's time columns converted for drawing, with the span they cover."""

    def __init__(self, clock: Clock, *frames: tuple[pd.DataFrame | None, tuple[str, ...]]):
        self.clock = clock
        self.frames: list[pd.DataFrame | None] = []
        spans = []
        for df, cols in frames:
            if df is None:
                self.frames.append(None)
                continue
            d = df.copy()
            for k, c in enumerate(cols):
                if c in d.columns:
                    u = unix_seconds(d[c])
                    spans.append(u)
                    if k == 0:
                        d["when"] = clock.text(u)
                    d[c] = clock.draw(u)
            self.frames.append(d)
        allu = np.concatenate(spans) if spans else np.empty(0)
        allu = allu[np.isfinite(allu)]
        self.lo_drawn = float(np.nanmin(clock.draw(allu))) if len(allu) else float("nan")
        self.span = float(allu.max() - allu.min()) if len(allu) else 1.0
        self.unix = allu

    def x(self, field: str) -> alt.X:
        return self.clock.x(field, self.span, self.clock.title(self.unix), lo=self.lo_drawn)

    def tooltip(self) -> alt.Tooltip:
        return alt.Tooltip("when:N", title="time")


def windows_layer(tm: _Timed, k: int = 1) -> alt.LayerChart | None:
    """Shaded sweep-point windows (so warmup and gaps are visible on every time axis): the
    `k`-th frame of `tm` (columns label, start, end)."""
    w = tm.frames[k] if len(tm.frames) > k else None
    if w is None or w.empty:
        return None
    base = alt.Chart(w)
    x = tm.x("start")  # same axis as the data layer: one axis, one title
    rect = base.mark_rect(opacity=0.08, color="#4c78a8").encode(x=x, x2="end")
    text = base.mark_text(align="left", dx=3, dy=-2, baseline="top", fontSize=10,
                          color="#555").encode(x=x, y=alt.value(2), text="label:N")
    return rect + text


def with_windows(chart: alt.Chart, tm: _Timed) -> alt.Chart | alt.LayerChart:
    layer = windows_layer(tm)
    return layer + chart if layer is not None else chart


def legend_columns(labels: pd.Series, width_px: int = 360, most: int = 4) -> int:
    """As many legend columns as fit a half-page chart at the narrowest page (402 px at
    1280 px, less the axis's room; ~7 px a character, 30 px of symbol and gap): long labels
    wrap into fewer columns instead of widening the chart past its column."""
    longest = max((len(str(x)) for x in labels.dropna().unique()), default=8)
    return max(1, min(most, width_px // (longest * 7 + 30)))


def line(df: pd.DataFrame, *, title: str, y_title: str, color: str = "group",
         color_title: str = "", y_format: str | None = None, height: int = 180,
         windows: pd.DataFrame | None = None, stacked: bool = False,
         clock: Clock = WALL_CLOCK) -> alt.Chart:
    tm = _Timed(clock, (df, ("t",)), (windows, ("start", "end")))
    d = tm.frames[0]
    axis = alt.Axis(title=y_title, format=y_format) if y_format else alt.Axis(title=y_title)
    mark = alt.Chart(d).mark_area(opacity=0.8) if stacked else alt.Chart(d).mark_line(
        interpolate="monotone", strokeWidth=1.5)
    ch = mark.encode(
        x=tm.x("t"),
        y=alt.Y("value:Q", axis=axis, stack="zero" if stacked else None),
        color=alt.Color(f"{color}:N", title=color_title or None,
                        legend=alt.Legend(orient="bottom", columns=legend_columns(d[color]),
                                          labelLimit=360)),
        tooltip=[tm.tooltip(), f"{color}:N", alt.Tooltip("value:Q", format=",.3~f")],
    )
    return with_windows(ch, tm).properties(title=title, height=height)


def spread(df: pd.DataFrame, *, title: str, y_title: str, y_format: str = ".0%",
           windows: pd.DataFrame | None = None, height: int = 200,
           color_title: str = "endpoint", clock: Clock = WALL_CLOCK) -> alt.Chart:
    """min..max band plus mean line per group (df columns group, t, min, mean, max)."""
    tm = _Timed(clock, (df, ("t",)), (windows, ("start", "end")))
    base = alt.Chart(tm.frames[0])
    x = tm.x("t")
    band = base.mark_area(opacity=0.25).encode(
        x=x, y=alt.Y("min:Q", axis=alt.Axis(title=y_title, format=y_format),
                     scale=alt.Scale(domain=[0, 1])),
        y2="max:Q", color=alt.Color("group:N", title=color_title,
                                    legend=alt.Legend(orient="bottom", columns=6,
                                                      labelLimit=360)))
    mean = base.mark_line(strokeWidth=1.5).encode(
        x=x, y="mean:Q", color="group:N",
        tooltip=[tm.tooltip(), "group:N",
                 alt.Tooltip("min:Q", format=".1%"), alt.Tooltip("mean:Q", format=".1%"),
                 alt.Tooltip("max:Q", format=".1%")])
    full = alt.Chart(pd.DataFrame({"y": [0.9]})).mark_rule(
        color="#e45756", strokeDash=[4, 3]).encode(y=alt.datum(0.9))
    return with_windows(band + mean + full, tm).properties(title=title, height=height)


def heatmap(df: pd.DataFrame, *, title: str, y: str, color_title: str,
            color_format: str = ".0%", domain: tuple[float, float] | None = (0.0, 1.0),
            bin_s: float = 60.0, height: int | None = None,
            clock: Clock = WALL_CLOCK) -> alt.Chart:
    """Series × time heatmap (one row per engine/GPU): shows hot spots across many series."""
    n_rows = df[y].nunique() if not df.empty else 1
    scale = alt.Scale(scheme="turbo", domain=list(domain)) if domain else alt.Scale(
        scheme="turbo")
    d = df.assign(t2=unix_seconds(df["t"]) + bin_s)
    tm = _Timed(clock, (d, ("t", "t2")))
    return alt.Chart(tm.frames[0]).mark_rect().encode(
        x=tm.x("t"), x2="t2",
        y=alt.Y(f"{y}:N", title=None, sort=None,
                axis=alt.Axis(labelFontSize=9 if n_rows > 24 else 11, labelLimit=220,
                              # rows of 18 px hold an 11 px label: name every row
                              labelOverlap=n_rows > 24)),
        color=alt.Color("value:Q", title=color_title, scale=scale,
                        legend=alt.Legend(format=color_format)),
        tooltip=[tm.tooltip(), f"{y}:N", alt.Tooltip("value:Q", format=color_format)],
    ).properties(title=title, height=height or alt.Step(10 if n_rows > 24 else 18))


def timeline(df: pd.DataFrame, clock: Clock = WALL_CLOCK) -> alt.Chart:
    """Stage gantt (df: stage, start, end as datetimes or unix s, seconds)."""
    tm = _Timed(clock, (df, ("start", "end")))
    d = tm.frames[0]
    d["until"] = clock.text(unix_seconds(df["end"]))
    return alt.Chart(d).mark_bar(height=16).encode(
        x=tm.x("start"), x2="end",
        y=alt.Y("stage:N", sort=None, title=None),
        color=alt.Color("stage:N", legend=None),
        tooltip=["stage:N", alt.Tooltip("when:N", title="start"),
                 alt.Tooltip("until:N", title="end"),
                 alt.Tooltip("seconds:Q", format=",.0f", title="seconds")],
    ).properties(title="Stage timeline", height=alt.Step(24))


# --- other charts --------------------------------------------------------------------------


def topology(df: pd.DataFrame) -> alt.Chart:
    """Nodes (rows) × GPU index (columns), coloured by role, labelled with endpoint/ranks."""
    n_nodes = df["node"].nunique() if not df.empty else 1
    base = alt.Chart(df).encode(
        x=alt.X("gpu:O", title="GPU index", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("node:N", title=None, sort=None))
    # Only the roles present: a legend longer than the chart is clipped by Streamlit.
    roles = [r for r in ROLE_COLORS.domain if r in set(df.get("role", []))]
    colors = [c for r, c in zip(ROLE_COLORS.domain, ROLE_COLORS.range, strict=True)
              if r in roles]
    rect = base.mark_rect(stroke="white", strokeWidth=2).encode(
        color=alt.Color("role:N", scale=alt.Scale(domain=roles, range=colors), title="role",
                        legend=alt.Legend(orient="bottom")),
        tooltip=["node:N", "gpu:O", "endpoint:N", "process:N", "ranks:N", "role:N"])
    text = base.mark_text(fontSize=10, color="white").encode(text="short:N")
    # a step per row: the bands keep their height however many nodes there are
    return (rect + text).properties(title="Topology: nodes → GPUs → endpoints",
                                    height=alt.Step(26 if n_nodes <= 18 else 14))


def _fine_axis(values: pd.Series, ticks: int = 5) -> alt.Axis:
    """An axis whose labels have the decimals its tick step needs: points 82.80 to 82.84
    apart take ticks 0.01 apart, which 4 significant digits would show as 82.8 twice. One
    value alone: 4 significant digits (the tick is the value itself, 82.043590
    unformatted)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    span = float(v.max() - v.min()) if len(v) else 0.0
    if not (span > 0 and math.isfinite(span)):
        return alt.Axis(format=",.4~r")
    # Vega's ticks are 1, 2 or 5 x 10^k, at least 10^floor(log10(span / count)) apart
    decimals = max(0, -math.floor(math.log10(span / ticks)))
    return alt.Axis(format=f",.{decimals}~f", tickCount=ticks)


def pareto(df: pd.DataFrame, frontier: pd.DataFrame, *, y: str, y_title: str,
           color: str = "run", color_title: str = "run", curves: bool = False,
           title: str | None = None, height: int = 360,
           reference: pd.DataFrame | None = None) -> alt.LayerChart:
    """Throughput per GPU vs tokens/s per user, points labelled by concurrency.

    `curves`: one line per `color` through its points in concurrency order (a study's
    configurations). `frontier` with a `color` column: a dashed frontier per colour; without
    it, one black dashed frontier over everything (the study's envelope). `reference`: the
    published Pareto (`color`, tokens_per_s_per_user, `y`, concurrency, point, published),
    drawn as dotted curves with hollow diamonds in the colour of the configuration it
    belongs to."""
    x = alt.X("tokens_per_s_per_user:Q", title="tok/s per user (1000 ÷ median TPOT ms)",
              scale=alt.Scale(zero=False), axis=_fine_axis(df["tokens_per_s_per_user"]))
    # A study's few configurations: distinct hues, one name a line beside the plot.
    side = "right" if curves else "bottom"
    col = alt.Color(f"{color}:N", title=color_title,
                    scale=alt.Scale(scheme="tableau10") if curves else alt.Undefined,
                    legend=alt.Legend(orient=side, columns=1, labelLimit=480))
    base = alt.Chart(df).encode(x=x, y=alt.Y(f"{y}:Q", title=y_title), color=col)
    tips = [f"{color}:N", "point:N", alt.Tooltip(f"{y}:Q", format=",.0f", title=y_title),
            alt.Tooltip("tokens_per_s_per_user:Q", format=",.1f", title="tok/s per user"),
            alt.Tooltip("ttft_p99_s:Q", format=".3f", title="TTFT p99 (s)"), "verdict:N"]
    pts = base.mark_point(filled=True, size=80).encode(
        shape=alt.Shape("verdict:N", title="verdict",
                        legend=alt.Legend(orient=side, columns=1 if curves else 2,
                                          labelLimit=480)),
        tooltip=tips)
    labels = base.mark_text(dx=8, dy=-8, fontSize=10).encode(text="point:N")
    layers = []
    if curves:
        layers.append(base.mark_line(strokeWidth=2, opacity=0.75).encode(
            order=alt.Order("concurrency:Q")))
    if frontier is not None and not frontier.empty:
        fbase = alt.Chart(frontier).encode(x="tokens_per_s_per_user:Q", y=f"{y}:Q")
        if color in frontier.columns:
            layers.append(fbase.mark_line(strokeDash=[5, 3], strokeWidth=1.5).encode(
                color=f"{color}:N"))
        else:
            layers.append(fbase.mark_line(strokeDash=[6, 4], strokeWidth=1.5,
                                          color="#333333", stroke="#333333"))
    if reference is not None and not reference.empty:
        rbase = alt.Chart(reference).encode(x="tokens_per_s_per_user:Q", y=f"{y}:Q",
                                            color=alt.Color(f"{color}:N"))
        layers.append(rbase.mark_line(strokeDash=[2, 3], strokeWidth=2, opacity=0.9).encode(
            order=alt.Order("concurrency:Q")))
        layers.append(rbase.mark_point(shape="diamond", filled=False, size=90,
                                       strokeWidth=2).encode(
            tooltip=[alt.Tooltip("published:N", title="published (read off Figure 1)"),
                     "point:N",
                     alt.Tooltip(f"{y}:Q", format=",.0f", title="published tok/s/GPU ±300"),
                     alt.Tooltip("tokens_per_s_per_user:Q", format=",.1f",
                                 title="tok/s per user")]))
    what = ("dashed: Pareto frontier over every configuration" if curves else
            "dashed: Pareto frontier per run")
    return alt.layer(*layers, pts, labels).properties(
        title=title or f"{y_title} vs tok/s per user ({what})", height=height)


def latency_vs_concurrency(df: pd.DataFrame, *, metric: str, title: str,
                           color: str = "run", legend_right: bool = False,
                           color_title: str | None = None) -> alt.Chart:
    """df: `color`, concurrency, stat (p50/p90/p99), value (ms). Ticks at the sweep's own
    concurrencies (log 2 scale)."""
    ticks = sorted({float(c) for c in df["concurrency"].dropna()}) if not df.empty else []
    scheme = alt.Scale(scheme="tableau10") if legend_right else alt.Undefined
    return alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("concurrency:Q", title="max concurrency",
                scale=alt.Scale(type="log", base=2),
                axis=alt.Axis(values=ticks, format=",d") if ticks else alt.Undefined),
        y=alt.Y("value:Q", title=f"{metric} (ms)", scale=alt.Scale(type="log")),
        color=alt.Color(f"{color}:N", scale=scheme, title=color_title or color,
                        legend=alt.Legend(orient="right" if legend_right else "bottom",
                                          columns=1, labelLimit=480)),
        strokeDash=alt.StrokeDash("stat:N", title="percentile"),
        shape=alt.Shape("stat:N", title="percentile"),  # a legend symbol per percentile
        tooltip=[f"{color}:N", "concurrency:Q", "stat:N",
                 alt.Tooltip("value:Q", format=",.1f")],
    ).properties(title=title, height=260)


def ttft_breakdown(parts: pd.DataFrame, client: pd.DataFrame) -> alt.Chart:
    """Stacked horizontal bars per point (ms, as the table beside it) plus a tick at the
    client mean TTFT. `parts`: point, part, ms, order, share; `client`: point, ttft_mean_ms."""
    bars = alt.Chart(parts).mark_bar().encode(
        y=alt.Y("point:N", sort=None, title="sweep point"),
        x=alt.X("ms:Q", title="mean ms per request", stack="zero"),
        color=alt.Color("part:N", scale=PART_COLORS, title="TTFT part",
                        legend=alt.Legend(orient="bottom", columns=3, labelLimit=360)),
        order=alt.Order("order:Q"),
        tooltip=["point:N", "part:N", alt.Tooltip("ms:Q", format=",.0f", title="ms"),
                 alt.Tooltip("share:Q", format=".0%", title="share of client TTFT")])
    tick = alt.Chart(client).mark_tick(color="black", thickness=2, size=22).encode(
        y=alt.Y("point:N", sort=None), x="ttft_mean_ms:Q",
        tooltip=["point:N", alt.Tooltip("ttft_mean_ms:Q", format=",.0f",
                                        title="client mean TTFT (ms)")])
    return (bars + tick).properties(
        title="Client TTFT split per sweep point (black tick: client mean TTFT)",
        height=alt.Step(32))


def capacity_bars(df: pd.DataFrame) -> alt.Chart:
    """Predicted vs observed concurrent requests per endpoint (df: endpoint, source, value)."""
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("endpoint:N", title=None),
        yOffset=alt.YOffset("source:N"),
        x=alt.X("value:Q", title="concurrent requests the KV cache holds"),
        color=alt.Color("source:N", title=None, legend=alt.Legend(orient="bottom",
                                                                  labelLimit=480)),
        tooltip=["endpoint:N", "source:N", alt.Tooltip("value:Q", format=",.0f")],
    ).properties(title="KV capacity: predicted (plan.json) vs observed (top sweep point)",
                 height=alt.Step(16))


def hit_rate_vs_sessions(df: pd.DataFrame) -> alt.Chart:
    """df: sessions, hit (%): an agentic run's prefill prefix-cache hit rate per point, live
    sessions on the x axis (log 2, ticks at the run's own values)."""
    ticks = sorted({float(c) for c in df["sessions"].dropna()})
    return alt.Chart(df.dropna(subset=["hit"])).mark_line(point=True).encode(
        x=alt.X("sessions:Q", title="live sessions", scale=alt.Scale(type="log", base=2),
                axis=alt.Axis(values=ticks, format=",d") if ticks else alt.Undefined),
        y=alt.Y("hit:Q", title="prefix-cache hit rate (%)", scale=alt.Scale(domain=[0, 100])),
        tooltip=["sessions", alt.Tooltip("hit:Q", format=".1f")],
    ).properties(title="Prefill prefix-cache hit rate vs live sessions", height=260)


SOURCE_COLORS = {  # launcher.analysis.kv_tiers.SOURCE_TITLES, in its order
    "local prefix-cache hit": "#54a24b", "P→D handoff": "#f58518", "KV store hit": "#4c78a8",
    "CPU offload hit": "#72b7b2", "external, not split": "#bab0ac", "computed": "#e45756"}


def source_scale(shown) -> alt.Scale:
    """The sources' fixed colours, for the sources a chart shows (its legend lists no
    other)."""
    domain = [s for s in SOURCE_COLORS if s in set(shown)]
    return alt.Scale(domain=domain, range=[SOURCE_COLORS[s] for s in domain])


def tokens_by_source(df: pd.DataFrame, role: str) -> alt.Chart:
    """Stacked bars per sweep point, each the role's prompt tokens by where they came from
    (df: point, source, tokens, share, order; kv_tiers.sources_long)."""
    return alt.Chart(df).mark_bar().encode(
        y=alt.Y("point:N", sort=None, title="sweep point"),
        x=alt.X("share:Q", title="share of prompt tokens", stack="zero",
                axis=alt.Axis(format=".0%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("source:N", scale=source_scale(df["source"]), title="came from",
                        legend=alt.Legend(orient="bottom", columns=3, labelLimit=240)),
        order=alt.Order("order:Q"),
        tooltip=["point:N", "source:N", alt.Tooltip("tokens:Q", format=",.0f"),
                 alt.Tooltip("share:Q", format=".1%")],
    ).properties(title=f"Prompt tokens by source, {role}", height=alt.Step(28))


def reuse_vs_theoretical(df: pd.DataFrame) -> alt.Chart:
    """Per point: local, store and offload hit shares stacked, and a black tick at the
    trace's theoretical hit rate (df: kv_tiers.reuse's point, *_share, theoretical)."""
    parts = []
    for key, title, k in (("local_hit_share", "local prefix-cache hit", 0),
                          ("store_hit_share", "KV store hit", 2),
                          ("offload_hit_share", "CPU offload hit", 3)):
        parts.append(df[["point"]].assign(source=title, share=df[key].fillna(0.0), order=k))
    hits = pd.concat(parts, ignore_index=True)
    bars = alt.Chart(hits).mark_bar().encode(
        y=alt.Y("point:N", sort=None, title="sweep point"),
        x=alt.X("share:Q", title="share of prompt tokens served from a cache", stack="zero",
                axis=alt.Axis(format=".0%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("source:N", scale=source_scale(hits["source"]), title="hit in",
                        legend=alt.Legend(orient="bottom")),
        order=alt.Order("order:Q"),
        tooltip=["point:N", "source:N", alt.Tooltip("share:Q", format=".1%")])
    theo = df.dropna(subset=["theoretical"])
    if theo.empty:
        return bars.properties(title="Prompt tokens served from a cache", height=alt.Step(28))
    tick = alt.Chart(theo).mark_tick(color="black", thickness=2, size=22).encode(
        y=alt.Y("point:N", sort=None), x="theoretical:Q",
        tooltip=["point:N", alt.Tooltip("theoretical:Q", format=".1%",
                                        title="the trace's theoretical hit rate")])
    return (bars + tick).properties(
        title="Hits against the trace's theoretical hit rate (black tick)",
        height=alt.Step(28))


def slo_frontier(df: pd.DataFrame, *, limit_ms: float, limit_text: str, metric: str,
                 color_title: str = "configuration") -> alt.Chart:
    """One limit of an SLO: every configuration's points (df: config, concurrency, value in
    ms, result 'passes'/'fails', why), a line per configuration through them, filled where a
    point passes and hollow where it fails, and the limit as a dashed red rule."""
    ticks = sorted({float(c) for c in df["concurrency"].dropna()}) if not df.empty else []
    x = alt.X("concurrency:Q", title="max concurrency", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=ticks, format=",d") if ticks else alt.Undefined)
    y = alt.Y("value:Q", title=f"{metric} (ms)")
    color = alt.Color("config:N", title=color_title, scale=alt.Scale(scheme="tableau10"),
                      legend=alt.Legend(orient="bottom", columns=1, labelLimit=480))
    base = alt.Chart(df)
    line = base.mark_line(opacity=0.5).encode(x=x, y=y, color=color, order="concurrency:Q")
    dots = base.mark_point(size=90, strokeWidth=2).encode(
        x=x, y=y, color=color,
        fill=alt.condition(alt.datum.result == "passes",
                           alt.Fill("config:N", scale=alt.Scale(scheme="tableau10"),
                                    legend=None), alt.value("white")),
        # the title says which is which (a shape legend draws no symbols under the theme)
        shape=alt.Shape("result:N", scale=alt.Scale(domain=["passes", "fails"],
                                                    range=["circle", "diamond"]), legend=None),
        tooltip=["config:N", "concurrency:Q", alt.Tooltip("value:Q", format=",.1f",
                                                          title=f"{metric} (ms)"),
                 "result:N", "why:N"])
    limit = pd.DataFrame({"value": [limit_ms], "label": [f"SLO {limit_text}"]})
    rule = alt.Chart(limit).mark_rule(color="#c0262d", strokeDash=[5, 3], size=2).encode(
        y="value:Q", tooltip=["label:N"])
    text = alt.Chart(limit).mark_text(color="#c0262d", align="left", dx=4, dy=-7).encode(
        y="value:Q", text="label:N", x=alt.value(0))
    return (line + dots + rule + text).properties(
        title=f"{metric} against its limit ({limit_text}): filled circles pass, hollow "
              "diamonds fail",
        height=280)


# --- agentic ---------------------------------------------------------------------------------


def ttft_vs_context(requests: pd.DataFrame, curves: pd.DataFrame) -> alt.LayerChart:
    """An agentic run's TTFT against each turn's context (log-log). `requests`: point,
    context, ttft_ms (AIPerf's records, dots); `curves`: point, context, value (ms), stat
    ('TTFT p50' / 'TTFT p90' per context bucket, 'prefill compute line')."""
    # not niced to whole decades: a trace's contexts span one or two
    x = alt.X("context:Q", title="the turn's context (prompt tokens, log scale)",
              scale=alt.Scale(type="log", nice=False, padding=12), axis=alt.Axis(format="~s"))
    y = alt.Y("value:Q", title="TTFT (ms, log scale)",
              scale=alt.Scale(type="log", nice=False, padding=12))
    color = alt.Color("point:N", title="point",
                      legend=alt.Legend(orient="bottom", columns=6, labelLimit=360))
    dots = alt.Chart(requests.rename(columns={"ttft_ms": "value"})).mark_circle(
        size=28, opacity=0.45).encode(
        x=x, y=y, color=color,
        tooltip=["point:N", alt.Tooltip("context:Q", format=",.0f", title="context tokens"),
                 alt.Tooltip("value:Q", format=",.0f", title="TTFT ms")])
    stats = ["TTFT p50", "TTFT p90", "prefill compute line"]
    lines = alt.Chart(curves).mark_line(point=True, strokeWidth=2).encode(
        x=x, y=y, color=color,
        strokeDash=alt.StrokeDash("stat:N", title="line", scale=alt.Scale(
            domain=stats, range=[[1, 0], [6, 3], [2, 2]]),
            legend=alt.Legend(orient="bottom", labelLimit=360)),
        # a legend symbol per line (as latency_vs_concurrency: the theme draws no stroke)
        shape=alt.Shape("stat:N", title="line", scale=alt.Scale(domain=stats)),
        detail="stat:N",
        tooltip=["point:N", "stat:N",
                 alt.Tooltip("context:Q", format=",.0f", title="context tokens"),
                 alt.Tooltip("value:Q", format=",.0f", title="ms")])
    return (dots + lines).properties(
        title="TTFT against the turn's context (p50, p90 per bucket; compute line)",
        height=320)


def point_timeline(frame: pd.DataFrame, spans: pd.DataFrame, *, offered: float | None,
                   kv_full: float, title: str, clock: Clock = WALL_CLOCK) -> alt.LayerChart:
    """One agentic point on one time axis: KV use and the prefix-cache hit rate (left, %),
    requests waiting (right), the spans where the prefix KV was full shaded, its 90 % line
    and the rate the trace offers as dashed rules. `frame`: t, value, measure, series;
    `spans`: start, end."""
    tm = _Timed(clock, (frame, ("t",)), (spans, ("start", "end")))
    d, sp = tm.frames
    x = tm.x("t")
    names = list(dict.fromkeys(d["series"]))
    shade = {"KV use": ["#e45756", "#f58518", "#b279a2"], "hit rate": ["#4c78a8"],
             "waiting": ["#9d9d9d", "#54a24b"]}
    used: dict[str, int] = {}
    colors = []
    for n in names:
        m = d.loc[d["series"] == n, "measure"].iloc[0]
        k = used.get(m, 0)
        used[m] = k + 1
        colors.append(shade[m][k % len(shade[m])])
    color = alt.Color("series:N", title=None, scale=alt.Scale(domain=names, range=colors),
                      legend=alt.Legend(orient="bottom", columns=2, labelLimit=420))
    pct = d[d["measure"] != "waiting"]
    left = [alt.Chart(pct).mark_line(point=True, strokeWidth=2).encode(
        x=x, y=alt.Y("value:Q", title="KV use, prefix-cache hit rate",
                     axis=alt.Axis(format=".0%"), scale=alt.Scale(domain=[0, 1])),
        color=color, tooltip=[tm.tooltip(), "series:N",
                              alt.Tooltip("value:Q", format=".1%")])]
    if sp is not None and not sp.empty:
        left.insert(0, alt.Chart(sp).mark_rect(opacity=0.12, color="#e45756").encode(
            x=tm.x("start"), x2="end"))
    rules = pd.DataFrame({"y": [kv_full] + ([offered] if offered is not None else []),
                          "label": [f"KV {kv_full:.0%}"] + (
                              [f"the trace offers {offered:.0%}"] if offered is not None
                              else [])})
    left.append(alt.Chart(rules).mark_rule(strokeDash=[4, 3], color="#555").encode(
        y="y:Q", tooltip=["label:N"]))
    left.append(alt.Chart(rules).mark_text(align="left", dx=4, dy=-6, fontSize=10,
                                           color="#555").encode(
        y="y:Q", x=alt.value(0), text="label:N"))
    waiting = d[d["measure"] == "waiting"]
    right = alt.Chart(waiting).mark_line(strokeDash=[5, 2], strokeWidth=1.5).encode(
        x=x, y=alt.Y("value:Q", title="requests waiting", axis=alt.Axis(orient="right")),
        color=color, tooltip=[tm.tooltip(), "series:N", alt.Tooltip("value:Q", format=",.1f")])
    return alt.layer(alt.layer(*left), right).resolve_scale(y="independent").properties(
        title=title, height=260)


def sessions_per_endpoint(df: pd.DataFrame) -> alt.Chart:
    """Sessions each decode endpoint served, per point (df: point, endpoint, sessions)."""
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("point:N", title="point (live sessions)", sort=None,
                axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("endpoint:N"),
        y=alt.Y("sessions:Q", title="sessions", axis=alt.Axis(tickMinStep=1, format="d")),
        color=alt.Color("endpoint:N", title="decode endpoint",
                        legend=alt.Legend(orient="bottom", labelLimit=360)),
        tooltip=["point:N", "endpoint:N", "sessions:Q", "requests:Q", "split:Q"],
    ).properties(title="Sessions per decode endpoint (from the decodes' own request lines)",
                 height=220)
