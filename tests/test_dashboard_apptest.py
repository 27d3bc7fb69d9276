"""Every dashboard page renders under Streamlit's AppTest, on the runs a user meets: a healthy
(demo-like) run, an empty run directory, a failed run and a 72-GPU run; and says what it
should (simulation label, failure, empty explanation, charts with data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
import synth  # noqa: E402
from helpers import open_app  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard import ui  # noqa: E402

PAGES = [p for p, *_ in ui.PAGES]
# Pages about all runs, a study or two runs, not the selected run.
NOT_RUN_PAGES = ("app_pages/runs.py", "app_pages/study.py", "app_pages/compare.py")
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
        "kv_store": synth.kv_store(root),
    }


def open_page(runs_root: Path, run_id: str, page: str, monkeypatch) -> AppTest:
    at = open_app(runs_root, monkeypatch, run=run_id)
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
    # a page body that raised is caught and said (ui.guarded): none may here
    assert not [e.value for e in at.error if "could not be drawn" in e.value], page
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
    # the topology in short (the table fits 1280 px): 2 decode DEP16 + 20 prefill DEP2
    assert set(df.loc[df["run"] == runs["large"].name, "topology"]) == {"D 2×DEP16 · P 20×DEP2"}
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


def test_kv_tiers_page_shows_tokens_by_source_the_stores_health_and_verdicts(runs,
                                                                            monkeypatch):
    run = runs["kv_store"]
    at = open_page(run.parent, run.name, "app_pages/kv_tiers.py", monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    titles = " | ".join(str(json.loads(c.proto.spec).get("title", ""))
                        for c in at.get("vega_lite_chart"))
    for want in ("Prompt tokens by source, prefill", "Prompt tokens by source, decode",
                 "Hits against the trace's theoretical hit rate"):
        assert want in titles, titles
    body = texts(at)
    # the synthetic master fills at c=32 (evicting) and refuses puts at c=64; gets slow there
    for want in ("**c=32** · KV store evicting", "**c=64** · KV store full: puts refused",
                 "**c=64** · KV store slower than recomputing", "130 of 1,042 puts refused"):
        assert want in body, want
    assert "**c=8**" not in body  # a healthy point has no store verdict
    # a run without a store says so instead of an empty table
    healthy = open_page(runs["healthy"].parent, runs["healthy"].name, "app_pages/kv_tiers.py",
                        monkeypatch)
    assert "No KV store or CPU offload in this run" in texts(healthy)
    assert "Prompt tokens by source, decode" in " | ".join(
        str(json.loads(c.proto.spec).get("title", "")) for c in healthy.get("vega_lite_chart"))


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


def test_sweep_shows_the_lengths_each_point_sent(runs, monkeypatch):
    at = open_page(runs["healthy"].parent, runs["healthy"].name, "app_pages/sweep.py",
                   monkeypatch)
    assert any(s.value == "Lengths sent" for s in at.subheader)
    assert any("The workload:" in c.value for c in at.caption)
    table = at.dataframe[-1].value
    assert {"input_min", "input_mean", "input_max", "output_mean"} <= set(table.columns)
    assert len(table) >= 1 and (table["input_min"] <= table["input_max"]).all()


def test_sweep_shows_the_mtp_acceptance_of_each_point(runs, monkeypatch):
    """The 72-GPU run's decodes draft 2 tokens a step (MTP), each position accepted at 0.75
    given the one before: 0.75 and 0.5625, so (0.75 + 0.5625) / 2 of the drafted tokens."""
    at = open_page(runs["large"].parent, runs["large"].name, "app_pages/sweep.py",
                   monkeypatch)
    assert any(s.value == "Speculative decoding" for s in at.subheader)
    spec = next(d.value for d in at.dataframe
                if "spec_mean_acceptance_length" in d.value.columns)
    assert len(spec) == 8  # every sweep point
    assert ((spec["spec_acceptance_rate"] - 65.625).abs() < 1.5).all(), spec
    assert ((spec["spec_mean_acceptance_length"] - 2.3125).abs() < 0.03).all(), spec
    first = [float(x) for x in spec["spec_per_position"].iloc[0].split(", ")]
    assert abs(first[0] - 0.75) < 0.02 and abs(first[1] - 0.5625) < 0.02
    healthy = open_page(runs["healthy"].parent, runs["healthy"].name, "app_pages/sweep.py",
                        monkeypatch)
    assert not any(s.value == "Speculative decoding" for s in healthy.subheader)


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


# --- damage isolation: a bad file costs only the panels that read it -------------------------

TELEMETRY_PAGES = ("app_pages/overview.py", "app_pages/sweep.py", "app_pages/kv_cache.py",
                   "app_pages/kv_tiers.py", "app_pages/ttft.py", "app_pages/gpus.py")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path | str]:
    """Three runs: healthy; one telemetry segment corrupt (a parquet cut in half, or a text
    segment of garbage); plan.json valid JSON with a field of the wrong type."""
    root = tmp_path_factory.mktemp("damaged")
    runs = {k: synth.write_run(root, synth.Scenario("healthy", "healthy"), run_id=f"2025112{i}-"
                               f"000000-{k}") for i, k in enumerate(("good", "parquet", "tsv",
                                                                     "plan"))}
    seg = sorted((runs["parquet"] / "telemetry").glob("*/samples-*.parquet"))[0]
    seg.write_bytes(seg.read_bytes()[: seg.stat().st_size // 2])
    tsv = next((runs["tsv"] / "telemetry").iterdir()) / "samples-0000000000001-999.tsv"
    tsv.write_bytes(b"\x00\xff garbage\tthat\tis not a row\n" * 50 + b"1.0\tx\n")
    plan = json.loads((runs["plan"] / "plan.json").read_text())
    plan["nodes"][0]["gpus"] = "four"
    (runs["plan"] / "plan.json").write_text(json.dumps(plan))
    return {**runs, "parquet_file": str(seg.relative_to(runs["parquet"])),
            "tsv_file": str(tsv.relative_to(runs["tsv"]))}


def _problems(at: AppTest) -> tuple[list[str], list[str]]:
    warnings = [str(w.value) for w in at.warning if "Damaged telemetry" in str(w.value)]
    errors = [str(e.value) for e in at.error]
    return warnings, errors


@pytest.mark.parametrize("kind", ["parquet", "tsv"])
@pytest.mark.parametrize("page", PAGES)
def test_a_damaged_telemetry_segment_costs_only_its_panels(damaged, kind, page, monkeypatch):
    run = damaged[kind]
    at = open_page(run.parent, run.name, page, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    warnings, errors = _problems(at)
    assert not errors, errors  # nothing failed: the damaged file is left out, said in words
    if page in TELEMETRY_PAGES:
        assert warnings and all(damaged[f"{kind}_file"] in w for w in warnings), warnings
    else:
        assert not warnings, (page, warnings)
    if page == "app_pages/kv_cache.py":  # the other segments are still drawn
        assert at.get("vega_lite_chart")


@pytest.mark.parametrize("page", PAGES)
def test_a_malformed_plan_costs_only_the_panels_that_need_it(damaged, page, monkeypatch):
    run = damaged["plan"]
    at = open_page(run.parent, run.name, page, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    warnings, errors = _problems(at)
    assert not warnings
    assert not [e for e in errors if "could not be drawn" in e], errors
    needs_plan = {"app_pages/overview.py": "The topology",
                  "app_pages/sweep.py": "Throughput per GPU",
                  "app_pages/kv_cache.py": "The predicted KV capacity"}
    if page in needs_plan:
        (err,) = errors
        assert err.startswith(needs_plan[page]) and "plan.json" in err
        assert "nodes[0].gpus is 'four'" in err
        assert at.get("vega_lite_chart"), "the panels that do not need the plan are drawn"
    else:
        assert not errors, (page, errors)
    body = "\n".join(str(w.value) for w in at.warning)
    assert "plan.json" not in body  # said in the panel that needs it, not on every page


def test_the_runs_list_shows_every_run_however_damaged(damaged, monkeypatch):
    good = damaged["good"]
    at = open_page(good.parent, good.name, "app_pages/runs.py", monkeypatch)
    assert not at.exception
    runs = set(at.dataframe[0].value["run"])
    assert runs == {damaged[k].name for k in ("good", "parquet", "tsv", "plan")}
    for kind in ("good", "parquet", "tsv"):
        at = open_page(good.parent, damaged[kind].name, "app_pages/overview.py", monkeypatch)
        assert not _problems(at)[1]
    # the healthy run next to the damaged ones says nothing about damage
    for page in PAGES:
        at = open_page(good.parent, good.name, page, monkeypatch)
        assert _problems(at) == ([], []), page


def test_a_dead_agent_is_named_with_its_exit_status(tmp_path, monkeypatch):
    run = synth.healthy(tmp_path)
    rec = json.loads((run / "run.json").read_text())
    agent = next(n for n in rec["processes"] if n.startswith("agent@"))
    node = agent.split("@", 1)[1]
    rec["processes"][agent].update(exit_code=137, stopped=False)
    note = (f"{agent} exited with status 137 at 12:00:00: telemetry of {node} stops there "
            f"(see logs/{agent}.log)")
    rec["notes"] = [note]
    (run / "run.json").write_text(json.dumps(rec))
    for page in ("app_pages/overview.py", "app_pages/gpus.py"):
        at = open_page(tmp_path, run.name, page, monkeypatch)
        assert note in [w.value for w in at.warning], page
    at = open_page(tmp_path, run.name, "app_pages/logs.py", monkeypatch)
    assert any(f"**{agent}** (exit 137)" in e.value for e in at.error), [e.value for e in at.error]
    df = at.dataframe[0].value
    assert dict(zip(df["process"], df["state"], strict=True))[agent] == "exit 137"
    at = open_page(tmp_path, run.name, "app_pages/sweep.py", monkeypatch)
    assert note not in [w.value for w in at.warning]  # said where it matters, not everywhere


def test_a_dry_run_is_not_live_and_says_what_it_is(tmp_path, monkeypatch):
    """Issue 28 item 9: dry-runs were counted as live and refreshed forever."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "launcher", "submit", "local-sim", "--dry-run",
                        "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (run,) = [r.parent for r in tmp_path.glob("*/plan.json")]
    at = open_page(tmp_path, run.name, "app_pages/runs.py", monkeypatch)
    live = [m for m in at.metric if m.label == "Live"]
    assert live and live[0].value == "0", [(m.label, m.value) for m in at.metric]
    at = open_page(tmp_path, run.name, "app_pages/overview.py", monkeypatch)
    assert any("A dry-run" in i.value for i in at.info)
    assert not any("refreshes every" in i.value for i in at.info)
    assert "dry-run" in texts(at)


