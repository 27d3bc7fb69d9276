"""Study: every configuration of a `--sweep` study on one Pareto chart, the best
configuration per interactivity band, each point's verdict and the P:D recommendation."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from launcher.analysis import load, studies
from launcher.run import published, slo, slo_answer
from launcher.run.figures import allocated_gpus, harness_of

ui.header("Study", need_run=False)
all_studies = ui.studies()
if not all_studies:
    st.info(f"No study under `{ui.runs_dir()}`. A study is the runs of one "
            "`python -m launcher submit RECIPE --sweep prefill.endpoints=4,5,6,7,8` "
            "(one run per configuration, in one directory with a study.json).")
    st.stop()

current = ui.selected_study()
names = [s.name for s in all_studies]


def picked() -> None:
    st.query_params["study"] = st.session_state["study"]


if current is not None and st.session_state.get("study") != current.name:
    st.session_state["study"] = current.name
st.selectbox("Study", names, key="study", on_change=picked,
             help="Every study under the runs directory, newest first.")
st.query_params["study"] = st.session_state["study"]
study = next(s for s in all_studies if s.name == st.session_state["study"])



def members_now() -> list:
    """(configuration label, RunInfo) per run of the study, re-read (live refresh)."""
    by_path = {str(i.path): i for i in ui.run_infos()}
    return [(lab, by_path[str(p)]) for lab, p in studies.configs(study) if str(p) in by_path]


members = members_now()
axes = ", ".join(f"{k} = {', '.join(map(str, v))}" for k, v in study.axes.items())
axis_title = " · ".join(study.axes) or "configuration"
states: dict[str, int] = {}
for _, m in members:
    b = ui.STATE_BADGE.get(m.state, m.state)
    states[b] = states.get(b, 0) + 1
st.caption(" · ".join(x for x in (
    f"**{study.name}**", f"recipe: {study.doc.recipe or '—'}",
    f"swept: {axes}" if axes else "", f"{len(members)} configurations",
    ", ".join(f"{n} {s}" for s, n in states.items())) if x))
for why in study.problems():  # its damaged files (study.json, allocation.json)
    st.error(f"{why}: left out, so what is shown comes from its runs.",
             icon=":material/report:")
tags = list(dict.fromkeys(m.engine_kind.tag for _, m in members if m.engine_kind.tag))
if tags:
    st.warning(f"**{' and '.join(tags)}** — these runs are not GB200 measurements: the "
               "comparison checks the pipeline, not GB200 performance.",
               icon=":material/science:")
if not members:
    st.info("This study's directory holds no run directories yet.")
    st.stop()
facts = studies.allocation_facts(study)
if len(facts) > 1:
    with st.expander("Allocation: " + facts[0][1], expanded=False):
        st.table(pd.DataFrame(facts[1:], columns=["", "value"]).set_index(""))
else:
    st.caption(f"Ran as {facts[0][1]}.")


def body() -> None:
    members = members_now()
    live = [(lab, m) for lab, m in members if m.live]
    for lab, m in live:
        line = ui.progress_line(m)
        st.info(f"Live: **{lab}** ({m.run_id}) is {m.state}"
                f"{', stage ' + m.stage if m.stage else ''}{': ' + line if line else ''}.",
                icon=":material/autorenew:")
    slo_section()
    frames = []
    for lab, m in members:
        t = ui.points(m)
        if t.empty:
            continue
        t = studies.verdict_columns(t)
        t["config"], t["run"] = lab, m.run_id
        frames.append(t)
    if not frames:
        st.info("No configuration has sweep results yet.")
        return
    table = pd.concat(frames, ignore_index=True)
    ok = table[table["status"] == "ok"]

    c1, c2 = st.columns([2, 1])
    y = c1.selectbox("Throughput measure (y)", list(studies.MEASURES),
                     format_func=studies.MEASURES.get, key="study_y")
    if ok.empty or ok[y].isna().all():
        st.info("No ok sweep point has this measure (an aggregated run has no per-prefill or "
                "per-decode figure).")
        return
    front = studies.envelope(table, y)
    cmp = studies.published_comparison(
        [(lab, ui.plan(m), studies.points_of_table(table[table["config"] == lab]))
         for lab, m in members])
    ref = cmp["reference"] if y == published.MEASURE and cmp["matched"] else None
    ui.altair(charts.pareto(ok.dropna(subset=[y]), front, y=y, y_title=studies.MEASURES[y],
                            color="config", color_title=axis_title, curves=True,
                            reference=ref,
                            title=f"{studies.SHORT[y]} vs tok/s per user, one curve per "
                                  "configuration" + ("" if ref is None else
                                                     ", and the published Pareto")))
    st.caption(f"y = {studies.MEASURES[y]}. Each curve is one configuration's sweep (points "
               "labelled with max concurrency, shaped by their verdict); dashed: the Pareto "
               "frontier over every configuration; x = 1000 ÷ median TPOT (ms)."
               + (" Dotted curves with hollow diamonds, in the colour of the configuration "
                  f"they match: the published Pareto ({published.precision_text()})."
                  if ref is not None else ""))
    published_section(cmp, y)

    best = ok.loc[ok[y].idxmax()]
    c2.markdown(f"**Best configuration:** :green[**{best['config']}**]  \n"
                f"{ui.num(best[y])} {studies.SHORT[y]} at {best['point']}, "
                f"{ui.num(best['tokens_per_s_per_user'], 1)} tok/s per user")
    margin = studies.lead_and_spread(ok, y)
    if margin is not None and margin["lead"] is not None:
        lead = f"{margin['lead']:.1%} ahead of {margin['second']}"
        if margin["spread"] is None:
            c2.caption(f"{lead}; each configuration ran once, so the run-to-run spread is "
                       "not measured: repeat the top two to know whether the lead is real.")
        else:
            where = "outside" if margin["outside"] else "inside"
            c2.caption(f"{lead}; repeats of one configuration differ by up to "
                       f"{margin['spread']:.1%}: the lead is **{where}** that spread.")

    st.subheader("Best configuration per interactivity band")
    bands = studies.best_per_band(table, y)
    if bands.empty:
        st.info("No ok point has a tok/s-per-user figure.")
    else:
        show = pd.DataFrame({
            "interactivity": [f"≥ {b:g} tok/s per user" for b in bands["at_least"]],
            "best configuration": bands["config"], "at point": bands["point"],
            studies.SHORT[y]: bands[y], "tok/s per user": bands[studies.X],
            "verdict there": bands["verdict"]})
        show, cfg = ui.numbers_as_text(show, {studies.SHORT[y]: 0, "tok/s per user": 1}, {
            studies.SHORT[y]: st.column_config.TextColumn(help=studies.MEASURES[y])})
        ui.table(show, column_config=cfg)
        st.caption("For a user who needs at least that many tokens per second: the "
                   "configuration with the most throughput among points that deliver it.")

    st.subheader("Configurations")
    rows = []
    short = studies.SHORT[y]
    all_done = all(m.state == "succeeded" for _, m in members)
    harnesses: set[str] = set()
    for lab, m in members:
        t = ok[ok["run"] == m.run_id]
        b = t.loc[t[y].idxmax()] if not t.empty and t[y].notna().any() else None
        acc = load.read_accuracy(m.path)
        plan = ui.plan(m)
        gpus = (f"{plan.gpus()} / {allocated_gpus(plan)}" if plan else "—")
        harnesses.update([harness_of(acc)] if acc else [])
        rows.append({"configuration": lab, "run": f"./overview?run={m.run_id}",
                     "state": ui.STATE_BADGE.get(m.state, m.state),
                     "topology": ui.shapes(plan) if plan else m.topology, "GPUs": gpus,
                     "best y": None if b is None else b[y],
                     "at": "—" if b is None else b["point"],
                     "tok/s/user": None if b is None else b["tokens_per_s_per_user"],
                     "GSM8K": "—" if not acc else
                     f"{ui.pct(acc.get('accuracy'))} {'pass' if acc.get('passed') else 'FAIL'}"})
    cfg = pd.DataFrame(rows)
    if all_done:
        cfg = cfg.drop(columns=["state"])  # the caption above says they all succeeded
    cfg, conf = ui.numbers_as_text(cfg, {"best y": 0, "tok/s/user": 1}, {
        "best y": st.column_config.TextColumn(
            f"best {short}", help=f"{studies.MEASURES[y]} at the configuration's best point"),
        "tok/s/user": st.column_config.TextColumn(help="at that point")})
    ui.table(cfg, column_config=conf | {
        "run": st.column_config.LinkColumn("run", display_text="overview ↗",
                                           help="opens the run's Overview"),
        "GPUs": st.column_config.TextColumn(help="working (prefill and decode endpoints) / "
                                                 "allocated (nodes × GPUs per node)"),
        "GSM8K": st.column_config.TextColumn(
            help="accuracy and verdict, as scored by the " + (", ".join(sorted(harnesses))
                                                             or "accuracy") + " harness")})

    st.subheader("Verdict per sweep point")
    pivot = table.pivot_table(index="config", columns="point", values="verdict",
                              aggfunc="first", sort=False)
    order = sorted(pivot.columns, key=lambda p: table.loc[table["point"] == p,
                                                          "concurrency"].min())
    pivot = pivot[order].reindex([lab for lab, _ in members if lab in pivot.index])
    ui.table(pivot.reset_index().rename(columns={"config": "configuration"}).fillna("—"))
    failed = table[table["status"] != "ok"]
    if not failed.empty:
        st.caption(f"{len(failed)} failed point(s) are left out of the charts.")
    for lab, _m in members:
        t = table[table["config"] == lab]
        if t.empty:
            continue
        bad = int((t["verdict_kind"] != "healthy").sum())
        with st.expander(f"Evidence: {lab} ({bad} of {len(t)} points not healthy)"):
            ui.verdict_list([(r.point, r.verdict_title, r.evidence.split("; ")
                              if r.evidence else []) for r in t.itertuples()])

    lat = []
    for q in ("p50", "p99"):
        col = f"ttft_{q}_s"
        if col in ok:
            lat.append(ok[["config", "concurrency"]].assign(stat=q, value=ok[col] * 1000.0))
    if lat:
        d = pd.concat(lat, ignore_index=True).dropna(subset=["value"])
        if not d.empty:
            ui.altair(charts.latency_vs_concurrency(
                d, metric="TTFT", title="TTFT p50/p99 vs concurrency per configuration",
                color="config", color_title=axis_title, legend_right=True))

    recommendation_section(best, members)
    ui.report_panel(study.path, "study")


def slo_section() -> None:
    """Under benchmark.slo: the answer in one sentence, each configuration's frontier and,
    per limit, every point against the limit's line (launcher.run.slo_answer)."""
    ans = slo_answer.answer(study.configurations())
    if ans is None:
        return
    st.subheader("SLO: the best configuration under the limits")
    (st.success if ans.best else st.warning)(ans.sentence, icon=":material/flag:")
    st.caption(f"Each configuration searched for the highest concurrency meeting every limit "
               f"of {ans.limits}: probing up by doubling from its first concurrency, then "
               f"bisecting between the last passing and the first failing point to within "
               f"{ans.precision:.0%}, on the same engines. A point that fails in any other "
               "way (errors, zero tokens, the accuracy gate) never passes.")
    rows = [{"configuration": f.label, "largest passing": f.passing,
             "first failing": f.failing,
             "tok/s per working GPU": f.best.per_gpu if f.best else None,
             "per allocated GPU": f.best.per_allocated_gpu if f.best else None,
             "not named because": f.excluded} for f in ans.frontiers]
    table = pd.DataFrame(rows)
    if table["not named because"].isna().all():
        table = table.drop(columns=["not named because"])
    show, cfg = ui.numbers_as_text(table, {"largest passing": 0, "first failing": 0,
                                           "tok/s per working GPU": 0,
                                           "per allocated GPU": 0})
    ui.table(show, column_config=cfg)
    for f in ans.frontiers:
        st.caption(f"{f.label}: {f.outcome}.")
    for lim in slo.parse(ans.limits):
        df = pd.DataFrame([{"config": f.label, "concurrency": p.concurrency,
                            "value": p.values_ms.get(lim.name),
                            "result": "passes" if p.passed else "fails", "why": p.why}
                           for f in ans.frontiers for p in f.points]).dropna(subset=["value"])
        if df.empty:
            continue
        ui.altair(charts.slo_frontier(df, limit_ms=lim.value_ms, limit_text=lim.text,
                                      metric=lim.name, color_title=axis_title))


