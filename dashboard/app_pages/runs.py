"""Runs: every run directory with its state, recipe and topology."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import ui

ui.header("Runs", need_run=False)
infos = ui.run_infos()
if not infos:
    st.info(f"No run directories under `{ui.runs_dir()}`. Start one with "
            "`python -m launcher submit RECIPE` (or `--dry-run` to see what it would do).")
    st.stop()

now = time.time()
rows = []
for i in infos:
    end = i.ended or (now if i.live else None)
    rows.append({
        "run": i.run_id,
        "state": ui.STATE_BADGE.get(i.state, i.state),
        "engine": "SIMULATION" if i.simulated else (i.engine or "—"),
        "recipe": i.recipe or "—",
        "topology": i.topology,
        "GPUs": i.gpus,
        "sweep points": i.points,
        "telemetry": "yes" if i.has_telemetry else "no",
        "started": ui.fmt_time(i.started),
        "duration": ui.fmt_duration(end - i.started if end and i.started else None),
        "stage / error": i.error or (i.stage if i.live else "") or "",
    })
df = pd.DataFrame(rows)
c1, c2, c3, c4 = st.columns(4)
c1.metric("Runs", len(infos))
c2.metric("Live", sum(i.live for i in infos))
c3.metric("Failed", sum(i.state == "failed" for i in infos))
c4.metric("Simulated", sum(i.simulated for i in infos))
st.dataframe(df, hide_index=True, width="stretch",
             column_config={"GPUs": st.column_config.NumberColumn(format="%d"),
                            "stage / error": st.column_config.TextColumn(width="large")})
st.caption("Pick a run in the sidebar; the other pages show the selected run. "
           "SIMULATION runs use the launcher's simulated engine, not vLLM on GPUs.")
empty = [i.run_id for i in infos if i.state == "empty"]
if empty:
    st.caption("Empty run directories (nothing written yet): " + ", ".join(empty))
