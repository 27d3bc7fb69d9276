"""Streamlit glue shared by the pages: the runs directory, the selected run, cached loaders
keyed by file fingerprints, the page header (simulation label, state, why a page is empty)
and live refresh."""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts
from launcher.analysis import derive, load
from launcher.run import listing, numbers
from launcher.run.plandoc import PlanDoc
from launcher.run.rundir import RunDir

RUNS_ENV = "PD_DASHBOARD_RUNS"
LIVE_EVERY_S = 5
STATE_BADGE = {"succeeded": "succeeded", "failed": "FAILED", "cancelled": "cancelled",
               "refused": "REFUSED",
               "running": "running", "submitted": "submitted", "planned": "planned",
               "dry-run": "dry-run", "empty": "empty", "unknown": "unknown"}
STATE_COLOR = {"succeeded": "green", "failed": "red", "cancelled": "gray", "running": "blue",
               "refused": "red",
               "submitted": "orange", "planned": "orange", "dry-run": "violet", "empty": "gray",
               "unknown": "gray"}
PAGES = (  # (file, title, icon, url path); Material icons ship with Streamlit's font
    ("app_pages/runs.py", "Runs", ":material/list:", "runs"),
    ("app_pages/study.py", "Study", ":material/compare_arrows:", "study"),
    ("app_pages/compare.py", "Compare", ":material/difference:", "compare"),
    ("app_pages/overview.py", "Overview", ":material/hub:", "overview"),
    ("app_pages/sweep.py", "Sweep", ":material/show_chart:", "sweep"),
    ("app_pages/kv_cache.py", "KV cache", ":material/memory:", "kv"),
    ("app_pages/kv_tiers.py", "KV tiers", ":material/layers:", "kv-tiers"),
    ("app_pages/ttft.py", "TTFT breakdown", ":material/timer:", "ttft"),
    ("app_pages/gpus.py", "GPUs and hosts", ":material/developer_board:", "gpus"),
    ("app_pages/logs.py", "Logs", ":material/article:", "logs"),
)


# --- runs dir and selection ----------------------------------------------------------------


def run_label(run_id: str) -> str:
    """A run's name for narrow places, what tells runs apart first: a study's configuration
    ('endpoints2 · local-sim · 20261201-235105'), else the recipe, then the time."""
    m = re.match(r"^(\d{8}-\d{6})-(.+)$", run_id)
    if not m:
        return run_id
    when, rest = m.groups()
    recipe, sep, config = rest.rpartition("_")
    return f"{config} · {recipe} · {when}" if sep else f"{rest} · {when}"


def runs_dir() -> Path:
    return Path(st.session_state.get("runs_dir") or os.environ.get(RUNS_ENV) or "runs")


@st.cache_data(ttl=3, show_spinner=False, max_entries=8)
def _run_infos(runs: str, listing: tuple[tuple[str, int], ...]) -> list[load.RunInfo]:
    return [load.run_info(Path(p)) for p, _ in listing]


def run_infos() -> list[load.RunInfo]:
    """Every run under the runs dir; re-read when a run's top-level files change."""
    paths = load.list_run_dirs(runs_dir())
    listing = []
    for p in paths:
        try:
            m = max((f.stat().st_mtime_ns for f in p.iterdir()), default=0)
        except FileNotFoundError:
            m = 0
        listing.append((str(p), m))
    return _run_infos(str(runs_dir()), tuple(listing))


def studies() -> list[listing.Study]:
    """Every study under the runs dir (launcher.run.listing: what `launcher runs` shows)."""
    return load.studies(runs_dir())


def selected_study() -> listing.Study | None:
    """The study of ?study=..., else the selected run's study, else the newest study."""
    all_ = studies()
    want = st.session_state.get("study")
    info = selected_run()
    for name in (want, info.study if info else None):
        for s in all_:
            if name and s.name == name:
                return s
    return all_[0] if all_ else None


