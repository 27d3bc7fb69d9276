"""The session's guard against NIXL's busy poller (conftest.py, docs/vllm-cpu.md): a thread of a
`VLLM::Worker` process that wants a whole core is moved into a CPU cgroup with a cap, which then
holds it back (or lowered to nice 19 where no cgroup can be made), on a loaded machine too; the
process's main thread, its quiet threads and a thread that works hard but blocks (no poller)
are left where they are."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import conftest
import pytest
from helpers import wait_for

# vLLM's worker is `VLLM::Worker`; this one has a name of its own, so that the session's guard
# (which looks for vLLM's) leaves it to the guard under test
NAME = "PDTEST::Worker"
WORKER = f"""
NAME = {NAME!r}
import ctypes, sys, threading, time
ctypes.CDLL(None).prctl(15, NAME.encode(), 0, 0, 0)  # PR_SET_NAME, as vLLM names its worker
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print(*(t.native_id for t in threading.enumerate()), flush=True)  # main, spin, sleep
time.sleep(60)
"""
# A thread that works as hard as a poller spins, but blocks a few hundred times a second (as
# NIXL's handshake in Python does, on the GIL or a lock): work, not a poll
BUSY_WORKER = f"""
NAME = {NAME!r}
import ctypes, threading, time
ctypes.CDLL(None).prctl(15, NAME.encode(), 0, 0, 0)
def work():
    pause = threading.Event()
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.005:
            pass
        pause.wait(0.0003)
threading.Thread(target=work, daemon=True).start()
print(*(t.native_id for t in threading.enumerate()), flush=True)  # main, work
time.sleep(60)
"""


def _cpu_cgroup(tid: int) -> str:
    """The CPU cgroup of thread `tid` (cgroup v1's cpu hierarchy, else v2's)."""
    lines = Path(f"/proc/{tid}/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))


@pytest.fixture
def worker():
    p = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    try:
        main, spinner, quiet = (int(x) for x in p.stdout.readline().split())
        assert main == p.pid
        yield p, main, spinner, quiet, stop
    finally:
        stop.set()
        p.kill()
        p.wait()


def test_a_busy_worker_thread_is_capped_in_a_cgroup_and_its_other_threads_are_not(worker):
    p, main, spinner, quiet, stop = worker
    group = conftest._pollers_cgroup(owner=p.pid)
    if group is None:
        pytest.skip("no CPU cgroup can be made here (not root, or no cpu controller)")
    try:
        before = {t: _cpu_cgroup(t) for t in (main, quiet)}
        guard = threading.Thread(target=conftest._nixl_pollers_capped, args=(stop, group, NAME),
                                 daemon=True)
        guard.start()
        wait_for(lambda: _cpu_cgroup(spinner) == "/" + group[0].name, 20,
                 "the spinner moved into the group")
        assert {t: _cpu_cgroup(t) for t in (main, quiet)} == before
        assert os.getpriority(os.PRIO_PROCESS, spinner) == 0  # moved, not niced
        wait_for(lambda: conftest._cgroup_stat(group[0])["nr_throttled"] > 0, 10,
                 "the cap to hold the spinner back")
    finally:
        stop.set()
        conftest._pollers_release(group)  # hands the spinner back first
    assert not group[0].exists()


def test_where_no_cgroup_can_be_made_a_busy_worker_thread_is_niced(worker):
    p, main, spinner, quiet, stop = worker
    guard = threading.Thread(target=conftest._nixl_pollers_capped, args=(stop, None, NAME),
                             daemon=True)
    guard.start()
    wait_for(lambda: os.getpriority(os.PRIO_PROCESS, spinner) == 19, 20, "the spinner niced")
    assert os.getpriority(os.PRIO_PROCESS, main) == 0
    assert os.getpriority(os.PRIO_PROCESS, quiet) == 0


def test_a_thread_that_works_hard_but_blocks_is_not_taken_for_a_poller():
    p = subprocess.Popen([sys.executable, "-c", BUSY_WORKER], stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    group = None
    try:
        main, busy = (int(x) for x in p.stdout.readline().split())
        group = conftest._pollers_cgroup(owner=p.pid)
        guard = threading.Thread(target=conftest._nixl_pollers_capped, args=(stop, group, NAME),
                                 daemon=True)
        before = _cpu_cgroup(busy), conftest._thread_load(p.pid, busy)
        t0 = time.monotonic()
        guard.start()
        time.sleep(conftest.POLLER_SECONDS + 3)
        after = conftest._thread_load(p.pid, busy)
        wanted = (after[0] - before[1][0]) / 1e9 / (time.monotonic() - t0)
        # what a poller would have shown, but for its blocking
        assert wanted >= conftest.POLLER_CORE_SHARE, wanted
        assert after[1] - before[1][1] > conftest.POLLER_MAX_BLOCKS * 10
        assert _cpu_cgroup(busy) == before[0]
        assert os.getpriority(os.PRIO_PROCESS, busy) == 0
    finally:
        stop.set()
        p.kill()
        p.wait()
        conftest._pollers_release(group)
