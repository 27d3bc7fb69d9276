"""Watching the nodes of a running job from its orchestrator: is every node still there, and
can every agent still write its telemetry?

A lost node is hard to see from the batch step: the `srun` of a step whose node died does not
end until Slurm itself notices (SlurmdTimeout, minutes on real clusters), and the first
process to exit is often a healthy one on another node (a decode head whose remote ranks
vanished). So a node counts as lost when its `slurmd` does not take a TCP connection (refused,
or silent for PROBE_TIMEOUT_S) or Slurm marks it down / not responding, and the question is
asked

- whenever any process exits, before that process is blamed (`confirm`), and
- in the background when a node's agent stops answering on its exporter: the agent is the
  node's heartbeat (`start`). slurmd is only knocked on then, so its log stays quiet.

The same exporter poll reads the agent's write counts (`pd_telemetry_*`), so a node whose
telemetry directory went read-only or full is known while the run goes on.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SLURMD_PORT = 6818  # Slurm's default when `scontrol show node` gives no Port
PROBE_TIMEOUT_S = 3.0
HEARTBEAT_S = 3.0  # how often each agent's exporter is asked
MISSES = 2  # unanswered heartbeats in a row before the node's slurmd is knocked on
SINFO_EVERY_S = 15.0
WRITE_SERIES = ("pd_telemetry_dropped_rows_total", "pd_telemetry_write_errors_total",
                "pd_telemetry_pending_rows", "pd_telemetry_write_failing")
_SAMPLE = re.compile(r'^(pd_telemetry_\w+?)(?:\{error="((?:[^"\\]|\\.)*)"\})? (\S+)$', re.M)


def slurm_lost(nodes: list[str], anywhere: bool = False) -> dict[str, str]:
    """Nodes Slurm no longer considers alive, with its word for their state (asked only
    inside a job, unless `anywhere`)."""
    if not nodes or not (anywhere or os.environ.get("SLURM_JOB_ID")):
        return {}
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"],
            capture_output=True, text=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    lost = {}
    for line in out.splitlines():
        name, _, state = line.partition(" ")
        s = state.strip().lower()
        if any(w in s for w in ("down", "fail", "not_responding", "unknown")) or s.endswith("*"):
            lost[name] = f"Slurm says {state.strip()}"
    return lost


def slurmd_addresses(nodes: list[str]) -> dict[str, tuple[str, int]]:
    """Each node's slurmd (NodeAddr, Port) from `scontrol show node`; a node scontrol did not
    describe is left out (never guessed: a wrong address would read as a lost node)."""
    out = ""
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "node", ",".join(nodes)],
            capture_output=True, text=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        pass
    found: dict[str, tuple[str, int]] = {}
    for line in out.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        name = fields.get("NodeName")
        if name:
            port = fields.get("Port", "")
            found[name] = (fields.get("NodeAddr") or name,
                           int(port) if port.isdigit() else SLURMD_PORT)
    return {n: found[n] for n in nodes if n in found}


def knock(addr: tuple[str, int], timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None if something listens at `addr`, else why not."""
    try:
        with socket.create_connection(addr, timeout=timeout):
            return None
    except TimeoutError:
        return f"its slurmd at {addr[0]}:{addr[1]} does not answer within {timeout:g} s"
    except OSError as e:
        return f"its slurmd at {addr[0]}:{addr[1]} does not answer ({e.strerror or e})"


def agent_writes(url: str, timeout: float = 2.0) -> dict | None:
    """The agent's write counts from its exporter, or None when it does not answer."""
    query = "&".join(f"name[]={n}" for n in WRITE_SERIES)
    try:
        with urllib.request.urlopen(f"{url}?{query}", timeout=timeout) as resp:
            text = resp.read(1 << 16).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    out: dict = {"dropped_rows": 0, "write_errors": 0, "pending_rows": 0, "failing": False,
                 "error": ""}
    keys = {"pd_telemetry_dropped_rows_total": "dropped_rows",
            "pd_telemetry_write_errors_total": "write_errors",
            "pd_telemetry_pending_rows": "pending_rows"}
    for name, error, value in _SAMPLE.findall(text):
        try:
            v = float(value)
        except ValueError:
            continue
        if name in keys:
            out[keys[name]] = int(v)
        elif name == "pd_telemetry_write_failing":
            out["failing"], out["error"] = v > 0, error
    return out