def selected_run() -> load.RunInfo | None:
    run_id = st.session_state.get("run")
    for info in run_infos():
        if info.run_id == run_id:
            return info
    return None


# --- cached loaders ------------------------------------------------------------------------


@st.cache_data(max_entries=32, show_spinner=False)
def plan_of(path: str, fp: str) -> PlanDoc | None:
    return load.read_plan_safe(Path(path))[0]


def plan(info: load.RunInfo) -> PlanDoc | None:
    p = RunDir(info.path).plan
    return plan_of(str(info.path), load.fingerprint(p) if p.exists() else "")


@st.cache_data(max_entries=32, show_spinner=False)
def _bench(path: str, fp: str) -> list[dict]:
    return load.load_bench(Path(path))


def bench(info: load.RunInfo) -> list[dict]:
    return _bench(str(info.path), load.fingerprint(info.path / "bench"))


@st.cache_resource(max_entries=12, show_spinner=False)
def _reader(path: str, family: str) -> load.TelemetryReader:
    # One incremental reader per (run, family): a live run's refresh reads only new rows.
    if family in load.FAMILIES:
        return load.TelemetryReader(Path(path), names=load.FAMILIES[family])
    return load.TelemetryReader(Path(path), prefix=family)


# One SeriesSet per (run, telemetry fingerprint, name family); cache_resource: shared,
# not copied per rerun (read-only by convention), a few runs at a time. An unchanged
# fingerprint never touches the files.
@st.cache_resource(max_entries=6, show_spinner="Reading telemetry…")
def series_for(path: str, fp: str, family: str, plan_fp: str) -> derive.SeriesSet:
    reader = _reader(path, family)
    ss = derive.SeriesSet(reader.read(), load.read_plan_safe(Path(path))[0])
    ss.damaged = dict(reader.damaged)  # files left out of it: path -> why
    return ss


def series(info: load.RunInfo, family: str) -> derive.SeriesSet:
    """Telemetry of one name family: "kv" (the KV page), "ttft" (per-point evidence),
    or a name prefix ("gpu:", "host:", "proc:"). Re-read only when a telemetry file changed;
    each page reads only the names it draws (a 2-hour 72-GPU run has ~16 M rows). A damaged
    telemetry file is named here, where its rows are missing."""
    ss = series_for(str(info.path), load.telemetry_fingerprint(info.path), family,
                    load.fingerprint(RunDir(info.path).plan))
    damage_note(info, getattr(ss, "damaged", {}))
    return ss


def damage_note(info: load.RunInfo, damaged: dict[str, str]) -> None:
    """One warning naming the telemetry files a panel had to leave out, and why."""
    if not damaged:
        return
    lines = []
    for path, why in sorted(damaged.items()):
        try:
            rel = Path(path).relative_to(info.path)
        except ValueError:
            rel = Path(path)
        lines.append(f"- `{rel}`: {why}")
    st.warning("Damaged telemetry left out of what is drawn here (the other files are "
               "drawn; the file itself is kept as it is):\n" + "\n".join(lines),
               icon=":material/broken_image:")


def plan_damaged(info: load.RunInfo, what: str) -> bool:
    """Say (and return True) when plan.json exists but cannot be read, in the panel that
    needs it: `what` is what that panel cannot show."""
    if not info.plan_error:
        return False
    st.error(f"{what} needs the run's plan, and `plan.json` cannot be read: "
             f"{info.plan_error} Fix or regenerate it (`python -m launcher submit RECIPE "
             "--dry-run` writes one); the rest of this page does not need it.")
    return True


@st.cache_data(max_entries=16, show_spinner=False)
def _points(path: str, bench_fp: str, tel_fp: str) -> pd.DataFrame:
    p = Path(path)
    pl = load.read_plan_safe(p)[0]
    info = load.run_info(p)
    ss = series_for(path, tel_fp, "ttft", load.fingerprint(RunDir(p).plan))
    step = pl.telemetry_interval_s if pl else 1.0
    return derive.point_table(_bench(path, bench_fp), pl, ss if info.has_telemetry else None,
                              step_s=step)


