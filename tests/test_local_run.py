"""The local profile end to end: sim engines, the real vllm-router, agents, sweep, gate.

Every test runs the CLI as a user would and then checks what a user would look at: the exit
status, run.json, `status`, the logs, the results, and that no process of the run is left.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import synth
from helpers import launcher, leftovers

from launcher.run import figures, rundir

RECIPE = "local-sim"


def the_run(tmp_path) -> Path:
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    return run


def test_demo_runs_end_to_end(tmp_path, tmp_path_factory):
    # the session's one demo run (synth.local_demo), shared with the dashboard and report tests
    run = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    out = (run.parent.parent / "demo.out").read_text()
    assert f"run directory: {run}" in out and "SIMULATED" in out
    st = rundir.RunDir(run).status()
    assert st.state == "succeeded" and st.error is None
    plan = json.loads((run / "plan.json").read_text())
    for proc in plan["processes"]:
        log = run / proc["log"]
        assert log.is_file() and log.stat().st_size > 0, f"no log for {proc['name']}"
    # One result file per point, and re-reading them reproduces the summary.
    assert sorted(p.name for p in (run / "bench").glob("c*.json")) == [
        "c00004.json", "c00016.json", "c00064.json",
    ]  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    from launcher.analysis import load

    again = figures.summary(run, log_signals=load.log_signals(run))
    for s in (again, summary):
        s.pop("generated")
    lc = summary.pop("lifecycle")  # written at the report stage, it ends there
    again.pop("lifecycle")
    assert again == summary
    # a clean run: every failure signal counted, each 0 (kept when zero); preemptions are
    # load, not a failure (the decode preempts at c=64), and counted too
    sig = summary["log_signals"]
    failures = {k: v for k, v in sig["totals"].items() if k != "preemptions"}
    assert failures == dict.fromkeys(failures, 0) and len(failures) == 7, sig["totals"]
    assert isinstance(sig["totals"]["preemptions"], int)
    assert set(sig["processes"]) == {p["name"] for p in plan["processes"]}
    # where the allocation's time went, adding up to the whole
    assert sum(v["seconds"] for v in lc["phases"].values()) == pytest.approx(lc["seconds"], abs=0.05)
    assert lc["phases"]["measuring"]["seconds"] > 0 and set(lc["engine_ready_s"]) >= {
        p["name"] for p in plan["processes"] if p["kind"] == "engine" and p["url"]}
    # of which loading weights, read off each engine's "Model loading took" line
    loads = lc["engine_load_s"]
    assert set(loads) == {p["name"] for p in plan["processes"] if p["kind"] == "engine"}
    assert all(0 <= v <= lc["engine_ready_s"].get(k, v) for k, v in loads.items()), lc
    assert [p["status"] for p in summary["points"]] == ["ok", "ok", "ok"]
    acc = json.loads((run / "accuracy" / "gsm8k.json").read_text())
    assert acc["passed"] and acc["accuracy"] >= 0.7
    # lm-eval's two figures, the one the threshold used, and one request per question
    assert set(acc["scores"]) == {"strict-match", "flexible-extract"}
    assert acc["metric"] == "strict-match" and acc["comparable_with_lm_eval"] is True
    assert acc["requests"]["answered"] == acc["num_questions"] == 30
    # the summary names the harness; the published figure (vLLM's harness) is not beside it
    said = " ".join(out.split())  # the table's console wraps long lines
    assert "lm-eval harness" in said and "flexible-extract" in said
    assert "no published figure for this harness" in said and "published 0.88" not in said
    # Every node's agent wrote telemetry; no GPU here is recorded, not fatal.
    from launcher.telemetry import store

    info = store.read_agent_info(run)
    assert set(info) == {n["name"] for n in plan["nodes"]}
    df = store.read_samples(run)
    names = set(df["name"])
    assert "vllm:kv_cache_usage_perc" in names
    assert any(n.startswith("log:") for n in names), "no stats-log samples"
    assert any(n.startswith("host:") for n in names) and any(n.startswith("proc:") for n in names)
    engines = {p["name"] for p in plan["processes"] if p["kind"] == "engine" and p["url"]}
    assert engines <= set(df.loc[df["name"] == "vllm:kv_cache_usage_perc", "process"])
    assert engines <= set(df.loc[df["name"].str.startswith("log:"), "process"])
    for node, node_info in info.items():  # no GPU here: said once per node, not fatal
        assert any("no NVML" in n for n in node_info["notices"]), node
    assert leftovers(run) == []
    # status and logs work on the finished run
    code, out = launcher(tmp_path, "status", str(run))
    assert code == 0 and "state succeeded" in out and "decode-0@local-1" in out
    code, out = launcher(tmp_path, "logs", str(run), "router", "-n", "5")
    assert code == 0 and out.strip()


def _fail_run(tmp_path, *sets):
    args = ["submit", RECIPE]
    for s in sets:
        args += ["--set", s]
    t = time.monotonic()
    code, out = launcher(tmp_path, *args)
    return code, out, time.monotonic() - t, the_run(tmp_path)


@pytest.mark.parametrize("cause, signal, label", [("oom", "cuda_oom", "CUDA out of memory"),
                                                  ("nccl", "nccl_errors", "NCCL errors")])
def test_decode_crash_fails_fast_and_names_it(tmp_path, cause, signal, label):
    code, out, took, run = _fail_run(
        tmp_path, "benchmark.enabled=false", "accuracy.enabled=false", "hold_s=120",
        "decode.env.SIM_CRASH_AFTER_S=6", f"decode.env.SIM_CRASH_CAUSE={cause}",
    )  # fmt: skip
    assert code == 1, out
    assert took < 40, f"took {took:.0f} s to notice a crash"
    st = rundir.RunDir(run).status()
    assert st.state == "failed"
    assert st.error.startswith("decode-0@local-") and "exited with status" in st.error
    code, status = launcher(tmp_path, "status", str(run))
    assert "decode-0@local-" in status and "exited with status" in status
    assert (run / "logs" / "decode-0@local-1.log").stat().st_size > 0
    assert leftovers(run) == []
    # The engine's death and its cause (an OOM or an NCCL error, as vLLM logs them) are
    # counted on the processes that logged them. Both parts have the crash setting: the one
    # whose timer fires first logs the cause, and the head logs the engine's death either way.
    sig = json.loads((run / "summary.json").read_text())["log_signals"]
    decode = {p: {k: v for k, v in c.items() if v} for p, c in sig["processes"].items()
              if p.startswith("decode-0@")}
    assert decode["decode-0@local-1"].get("engine_crashes") in (1, 2), sig
    assert any(c.get(signal) == 1 and c.get("tracebacks") == 1 for c in decode.values()), sig
    assert all(set(c) <= {"engine_crashes", signal, "tracebacks"} for c in decode.values()), sig
    hit = {p for p, c in sig["processes"].items() if any(c.values())}
    assert hit <= {"decode-0@local-1", "decode-0@local-2"}, hit  # both parts may crash
    said = " ".join(status.split())
    assert re.search(r"log signals: engine crashes [1-3] \(decode-0@local-[12][,)].*"
                     + label + r" [12] \(decode-0@local-[12][,)]", said), said
    # The node's agent saw the dead endpoint as a gap with a reason and kept going.
    from launcher.telemetry import store

    gaps = store.read_gaps(run)
    dead = gaps[(gaps["process"] == "decode-0@local-1") & (gaps["source"] == "scrape")]
    assert len(dead) and dead["reason"].str.contains("refused|reset").all(), gaps
    agent = rundir.RunDir(run).read_record().processes["agent@local-1"]
    assert agent.exit_code == 0 and agent.stopped


def test_prefill_never_healthy_hits_the_health_timeout(tmp_path):
    code, out, took, run = _fail_run(
        tmp_path, "prefill.env.SIM_HANG_BEFORE_HEALTHY=1", "health.timeout_s=6",
    )  # fmt: skip
    assert code == 1
    err = rundir.RunDir(run).status().error
    assert "not healthy within 6 s" in err and "prefill-0@local-3" in err
    assert "last lines of logs/prefill-0@local-3.log" in err
    assert leftovers(run) == []


def test_wrong_answers_fail_the_gate_and_keep_the_sweep(tmp_path):
    code, out, _, run = _fail_run(tmp_path, "sim.wrong_answers=true",
                                  "benchmark.concurrency=[4,16]")
    assert code == 1
    err = rundir.RunDir(run).status().error
    assert "accuracy gate failed: gsm8k strict-match scored 0.000" in err
    assert len(list((run / "bench").glob("c*.json"))) == 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "failed"


def test_zero_tokens_marks_points_failed_not_fast(tmp_path):
    code, out, _, run = _fail_run(tmp_path, "sim.zero_tokens=true", "accuracy.enabled=false")
    assert code == 1
    summary = json.loads((run / "summary.json").read_text())
    assert [p["status"] for p in summary["points"]] == ["failed"] * 3
    assert "sweep point(s) failed" in rundir.RunDir(run).status().error


def test_ctrl_c_tears_down_and_records_cancelled(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "submit", RECIPE, "--runs-dir", str(tmp_path / "runs"),
         "--set", "benchmark.enabled=false", "--set", "accuracy.enabled=false",
         "--set", "hold_s=120"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180  # a hang guard: a loaded host starts slowly
    run = None
    while time.monotonic() < deadline:
        runs = list((tmp_path / "runs").glob("*/run.json"))
        rec = rundir.RunDir(runs[0].parent).read_record() if runs else None
        if rec and rec.serving:
            run = runs[0].parent
            break
        time.sleep(0.5)
    assert run, "never reached serving"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    st = rundir.RunDir(run).status()
    assert st.state == "cancelled" and "Ctrl-C" in st.error
    assert leftovers(run) == []


def test_a_busy_port_moves_the_run_and_every_block_busy_is_named_before_anything_starts(
        tmp_path):
    import socket

    import helpers

    from launcher.planning import plan
    from launcher.schema import cluster, recipe

    # a profile of two blocks of this test's own (other runs on this host take the shipped
    # one's)
    path = helpers.profile_copy(tmp_path / "mine.yaml", "local", port_blocks=2,
                                port_base=helpers.free_port_base(range(27000, 32000, 100), 1400))
    mine = ["--set", f"cluster={path}"]
    prof = cluster.load(path)
    p = plan.make_plan(recipe.load(RECIPE), prof, ["local-1", "local-2", "local-3"])
    slots, block = plan.job_port_slots(prof, p.port_span)
    port = p.endpoints[0].http_port
    held = []
    try:
        # another program on the decode's port of the first block: the run takes another
        held.append(socket.socket())
        held[0].setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held[0].bind(("127.0.0.1", port))
        held[0].listen()
        (tmp_path / "moved").mkdir()
        code, out = launcher(tmp_path / "moved", "submit", RECIPE, *mine, "--set",
                             "benchmark.enabled=false", "--set", "accuracy.enabled=false")
        assert code == 0, out
        assert f"({port} (decode-0 http, held by pid {os.getpid()} (" in out, out
        assert "are taken on this host: this run plans on " in out
        # the same port of every block taken: refused, naming it, before anything starts
        with helpers.listening(port + slot * block for slot in range(1, slots)):
            code, out = launcher(tmp_path, "submit", RECIPE, *mine)
    finally:
        for s in held:
            s.close()
    assert code == 2, out
    assert f"{port} (decode-0 http, held by pid {os.getpid()} (" in out, out
    assert "another run still up" in out
    run = the_run(tmp_path)
    assert rundir.RunDir(run).status().state == "failed"
    assert not list((run / "logs").glob("*@*.log")), "a process started"


def test_missing_accuracy_data_fails_before_anything_starts(tmp_path):
    code, out = launcher(tmp_path, "submit", RECIPE, "--set", "accuracy.data=/no/such/gsm8k.jsonl")
    assert code == 1, out
    run = the_run(tmp_path)
    err = rundir.RunDir(run).status().error
    assert err.startswith("preflight: /no/such/gsm8k.jsonl is not readable on local-1 for ")
    assert "accuracy (GSM8K test file)" in err and len(err.splitlines()) == 1
    assert not (run / "bench").exists() and not list((run / "logs").glob("*@*.log"))


def test_two_local_runs_on_one_host_take_separate_port_blocks(tmp_path):
    """A second local run while the first serves takes the next free block of the profile's
    ports (as a second Slurm job on a shared host does) instead of failing on the first's."""
    serve = ["--set", "benchmark.enabled=false", "--set", "accuracy.enabled=false"]
    first = subprocess.Popen(
        [sys.executable, "-m", "launcher", "submit", RECIPE, *serve, "--set", "hold_s=15",
         "--runs-dir", str(tmp_path / "a" / "runs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        (tmp_path / "b").mkdir()
        deadline = time.monotonic() + 60
        while not any((tmp_path / "a" / "runs").glob("*/run.json")) or not rundir.RunDir(
                the_run(tmp_path / "a")).status().record.serving:
            assert time.monotonic() < deadline and first.poll() is None, "first run not serving"
            time.sleep(0.3)
        code, out = launcher(tmp_path / "b", "submit", RECIPE, *serve)
        assert code == 0, out
        a_out, _ = first.communicate(timeout=90)
        assert first.returncode == 0, a_out
    finally:
        if first.poll() is None:  # as Ctrl-C: the launcher tears its processes down
            first.send_signal(signal.SIGINT)
            try:
                first.wait(timeout=60)
            except subprocess.TimeoutExpired:
                first.kill()
    from launcher.schema import cluster

    base = cluster.load("local").port_base
    ports = [int(json.loads((the_run(tmp_path / x) / "plan.json").read_text())["router"]["url"]
                 .rsplit(":", 1)[1]) for x in ("a", "b")]
    assert ports[0] != ports[1] and all((p - base) % 1000 == 0 for p in ports), ports
    assert leftovers(the_run(tmp_path / "a")) == [] and leftovers(the_run(tmp_path / "b")) == []