def published_section(cmp: dict, y: str) -> None:
    """The ratio of each measured point to the published one (launcher.run.published)."""
    st.subheader("Against the published Pareto")
    src = f"{published.precision_text()}; {published.source_text()}"
    if not cmp["matched"]:
        why = "; ".join(f"{lab}: {w}" for lab, w in cmp["not_comparable"].items())
        st.caption(f"The published Pareto ({src}) is not drawn: no configuration of this "
                   f"study is the published workload ({why}).")
        return
    if cmp["simulated"]:
        st.warning("**SIMULATION** — the measured side of these ratios is the launcher's "
                   "simulated engine (a speed model), not a GB200 measurement: they check the "
                   "comparison, not performance.", icon=":material/science:")
    st.caption(f"Published points {src}. Ratio = measured total tok/s per **working** GPU "
               "(÷ GPUs of the prefill and decode endpoints; which denominator the published "
               "figure used is not known: srt-slurm v1.0.32 divided by the allocated GPUs, "
               "v1.0.39 on by the working ones, so the per-allocated-GPU figure is beside it) "
               "÷ the published total tok/s/GPU at the same configuration and max "
               "concurrency; where the figure has no point at a concurrency the row says so "
               "(nothing is interpolated). The range is the ratio over the reading "
               "precision." + ("" if y == published.MEASURE else
                               " The published curves are drawn on the per-working-GPU "
                               "measure only."))
    if cmp["not_comparable"]:
        st.caption("Not compared: " + "; ".join(f"{lab}: {w}"
                                                for lab, w in cmp["not_comparable"].items()))
    r = cmp["ratios"]
    ui.table(studies.ratio_grid(r))
    st.caption("Measured ÷ published total tok/s per working GPU, per configuration and max "
               "concurrency. *no published point*: the figure has none at that concurrency; "
               "*not measured*: this study did not run it; *failed*: the point failed; —: "
               "neither measured nor published.")
    with st.expander(f"Every point: measured, published, ratio and its range ({len(r)} rows)"):
        show = r[list(studies.RATIO_COLUMNS)].rename(columns=studies.RATIO_COLUMNS)
        for k in ("measured", "measured_per_allocated_gpu", "published", "ratio",
                  "measured_tokens_per_s_per_user", "published_tokens_per_s_per_user"):
            show[studies.RATIO_COLUMNS[k]] = pd.to_numeric(show[studies.RATIO_COLUMNS[k]],
                                                           errors="coerce")
        fmt = {studies.RATIO_COLUMNS[k]: st.column_config.NumberColumn(format=f)
               for k, f in (("measured", "%.0f"), ("measured_per_allocated_gpu", "%.0f"),
                            ("published", "%.0f"), ("ratio", "%.2f"),
                            ("measured_tokens_per_s_per_user", "%.1f"),
                            ("published_tokens_per_s_per_user", "%.1f"))}
        ui.table(show, column_config=fmt)


