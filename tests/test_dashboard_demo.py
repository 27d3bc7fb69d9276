"""The dashboard on a run the local demo really produced (sim engines, the real router,
agents, bench client): every page renders, the headline figure is the one launcher.run.figures
computes, and the top point's bottleneck is the decode KV limit the demo recipe sets."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
import synth  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard import ui  # noqa: E402
from launcher.analysis import derive, diagnose, load  # noqa: E402
from launcher.run import figures  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    # One local demo per test session (tests/synth.py), on a free port block, so this runs
    # next to other demo runs; test_report.py and the browser tests read the same run.
    return synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")


@pytest.mark.parametrize("page", [p for p, *_ in ui.PAGES if p != "app_pages/study.py"])
def test_every_page_renders_on_the_demo_run(demo, page, monkeypatch):
    monkeypatch.setenv(ui.RUNS_ENV, str(demo.parent))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["run"] = demo.name
    at.run()
    at.switch_page(page).run()
    assert not at.exception, "\n".join(e.value for e in at.exception)
    if page in ("app_pages/kv_cache.py", "app_pages/ttft.py", "app_pages/overview.py"):
        assert at.get("vega_lite_chart")
    if page == "app_pages/overview.py":
        best = max(p["total_tokens_per_s_per_gpu"] for p in figures.summary(demo)["points"])
        assert at.metric[0].value == f"{best:,.0f}"


def test_demo_top_point_is_decode_kv_bound(demo):
    plan, _ = load.read_plan_safe(demo)
    ss = derive.SeriesSet(load.read_telemetry(demo, names=load.TTFT_NAMES), plan)
    table = derive.point_table(load.load_bench(demo), plan, ss)
    assert table["prefill_compute_s"].notna().all() and table["kv_transfer_s"].notna().all()
    vs = diagnose.diagnose(table.to_dict("records"))
    assert vs[0].kind == diagnose.HEALTHY, vs[0].evidence
    assert vs[-1].kind == diagnose.KV_CAPACITY, (vs[-1].kind, vs[-1].evidence)
