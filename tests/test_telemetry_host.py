"""Host/process collector and the Prometheus exporter, on real processes and a real socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from launcher.telemetry.exporter import Exporter
from launcher.telemetry.host import HostCollector

BUSY_PARENT = """
import os, subprocess, sys, time
# a child started with an empty environment: attributed through its parent
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={})
t = time.time()
while time.time() - t < 30:
    sum(range(10000))
"""


@pytest.mark.alone  # a busy loop's CPU share is measured: other tests' load takes from it
def test_processes_found_by_env_and_ancestry(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "PD_PROCESS": "decode-0@n1", "PD_RUN_DIR": str(run)}
    other = {**os.environ, "PD_PROCESS": "decode-0@n1", "PD_RUN_DIR": str(tmp_path / "other")}
    children: list = []
    p = subprocess.Popen([sys.executable, "-c", BUSY_PARENT], env=env)
    q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=other)
    try:
        h = HostCollector("n1", run_dir=str(run), rescan_s=0.0)
        deadline = time.time() + 20
        rows: list[tuple] = []
        while time.time() < deadline:
            rows = h.sample()
            if len(h.processes().get("decode-0@n1", [])) >= 2:
                break
            time.sleep(0.2)
        pids = h.processes()["decode-0@n1"]
        assert p.pid in pids and q.pid not in pids and len(pids) == 2
        time.sleep(0.5)
        rows = h.sample()
        v = {r[4]: r[6] for r in rows if r[2] == "decode-0@n1"}
        assert v["proc:num_pids"] == 2
        assert v["proc:cpu_pct"] > 20  # the busy loop
        assert v["proc:rss_bytes"] > 1e6 and v["proc:threads"] >= 2 and v["proc:open_fds"] >= 3
        assert v["proc:ctx_switches_voluntary"] + v["proc:ctx_switches_involuntary"] > 0
        host = {r[4] for r in rows if r[2] == ""}
        assert {"host:cpu_util_pct", "host:mem_total_bytes", "host:mem_available_bytes",
                "host:cpu_user_s"} <= host
        children = psutil.Process(p.pid).children()
        p.kill()
        p.wait()
        h.sample()
        assert p.pid not in h.processes().get("decode-0@n1", [])
    finally:
        children = psutil.Process(p.pid).children() if p.poll() is None else children
        for x in (p, q):
            if x.poll() is None:
                x.kill()
                x.wait()
        for c in children:  # the grandchild we started through p, by its pid
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass


def test_exporter_serves_prometheus_text() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    ex = Exporter("n1", 0, addr="127.0.0.1")
    try:
        ex.update([
            (1.0, "n1", "decode-0@n1", "", "gpu:power_w", '{"index":"0","uuid":"GPU-a"}', 312.5),
            (1.0, "n1", "decode-0@n1", "", "gpu:util_pct", '{"index":"0","uuid":"GPU-a"}', 87.0),
            (1.0, "n1", "decode-0@n1", "", "gpu:sm_clock_mhz", '{"index":"0","uuid":"GPU-a"}',
             1980.0),
            (1.0, "n1", "", "", "host:net_recv_bytes", {"nic": "ib0"}, 1e9),
            (1.0, "n1", "", "", "host:cpu_user_s", "{}", 12.5),
            (1.0, "n1", "", "", "host:cpu_system_s", "{}", 2.5),
            (1.0, "n1", "decode-0@n1", "", "proc:cpu_pct", "{}", 150.0),
            (1.0, "n1", "", "", "gpu:clock_event_active",
             '{"index":"0","reason":"sw_power_cap","uuid":"GPU-a"}', 1.0),
            (1.0, "n1", "", "", "host:some_new_field", "{}", 3.0),
        ])
        body = urllib.request.urlopen(f"http://127.0.0.1:{ex.port}/metrics", timeout=5).read()
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        # base units, the GPU index as `gpu`, no node label (Prometheus adds it from file-SD)
        s = fams["pd_gpu_power_watts"].samples[0]
        assert s.value == 312.5 and s.labels == {"process": "decode-0@n1", "gpu": "0",
                                                 "uuid": "GPU-a"}
        assert fams["pd_gpu_utilization_ratio"].samples[0].value == 0.87
        assert fams["pd_gpu_sm_clock_hertz"].samples[0].value == 1.98e9
        assert fams["pd_proc_cpu_utilization_ratio"].samples[0].value == 1.5
        # counters are typed as such and carry _total; parts of one whole are one label
        net = fams["pd_host_network_receive_bytes"]
        assert net.type == "counter" and net.samples[0].name.endswith("_total")
        assert net.samples[0].labels == {"nic": "ib0"}
        cpu = {x.labels["mode"]: x.value for x in fams["pd_host_cpu_seconds"].samples}
        assert cpu == {"user": 12.5, "system": 2.5}
        assert fams["pd_gpu_clock_event_active"].samples[0].labels["reason"] == "sw_power_cap"
        assert "process" not in fams["pd_gpu_clock_event_active"].samples[0].labels
        # a sample name without a mapping is still served, as a gauge named after it
        assert fams["pd_host_some_new_field"].samples[0].value == 3.0
        assert fams["pd_telemetry_last_sample_timestamp_seconds"].samples
        assert all(f.documentation for f in fams.values())
    finally:
        ex.close()


def test_exporter_forgets_series_that_stopped() -> None:
    ex = Exporter("n1", 0, addr="127.0.0.1", stale_after_s=0.3)
    try:
        ex.update([(1.0, "n1", "bench-c4", "", "proc:rss_bytes", "{}", 1e6)])
        url = f"http://127.0.0.1:{ex.port}/metrics"
        assert 'pd_proc_resident_memory_bytes{process="bench-c4"}' in \
            urllib.request.urlopen(url, timeout=5).read().decode()
        time.sleep(0.5)
        assert "bench-c4" not in urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        ex.close()