def agent_sample(url: str, timeout: float) -> float | None:
    """Ask the agent behind this exporter URL for one sample now; its time once written, or
    None when it did not answer in `timeout` (launcher.telemetry.exporter, `POST /sample`)."""
    parts = urllib.parse.urlsplit(url)
    target = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/sample",
                                      f"timeout={timeout:g}", ""))
    try:
        req = urllib.request.Request(target, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=timeout + 1.0) as resp:
            return float(json.loads(resp.read(1 << 12))["ts"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None


class NodeWatch:
    """Lost nodes (`lost`, node -> why) and each agent's write counts (`writes`), kept up to
    date by a background thread; `confirm()` asks every node at once."""

    def __init__(self, nodes: list[str], slurm: bool) -> None:
        self.nodes = list(nodes)
        self.slurm = slurm and bool(os.environ.get("SLURM_JOB_ID"))
        self.lost: dict[str, str] = {}
        self.writes: dict[str, dict] = {}
        self.agents: dict[str, str] = {}  # node -> exporter URL of its agent
        self._addr: dict[str, tuple[str, int]] | None = None
        self._misses: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sinfo = 0.0

    def addresses(self) -> dict[str, tuple[str, int]]:
        """Asked while all is well (start), so a node that dies later is still known; asked
        again only while some are missing."""
        if self.slurm and (self._addr is None or len(self._addr) < len(self.nodes)):
            self._addr = {**slurmd_addresses(self.nodes), **(self._addr or {})}
        return self._addr or {}

    def _mark(self, found: dict[str, str]) -> None:
        with self._lock:
            for node, why in found.items():
                self.lost.setdefault(node, why)

    def confirm(self, nodes: list[str] | None = None) -> dict[str, str]:
        """Knock on every node's slurmd (in parallel) and ask Slurm: the lost ones, with why."""
        if not self.slurm:
            return {}
        addr = self.addresses()
        nodes = [n for n in (nodes or self.nodes) if n in addr]
        answers: dict[str, str | None] = {}
        if nodes:
            with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
                answers = dict(zip(nodes, pool.map(lambda n: knock(addr[n]), nodes),
                                   strict=True))
        found = {n: why for n, why in answers.items() if why}
        for n, why in slurm_lost(nodes).items():
            found[n] = f"{found[n]}; {why}" if n in found else why
        self._mark(found)
        return dict(self.lost)

    # --- the background heartbeat ---
    def start(self, agents: dict[str, str]) -> None:
        """Poll these agents' exporters (node -> URL) every HEARTBEAT_S."""
        self.agents = dict(agents)
        self.addresses()  # while every node is there
        if self._thread is None and (self.agents or self.slurm):
            self._thread = threading.Thread(target=self._loop, name="node-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """No more heartbeats (the thread may finish its round; it only reads)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=0.5)

    def _loop(self) -> None:
        pool = ThreadPoolExecutor(max_workers=min(16, max(1, len(self.agents))))
        try:
            while not self._stop.wait(HEARTBEAT_S):
                self.beat(pool)
        finally:
            pool.shutdown(wait=False)

    def sample(self, nodes: list[str], timeout: float) -> list[str]:
        """The agents of these nodes (those watched, not lost) take one sample now, all at
        once; the nodes whose agent did not say it had within `timeout`."""
        nodes = [n for n in nodes if n in self.agents and n not in self.lost]
        if not nodes:
            return []
        with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
            answers = list(pool.map(lambda n: agent_sample(self.agents[n], timeout), nodes))
        return [n for n, ts in zip(nodes, answers, strict=True) if ts is None]

    def beat(self, pool: ThreadPoolExecutor | None = None, knock_too: bool = True,
             timeout: float = 2.0) -> None:
        """One round: every agent's write counts; a silent agent's node is knocked on."""
        nodes = list(self.agents)
        if not nodes and not self.slurm:
            return
        own = pool is None and len(nodes) > 1
        if own:
            pool = ThreadPoolExecutor(max_workers=min(32, len(nodes)))
        try:
            run = pool.map if pool is not None else map
            answers = list(run(lambda n: agent_writes(self.agents[n], timeout), nodes))
        finally:
            if own:
                pool.shutdown(wait=False)
        for node, w in zip(nodes, answers, strict=True):
            if w is not None:
                self._misses[node] = 0
                with self._lock:
                    self.writes[node] = w
                continue
            self._misses[node] = self._misses.get(node, 0) + 1
            addr = self.addresses().get(node) if knock_too else None
            if (addr and self.slurm and self._misses[node] >= MISSES
                    and node not in self.lost):
                why = knock(addr)
                if why:
                    self._mark({node: why + "; its agent stopped answering too"})
        now = time.monotonic()
        if knock_too and self.slurm and now - self._last_sinfo >= SINFO_EVERY_S:
            self._last_sinfo = now
            self._mark(slurm_lost(self.nodes))
