"""Stopping a process means its whole process group: vLLM's API server can exit (or crash on
exit) while its engine core, worker or multiprocessing resource tracker is still running in
its group, and a run that reports "stopped" then leaves it behind."""

from __future__ import annotations

import os
import signal
import sys
import time

from launcher.control.backends import Backend, Handle
from launcher.run.plandoc import Kind, Process

# The leader ends at once on SIGTERM; its child outlives it, as vLLM's resource tracker
# does while it cleans up (`lingers` seconds), or ignores SIGTERM outright (`forever`).
CHILD = """
import os, signal, sys, time
if sys.argv[1] == "forever":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.5), os._exit(0)))
open(sys.argv[2], "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""
LEADER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
while True:
    time.sleep(0.1)
"""


def _start(tmp_path, how: str) -> tuple[Backend, Handle, int]:
    backend = Backend.for_steps(tmp_path)
    pidfile = tmp_path / f"{how}.pid"
    argv = [sys.executable, "-c", LEADER, CHILD, how, str(pidfile)]
    proc = Process(name=f"engine-{how}", kind=Kind.ENGINE, node="local", argv=argv, env={},
                   log=f"{how}.log")
    h = Handle(proc, backend.spawn(argv, tmp_path / proc.log), tmp_path / proc.log)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return backend, h, int(pidfile.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # reparented and not yet reaped counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_stop_waits_for_a_child_that_outlives_its_leader(tmp_path):
    backend, h, child = _start(tmp_path, "lingers")
    t0 = time.monotonic()
    backend.stop([h], grace_s=10)
    assert h.exit_code() is not None
    assert not _alive(child), "stop() returned while the group's child still ran"
    assert time.monotonic() - t0 < 8  # it ended by itself: no SIGKILL needed


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace(tmp_path):
    backend, h, child = _start(tmp_path, "forever")
    backend.stop([h], grace_s=1)
    assert not _alive(child)


def test_kill_waits_for_the_whole_group(tmp_path):
    backend, h, child = _start(tmp_path, "lingers")
    backend.kill(h.popen)
    assert h.popen.returncode == -signal.SIGTERM  # the leader went on SIGTERM
    assert not _alive(child)
