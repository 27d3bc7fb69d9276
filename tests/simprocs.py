"""Start simulated engines as real processes on loopback (tests, benchmarks, local demos).

Only the standard library: ports are found by binding, health is polled with urllib, and
every wait is bounded.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"

# Ports under pytest-xdist: the dev cluster's tests (one worker, one at a time) keep the
# bases they name (23000-31999, where the shipped profiles' runs are too: those take a free
# block by lock, launcher/control/probes.py); every other worker takes only its own
# contiguous share of 10000-21999, so tests on two workers never plan the same port, and
# never one of a shipped profile's runs.
WORKER_PORTS = range(10000, 22000)
ON_DEVCLUSTER = [False]  # set per test by tests/conftest.py


def worker_ports() -> range | None:
    """The ports this xdist worker owns (whole thousands); None outside xdist or on the dev
    cluster's worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or ON_DEVCLUSTER[0]:
        return None
    share = len(WORKER_PORTS) // 1000 // count * 1000
    start = WORKER_PORTS.start + int(worker[2:]) % count * share
    return range(start, start + share)


def _can_bind(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


_used: set[int] = set()


def free_ports(n: int = 1) -> int:
    """First of ``n`` consecutive free loopback ports (not handed out before here)."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(2000):
        # below Linux's ephemeral range (32768+) and above the launcher's port plans
        # (port_base 21000-24000 + a few hundred), so concurrent runs do not collide; under
        # pytest-xdist in this worker's own ports (worker_ports)
        own = worker_ports()
        base = (rng.randrange(own.start, own.stop - n) if own
                else rng.randrange(26000, 32700 - n))
        ports = range(base, base + n)
        if any(p in _used for p in ports):
            continue
        if all(_can_bind(p) for p in ports):
            _used.update(ports)
            return base
    raise RuntimeError("no free loopback ports")


@dataclass
class SimProc:
    """One ``python -m launcher.sim serve`` process (or any command) with its log file."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> SimProc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv} exited with {self.proc.returncode}:\n"
                                   + self.log_text()[-3000:])
            if self.healthy():
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.url} not healthy after {timeout} s:\n"
                           + self.log_text()[-3000:])

    def log_text(self) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode


def sim_argv(model: str, port: int | None, *flags: str) -> list[str]:
    argv = [sys.executable, "-m", "launcher.sim", "serve", model]
    if port is not None:
        argv += ["--host", LOOPBACK, "--port", str(port)]
    return argv + list(flags)


def kv_config(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role,
                       "kv_buffer_device": "cuda",
                       "kv_connector_extra_config": {"backends": ["UCX"]}})


def sim_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", LOOPBACK)
    env.update(extra)
    return env


def start_sim(log_dir: Path, name: str, model: str, *flags: str, port: int | None = None,
              headless: bool = False, **env: str) -> SimProc:
    """Start a sim on a free port (unless headless) and return it (not yet healthy)."""
    if not headless and port is None:
        port = free_ports(1)
    argv = sim_argv(model, None if headless else port, *flags)
    return SimProc(argv, sim_env(**env), log_dir / f"{name}.log", port=port).start()


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 30.0,
              headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as r:
        return r.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (fast line parse)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        brace = head.find("{")
        metric = head if brace < 0 else head[:brace]
        if metric != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def fill_to_capacity(sim: SimProc, workload_flags: list[str], n: int,
                     cwd: Path) -> tuple[dict[str, float], list[float]]:
    """Send `n` requests at once (more than fit) with the benchmark client and watch the
    simulator's /metrics meanwhile: (peaks of running, KV usage and capacity waits; the
    running count at each scrape where the cache was full and requests waited)."""
    import threading

    peak = {"running": 0.0, "usage": 0.0, "capacity_waits": 0.0}
    full: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                text = scrape(sim.url, timeout=5)
            except OSError:
                time.sleep(0.2)
                continue
            running = sample(text, "vllm:num_requests_running")
            usage = sample(text, "vllm:kv_cache_usage_perc")
            waits = sample(text, "vllm:num_requests_waiting_by_reason", reason="capacity")
            peak["running"] = max(peak["running"], running)
            peak["usage"] = max(peak["usage"], usage)
            peak["capacity_waits"] = max(peak["capacity_waits"], waits)
            if usage > 0.95 and waits > 0:
                full.append(running)
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        subprocess.run(
            [sys.executable, "-m", "launcher.clients.bench", "--base-url", sim.url, "--model",
             "m", "--dataset-name", "random", *workload_flags, "--num-prompts", str(n),
             "--max-concurrency", str(n), "--ignore-eos"],
            cwd=cwd, capture_output=True, text=True, timeout=200, check=True,
        )  # fmt: skip
    finally:
        stop.set()
        t.join(10)
    return peak, full
