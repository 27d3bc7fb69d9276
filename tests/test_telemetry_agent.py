"""The agent as a real process on a local "run": fixture /metrics servers on 127.0.0.1, a vLLM
log being appended, a dead and a hanging endpoint; then SIGTERM and the reader API."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import FIXTURES

from launcher.run.plandoc import NodeDoc, PlanDoc, Process
from launcher.run.vocab import Kind, Role
from launcher.telemetry import agent as agent_mod
from launcher.telemetry.store import read_agent_info, read_gaps, read_raw, read_samples

REPO = Path(__file__).resolve().parents[1]
FIX = FIXTURES


GEN0 = re.compile(r'^(vllm:generation_tokens_total\{engine="0",[^}]*\} ).*$', re.M)


class MetricsServer:
    """Serves a fixture; each request bumps engine 0's generation counter so series change."""

    def __init__(self, text: str, delay: float = 0.0) -> None:
        self.text = text
        self.delay = delay
        self.hits = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.hits += 1
                if outer.delay:
                    time.sleep(outer.delay)
                body = GEN0.sub(lambda m: f"{m.group(1)}{1000 + outer.hits}.0",
                                outer.text).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def kill(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine(name: str, url: str | None, gpus: list[int], node: str = "n1") -> Process:
    return Process(name=name, kind=Kind.ENGINE, endpoint=name.split("@")[0], role=Role.DECODE,
                   node=node, gpus=gpus, dp_ranks=[0, 1], headless=url is None,
                   url=url and url.rsplit("/", 1)[0], metrics_url=url, argv=[], env={},
                   log=f"logs/{name}.log")


def test_agent_end_to_end(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    dec = MetricsServer((FIX / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl.prom").read_text())
    pre = MetricsServer((FIX / "vllm_metrics_v0.33.0_generated_prefill_dp2_nixl.prom").read_text())
    hang = MetricsServer("vllm:x 1\n", delay=30.0)
    exporter_port = free_port()
    plan = PlanDoc(
        run_id="t", recipe="t", cluster="local", engine="sim", mode="disagg", model_path="m",
        served_name="m", telemetry_interval_s=0.3,
        nodes=[NodeDoc("n1", "127.0.0.1", 4)], endpoints=[],
        processes=[
            engine("decode-0@n1", dec.url, [0, 1]),
            engine("prefill-0@n1", pre.url, [2]),
            engine("prefill-1@n1", hang.url, [3]),
            engine("prefill-2@n2", "http://127.0.0.1:9/metrics", [], node="n2"),
            Process(name="agent@n1", kind=Kind.AGENT, node="n1", argv=[], env={},
                    metrics_url=f"http://127.0.0.1:{exporter_port}/metrics",
                    log="logs/agent@n1.log"),
        ],
        router_url="http://127.0.0.1:9", router_metrics_url="http://127.0.0.1:9/metrics",
        gpu_count={"total": 4},
    )
    (run / "plan.json").write_text(json.dumps(plan.to_json()))
    log_lines = (FIX / "vllm_server_v0.33.0_generated_decode_dp4_nixl.log").read_text() \
        .splitlines(keepends=True)
    log = run / "logs" / "decode-0@n1.log"
    log.write_text("".join(log_lines[:3]) + log_lines[3][:50])  # ends mid-line
    env = {**os.environ, "PYTHONPATH": str(REPO), "PD_PROCESS": "agent@n1",
           "PD_RUN_DIR": str(run)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "launcher.telemetry.agent", "--run-dir", str(run), "--node", "n1",
         "--exporter-port", str(exporter_port), "--exporter-addr", "127.0.0.1",
         "--raw-every", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(2.5)
        with open(log, "a") as f:  # the rest of the partial line and more
            f.write(log_lines[3][50:])
            f.writelines(log_lines[4:8])
        killed_at = time.time()
        pre.kill()  # an endpoint dies
        time.sleep(2.5)
        assert agent.poll() is None, "the agent keeps running with a dead endpoint"
        hits_before = dec.hits
        time.sleep(1.0)
        assert dec.hits >= hits_before + 2, "the live endpoint is still scraped on the beat"
        body = urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics",
                                      timeout=5).read().decode()
        assert "\npd_host_memory_total_bytes " in body  # node: a target label (promsd)
        assert 'pd_proc_resident_memory_bytes{process="agent@n1"}' in body
        live = read_samples(run, names=["vllm:kv_cache_usage_perc"])  # readable while written
        assert set(live.process) >= {"decode-0@n1"}
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
        dec.kill()
        hang.kill()
    assert agent.returncode == 0, out
    node_dir = run / "telemetry" / "n1"
    # a clean stop leaves one closed segment; this short run's is under the compaction
    # threshold, so it stays text (test_telemetry_store checks both sides of the threshold)
    (seg,) = node_dir.glob("samples-*")
    assert seg.suffix == ".tsv" and 0 < seg.stat().st_size < agent_mod.COMPACT_MIN_BYTES
    assert seg.read_bytes().endswith(b"\n")  # no torn row

    df = read_samples(run)
    procs = set(df.process)
    assert {"decode-0@n1", "prefill-0@n1", "agent@n1", ""} <= procs
    assert "prefill-2@n2" not in procs  # another node's endpoint is not ours
    # scrape samples: fixture values, per engine, histogram buckets kept
    kv = df[(df.name == "vllm:kv_cache_usage_perc") & (df.process == "decode-0@n1")]
    assert dict(zip(kv.engine, kv.value, strict=False)) == {"0": 0.5323073046384119,
                                                            "1": 0.487344709177123}
    ttft = df[(df.name == "vllm:time_to_first_token_seconds_bucket") &
              (df.process == "prefill-0@n1") & (df.engine == "1")]
    assert ttft.labels.str.contains('"le":"\\+Inf"').any()
    gen = df[(df.name == "vllm:generation_tokens_total") & (df.process == "decode-0@n1") &
             (df.engine == "0")].sort_values("ts")
    assert gen.value.is_monotonic_increasing and len(gen) >= 5  # changes every scrape
    assert gen.value.iloc[0] > 1000
    # an unchanged series is stored as its two ends (no keyframe in this short run)
    flat = df[(df.name == "vllm:kv_cache_usage_perc") & (df.process == "decode-0@n1")]
    assert len(flat) == 4 and flat.groupby("engine").size().to_dict() == {"0": 2, "1": 2}
    # the dead endpoint stops, with a gap and a reason; the hanging one times out
    # (proc: rows may go on: the port fallback attributes this test process, which served
    # prefill-0's port, to prefill-0@n1)
    pre_rows = df[(df.process == "prefill-0@n1") & ~df.name.str.startswith("proc:")]
    assert pre_rows.ts.max() < killed_at + 1.0
    gaps = read_gaps(run)
    g = gaps[gaps.process == "prefill-0@n1"]
    assert len(g) == 1 and g.iloc[0].source == "scrape"
    # the pooled connection is reset first, then new connections are refused
    assert set(g.iloc[0].reason.split("; ")) <= {"connection reset", "connection refused"}
    assert "connection refused" in g.iloc[0].reason and g.iloc[0].failures >= 3
    h = gaps[gaps.process == "prefill-1@n1"]
    assert len(h) == 1 and h.iloc[0].reason.startswith("timeout after")
    # stats-log samples, partial line completed later, KV Transfer fields attached
    lg = df[df.name.str.startswith("log:") & (df.process == "decode-0@n1")]
    xfer = lg[lg.name == "log:kv_num_successful_transfers"]
    assert sorted(zip(xfer.engine, xfer.value, strict=False)) == [
        ("0", 208.0), ("1", 200.0), ("2", 216.0), ("3", 192.0)]
    assert set(lg[lg.name == "log:kv_fetch_in_progress"].engine) == {"0", "1", "2", "3"}
    # host and per-process samples
    assert {"host:cpu_util_pct", "host:mem_used_bytes", "proc:cpu_s", "proc:rss_bytes",
            "proc:threads", "proc:open_fds", "proc:ctx_switches_voluntary"} <= set(df.name)
    nic = df[df.name == "host:net_recv_bytes"]
    assert nic.empty or nic.labels.str.contains('"nic"').all()
    # GPU: real samples, or the recorded "no NVML" notice
    info = read_agent_info(run)["n1"]
    if info["gpu"]["available"]:
        assert (df.name == "gpu:util_pct").any()
    else:
        assert any(n.startswith("no NVML") for n in info["notices"])
    assert info["final"] is True
    assert {t["process"] for t in info["scrape_targets"]} == {
        "decode-0@n1", "prefill-0@n1", "prefill-1@n1"}
    # raw text kept for re-parsing
    raw = [r for r in read_raw(run, processes=["decode-0@n1"])]
    assert raw and "vllm:kv_cache_usage_perc" in raw[0][3]


def test_a_stopped_agent_samples_once_more_before_it_exits(tmp_path):
    """The teardown stops the agents after the servers and waits for no beat: the agent takes
    its last sample when told to stop, so the end is on record whatever the interval."""
    import asyncio

    agent = agent_mod.Agent(tmp_path, "n1", 30.0, gpu=False)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(agent.run()))
    t.start()
    deadline = time.monotonic() + 10
    while agent.ticks < 1:
        assert time.monotonic() < deadline, "no first beat"
        time.sleep(0.05)
    time.sleep(0.3)
    stopped = time.time()
    loop.call_soon_threadsafe(agent.stop)  # long before the next 30 s beat (SIGTERM's way)
    t.join(timeout=10)
    loop.close()
    assert not t.is_alive() and agent.ticks == 2
    df = read_samples(tmp_path)
    # the second sample is the stop's: 0.3 s after the first beat, at the stop (the agent's
    # clock is its own wall-clock reading, a few microseconds off this thread's)
    first, last = df["ts"].min(), df["ts"].max()
    assert last - first >= 0.25 and abs(last - stopped) < 0.2, (first, last, stopped)
    assert read_agent_info(tmp_path)["n1"]["final"]


def test_asked_for_a_sample_the_agent_takes_one_now_and_answers_once_it_is_written(tmp_path):
    """The teardown asks every agent for a sample before it stops the servers: their last
    requests' counts (a gate of a few questions ends within one beat) are on record though
    the next beat would come only after the servers are gone."""
    import asyncio

    from launcher.control import watch

    dec = MetricsServer((FIX / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl.prom").read_text())
    port = free_port()
    plan = PlanDoc(
        run_id="t", recipe="t", cluster="local", engine="sim", mode="disagg", model_path="m",
        served_name="m", telemetry_interval_s=30.0, nodes=[NodeDoc("n1", "127.0.0.1", 2)],
        endpoints=[], processes=[engine("decode-0@n1", dec.url, [0, 1])],
        router_url="http://127.0.0.1:9", router_metrics_url="http://127.0.0.1:9/metrics",
        gpu_count={"total": 2},
    )
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    agent = agent_mod.Agent(tmp_path, "n1", gpu=False, exporter_port=port,
                            exporter_addr="127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    assert watch.agent_sample(url, 1.0) is None  # its loop not running yet: no sample
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(agent.run()))
    t.start()
    try:
        deadline = time.monotonic() + 10
        while agent.ticks < 1:
            assert time.monotonic() < deadline, "no first beat"
            time.sleep(0.05)
        asked = time.time()
        ts = watch.agent_sample(url, 5.0)  # 30 s before the next beat
        assert ts is not None and asked <= ts <= time.time(), (asked, ts)
        assert agent.ticks == 2 and dec.hits == 2
        df = read_samples(tmp_path)
        gen = df[(df["name"] == "vllm:generation_tokens_total") & (df["engine"] == "0")]
        # the second GET's, at the time answered (the store keeps milliseconds)
        assert gen["value"].max() == 1002.0 and abs(gen["ts"].max() - ts) < 1e-3
        # what else reaches /sample: a GET (a browser, a scraper) takes nothing
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/sample", timeout=5)
        assert e.value.code == 405 and agent.ticks == 2
        # the orchestrator's round: a node whose agent does not answer is named
        nw = watch.NodeWatch(["n1", "n2"], slurm=False)
        nw.agents = {"n1": url, "n2": f"http://127.0.0.1:{free_port()}/metrics"}
        assert nw.sample(["n1", "n2"], 2.0) == ["n2"] and agent.ticks == 3
    finally:
        loop.call_soon_threadsafe(agent.stop)
        t.join(timeout=10)
        loop.close()
        dec.kill()
    assert not t.is_alive()


class KeepAliveServer:
    """HTTP/1.1 /metrics that keeps a connection open between requests and closes it after
    `idle_s` without one, as vLLM's uvicorn does after 5 s; counts connections and GETs."""

    def __init__(self, text: str, idle_s: float) -> None:
        self.connections = 0
        self.gets = 0
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = idle_s  # the socket's: an idle connection is closed after it

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def do_GET(self) -> None:  # noqa: N802
                outer.gets += 1
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_a_target_keeps_its_connection_and_one_closed_while_idle_costs_no_scrape(tmp_path):
    """Scrapes of a target share one kept-alive connection; one the endpoint closed while it
    was idle is not a failed scrape (no gap): the GET goes once more on a new connection."""
    import asyncio

    from launcher.telemetry.scrape import Scraper, Target
    from launcher.telemetry.store import SampleWriter

    srv = KeepAliveServer((FIX / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl.prom").read_text(), idle_s=0.3)
    scraper = Scraper("n1", [Target("decode-0@n1", srv.url)], timeout=2.0)
    writer = SampleWriter(tmp_path / "n1")

    async def scrapes() -> list:
        status = [await scraper.scrape_once(writer) for _ in range(3)]
        await asyncio.sleep(1.0)  # the endpoint closes the idle connection
        status.append(await scraper.scrape_once(writer))
        await scraper.close()
        return status

    try:
        status = asyncio.run(scrapes())
    finally:
        writer.close()
        srv.httpd.shutdown()
        srv.httpd.server_close()
    assert status == [{"decode-0@n1": None}] * 4, status
    assert (srv.connections, srv.gets) == (2, 4)
    assert read_gaps(tmp_path).empty


def test_the_agent_does_without_aiohttp(tmp_path):
    """An agent starts on every node of every run: it scrapes with the standard library,
    and aiohttp's import (~0.15 s of CPU each start) stays out of it."""
    srv = KeepAliveServer((FIX / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl.prom").read_text(), idle_s=5)
    code = ("import asyncio, sys\n"
            "from launcher.telemetry import agent\n"
            "from launcher.telemetry.scrape import Scraper, Target\n"
            "from launcher.telemetry.store import SampleWriter\n"
            f"s = Scraper('n1', [Target('decode-0@n1', {srv.url!r})])\n"
            f"w = SampleWriter({str(tmp_path / 'n1')!r})\n"
            "print(asyncio.run(s.scrape_once(w)), 'aiohttp' in sys.modules)\n"
            "w.close()\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=REPO, timeout=60)
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()
    assert out.stdout.split("}")[-1].strip() == "False", (out.stdout, out.stderr)
    assert out.stdout.startswith("{'decode-0@n1': None}"), (out.stdout, out.stderr)