def points(info: load.RunInfo) -> pd.DataFrame:
    """The per-point table (client + headline + TTFT parts + evidence)."""
    tel_fp = load.telemetry_fingerprint(info.path)
    table = _points(str(info.path), load.fingerprint(info.path / "bench"), tel_fp)
    if info.has_telemetry:
        ss = series_for(str(info.path), tel_fp, "ttft", load.fingerprint(RunDir(info.path).plan))
        damage_note(info, getattr(ss, "damaged", {}))
    return table


@st.cache_data(max_entries=16, show_spinner=False)
def _decode_endpoints(path: str, bench_fp: str, tel_fp: str) -> pd.DataFrame:
    p = Path(path)
    info = load.run_info(p)
    if not info.has_telemetry:
        return derive.decode_endpoints([], None)
    ss = series_for(path, tel_fp, "ttft", load.fingerprint(RunDir(p).plan))
    return derive.decode_endpoints(_bench(path, bench_fp), ss)


def decode_endpoints(info: load.RunInfo) -> pd.DataFrame:
    """Per point and decode endpoint: admission, its TTFT, its peak KV use."""
    return _decode_endpoints(str(info.path), load.fingerprint(info.path / "bench"),
                             load.telemetry_fingerprint(info.path))


@st.cache_data(max_entries=8, show_spinner="Reading AIPerf's per-request records…")
def _agentic(path: str, bench_fp: str, plan_fp: str) -> Any:
    from launcher.analysis import agentic

    p = Path(path)
    return agentic.load_run(p, _bench(path, bench_fp), load.read_plan_safe(p)[0])


def agentic(info: load.RunInfo) -> Any:
    """An agentic run's per-request records, TTFT by context and sessions per decode
    (launcher.analysis.agentic.AgenticRun), or None."""
    return _agentic(str(info.path), load.fingerprint(info.path / "bench"),
                    load.fingerprint(RunDir(info.path).plan))


def verdicts(info: load.RunInfo) -> list:
    from launcher.analysis import diagnose

    table = _points(str(info.path), load.fingerprint(info.path / "bench"),
                    load.telemetry_fingerprint(info.path))  # points() already said any damage
    return diagnose.diagnose(table.to_dict("records")) if not table.empty else []


def windows_frame(info: load.RunInfo) -> pd.DataFrame:
    rows = []
    for p in bench(info):
        w = derive.window_of(p)
        if w:
            rows.append({"label": w.label, "start": pd.to_datetime(w.start, unit="s", utc=True),
                         "end": pd.to_datetime(w.end, unit="s", utc=True)})
    return pd.DataFrame(rows)


# --- header and explanations ---------------------------------------------------------------


def fmt_time(ts: float | None) -> str:
    if not ts:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


TIME_AXES = (charts.WALL, charts.ELAPSED)


def clock(info: load.RunInfo | None) -> charts.Clock:
    """How this session draws time (the sidebar's "Time axis"): wall clock in this host's
    zone (the zone of the logs' and events' times), or seconds since the job started."""
    if st.session_state.get("time_axis") == charts.ELAPSED and info is not None:
        origin = info.started
        if not origin:
            ts = [e.get("ts") for e in load.read_events(info.path)]
            ts = [t for t in ts if isinstance(t, (int, float))]
            origin = min(ts) if ts else None
        if origin:
            return charts.Clock(origin=float(origin))
    return charts.WALL_CLOCK


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "—"
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s"


