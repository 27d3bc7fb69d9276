"""Two published srt-slurm recipes, as their files are, on the dev cluster under real Slurm
and pyxis with simulated engines: Kimi-K2.5's 1P4D (one DEP4 prefill, four TEP4 decodes,
5 trays) and DeepSeek-V4-Pro's low-latency MTP recipe, a TP8 decode over two trays with
speculative decoding (with a DEP8 prefill over two more). Only what a site changes is set: the engine (simulated, in the dev
cluster's image), the profile, the partition, shorter waits and sweep. The dev cluster
must be up (`bash slurm/devcluster/up.sh`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import leftovers

from launcher.schema import srt_slurm

pytestmark = pytest.mark.slurm
SOURCES = srt_slurm.BUNDLED / "recipes" / "multi-node"
REPO_RECIPES = Path(srt_slurm.__file__).parents[1] / "recipes" / "srt-slurm"
KIMI_1P4D = SOURCES / "Kimi-K2.5/GB200/vllm/8k1k-sa/disagg-gb200-1p4d-dep4-tep4.yaml"
DSV4_TP8 = SOURCES / "DeepSeek-V4-Pro/GB200/vllm/8k1k-sa/disagg-gb200-low-latency-mtp2.yaml"
SITE = [
    "engine=sim", "cluster=devcluster", "slurm.partition=dev", "slurm.time_limit=00:15:00",
    "container.image=127.0.0.1:5000/pd/devcluster-engine:bookworm",
    'container.environment="{compute_env}"', "health.timeout_s=120", "health.router_timeout_s=60",
    # a short sweep of short requests: the shapes are under test, not the workload; long
    # enough (a few seconds at the simulator's GB200 speed) for 1 s telemetry to see it
    "benchmark.input_len=512", "benchmark.output_len=64", "benchmark.prompts_multiplier=4",
    "benchmark.warmup_multiplier=1", "sim.speed=1",
]


def run_on_devcluster(tmp: Path, source: Path, *sets: str) -> tuple[Path, str]:
    args = [a for s in (*SITE, *sets) for a in ("--set", s)]
    p = subprocess.run(
        [sys.executable, "-m", "launcher", "submit", str(source), *args,
         "--runs-dir", str(tmp / "runs"), "--wait"],
        capture_output=True, text=True, timeout=600, cwd=tmp, env=dict(os.environ),
    )  # fmt: skip
    runs = [r.parent for r in (tmp / "runs").glob("*/plan.json")]
    assert p.returncode == 0 and runs, p.stdout + p.stderr
    return runs[0], p.stderr


@pytest.fixture(scope="module")
def kimi_1p4d(tmp_path_factory):
    return run_on_devcluster(tmp_path_factory.mktemp("kimi"), KIMI_1P4D,
                             "benchmark.concurrency=[16]",
                             # vLLM 0.33 (the simulator's parser) has no such attention key
                             "prefill.args.attention-config=null")


@pytest.fixture(scope="module")
def dsv4_tp8(tmp_path_factory):
    """One of the recipe's four TP8 decodes (the dev cluster has 6 trays), with its MTP."""
    return run_on_devcluster(tmp_path_factory.mktemp("dsv4"), DSV4_TP8,
                             "benchmark.concurrency=[2]", "decode.endpoints=1",
                             # vLLM 0.33 (the simulator's parser) has no such attention key
                             "vllm_args.attention-config=null")


def engines(run: Path) -> list[dict]:
    plan = json.loads((run / "plan.json").read_text())
    return [p for p in plan["processes"] if p["kind"] == "engine"]


def test_a_1p4d_recipe_runs_each_decode_serving(kimi_1p4d):
    run, err = kimi_1p4d
    assert "is an srt-slurm recipe, imported on the way" in err
    procs = engines(run)
    decodes = sorted(p["name"] for p in procs if p["role"] == "decode")
    assert [d.split("@")[0] for d in decodes] == [f"decode-{i}" for i in range(4)]
    assert len({p["node"] for p in procs}) == 5  # one tray per TEP4 decode, one for the DEP4
    for d in decodes:  # the router spread the sweep over every decode endpoint
        assert (run / "logs" / f"{d}.log").read_text().count("POST /v1/completions") > 8, d
    for p in procs:
        assert "--tensor-parallel-size" in p["argv"]
    assert all(p["container"] for p in procs)
    assert json.loads((run / "summary.json").read_text())["verdict"] == "passed"
    assert leftovers(run) == []


