"""The dashboard's entry point.

    streamlit run dashboard/app.py -- --runs RUNS_DIR
    python -m launcher dashboard [RUNS_DIR]          # the CLI calls dashboard.serve()

RUNS_DIR holds run directories (or is one). Also read from $PD_DASHBOARD_RUNS.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# `streamlit run dashboard/app.py` puts dashboard/ (not the repo root) on sys.path.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import ui  # noqa: E402


def parse_runs_arg(argv: list[str]) -> str | None:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--runs", default=None)
    known, _ = ap.parse_known_args(argv)
    return known.runs


def main() -> None:
    st.set_page_config(page_title="P/D vLLM runs", page_icon=":material/monitoring:",
                       layout="wide")
    if "runs_dir" not in st.session_state:
        st.session_state["runs_dir"] = (parse_runs_arg(sys.argv[1:])
                                        or os.environ.get(ui.RUNS_ENV) or "runs")
    infos = ui.run_infos()
    ids = [i.run_id for i in infos]
    # The run comes from the URL (?run=...) first, so a page can be shared by its link;
    # likewise the study (?study=...).
    wanted = st.query_params.get("run")
    if wanted in ids:
        st.session_state["run"] = wanted
    elif ids and st.session_state.get("run") not in ids:
        st.session_state["run"] = ids[0]
    wanted_study = st.query_params.get("study")
    if wanted_study and wanted_study in {s.name for s in ui.studies()}:
        st.session_state["study"] = wanted_study

    def picked() -> None:
        st.query_params["run"] = st.session_state["run"]

    with st.sidebar:
        st.markdown(f"**Runs directory**  \n`{ui.runs_dir()}`")
        if ids:
            by_id = {i.run_id: i for i in infos}
            st.selectbox("Run", ids, key="run", on_change=picked, format_func=ui.run_label,
                         help="The run the Overview, Sweep, KV cache, TTFT, GPUs and Logs "
                              "pages show. Studies are listed on the Runs page.")
            cur = by_id.get(st.session_state.get("run"))
            if cur is not None:
                bits = [f":{ui.STATE_COLOR.get(cur.state, 'gray')}"
                        f"[{ui.STATE_BADGE.get(cur.state, cur.state)}]"]
                if cur.engine_kind.tag:
                    bits.append(cur.engine_kind.tag)
                if cur.study:
                    bits.append(f"study `{cur.study}`")
                st.caption(" · ".join(bits))
        else:
            st.caption("No runs yet.")
        st.radio("Time axis", ui.TIME_AXES, key="time_axis",
                 help="Wall clock: this host's time zone, the times of the logs and of "
                      "events.jsonl. Or seconds since the job started (run.json).")
    if st.session_state.get("run"):
        st.query_params["run"] = st.session_state["run"]
    (home_path, home_title, home_icon, home_url), *rest = ui.PAGES
    # Streamlit serves the default page at "/" only; "/runs", like every other page's own
    # path, would open "Page not found". A hidden page there hands over to it.
    home = st.Page(home_path, title=home_title, icon=home_icon, url_path="home", default=True)

    def to_home() -> None:
        st.switch_page(home, query_params=st.query_params.to_dict())

    pages = [home, *(st.Page(path, title=title, icon=icon, url_path=url)
                     for path, title, icon, url in rest),
             st.Page(to_home, title=home_title, url_path=home_url, visibility="hidden")]
    st.navigation(pages, position="sidebar", expanded=True).run()


if __name__ == "__main__":
    main()