def header(title: str, *, need_run: bool = True) -> load.RunInfo | None:
    """Page title, the run's identity and state, the SIMULATION or vLLM (CPU) label, and a sentence on
    what is missing. Returns the run, or None when there is nothing to show."""
    info = selected_run()
    tag = info.engine_kind.tag if need_run and info is not None else ""
    st.title(f"{title} · {tag}" if tag else title)  # the runs list mixes runs
    if not need_run:
        return info
    if info is None:
        if not run_infos():
            st.info(f"No run directories under `{runs_dir()}`. Start one with "
                    "`python -m launcher submit RECIPE`, or point the dashboard at another "
                    "directory: `python -m launcher dashboard RUNS_DIR`.")
        else:
            st.info("Pick a run in the sidebar.")
        return None
    state = "dry-run" if info.dry_run else info.state
    badge = STATE_BADGE.get(state, state)
    bits = [f"**{info.run_id}**", f":{STATE_COLOR.get(state, 'gray')}[**{badge}**]"]
    if info.stage and info.state not in ("succeeded",):
        bits.append(f"stage: {info.stage}")
    if info.recipe:
        bits.append(f"recipe: {info.recipe}")
    bits.append(info.topology)
    st.caption(" · ".join(bits))
    for why in info.study_problems:  # its study's damaged files
        st.error(f"{why}: left out, so this run is shown from its own files.",
                 icon=":material/report:")
    if info.engine_kind.caveat:
        st.warning(info.engine_kind.caveat, icon=info.engine_kind.caveat_icon)
    if not info.has_plan and not info.plan_error:
        st.info("This run directory is empty of a plan: no plan.json was written yet. Either "
                "the submission died before planning, or the launcher is still creating it.")
    if info.state == "failed":
        st.error(f"This run failed during stage **{info.stage or '?'}**: "
                 f"{info.error or 'no error message was recorded'}. "
                 "What it recorded before failing is shown below; see the Logs page.")
    elif info.state == "cancelled":
        st.warning("This run was cancelled; the data stops where it was cancelled.")
    elif info.state == "refused":
        why = info.error or "no reason was recorded"
        st.error(f"This submission was refused, nothing ran: {why}. Mend what it names and "
                 "submit the recipe again.")
    elif info.dry_run:
        st.info("A dry-run: its plan and command lines were written, nothing was submitted. "
                "Submit the recipe without --dry-run to run it.", icon=":material/draft:")
    elif info.live:
        st.info(f"Live run: this page refreshes every {LIVE_EVERY_S} s (state, stage and "
                "progress just below).", icon=":material/autorenew:")
    return info


def run_notes(info: load.RunInfo, about: str | None = None) -> None:
    """run.json's notes (a dead agent with its exit status, partial telemetry, what the
    orchestrator could not write), or those that mention `about`."""
    for note in info.notes:
        if about is None or about in note:
            st.warning(note, icon=":material/report:")


def progress_line(info: load.RunInfo) -> str:
    """'sweep point 2 of 5 (c=128), about 4m10s left; engines loaded 3 of 4'."""
    pv = load.progress_view(info.progress, time.time())
    parts = []
    sw = pv.get("sweep")
    if sw:
        s = f"sweep point {sw['index']} of {sw['total']}"
        if sw.get("concurrency"):
            s += f" (c={sw['concurrency']})"
        if sw.get("left_s") is not None:
            s += f", about {fmt_duration(sw['left_s'])} left"
        parts.append(s)
    if pv.get("loading") and pv["loaded"] < len(pv["loading"]):
        parts.append(f"engines loaded {pv['loaded']} of {len(pv['loading'])}")
    return "; ".join(parts)