def recommendation_section(best: pd.Series, members: list) -> None:
    st.subheader("P:D recommendation")
    labels = [lab for lab, _ in members]
    runs = {lab: m for lab, m in members}
    c1, c2, c3 = st.columns([2, 1, 1])
    default = labels.index(best["config"]) if best["config"] in labels else 0
    lab = c1.selectbox("From the run of configuration", labels, index=default,
                       key="study_rec_config",
                       help="The recommender reads one run (its KV capacity and sweep).")
    target = c2.number_input("Target tok/s per user (0: none)", min_value=0.0, value=0.0,
                             step=5.0, key="study_rec_target")
    ttft = c3.number_input("Target TTFT ms (0: none)", min_value=0.0, value=0.0, step=100.0,
                           key="study_rec_ttft", help="Mean time to first token to stay under.")
    rec, why = studies.recommendation(runs[lab].path, target or None, ttft or None)
    if rec is None:
        st.info(f"The P:D recommendation is not available: {why}.")
        return
    adv = studies.advice(rec)
    # only a high-confidence advice without caveats is good news; the rest is a warning
    text = f"**{adv['head']}**" + (f"; confidence {adv['confidence']}"
                                   if adv["confidence"] else "")
    if adv["good"]:
        st.success(text, icon=":material/recommend:")
    else:
        st.warning(text + "".join(f"\n- {c}" for c in adv["caveats"]),
                   icon=":material/warning:")
    if adv["figures"]:
        st.markdown(adv["figures"][0].upper() + adv["figures"][1:] + ".")
    for e in rec.get("evidence") or []:
        st.markdown(f"- {e}")
    if rec.get("next_command"):
        st.markdown("Next run to try:")
        st.code(str(rec["next_command"]), language="bash", wrap_lines=True)


if any(m.live for _, m in members):
    st.fragment(body, run_every=ui.LIVE_EVERY_S)()
else:
    body()
