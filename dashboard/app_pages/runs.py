"""Runs: every run directory with its state, recipe and topology; a study (`--sweep`) is one
item with its runs under it, in the order `launcher runs` prints them."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import ui
from launcher.analysis import load, studies
from launcher.run import listing

ui.header("Runs", need_run=False)
infos = ui.run_infos()
if not infos:
    st.info(f"No run directories under `{ui.runs_dir()}`. Start one with "
            "`python -m launcher submit RECIPE` (or `--dry-run` to see what it would do).")
    st.stop()

now = time.time()
by_path = {str(i.path): i for i in infos}


def duration(i: load.RunInfo) -> str:
    end = i.ended or (now if i.live else None)
    return ui.fmt_duration(end - i.started if end and i.started else None)


def run_row(i: load.RunInfo, name: str, config: str = "") -> dict:
    return {
        "run": name, "open": f"./overview?run={i.run_id}", "configuration": config,
        "state": "dry-run" if i.dry_run else ui.STATE_BADGE.get(i.state, i.state),
        "engine": "SIMULATION" if i.simulated else "vLLM (CPU)" if i.on_cpu else (i.engine or "—"),
        "topology": i.topology, "GPUs": i.gpus,  # the recipe is in the run's name
        "points": i.points,
        "started": ui.fmt_time(i.started), "duration": duration(i),
        "stage / error": i.error or (ui.progress_line(i) or i.stage if i.live else "") or "",
        "_page": "app_pages/overview.py", "_query": {"run": i.run_id},
    }


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
        started = [m.started for m in members if m.started]
        rows.append({
            "run": f"▾ {e.name}", "open": f"./study?study={e.name}",
            "configuration": axes or "?",
            "state": ", ".join(f"{n} {s}" for s, n in states.items()) or "—",
            "engine": "SIMULATION" if any(m.simulated for m in members) else
            "vLLM (CPU)" if any(m.on_cpu for m in members) else
            (members[0].engine if members else "—") or "—",
            "recipe": str(e.doc.get("recipe") or (members[0].recipe if members else "—")),
            "topology": f"{len(members)} configurations", "GPUs": None,
            "sweep points": sum(m.points for m in members),
            "started": ui.fmt_time(min(started) if started else None), "duration": "",
            "stage / error": "; ".join(f"{m.run_id}: {m.error}" for m in members if m.error),
            "_page": "app_pages/study.py", "_query": {"study": e.name},
        })
        labels = dict((str(p), lab) for lab, p in studies.configs(e))
        for m in members:
            rows.append(run_row(m, f"    └ {m.run_id}", labels.get(str(m.path), "")))
    else:
        i = by_path.get(str(e.path))
        if i is not None:
            rows.append(run_row(i, i.run_id))

c1, c2, c3, c4, c5 = st.columns(5)
c1.metric("Runs", len(infos))
c2.metric("Studies", sum(isinstance(e, listing.Study) for e in entries))
c3.metric("Live", sum(i.live for i in infos))
c4.metric("Failed", sum(i.state == "failed" for i in infos))
c5.metric("Simulated", sum(i.simulated for i in infos))

df = pd.DataFrame(rows)
show = df.drop(columns=[c for c in df.columns if c.startswith("_")])
if not show["configuration"].astype(bool).any():
    show = show.drop(columns=["configuration"])
event = st.dataframe(
    show, hide_index=True, width="stretch", key="runs_table", on_select="rerun",
    selection_mode="single-row",
    height=ui.HEADER_PX + ui.ROW_PX * len(show) if len(show) <= 40 else "auto",
    column_config={
        "run": st.column_config.TextColumn("run / study"),
        "open": st.column_config.LinkColumn("open", display_text="open ↗", width="small",
                                            help="opens in a new tab"),
        "stage / error": st.column_config.TextColumn(width="large"),
        "configuration": st.column_config.TextColumn(
            width="medium", help="a study's swept values; under it, each run's"),
        "GPUs": st.column_config.NumberColumn(format="%d", width="small"),
        "points": st.column_config.NumberColumn(format="%d", width="small",
                                                help="sweep points measured"),
        "started": st.column_config.TextColumn(width="medium"),
    })
st.caption("Select a row to open it here (a study opens its Study page, a run its Overview), "
           "or use *open ↗* for a new tab. A study (`submit --sweep`) is one item with its "
           "configurations' runs under it. SIMULATION runs use the launcher's simulated "
           "engine, not vLLM on GPUs; vLLM (CPU) runs use real vLLM built for CPU on a tiny "
           "model, not GPUs either.")
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