def progress_panel(info: load.RunInfo) -> None:
    """A live run's progress: sweep point i of N with the time left, and per engine how far
    vLLM is through loading its weights (its own 'Loading safetensors checkpoint shards'
    lines, read by the orchestrator into run.json)."""
    if not info.live:
        return
    pv = load.progress_view(info.progress, time.time())
    sw = pv.get("sweep")
    loading = pv.get("loading") or []
    if not sw and not loading:
        if info.stage:
            st.caption(f"Stage **{info.stage}**: no sweep or loading progress recorded yet.")
        return
    with st.container(border=True):
        st.markdown("**Progress**")
        if sw:
            text = f"Sweep point {sw['index']} of {sw['total']}"
            if sw.get("concurrency"):
                text += f" (max concurrency {sw['concurrency']})"
            if sw.get("running_s") is not None:
                text += f" · this point running for {fmt_duration(sw['running_s'])}"
            if sw.get("left_s") is not None:
                text += f" · about {fmt_duration(sw['left_s'])} left in the sweep"
            elif not sw.get("estimated"):
                text += " · time left: estimated once the first point is done"
            st.progress(sw["fraction"], text=text)
        if loading:
            done = pv.get("loaded", 0)
            if done == len(loading) and sw:
                st.caption(f"All {len(loading)} engines finished loading their weights.")
            else:
                st.markdown(f"Model loading (from vLLM's log lines): {done} of "
                            f"{len(loading)} engines done")
                cols = st.columns(min(3, len(loading)))
                for k, (name, frac) in enumerate(loading):
                    cols[k % len(cols)].progress(min(max(frac, 0.0), 1.0),
                                                 text=f"{name}: {frac:.0%}")


def live(info: load.RunInfo, body: Callable[[load.RunInfo], None],
         panel: bool = False) -> None:
    """Run `body(info)` once, or, while the run is live, as a fragment that reruns itself
    every LIVE_EVERY_S with the run re-read (state, stage, progress), under a line saying
    how far it is (`panel`: the body draws the full progress panel itself). When the run
    ends, the whole page is drawn once more, as a finished run."""
    if not info.live:
        guarded(body, info)
        return

    def refresh() -> None:
        fresh = selected_run()
        if fresh is None or fresh.run_id != info.run_id:
            fresh = info
        if not fresh.live:
            st.rerun()
        if not panel:
            line = progress_line(fresh)
            st.caption(f"Live: {fresh.state}"
                       f"{', stage ' + fresh.stage if fresh.stage else ''}"
                       f"{' · ' + line if line else ''}")
        guarded(body, fresh)

    st.fragment(refresh, run_every=LIVE_EVERY_S)()


def guarded(body: Callable[[load.RunInfo], None], info: load.RunInfo) -> None:
    """The page's body; whatever a file of the run does to it costs this page's body, said
    in one line (the header, the sidebar and the other pages stay)."""
    try:
        body(info)
    except Exception as e:  # noqa: BLE001 - st.stop()/st.rerun() are BaseExceptions
        import logging

        logging.getLogger(__name__).exception("page body failed on %s", info.path)
        msg = " ".join(str(e).split())[:400]
        st.error(f"This part of the page could not be drawn from {info.path}: "
                 f"{type(e).__name__}: {msg}")


def no_telemetry(info: load.RunInfo, what: str) -> bool:
    """Explain (and return True) when the run has no telemetry to draw."""
    if info.has_telemetry:
        return False
    if info.state == "empty":
        return True
    st.info(f"No telemetry in this run, so there is no {what} to show: `telemetry/` is "
            "missing or empty (the node agents never started or never wrote a sample). "
            "Client-side figures are on the Sweep page.")
    return True


def num(x: Any, digits: int | None = 0, unit: str = "") -> str:
    """A number as the CLI and the report write it (`launcher.numbers.number`)."""
    return numbers.number(x, digits, unit)


def pct(x: Any, digits: int = 1) -> str:
    """A fraction as a percentage, as the report writes it: 0.733 -> '73.3%'."""
    v = numbers.value(x)
    return numbers.MISSING if v is None else numbers.number(v * 100, digits) + "%"


# Streamlit's chart theme puts titles 26 px above the plot and fits the view to its frame
# without them: a title or a wide axis's title fell outside the SVG and was cut (measured at
# 1440 px: 18 px above, 11 px left). Room on every side keeps them in.
CHART_PADDING = {"top": 24, "left": 16, "right": 8, "bottom": 8}


