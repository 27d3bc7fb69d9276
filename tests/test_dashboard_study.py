"""A study (`submit --sweep`) in the dashboard: the Study page puts every configuration on one
Pareto chart with the best configuration per interactivity band, each point's verdict and
the P:D recommendation (or why there is none); the Runs page lists a study as one item with
its runs under it. On a synthetic 3-configuration study planned by the real planner."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
import pandas as pd  # noqa: E402
import synth  # noqa: E402
from helpers import open_app  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from launcher.analysis import studies  # noqa: E402
from launcher.run import figures, listing  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("studies")
    synth.study(root)
    synth.healthy(root)
    return root


@pytest.fixture(scope="module")
def study(root) -> listing.Study:
    (s,) = [e for e in listing.entries(root) if isinstance(e, listing.Study)]
    return s


def open_page(root: Path, page: str, monkeypatch, **params: str) -> AppTest:
    at = open_app(root, monkeypatch, **params)
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    parts = []
    for kind in ("title", "markdown", "caption", "info", "warning", "error", "success"):
        parts += [str(e.value) for e in getattr(at, kind)]
    return "\n".join(parts)


def arrow_rows(chart) -> list[dict]:
    import pyarrow as pa

    rows = []
    for d in chart.proto.datasets:
        rows += pa.ipc.open_stream(d.data.data).read_all().to_pylist()
    return rows


def expected_best(study: listing.Study) -> tuple[str, float]:
    """The best configuration by total tok/s per GPU, from launcher.run.figures."""
    best = ("", -1.0)
    for label, path in studies.configs(study):
        for p in figures.summary(path)["points"]:
            v = p["total_tokens_per_s_per_gpu"]
            if p["status"] == "ok" and v and v > best[1]:
                best = (label, v)
    return best


def test_study_is_written_through_the_planner(study):
    assert study.axes == {"prefill.endpoints": [1, 2, 3]}
    labels = [lab for lab, _ in studies.configs(study)]
    assert labels == ["prefill.endpoints=1", "prefill.endpoints=2", "prefill.endpoints=3"]
    gpus = [json.loads((p / "plan.json").read_text())["gpu_count"]["prefill"]
            for _, p in studies.configs(study)]
    assert gpus == [2, 4, 6]  # one DEP2 prefill endpoint per configuration step


def test_study_page_draws_every_configuration(root, study, monkeypatch):
    at = open_page(root, "app_pages/study.py", monkeypatch, study=study.name)
    pareto = at.get("vega_lite_chart")[0]
    spec = json.loads(pareto.proto.spec)
    assert "one curve per configuration" in str(spec.get("title"))
    drawn = {r["config"] for r in arrow_rows(pareto) if "config" in r}
    assert drawn == {"prefill.endpoints=1", "prefill.endpoints=2", "prefill.endpoints=3"}
    body = texts(at)
    best, _ = expected_best(study)
    assert f"**Best configuration:** :green[**{best}**]" in body
    bands = next(d.value for d in at.dataframe if "interactivity" in d.value.columns)
    assert len(bands) >= 2 and bands["interactivity"].str.startswith("≥ ").all()
    assert set(bands["best configuration"]) <= {lab for lab, _ in studies.configs(study)}
    # every point of every configuration has its verdict: configurations × points
    verdicts = next(d.value for d in at.dataframe if "c=64" in d.value.columns)
    assert list(verdicts["configuration"]) == [lab for lab, _ in studies.configs(study)]
    assert list(verdicts.columns[1:]) == ["c=8", "c=16", "c=32", "c=64"]
    assert verdicts.iloc[0]["c=64"] == "prefill-bound"
    assert set(verdicts.iloc[2][1:]) == {"healthy"}
    assert any("Evidence: prefill.endpoints=1 (3 of 4 points not healthy)" in e.label
               for e in at.expander)


def test_study_page_without_the_recommender(root, study, monkeypatch):
    monkeypatch.setitem(sys.modules, "launcher.analysis.recommend", None)  # import fails
    at = open_page(root, "app_pages/study.py", monkeypatch, study=study.name)
    assert any("recommendation is not available" in i.value for i in at.info)


def test_study_page_shows_the_recommendation(root, study, monkeypatch):
    fake = types.ModuleType("launcher.analysis.recommend")
    seen = []

    def recommend(run_dir, target_tokens_per_s_per_user=None):
        seen.append((Path(run_dir).name, target_tokens_per_s_per_user))
        return {"prefill_endpoints": 5, "decode_endpoints": 1, "ratio": "5:1",
                "top_concurrency": 512, "evidence": ["prefill knee at c=32"],
                "confidence": "high", "caveats": [],
                "next_command": "python -m launcher submit r --sweep prefill.endpoints=4,5,6",
                "target_tokens_per_s_per_user": target_tokens_per_s_per_user}

    fake.recommend = recommend
    monkeypatch.setitem(sys.modules, "launcher.analysis.recommend", fake)
    at = open_page(root, "app_pages/study.py", monkeypatch, study=study.name)
    assert any("5 prefill : 1 decode endpoints" in s.value for s in at.success)
    assert "prefill knee at c=32" in texts(at)
    assert any("--sweep prefill.endpoints=4,5,6" in c.value for c in at.code)
    assert seen and seen[0][1] is None
    at.number_input(key="study_rec_target").set_value(40.0).run()
    assert seen[-1][1] == 40.0


def test_study_page_carries_every_caveat_of_the_advice(root, study, monkeypatch):
    """Issue 41 item 3: the advice of the best configuration's run with its confidence, TTFT
    and every caveat the CLI prints, as a warning, never as a success box."""
    from launcher.analysis import recommend

    at = open_page(root, "app_pages/study.py", monkeypatch, study=study.name)
    best, _ = expected_best(study)
    rec = recommend.recommend(dict(studies.configs(study))[best])
    assert rec["caveats"], rec  # the synthetic study's best run has some
    assert not [s.value for s in at.success if "prefill :" in s.value]
    (box,) = [w.value for w in at.warning if "prefill :" in w.value]
    assert f"confidence {rec['confidence']}" in box
    for c in rec["caveats"]:
        assert c in box, box
    assert recommend.ttft_text(rec["predicted"]) in texts(at)


def test_recommender_that_fails_or_says_nothing(tmp_path, monkeypatch):
    fake = types.ModuleType("launcher.analysis.recommend")
    fake.recommend = lambda run_dir, target=None: None
    monkeypatch.setitem(sys.modules, "launcher.analysis.recommend", fake)
    rec, why = studies.recommendation(tmp_path)
    assert rec is None and "no recommendation" in why

    def boom(run_dir, target=None):
        raise ValueError("no decode telemetry")

    fake.recommend = boom
    rec, why = studies.recommendation(tmp_path)
    assert rec is None and "ValueError: no decode telemetry" in why
    del fake.recommend
    assert "no recommend() function" in studies.recommendation(tmp_path)[1]


def test_runs_page_lists_a_study_as_one_item(root, study, monkeypatch):
    at = open_page(root, "app_pages/runs.py", monkeypatch)
    df = at.dataframe[0].value
    names = list(df["run / study"] if "run / study" in df else df["run"])
    head = names.index(f"▾ {study.name}")
    members = [r.run_id for r in study.runs]
    under = [n.strip().removeprefix("└ ").strip() for n in names[head + 1: head + 4]]
    assert sorted(under) == sorted(members)
    row = df.iloc[head]
    assert row["topology"] == "3 configurations"
    assert row["configuration"] == "prefill.endpoints = 1, 2, 3"
    assert "3 succeeded" in row["state"]
    assert any(n == synth_name(root) for n in names)  # the run outside the study


def test_the_cli_and_the_dashboard_list_the_same_runs(root, study, monkeypatch, capsys):
    """`launcher runs` and the Runs page: the same study, the same runs under it, the same
    runs outside it, in the same order."""
    from launcher import cli

    assert cli.main(["runs", f"--runs-dir={root}"]) == 0
    cli_rows = capsys.readouterr().out.splitlines()[1:]
    cli_names = [r.split()[0].rstrip("/") for r in cli_rows]
    at = open_page(root, "app_pages/runs.py", monkeypatch)
    df = at.dataframe[0].value
    page = [n.strip().removeprefix("▾ ").removeprefix("└ ").strip()
            for n in (df["run / study"] if "run / study" in df else df["run"])]
    assert page == cli_names
    assert study.name in page and all(r.run_id in page for r in study.runs)


def synth_name(root: Path) -> str:
    return next(p.name for p in root.iterdir() if p.name.endswith("-healthy"))


def test_a_study_run_links_to_its_study(root, study, monkeypatch):
    run = study.runs[0]
    at = open_page(root, "app_pages/overview.py", monkeypatch, run=run.run_id)
    links = [p for p in at.get("page_link")]
    assert any(study.name in str(p.proto.label) for p in links)


def test_best_per_band_picks_the_most_throughput_at_each_interactivity():
    df = pd.DataFrame([
        {"config": "A", "point": "c=8", "status": "ok", "tokens_per_s_per_user": 80.0,
         "y": 500.0, "verdict": "healthy"},
        {"config": "A", "point": "c=64", "status": "ok", "tokens_per_s_per_user": 30.0,
         "y": 2000.0, "verdict": "healthy"},
        {"config": "B", "point": "c=8", "status": "ok", "tokens_per_s_per_user": 90.0,
         "y": 700.0, "verdict": "healthy"},
        {"config": "B", "point": "c=64", "status": "ok", "tokens_per_s_per_user": 45.0,
         "y": 1800.0, "verdict": "prefill-bound"},
        {"config": "B", "point": "c=128", "status": "failed", "tokens_per_s_per_user": 99.0,
         "y": 9999.0, "verdict": "failed point"},
    ])
    b = studies.best_per_band(df, "y", thresholds=[20, 40, 60, 100])
    assert list(b["at_least"]) == [20, 40, 60]  # nobody reaches 100 (the failed point is out)
    assert list(b["config"]) == ["A", "B", "B"]
    assert list(b["point"]) == ["c=64", "c=64", "c=8"]
    assert studies.bands([30.0, 45.0, 80.0, 90.0]) == [30, 40, 50, 60, 75]
    th = studies.bands([3.0, 12.0, 800.0])
    assert len(th) <= 5 and th[0] <= 3.0 and th[-1] <= 800.0 and th == sorted(th)


def test_the_best_configurations_lead_is_set_against_the_repeats_spread():
    """Issue 28 item 10: a "best configuration" is only as good as its lead over the
    run-to-run spread."""
    y = "total_tokens_per_s_per_gpu"
    rows = [("prefill.endpoints=1", 4000), ("prefill.endpoints=2", 5100),
            ("prefill.endpoints=2 (20261201-000000-x_endpoints2)", 4700),
            ("prefill.endpoints=3", 5000)]
    ok = pd.DataFrame([{"config": c, y: v} for c, v in rows])
    m = studies.lead_and_spread(ok, y)
    assert m["best"] == "prefill.endpoints=2" and m["second"] == "prefill.endpoints=3"
    assert abs(m["lead"] - 0.02) < 1e-9 and abs(m["spread"] - (5100 / 4700 - 1)) < 1e-9
    assert m["outside"] is False and m["repeated"] == 1
    once = ok[~ok["config"].str.contains(r"\(")]
    m = studies.lead_and_spread(once, y)
    assert m["spread"] is None and m["outside"] is None and m["lead"] > 0
    assert studies.lead_and_spread(ok[ok["config"] == "prefill.endpoints=1"], y) is None
