"""The session's guard against NIXL's busy poller (conftest.py, docs/vllm-cpu.md): a thread of a
`VLLM::Worker` process that wants a whole core is lowered to nice 19, on a loaded machine too;
the process's main thread and its quiet threads keep their priority."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import conftest

WORKER = """
import ctypes, sys, threading, time
ctypes.CDLL(None).prctl(15, b"VLLM::Worker", 0, 0, 0)  # PR_SET_NAME: what vLLM's worker is called
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print(*(t.native_id for t in threading.enumerate()), flush=True)  # main, spin, sleep
time.sleep(60)
"""


def test_a_busy_worker_thread_is_niced_and_its_other_threads_are_not():
    p = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    try:
        main, spinner, quiet = (int(x) for x in p.stdout.readline().split())
        assert main == p.pid
        guard = threading.Thread(target=conftest._nixl_pollers_nice, args=(stop,), daemon=True)
        guard.start()
        deadline = time.monotonic() + 20
        while os.getpriority(os.PRIO_PROCESS, spinner) != 19 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert os.getpriority(os.PRIO_PROCESS, spinner) == 19
        assert os.getpriority(os.PRIO_PROCESS, main) == 0
        assert os.getpriority(os.PRIO_PROCESS, quiet) == 0
    finally:
        stop.set()
        p.kill()
        p.wait()
