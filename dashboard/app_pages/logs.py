"""Logs: errors and warnings per process, and the tail of any process log."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import ui
from launcher.analysis import load

info = ui.header("Logs")
if info is None:
    st.stop()


@st.cache_data(max_entries=256, show_spinner=False)
def scan(path: str, size: int, mtime: int) -> dict:
    # Keyed by size and mtime: an unchanged log is never read twice.
    return load.scan_log(Path(path))


def body(info) -> None:  # the run as re-read at each live refresh
    logs = load.list_logs(info.path)
    if not logs:
        st.info("No logs/ in this run yet: no process has been started."
                if info.state != "failed" else
                "The run failed before any process wrote a log; see the error above and "
                "the Slurm output under slurm/.")
        return
    rows, scans = [], {}
    for p in logs:
        stt = p.stat()
        s = scan(str(p), stt.st_size, stt.st_mtime_ns)
        scans[p.stem] = s
        rows.append({"process": p.stem, "state": info.processes.get(p.stem, "—"),
                     "errors": s["errors"], "warnings": s["warnings"],
                     "lines": s["lines"], "size (KiB)": round(stt.st_size / 1024, 1),
                     "last write": ui.fmt_time(stt.st_mtime)})
    df = pd.DataFrame(rows).sort_values(["errors", "warnings"], ascending=False)
    died = {n: s for n, s in info.processes.items() if s.startswith("exit ") or s == "lost"}
    if died:
        st.error("Ended on their own or lost with their node: " + ", ".join(
            f"**{n}** ({s})" for n, s in sorted(died.items())) + ". Their logs are below.")
    c1, c2, c3 = st.columns(3)
    c1.metric("Processes with logs", len(rows))
    c2.metric("Error lines", int(df["errors"].sum()))
    c3.metric("Warning lines", int(df["warnings"].sum()))
    ui.table(df)
    procs = list(df["process"])
    pick = st.selectbox("Process", procs, key="log_process")
    s = scans[pick]
    t_err, t_warn, t_tail = st.tabs([f"Errors ({s['errors']})", f"Warnings ({s['warnings']})",
                                     "Tail"])
    with t_err:
        if s["error_lines"]:
            st.code("\n".join(s["error_lines"]), language=None)
        else:
            st.success("No error lines.")
    with t_warn:
        if s["warning_lines"]:
            st.code("\n".join(s["warning_lines"]), language=None)
        else:
            st.success("No warning lines.")
    with t_tail:
        n = st.slider("Lines", 20, 1000, 200, step=20, key="log_tail_n")
        st.code("\n".join(load.tail(info.path / "logs" / f"{pick}.log", n)) or "(empty)",
                language=None)


ui.live(info, body)