def test_a_tp8_decode_over_two_trays_runs_under_pyxis(dsv4_tp8):
    run, _ = dsv4_tp8
    decode = [p for p in engines(run) if p["role"] == "decode"]
    assert len(decode) == 2 and len({p["node"] for p in decode}) == 2
    head, other = decode
    for p, rank in ((head, "0"), (other, "1")):
        a = p["argv"]
        assert a[a.index("--tensor-parallel-size") + 1] == "8"
        assert a[a.index("--nnodes") + 1] == "2" and a[a.index("--node-rank") + 1] == rank
        assert p["container"]
    assert "--headless" in other["argv"] and "--headless" not in head["argv"]
    head_log = (run / "logs" / f"{head['name']}.log").read_text()
    assert "Node rank 1 joined" in head_log and head_log.count("POST /v1/completions") >= 2
    assert "worker ranks 4-7 running" in (run / "logs" / f"{other['name']}.log").read_text()
    assert json.loads((run / "summary.json").read_text())["verdict"] == "passed"
    assert leftovers(run) == []


def test_the_dashboard_and_report_show_each_decode_endpoint(kimi_1p4d, dsv4_tp8, monkeypatch):
    """The 1P4D run: its KV page draws every decode endpoint, its TTFT page and its report
    split decode admission per endpoint; the TP8 run: its one decode (two trays) on the KV
    page and its TTFT split."""
    from helpers import open_app

    from launcher import report

    run, _ = kimi_1p4d
    at = open_app(run.parent, monkeypatch, run=run.name)
    at.switch_page("app_pages/ttft.py").run()
    assert not at.exception
    assert any(s.value == "Decode admission per endpoint" for s in at.subheader)
    per = next(d.value for d in at.dataframe if "admission_s" in d.value.columns)
    assert sorted(set(per["endpoint"])) == [f"decode-{i}" for i in range(4)]
    assert (per["requests"] > 0).all() and per["kv_max"].notna().all()
    at.switch_page("app_pages/kv_cache.py").run()
    assert not at.exception
    html = report.render_run(run)
    assert "Decode admission per endpoint" in html
    assert all(f"<td>decode-{i}</td>" in html for i in range(4))

    run, _ = dsv4_tp8
    at = open_app(run.parent, monkeypatch, run=run.name)
    at.switch_page("app_pages/ttft.py").run()
    assert not at.exception
    split = next(d.value for d in at.dataframe if "decode_admission_s" in d.value.columns)
    assert split["decode_admission_s"].notna().all()
    at.switch_page("app_pages/kv_cache.py").run()
    assert not at.exception and "decode-0" in str([c.proto for c in at.get("vega_lite_chart")])
    # its MTP: the acceptance of the point, from the simulated engines' spec_decode counters
    at.switch_page("app_pages/sweep.py").run()
    assert any(s.value == "Speculative decoding" for s in at.subheader)
    spec = next(d.value for d in at.dataframe if "spec_acceptance_rate" in d.value.columns)
    assert 50 < spec["spec_acceptance_rate"].iloc[0] < 90  # SIM_SPEC_ACCEPT 0.8, 2 tokens
    assert "Speculative decoding per sweep point" in report.render_run(run)


def test_a_family_of_other_shapes_runs_as_one_study_in_one_allocation(tmp_path):
    """Three MiniMax-M2.5 1k1k recipes (4 x DEP2, 1 x TP4 and 2 x TP4 decodes) as one study in
    one allocation: engines a configuration does not use but whose GPUs or ports it needs
    (another shape put other endpoints there) are stopped before it starts its own, the
    one it shares is kept loaded, and each configuration runs."""
    family = REPO_RECIPES / "minimax-m2.5"
    files = [str(family / f"minimax-m2.5-gb200-1k1k-{c}.yaml")
             for c in ("1p4d-dep2", "1p1d-tp4", "1p2d-tp4")]
    args = [a for s in (*SITE, "benchmark.concurrency=[8]", "sim.speed=20",
                        "benchmark.output_len=32", "benchmark.prompts_multiplier=2")
            for a in ("--set", s)]
    p = subprocess.run(
        [sys.executable, "-m", "launcher", "submit", *files, *args, "--allocation", "one",
         "--runs-dir", str(tmp_path / "runs"), "--wait"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=dict(os.environ),
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    [study] = (tmp_path / "runs").glob("*-study")
    alloc = json.loads((study / "allocation.json").read_text())
    assert [c["state"] for c in alloc["configurations"]] == ["succeeded"] * 3
    stops = [e for e in alloc["engines"] if e["event"] == "stopped" and e["run"] != "study"]
    assert any("ports" in e["why"] for e in stops), stops  # another shape's ports
    turns = json.loads((study / "study.json").read_text())["allocation"]["turns"]
    assert any(t.get("stop") for t in turns) and any(t.get("keep") for t in turns), turns
    for run in study.iterdir():
        if run.is_dir() and (run / "plan.json").exists():
            assert leftovers(run) == []
