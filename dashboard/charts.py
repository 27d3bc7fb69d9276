"""Chart builders: tidy DataFrame -> altair chart. Pure (no Streamlit), so they are testable
and the pages stay short. Every chart has a title and axis titles with units."""

from __future__ import annotations

import altair as alt
import pandas as pd

ROLE_COLORS = alt.Scale(domain=["prefill", "decode", "agg", "router", "other", "free"],
                        range=["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d9d9d",
                               "#e8e8e8"])
PART_COLORS = alt.Scale(
    domain=["Prefill queue", "Prefill compute", "KV transfer (NIXL)", "Decode admission",
            "Remainder (router, first decode step, client)"],
    range=["#e45756", "#4c78a8", "#f58518", "#b279a2", "#bab0ac"])
# No fixed format: vega's multi-scale time labels suit 1-minute demo runs and 2-hour sweeps.
TIME_AXIS = alt.Axis(title="time", labelAngle=0)


def _time_x() -> alt.X:
    return alt.X("t:T", axis=TIME_AXIS)


def windows_layer(windows: pd.DataFrame) -> alt.Chart | None:
    """Shaded sweep-point windows (so warmup and gaps are visible on every time axis)."""
    if windows is None or windows.empty:
        return None
    base = alt.Chart(windows)
    x = alt.X("start:T", axis=TIME_AXIS)  # same title as the data layer: one axis title
    rect = base.mark_rect(opacity=0.08, color="#4c78a8").encode(x=x, x2="end:T")
    text = base.mark_text(align="left", dx=3, dy=-2, baseline="top", fontSize=10,
                          color="#555").encode(x=x, y=alt.value(2), text="label:N")
    return rect + text


def with_windows(chart: alt.Chart, windows: pd.DataFrame | None) -> alt.Chart | alt.LayerChart:
    layer = windows_layer(windows) if windows is not None else None
    return layer + chart if layer is not None else chart


def line(df: pd.DataFrame, *, title: str, y_title: str, color: str = "group",
         color_title: str = "", y_format: str | None = None, height: int = 300,
         windows: pd.DataFrame | None = None, stacked: bool = False) -> alt.Chart:
    axis = alt.Axis(title=y_title, format=y_format) if y_format else alt.Axis(title=y_title)
    mark = alt.Chart(df).mark_area(opacity=0.8) if stacked else alt.Chart(df).mark_line(
        interpolate="monotone", strokeWidth=1.5)
    ch = mark.encode(
        x=_time_x(),
        y=alt.Y("value:Q", axis=axis, stack="zero" if stacked else None),
        color=alt.Color(f"{color}:N", title=color_title or None,
                        legend=alt.Legend(orient="bottom", columns=4, labelLimit=240)),
        tooltip=[alt.Tooltip("t:T", format="%H:%M:%S"), f"{color}:N",
                 alt.Tooltip("value:Q", format=",.3~f")],
    )
    return with_windows(ch, windows).properties(title=title, height=height)


def spread(df: pd.DataFrame, *, title: str, y_title: str, y_format: str = ".0%",
           windows: pd.DataFrame | None = None, height: int = 320,
           color_title: str = "endpoint") -> alt.Chart:
    """min..max band plus mean line per group (df columns group, t, min, mean, max)."""
    base = alt.Chart(df)
    band = base.mark_area(opacity=0.25).encode(
        x=_time_x(), y=alt.Y("min:Q", axis=alt.Axis(title=y_title, format=y_format),
                             scale=alt.Scale(domain=[0, 1])),
        y2="max:Q", color=alt.Color("group:N", title=color_title,
                                    legend=alt.Legend(orient="bottom", columns=6,
                                                      labelLimit=240)))
    mean = base.mark_line(strokeWidth=1.5).encode(
        x=_time_x(), y="mean:Q", color="group:N",
        tooltip=[alt.Tooltip("t:T", format="%H:%M:%S"), "group:N",
                 alt.Tooltip("min:Q", format=".1%"), alt.Tooltip("mean:Q", format=".1%"),
                 alt.Tooltip("max:Q", format=".1%")])
    full = alt.Chart(pd.DataFrame({"y": [0.9]})).mark_rule(
        color="#e45756", strokeDash=[4, 3]).encode(y=alt.datum(0.9))
    return with_windows(band + mean + full, windows).properties(title=title, height=height)


