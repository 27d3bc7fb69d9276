"""The telemetry writer and agent when the node directory stops taking writes (disk full,
read-only, I/O errors): the agent keeps sampling, keeps rows in memory and retries, counts
what it had to give up on (agent.json `writes`, the exporter's pd_telemetry_* series, its last
log line) and exits 0."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import wait_for

from launcher.run import rundir
from launcher.telemetry import agent as agent_mod
from launcher.telemetry import store
from launcher.telemetry.store import SampleWriter, read_agent_info, read_samples


def rows(t0: float, n: int) -> list[tuple]:
    return [(t0 + i, "n1", "decode-0@n1", "0", "vllm:num_requests_running",
             {"model_name": "m"}, float(i)) for i in range(n)]


def test_writer_keeps_rows_through_a_full_disk_and_counts_what_it_gives_up(tmp_path):
    w = SampleWriter(tmp_path / "telemetry" / "n1", max_pending_bytes=3000)
    w.write(rows(1000.0, 10))
    w.flush()
    # The disk fills up: the segment's descriptor now writes to /dev/full (ENOSPC).
    saved = os.dup(w._fd)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, w._fd)
    try:
        for k in range(1, 8):
            w.write(rows(1000.0 + 100 * k, 10))
            w.flush()
        st = w.status()
        assert st["failing"] and st["write_errors"] >= 7
        assert "No space left on device" in st["last_error"]
        assert 0 < st["pending_rows"] < 70 and st["dropped_rows"] > 0  # bounded, oldest out
        assert st["pending_rows"] + st["dropped_rows"] == 70
    finally:
        os.dup2(saved, w._fd)  # space again
        os.close(saved)
        os.close(full)
    w.write(rows(2000.0, 10))
    w.flush()
    st = w.status()
    assert not st["failing"] and st["pending_rows"] == 0 and st["first_failure"]
    w.close()
    df = read_samples(tmp_path)
    assert len(df) == 90 - st["dropped_rows"]
    assert df["ts"].is_unique  # every row read back is one that was written, none torn
    kept = set(df["ts"])
    assert {1000.0 + i for i in range(10)} <= kept and {2000.0 + i for i in range(10)} <= kept


class Faulty:
    """The filesystem as the store and the run directory's atomic writer (which the store
    uses for agent.json) see it, made read-only on demand (EROFS for every write,
    open-for-write, create and rename), the rest untouched."""

    def __init__(self, monkeypatch) -> None:
        self.on = False
        real_os, real_open = os, open
        outer = self

        def fail(what: object) -> OSError:
            return OSError(errno.EROFS, os.strerror(errno.EROFS), str(what))

        class OS:
            def __getattr__(self, name):
                return getattr(real_os, name)

            def write(self, fd, data):
                if outer.on:
                    raise fail(fd)
                return real_os.write(fd, data)

            def open(self, path, flags, *a, **k):
                if outer.on and flags & (real_os.O_WRONLY | real_os.O_RDWR | real_os.O_CREAT):
                    raise fail(path)
                return real_os.open(path, flags, *a, **k)

            def replace(self, a, b):
                if outer.on:
                    raise fail(b)
                return real_os.replace(a, b)

        def fake_open(path, mode="r", *a, **k):
            if outer.on and any(c in mode for c in "wax+"):
                raise fail(path)
            return real_open(path, mode, *a, **k)

        for module in (store, rundir):
            monkeypatch.setattr(module, "os", OS())
            monkeypatch.setattr(module, "open", fake_open, raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return dict(line.rsplit(" ", 1) for line in text.splitlines()
                if line.startswith("pd_telemetry_"))


@pytest.fixture
def faulty(monkeypatch) -> Faulty:
    return Faulty(monkeypatch)


def test_agent_survives_a_read_only_node_dir_and_counts_it(tmp_path, faulty):
    port = free_port()
    agent = agent_mod.Agent(tmp_path, "n1", 0.2, exporter_port=port,
                            exporter_addr="127.0.0.1", gpu=False)
    agent.writer.max_pending_bytes = 1500  # a small memory bound, so some rows are given up
    t = threading.Thread(target=lambda: __import__("asyncio").run(agent.run(16.0)))
    t.start()
    try:
        time.sleep(1.0)
        t_fault = time.time()
        faulty.on = True  # the node directory turns read-only
        time.sleep(1.0)
        ticks = agent.ticks
        deadline = time.monotonic() + 10
        while True:  # until the memory bound is hit (rows per beat vary with the machine)
            m = scrape(port)
            if float(m.get("pd_telemetry_dropped_rows_total", 0)) > 0:
                break
            assert time.monotonic() < deadline, m
            time.sleep(0.3)
        wait_for(lambda: agent.ticks > ticks, 5, "the agent to go on sampling")
        assert m['pd_telemetry_write_failing{error="Read-only file system"}'] == "1.0", m
        assert float(m["pd_telemetry_write_errors_total"]) > 0
        assert float(m["pd_telemetry_pending_rows"]) > 0
        faulty.on = False  # writable again: what is held goes out
        t_back = time.time()
        time.sleep(1.5)  # rows sampled after the recovery are part of what is checked
        m = scrape(port)
        assert m['pd_telemetry_write_failing{error=""}'] == "0.0", m
        assert m["pd_telemetry_pending_rows"] == "0.0"
    finally:
        faulty.on = False
        agent.stop()
        t.join(timeout=30)
    assert not t.is_alive()
    info = read_agent_info(tmp_path)["n1"]
    w = info["writes"]
    assert info["final"] and w["dropped_rows"] > 0 and w["write_errors"] > 0
    assert not w["failing"] and "Read-only file system" in w["last_error"]
    df = read_samples(tmp_path)  # before, during (what was held, not dropped) and after
    assert (df["ts"] < t_fault).any() and (df["ts"] >= t_back).any()
    assert ((df["ts"] > t_fault) & (df["ts"] < t_back)).any()
    assert "the telemetry of this node is partial" in agent.final_words()


def test_agent_exits_0_when_the_dir_is_still_read_only_at_teardown(tmp_path, faulty, capsys):
    (tmp_path / "plan.json").write_text(json.dumps({"not": "a plan"}))
    port = free_port()
    code: list[int] = []

    def main() -> None:
        code.append(agent_mod.main(["--run-dir", str(tmp_path), "--node", "n1", "--interval",
                                    "0.2", "--no-gpu", "--duration", "3", "--exporter-addr",
                                    "127.0.0.1", "--exporter-port", str(port)]))

    t = threading.Thread(target=main)
    t.start()
    time.sleep(1.0)
    faulty.on = True
    t.join(timeout=30)
    assert code == [0]
    out = capsys.readouterr().out
    assert "cannot write" in out and "Read-only file system" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("agent@n1: stopped after") and "could not be written" in last
    assert "the telemetry of this node is partial" in last
    assert "agent.json could not be written either" in last
    faulty.on = False
    rows_kept = read_samples(tmp_path)
    assert len(rows_kept) > 0  # what was written before the fault stays readable
    assert not Path(tmp_path / "telemetry" / "n1" / "agent.json").read_text().count('"final": true')
