"""Runs: every run directory with its state, recipe and topology; a study (`--sweep`) is one
item with its runs under it, in the order `launcher runs` prints them."""

from __future__ import annotations

import re

import pandas as pd
import streamlit as st

from dashboard import ui
from launcher.analysis import load, studies
from launcher.run import listing, numbers

ui.header("Runs", need_run=False)
infos = ui.run_infos()
if not infos:
    st.info(f"No run directories under `{ui.runs_dir()}`. Start one with "
            "`python -m launcher submit RECIPE` (or `--dry-run` to see what it would do).")
    st.stop()

by_path = {str(i.path): i for i in infos}


def run_row(i: load.RunInfo, name: str, config: str = "") -> dict:
    # what identifies a run, so the table fits the page at 1280 px: the recipe and start time
    # are in its name, errors and live stages in full under the table, the rest on its pages
    state = "dry-run" if i.dry_run else ui.STATE_BADGE.get(i.state, i.state)
    if i.live and i.stage:
        state = f"{state} ({i.stage})"
    return {
        "run": name, "state": state, "configuration": config,
        "engine": i.engine_kind.tag or i.engine or "—",
        "topology": compact_topology(i),
        "stage / error": i.error or (ui.progress_line(i) or i.stage if i.live else "") or "",
        "_page": "app_pages/overview.py", "_query": {"run": i.run_id},
    }


def compact_topology(i: load.RunInfo) -> str:
    """'D 1×DEP4 · P 2×DEP2': the topology the page headers spell out (with its GPUs), short
    (a shape says its GPUs: DEP4 is 4)."""
    t = re.sub(r"(\d+) (decode|prefill|agg) ", lambda m: f"{m[2][0].upper()} {m[1]}×",
               i.topology)
    return re.sub(r" \(\d+ GPUs?\)$", "", t).replace(" + ", " · ")


rows = []
entries = listing.entries(ui.runs_dir())
for e in entries:
    if isinstance(e, listing.Study):
        members = [by_path[str(r.path)] for r in e.runs if str(r.path) in by_path]
        states: dict[str, int] = {}
        for m in members:
            b = ui.STATE_BADGE.get(m.state, m.state)
            states[b] = states.get(b, 0) + 1
        axes = ", ".join(f"{k} = {', '.join(map(str, v))}" for k, v in e.axes.items())
        rows.append({
            "run": f"▾ {e.name}",
            "state": ", ".join(f"{n} {s}" for s, n in states.items()) or "—",
            "configuration": axes or "?",
            "engine": next((m.engine_kind.tag for m in members if m.engine_kind.tag), "")
            or (members[0].engine if members else "—") or "—",
            "topology": f"{len(members)} configurations",
            "stage / error": "; ".join(f"{m.run_id}: {m.error}" for m in members if m.error),
            "_page": "app_pages/study.py", "_query": {"study": e.name},
        })
        labels = dict((str(p), lab) for lab, p in studies.configs(e))
        for m in members:
            rows.append(run_row(m, f"  └ {m.run_id}", labels.get(str(m.path), "")))
    else:
        i = by_path.get(str(e.path))
        if i is not None:
            rows.append(run_row(i, i.run_id))

for e in entries:  # a study's damaged files (study.json, allocation.json)
    if isinstance(e, listing.Study):
        for why in e.problems():
            st.error(f"{why}: left out, so its runs are listed without it.",
                     icon=":material/report:")

c1, c2, c3, c4, c5 = st.columns(5)
c1.metric("Runs", len(infos))
c2.metric("Studies", sum(isinstance(e, listing.Study) for e in entries))
c3.metric("Live", sum(i.live for i in infos))
c4.metric("Failed", sum(i.state == "failed" for i in infos))
c5.metric("Simulated", sum(i.engine_kind.speed_modelled for i in infos))  # a model's figures

df = pd.DataFrame(rows)
show = df.drop(columns=[c for c in df.columns if c.startswith("_")] + ["stage / error"])
if not show["configuration"].astype(bool).any():
    show = show.drop(columns=["configuration"])
columns, row_px = ui.fit_page(show, {
    "run": st.column_config.TextColumn("run / study", help="its name begins with its "
                                       "start time (YYYYMMDD-HHMMSS) and its recipe"),
    "configuration": st.column_config.TextColumn(
        help="a study's swept values; under it, each run's"),
    "topology": st.column_config.TextColumn(
        help="D = decode, P = prefill endpoints (count × shape); A = aggregated"),
}, selectable=True)
event = st.dataframe(
    show, hide_index=True, width="stretch", key="runs_table", on_select="rerun",
    selection_mode="single-row", row_height=row_px,
    height=ui.HEADER_PX + row_px * len(show) if len(show) <= 40 else "auto",
    placeholder=numbers.MISSING, column_config=columns)
st.caption("Select a row to open it (a study opens its Study page, a run its Overview). A "
           "study (`submit --sweep`) is one item with its configurations' runs under it. "
           "SIMULATION runs use the launcher's simulated engine, not vLLM on GPUs; vLLM (CPU) "
           "runs use real vLLM built for CPU on a tiny model, not GPUs either. Each run's "
           "duration, points and figures: `python -m launcher runs` or its Overview.")
errors = [(r["run"].strip(" └▾"), r["stage / error"]) for r in rows
          if r["stage / error"] and not r["_page"].endswith("study.py")]
if errors:
    with st.expander(f"Errors and live stages in full ({len(errors)})"):
        ui.text_table(pd.DataFrame(errors, columns=["run", "stage / error"]))
empty = [i.run_id for i in infos if i.state == "empty"]
if empty:
    st.caption("Empty run directories (nothing written yet): " + ", ".join(empty))

sel = list(getattr(getattr(event, "selection", None), "rows", []) or [])
if sel:
    key = (tuple(sel), len(rows))
    if st.session_state.get("_runs_nav") != key:  # a new selection, not a return visit
        st.session_state["_runs_nav"] = key
        row = rows[sel[0]]
        st.switch_page(row["_page"], query_params=row["_query"])
