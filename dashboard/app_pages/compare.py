"""Compare: two runs side by side, what `python -m launcher diff A B` says (settings,
processes, fingerprint drift, figures against the run-to-run spread) and both runs' curves on
one chart."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from launcher.analysis import compare
from launcher.run import numbers
from launcher.run.rundir import RunDir

ui.header("Compare", need_run=False)
infos = ui.run_infos()
ids = [i.run_id for i in infos]
if len(ids) < 2:
    st.info(f"Comparing needs two runs under `{ui.runs_dir()}`; there "
            f"{'is one' if ids else 'are none'}.")
    st.stop()
by_id = {i.run_id: i for i in infos}

# A and B come from the URL (?a=...&b=...) so a comparison can be shared by its link; by
# default A is the run picked in the sidebar and B the run before it.
for key, default in (("cmp_a", st.session_state.get("run") or ids[0]), ("cmp_b", None)):
    wanted = st.query_params.get(key[-1])
    if wanted in by_id:
        st.session_state[key] = wanted
    elif st.session_state.get(key) not in by_id:
        if default is None:
            a = st.session_state["cmp_a"]
            default = ids[(ids.index(a) + 1) % len(ids)]
        st.session_state[key] = default


def picked() -> None:
    st.query_params["a"], st.query_params["b"] = st.session_state["cmp_a"], st.session_state["cmp_b"]


c1, c2 = st.columns(2)
c1.selectbox("Run A", ids, key="cmp_a", on_change=picked, format_func=ui.run_label)
c2.selectbox("Run B", ids, key="cmp_b", on_change=picked, format_func=ui.run_label)
picked()
info_a, info_b = by_id[st.session_state["cmp_a"]], by_id[st.session_state["cmp_b"]]
for side, info in (("A", info_a), ("B", info_b)):
    label = f" · {info.engine_kind.tag}" if info.engine_kind.tag else ""
    st.caption(f"**{side}** {info.run_id}{label} · "
               f"{ui.STATE_BADGE.get(info.state, info.state)} · {info.topology}")
for why in dict.fromkeys(info_a.study_problems + info_b.study_problems):  # their studies'
    st.error(f"{why}: left out, so the runs are compared from their own files.",
             icon=":material/report:")
tags = list(dict.fromkeys(i.engine_kind.tag for i in (info_a, info_b) if i.engine_kind.tag))
if tags:
    st.warning(f"**{' and '.join(tags)}** — at least one of these runs is not a GB200 "
               "measurement: the comparison checks the pipeline, not GB200 performance.",
               icon=":material/science:")
if info_a.run_id == info_b.run_id:
    st.info("A and B are the same run: pick another for B.")
    st.stop()


@st.cache_data(show_spinner=False, max_entries=16)
def result(a: str, b: str, runs: str, stamp: tuple) -> dict:
    """`stamp`: the runs and their states, so a new repeat or a finished run is seen."""
    return compare.compare(Path(a), Path(b), compare.pool(Path(runs), Path(a), Path(b)))


r = result(str(info_a.path), str(info_b.path), str(ui.runs_dir()),
           tuple((i.run_id, i.state) for i in infos))
sets, drifted, rows = r["settings"], r["drift"], r["figures"]
kind, head, rest = compare.verdict(r)
say = {"single": st.success, "repeat": st.info}.get(kind, st.warning)
say(f"**{head[0].upper()}{head[1:]}**: {rest}.")


def pairs(title: str, items, what: str, none: str) -> None:
    st.subheader(title)
    if items is None:
        st.caption("Unknown: a recipe.yaml is missing or unreadable.")
    elif items:
        ui.text_table(pd.DataFrame([{what: k, "A": compare.show(x), "B": compare.show(y)}
                                    for k, x, y in items]))
    else:
        st.caption(none)


pairs("Settings (resolved recipe)", sets, "setting", "The same.")
pairs("Fingerprint drift", drifted, "item",
      f"Unknown: {' and '.join(r['never_started'])} never started, so there is no "
      "fingerprint to compare." if r.get("never_started") else
      "No drift: the engine, image, packages, driver, GPUs and launcher are the same.")
with st.expander(f"Processes: {len(r['processes'])} difference(s) in argv and environment "
                 "(ports, run directory and node names aside)"):
    st.code("\n".join(r["processes"]) or "the same", language=None)

st.subheader("Curves")


def curve(info, side: str) -> list[dict]:
    """The run's ok sweep points, the figures the table below compares (summary.json, else
    the run's bench/), each with its verdict as the TTFT and Study pages have it."""
    points = list(compare.points(RunDir(info.path)).values())
    verdicts = {v.point: v.label for v in ui.verdicts(info)}
    return [{"run": f"{side}: {ui.run_label(info.run_id)}", "point": f"c={p['max_concurrency']}",
             "concurrency": p["max_concurrency"],
             "verdict": verdicts.get(f"c={p['max_concurrency']}", "no verdict"),
             "tokens_per_s_per_user": p.get("tokens_per_s_per_user"),
             "total_tokens_per_s_per_gpu": p.get("total_tokens_per_s_per_gpu"),
             "ttft_p99_s": (p.get("ttft_p99_ms") or 0) / 1000.0}
            for p in points if isinstance(p, dict) and p.get("status") == "ok"
            and p.get("max_concurrency") is not None]


ok = pd.DataFrame(curve(info_a, "A") + curve(info_b, "B"))
if ok.empty or ok[["tokens_per_s_per_user", "total_tokens_per_s_per_gpu"]].isna().all().any():
    st.info("Neither run has an ok sweep point to draw.")
else:
    ui.altair(charts.pareto(ok.dropna(), None, y="total_tokens_per_s_per_gpu",
                            y_title="tok/s per working GPU", color="run", color_title="run",
                            curves=True, title="tok/s per working GPU vs tok/s per user: "
                                               "A and B"))
    st.caption("x = 1000 ÷ median TPOT (ms); points labelled with max concurrency; each "
               "run's summary (or, without one, its bench/ results).")

st.subheader("Figures, B against A")
reps = r["repeats"]
if rows:
    if reps["a"] or reps["b"]:
        st.caption(f"Run-to-run spread from repeats in the runs directory (the same resolved "
                   f"recipe, no drift): A with {len(reps['a'])}, B with {len(reps['b'])}. "
                   "Outside: a larger change than the widest seen between repeats.")
    else:
        st.caption("Run-to-run spread unknown: no repeat of either run in the runs directory "
                   "(submit --again RUN makes one).")
    # written as `launcher diff` writes them (launcher.numbers), A and B to the same digits
    table = pd.DataFrame([{
        "concurrency": "" if x["concurrency"] is None else numbers.number(x["concurrency"]),
        "figure": x["figure"], **dict(zip(("A", "B"), numbers.same_digits(x["a"], x["b"]),
                                          strict=True)),
        "change": numbers.signed_pct(x["change_pct"]),
        "spread": numbers.MISSING if x.get("spread_pct") is None
        else numbers.number(x["spread_pct"], 1, "%"),
        "vs spread": {True: "outside", False: "within", None: "unknown"}[x.get("outside_spread")],
    } for x in rows])
    ui.table(table, column_config={c: st.column_config.TextColumn(alignment="right")
                                   for c in ("concurrency", "A", "B", "change", "spread")})
else:
    st.caption("No sweep point in both runs.")