# Streamlit's default autosize "fit" keeps the whole chart at its height, so a legend of six
# rows below the plot left it 0 px tall (the KV page's prompt-token chart drew nothing):
# fit the width only, and a chart's height is its plot's, with title, axes and legend added.
CHART_AUTOSIZE = {"type": "fit-x", "contains": "padding"}


def altair(chart: Any) -> None:
    st.altair_chart(chart.properties(padding=CHART_PADDING, autosize=CHART_AUTOSIZE),
                    width="stretch")


ROW_PX, HEADER_PX, MAX_FIT_ROWS = 35, 38, 30


def shapes(plan: PlanDoc) -> str:
    """The endpoints by role and shape, without the GPU total: '1 decode DEP4 + 2 prefill
    DEP2' (a table's GPUs column says the total)."""
    return re.sub(r" \(\d+ GPUs?\)$", "", plan.topology())


def numbers_as_text(df: pd.DataFrame, digits: dict[str, int | None],
                    config: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """`df` with the `digits` columns written by `launcher.numbers` (as the CLI and the
    report write them: 10,277; — for none) and right-aligned; returns (frame, column_config)
    with `config`'s entries kept. Columns that do not exist are skipped."""
    out, cfg = df.copy(), dict(config or {})
    for col, d in digits.items():
        if col not in out.columns:
            continue
        out[col] = [numbers.number(v, d) for v in out[col]]
        prev = cfg.get(col)
        label = prev.get("label") if isinstance(prev, dict) else None
        helptext = prev.get("help") if isinstance(prev, dict) else None
        cfg[col] = st.column_config.TextColumn(label, help=helptext, alignment="right")
    return out, cfg


# st.dataframe sizes a column from its first 9 rows and its last (glide-data-grid), so a
# longer value further down was cut. Tables of more rows get text columns as wide as their
# longest value, from the widths of the grid's font (14 px Source Sans, measured in Chromium)
# and its 8 px padding a side.
GLIDE_SAMPLED_ROWS = 10
_CHAR_PX = {ch: w for w, chars in (
    (3.0, " "), (3.5, "',.:;Iijl|·"), (4.0, "!()[]f{}"), (4.5, "-t▾°"), (5.0, "/\\r"),
    (6.0, '"*?sxz'), (6.5, "JYcvy"), (7.0, "#$+0123456789<=>FLVX^_aegk~×≥±÷"),
    (7.5, "AESTZ`bhnou"), (8.0, "BCKPRdpqµ"), (8.5, "&DG└↗"), (9.0, "HNU"), (9.5, "OQ"),
    (10.0, "Mw"), (11.0, "W—"), (11.5, "%m"), (12.0, "@"), (13.5, "…")) for ch in chars}


def text_px(text: str) -> float:
    """About how wide `text` is in a table cell (unknown characters count as wide)."""
    return sum(_CHAR_PX.get(ch, 10.0) for ch in text)


def fit_columns(df: pd.DataFrame, config: dict | None = None) -> dict:
    """`config` with a width for every text column of a table longer than the grid
    measures: its longest value or header, plus the cell's padding."""
    cfg = dict(config or {})
    if len(df) <= GLIDE_SAMPLED_ROWS:
        return cfg
    for col in df.columns:
        if pd.api.types.is_numeric_dtype(df[col]):
            continue
        c = cfg.get(col)
        if isinstance(c, dict) and c.get("width") not in (None, ""):
            continue
        if isinstance(c, dict) and (c.get("type_config") or {}).get("type") == "link":
            continue
        label = c.get("label") if isinstance(c, dict) and c.get("label") else str(col)
        widest = max([text_px(str(v)) for v in df[col] if v is not None] + [text_px(label)])
        cfg[col] = {**(c if isinstance(c, dict) else st.column_config.TextColumn()),
                    "width": int(widest + 2 * 8 + 1)}
    return cfg


# The main column at 1280 px with the sidebar open, the narrowest page the dashboard is
# checked at (measured in Chromium), less a row-selection column; st.dataframe wraps a cell's
# text only in rows taller than 4 rem (64 px).
PAGE_PX, SELECT_PX, WRAP_ROW_PX = 818, 34, 65


def fit_page(df: pd.DataFrame, config: dict | None = None,
             selectable: bool = False) -> tuple[dict, int]:
    """`config` with every text column as wide as its longest value, and the row height: when
    those widths outgrow the narrowest page, the widest column is narrowed to what is left and
    its text wraps (taller rows) rather than running past the page's edge."""
    cfg = dict(config or {})
    widths = {}
    for col in df.columns:
        c = cfg.get(col)
        label = c.get("label") if isinstance(c, dict) and c.get("label") else str(col)
        widths[col] = int(max([text_px(str(v)) for v in df[col] if v is not None]
                              + [text_px(label)]) + 2 * 8 + 1)
    over = sum(widths.values()) + (SELECT_PX if selectable else 0) - PAGE_PX
    if over <= 0:
        return fit_columns(df, cfg), ROW_PX
    widest = max(widths, key=widths.get)
    for col, w in widths.items():
        c = cfg.get(col)
        cfg[col] = {**(c if isinstance(c, dict) else st.column_config.TextColumn()),
                    "width": w - over if col == widest else w}
    return cfg, WRAP_ROW_PX


def table(df: pd.DataFrame, **kw: Any) -> None:
    """A dataframe exactly as tall as its rows (no empty filler rows, no inner scrolling up
    to MAX_FIT_ROWS rows)."""
    n = len(df)
    height = HEADER_PX + ROW_PX * max(n, 1) if n <= MAX_FIT_ROWS else "auto"
    kw.setdefault("placeholder", numbers.MISSING)  # never "None" for a missing value
    kw["column_config"] = fit_columns(df, kw.get("column_config"))
    st.dataframe(df, hide_index=True, width="stretch", height=height, **kw)


def text_table(df: pd.DataFrame) -> None:
    """A table whose cells wrap (evidence, errors, assumptions): nothing is cut off."""
    if len(df):
        st.table(df.reset_index(drop=True), hide_index=True)


def verdict_list(items: list[tuple[str, str, list[str]]]) -> None:
    """Verdicts as full-width lines: **point** · verdict, then its evidence; nothing is cut
    off or squeezed into a narrow column."""
    lines = []
    for point, title, evidence in items:
        lines.append(f"- **{point}** · {title}" + (":" if evidence else ""))
        lines += [f"    - {e}" for e in evidence]
    if lines:
        st.markdown("\n".join(lines))


def report_panel(path: Path, what: str) -> None:
    """The static HTML report (`python -m launcher report`): download it, or write it."""
    from launcher.run.rundir import REPORT

    report = Path(path) / REPORT
    with st.container(border=True):
        st.markdown(f"**Report to share** — one self-contained HTML file of this {what} "
                    "(summary table, Pareto chart, verdicts, identity; opens without a server)")
        c1, c2 = st.columns([1, 3])
        if report.is_file():
            c1.download_button("Download report.html", report.read_bytes(),
                               file_name=f"{Path(path).name}-report.html", mime="text/html",
                               key=f"dl_report_{what}", icon=":material/download:")
            c2.caption(f"`{report}` · written {fmt_time(report.stat().st_mtime)} · "
                       f"rewrite it with `python -m launcher report {path}`")
            again = c2.button("Rewrite it now", key=f"rewrite_report_{what}")
        else:
            c2.caption(f"Not written yet: `python -m launcher report {path}` writes `{report}`.")
            again = c1.button("Write report.html", key=f"write_report_{what}",
                              icon=":material/description:")
        if again:
            from launcher import report as report_mod

            with st.spinner("Writing the report…"):
                try:
                    report_mod.write_report(Path(path))
                except Exception as e:  # noqa: BLE001 - say it, keep the page
                    st.error(f"Could not write the report: {type(e).__name__}: {e}")
                    return
            st.rerun()