def test_a_planned_runs_kv_page_shows_the_planners_estimate(tmp_path, monkeypatch):
    """Issue 28 item 17: a dry-run of the seed has no telemetry but plan.json holds the KV
    estimate; the KV page shows it instead of nothing."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "launcher", "submit", "qwen3.5-397b-gb200-disagg",
                        "--dry-run", "--runs-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    (run,) = [r.parent for r in tmp_path.glob("*/plan.json")]
    cap = json.loads((run / "plan.json").read_text())["capacity"][0]
    at = open_page(tmp_path, run.name, "app_pages/kv_cache.py", monkeypatch)
    body = texts(at)
    assert "No telemetry in this run" in body
    assert "KV capacity: predicted vs observed" in [h.value for h in at.subheader]
    tables = " ".join(str(t.value) for t in at.table) + " ".join(
        m.value for m in at.markdown)
    assert f"{cap['endpoint_at_mean_length']:,.0f}" in tables, tables


def test_a_simulated_runs_kv_transport_is_not_claimed_as_ucx(runs, tmp_path, monkeypatch):
    import shutil

    run = tmp_path / runs["healthy"].name
    shutil.copytree(runs["healthy"], run)
    rec = json.loads((run / "run.json").read_text())
    rec.setdefault("identity", {})["kv_transport"] = {"decode-0@n1": ["cuda_ipc/cuda"]}
    (run / "run.json").write_text(json.dumps(rec))
    for engine, words in (("sim", "the simulator's stand-in for UCX's report"),
                          ("vllm", "KV transfers over cuda_ipc/cuda (UCX's own report)")):
        plan = json.loads((run / "plan.json").read_text())
        plan["engine"] = engine
        (run / "plan.json").write_text(json.dumps(plan))
        at = open_page(tmp_path, run.name, "app_pages/overview.py", monkeypatch)
        assert words in texts(at), (engine, texts(at))
