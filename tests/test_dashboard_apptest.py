"""Every dashboard page renders under Streamlit's AppTest, on the runs a user meets: a healthy
(demo-like) run, an empty run directory, a failed run and a 72-GPU run; and says what it
should (simulation label, failure, empty explanation, charts with data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
import synth  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard import ui  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
PAGES = [p for p, *_ in ui.PAGES]
# Pages about all runs or a study, not the selected run.
NOT_RUN_PAGES = ("app_pages/runs.py", "app_pages/study.py")
# The 72-GPU topology at a shorter span keeps CI fast; the benchmark uses the full 2 hours.
LARGE_S = 900.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "healthy": synth.healthy(root),
        "empty": synth.empty(root),
        "failed": synth.failed(root),
        "large": synth.large(root, duration_s=LARGE_S),
    }


def open_page(runs_root: Path, run_id: str, page: str, monkeypatch) -> AppTest:
    monkeypatch.setenv(ui.RUNS_ENV, str(runs_root))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["run"] = run_id
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page(page).run()
    return at


def texts(at: AppTest) -> str:
    parts = []
    for kind in ("title", "markdown", "caption", "info", "warning", "error", "success"):
        parts += [str(e.value) for e in getattr(at, kind)]
    return "\n".join(parts)


@pytest.mark.parametrize("kind", ["healthy", "empty", "failed", "large"])
@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders(runs, kind, page, monkeypatch):
    run = runs[kind]
    at = open_page(run.parent, run.name, page, monkeypatch)
    assert not at.exception, f"{page} on {kind}: " + "\n".join(e.value for e in at.exception)
    body = texts(at)
    if page in NOT_RUN_PAGES:
        return
    assert run.name in body  # the selected run is the one from the URL
    if kind in ("healthy", "failed", "large"):
        assert "SIMULATION" in body
    if kind == "failed":
        assert any("failed during stage" in e.value for e in at.error)
    if kind == "empty":
        assert any("empty" in e.value for e in at.info)
        assert not at.get("vega_lite_chart")


def test_runs_page_lists_every_run(runs, monkeypatch):
    at = open_page(runs["healthy"].parent, runs["healthy"].name, "app_pages/runs.py",
                   monkeypatch)
    df = at.dataframe[0].value
    assert set(df["run"]) == {p.name for p in runs.values()}
    states = dict(zip(df["run"], df["state"], strict=True))
    assert "failed" in states[runs["failed"].name].lower()
    assert states[runs["empty"].name] == "planned"  # the same word `launcher runs` prints
    assert set(df.loc[df["run"] == runs["large"].name, "GPUs"]) == {72}
    assert "SIMULATION" in set(df["engine"])


@pytest.mark.parametrize("kind", ["healthy", "large"])
def test_kv_page_draws_data(runs, kind, monkeypatch):
    at = open_page(runs[kind].parent, runs[kind].name, "app_pages/kv_cache.py", monkeypatch)
    charts = at.get("vega_lite_chart")
    assert len(charts) >= 7
    specs = [json.loads(c.proto.spec) for c in charts]
    titles = " | ".join(str(s.get("title", "")) for s in specs)
    titles += " | " + " | ".join(c.value for c in at.caption)  # flat series are captions
    # Few endpoints: one band per endpoint; 22 endpoints: per role (the heatmap has detail).
    spread = "per endpoint" if kind == "healthy" else "per role"
    for want in (f"KV cache usage {spread}", "KV cache usage per engine",
                 "Requests waiting", "Prompt tokens by source", "Mean NIXL transfer time"):
        assert want in titles
    # A series that never moves is said in words, not drawn as a flat line.
    assert any("constant" in c.value for c in at.caption)
    # Data travels as Arrow datasets next to the spec; every chart has some.
    assert all(c.proto.datasets or c.proto.data.data for c in charts)
    if kind == "large":
        heat = next(s for s in specs if "per engine" in str(s.get("title")))
        assert "decode" in str(heat.get("title"))


def test_kv_page_heatmap_is_downsampled(runs, monkeypatch):
    """72 engines × 900 s at 1 s would be 64 800 cells; the page draws ≤ 240 bins each."""
    at = open_page(runs["large"].parent, runs["large"].name, "app_pages/kv_cache.py",
                   monkeypatch)
    at.radio(key="kv_heat_role").set_value("all").run()
    assert not at.exception
    heat = next(c for c in at.get("vega_lite_chart")
                if "per engine" in json.loads(c.proto.spec).get("title", ""))
    rows = sum(_arrow_rows(d.data.data) for d in heat.proto.datasets)
    assert 0 < rows <= 72 * 240


def _arrow_rows(buf: bytes) -> int:
    import pyarrow as pa

    return pa.ipc.open_stream(buf).read_all().num_rows


def test_ttft_page_shows_breakdown_and_verdicts(runs, monkeypatch):
    at = open_page(runs["large"].parent, runs["large"].name, "app_pages/ttft.py", monkeypatch)
    charts = at.get("vega_lite_chart")
    assert charts and "Client TTFT split" in json.loads(charts[0].proto.spec)["title"]
    body = texts(at)
    # The synthetic 72-GPU run saturates decode KV at its highest concurrency.
    assert "decode KV capacity" in body
    assert "c=5120" in body


def test_failed_run_explains_itself(runs, monkeypatch):
    failed = runs["failed"]
    at = open_page(failed.parent, failed.name, "app_pages/sweep.py", monkeypatch)
    assert any("Failed points" in w.value for w in at.warning)
    at = open_page(failed.parent, failed.name, "app_pages/logs.py", monkeypatch)
    assert at.metric[1].value != "0"  # error lines counted
    assert any("decode-0@" in str(v) for v in at.selectbox(key="log_process").options)


def test_live_run_says_it_refreshes(tmp_path, monkeypatch):
    run = synth.healthy(tmp_path)
    state = json.loads((run / "run.json").read_text())
    state.update(state="running", stage="sweep", ended=None)
    (run / "run.json").write_text(json.dumps(state))
    at = open_page(tmp_path, run.name, "app_pages/kv_cache.py", monkeypatch)
    assert any("refreshes every" in i.value for i in at.info)
    assert at.get("vega_lite_chart")


def test_serve_binds_localhost_by_default(tmp_path):
    import dashboard

    argv = dashboard.serve_args(tmp_path)
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "8501"
    assert argv[-2:] == ["--runs", str(tmp_path.resolve())]
    assert dashboard.url("0.0.0.0", 9000) == "http://127.0.0.1:9000"


def test_sweep_compares_runs_on_one_pareto(runs, monkeypatch):
    at = open_page(runs["healthy"].parent, runs["healthy"].name, "app_pages/sweep.py",
                   monkeypatch)
    at.multiselect(key="sweep_compare").select(runs["large"].name).run()
    assert not at.exception
    pareto = at.get("vega_lite_chart")[0]
    assert "Pareto frontier" in json.loads(pareto.proto.spec)["title"]
    import pyarrow as pa

    runs_drawn = set()
    for d in pareto.proto.datasets:
        t = pa.ipc.open_stream(d.data.data).read_all()
        if "run" in t.column_names:
            runs_drawn |= set(t.column("run").to_pylist())
    assert {f"{runs['healthy'].name} (SIM)", f"{runs['large'].name} (SIM)"} <= runs_drawn


def test_run_that_died_before_the_sweep(tmp_path, monkeypatch):
    """Plan, logs and some telemetry but no bench results and no accuracy: every page says
    what is missing instead of drawing empty axes."""
    import shutil

    run = synth.healthy(tmp_path)
    shutil.rmtree(run / "bench")
    shutil.rmtree(run / "accuracy")
    state = json.loads((run / "run.json").read_text())
    state.update(state="failed", stage="health", error="prefill-1 never became healthy")
    (run / "run.json").write_text(json.dumps(state))
    for page in [p for p in PAGES if p not in NOT_RUN_PAGES]:
        at = open_page(tmp_path, run.name, page, monkeypatch)
        assert not at.exception, (page, [e.value for e in at.exception])
        if page == "app_pages/sweep.py":
            assert any("No sweep results" in i.value for i in at.info)
        if page == "app_pages/ttft.py":
            assert any("no client TTFT" in i.value for i in at.info)