def heatmap(df: pd.DataFrame, *, title: str, y: str, color_title: str,
            color_format: str = ".0%", domain: tuple[float, float] | None = (0.0, 1.0),
            bin_s: float = 60.0, height: int | None = None) -> alt.Chart:
    """Series × time heatmap (one row per engine/GPU): shows hot spots across many series."""
    n_rows = df[y].nunique() if not df.empty else 1
    scale = alt.Scale(scheme="turbo", domain=list(domain)) if domain else alt.Scale(
        scheme="turbo")
    d = df.assign(t2=df["t"] + pd.to_timedelta(bin_s, unit="s"))
    return alt.Chart(d).mark_rect().encode(
        x=alt.X("t:T", axis=TIME_AXIS), x2="t2:T",
        y=alt.Y(f"{y}:N", title=None, sort=None,
                axis=alt.Axis(labelFontSize=9 if n_rows > 24 else 11,
                              labelLimit=160)),
        color=alt.Color("value:Q", title=color_title, scale=scale,
                        legend=alt.Legend(format=color_format)),
        tooltip=[alt.Tooltip("t:T", format="%H:%M:%S"), f"{y}:N",
                 alt.Tooltip("value:Q", format=color_format)],
    ).properties(title=title, height=height or alt.Step(10 if n_rows > 24 else 18))


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
        color=alt.Color("role:N", scale=alt.Scale(domain=roles, range=colors), title="role"),
        tooltip=["node:N", "gpu:O", "endpoint:N", "process:N", "ranks:N", "role:N"])
    text = base.mark_text(fontSize=10, color="white").encode(text="short:N")
    # Step sizing: Streamlit keeps a fixed height for the whole chart (axes, legend
    # included), which squeezes the bands; a step per row cannot be squeezed.
    return (rect + text).properties(title="Topology: nodes → GPUs → endpoints",
                                    height=alt.Step(26 if n_nodes <= 18 else 14))


def timeline(df: pd.DataFrame) -> alt.Chart:
    """Stage gantt (df: stage, start, end as datetimes, state)."""
    return alt.Chart(df).mark_bar(height=16).encode(
        x=alt.X("start:T", axis=TIME_AXIS), x2="end:T",
        y=alt.Y("stage:N", sort=None, title=None),
        color=alt.Color("stage:N", legend=None),
        tooltip=["stage:N", alt.Tooltip("start:T", format="%H:%M:%S"),
                 alt.Tooltip("end:T", format="%H:%M:%S"),
                 alt.Tooltip("seconds:Q", format=",.0f", title="seconds")],
    ).properties(title="Stage timeline", height=alt.Step(24))


def pareto(df: pd.DataFrame, frontier: pd.DataFrame, *, y: str, y_title: str) -> alt.Chart:
    """Throughput per GPU vs tokens/s per user, points labelled by concurrency."""
    base = alt.Chart(df).encode(
        x=alt.X("tokens_per_s_per_user:Q", title="tok/s per user (1000 ÷ median TPOT ms)",
                scale=alt.Scale(zero=False)),
        y=alt.Y(f"{y}:Q", title=y_title),
        color=alt.Color("run:N", title="run",
                        legend=alt.Legend(orient="bottom", columns=1, labelLimit=400)))
    pts = base.mark_point(filled=True, size=70).encode(
        shape=alt.Shape("verdict:N", title="verdict"),
        tooltip=["run:N", "point:N", alt.Tooltip(f"{y}:Q", format=",.0f"),
                 alt.Tooltip("tokens_per_s_per_user:Q", format=",.1f"),
                 alt.Tooltip("ttft_p99_s:Q", format=".3f", title="TTFT p99 (s)"),
                 "verdict:N"])
    labels = base.mark_text(dx=8, dy=-8, fontSize=10).encode(text="point:N")
    front = alt.Chart(frontier).mark_line(strokeDash=[5, 3], strokeWidth=1.5).encode(
        x="tokens_per_s_per_user:Q", y=f"{y}:Q", color="run:N")
    return (front + pts + labels).properties(
        title=f"{y_title} vs tok/s per user (dashed: Pareto frontier per run)", height=440)


def latency_vs_concurrency(df: pd.DataFrame, *, metric: str, title: str) -> alt.Chart:
    """df: run, concurrency, stat (p50/p90/p99), value (ms)."""
    return alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("concurrency:Q", title="max concurrency",
                scale=alt.Scale(type="log", base=2)),
        y=alt.Y("value:Q", title=f"{metric} (ms)", scale=alt.Scale(type="log")),
        color=alt.Color("run:N", legend=alt.Legend(orient="bottom", columns=1,
                                                   labelLimit=400)),
        strokeDash=alt.StrokeDash("stat:N", title="percentile"),
        tooltip=["run:N", "concurrency:Q", "stat:N", alt.Tooltip("value:Q", format=",.1f")],
    ).properties(title=title, height=340)


def ttft_breakdown(parts: pd.DataFrame, client: pd.DataFrame) -> alt.Chart:
    """Stacked horizontal bars per point (seconds) plus a tick at the client mean TTFT."""
    bars = alt.Chart(parts).mark_bar().encode(
        y=alt.Y("point:N", sort=None, title="sweep point"),
        x=alt.X("seconds:Q", title="mean seconds per request", stack="zero"),
        color=alt.Color("part:N", scale=PART_COLORS, title="TTFT part",
                        legend=alt.Legend(orient="bottom", columns=3, labelLimit=300)),
        order=alt.Order("order:Q"),
        tooltip=["point:N", "part:N", alt.Tooltip("seconds:Q", format=".3f"),
                 alt.Tooltip("share:Q", format=".0%", title="share of client TTFT")])
    tick = alt.Chart(client).mark_tick(color="black", thickness=2, size=22).encode(
        y=alt.Y("point:N", sort=None), x="ttft_mean_s:Q",
        tooltip=["point:N", alt.Tooltip("ttft_mean_s:Q", format=".3f",
                                        title="client mean TTFT (s)")])
    return (bars + tick).properties(
        title="Client TTFT split per sweep point (black tick: client mean TTFT)",
        height=alt.Step(32))
