"""What the orchestrator asks of this host and of the run's servers: planned ports already
taken here (and by whom), HTTP health, an OpenAI-compatible server's readiness."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from launcher.planning import kv_tiers
from launcher.planning.plan import Plan, job_port_slots


def busy_ports(plan: Plan, ours: frozenset[int] = frozenset()) -> list[str]:
    """Planned ports already taken on this host, for the nodes that are this host (local
    and dev-cluster runs: a run still up, or another program, would make ours fail late).
    `ours`: ports a study's engines hold, which this configuration keeps or stops before it
    starts its own (the pool settles them)."""
    here = {"127.0.0.1", "localhost", socket.gethostname()}
    try:
        here.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    local = {n for n in plan.nodes if plan.address(n) in here or plan.address(n).startswith("127.")}
    wanted: list[tuple[int, str]] = []
    if plan.router_node in local:
        wanted += [(plan.router_port, "router http"), (plan.router_metrics_port, "router metrics")]
    wanted += [(p, f"agent@{n} exporter") for n, p in plan.exporter_ports.items() if n in local]
    if plan.recipe.kv_store is not None and kv_tiers.master_node(plan) in local:
        m = kv_tiers.master_ports(plan)
        wanted += [(m.rpc, "mooncake-master rpc"), (m.metadata, "mooncake-master metadata"),
                   (m.admin, "mooncake-master admin")]
    for ep in plan.endpoints:
        for part in ep.parts:
            if part.node not in local:
                continue
            if part.http_port is not None:
                wanted.append((part.http_port, f"{ep.name} http"))
            if ep.role.disaggregated:
                wanted += [
                    (ep.nixl_port_base + r, f"{ep.name} nixl rank {r}") for r in part.dp_ranks
                ]
        if ep.multi_node and ep.head.node in local:
            wanted.append((ep.dp_rpc_port,
                           f"{ep.name} {'master' if ep.spans_nodes else 'dp rpc'}"))
    busy = []
    for port, what in sorted(set(wanted)):
        if port in ours:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # Servers set SO_REUSEADDR too: a recent run's TIME_WAIT connections are no clash.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((plan.cluster.bind_host, port))
            except OSError:
                busy.append(f"{port} ({what}{port_holder(port)})")
    return busy


_BLOCK_HELD: dict[int, tuple[int, list[int]]] = {}  # port_base -> (slot, lock fds) held here
LOCK_PAGE = 1000  # ports per lock file: runs of profiles with different port_bases meet there


def block_lock(port: int) -> Path:
    """The lock file a run on this host holds (flock) while it plans on `port`: one per
    thousand ports, whatever the run's port_base."""
    return (Path(tempfile.gettempdir()) / "pd-launcher-ports"
            / f"{port // LOCK_PAGE * LOCK_PAGE}.lock")


def lock_ports(start: int, span: int) -> list[int] | None:
    """The locks of every thousand from `start` to `start + span`, or None (and none held)
    when another process holds one."""
    fds: list[int] = []
    for page in range(start // LOCK_PAGE, (start + span - 1) // LOCK_PAGE + 1):
        fd = os.open(block_lock(page * LOCK_PAGE), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            for held in fds:
                os.close(held)  # closing releases the lock
            return None
        fds.append(fd)
    return fds


def free_port_block(plan_at: Callable[[int | None], Plan], base: int,
                    ) -> tuple[Plan, str | None]:
    """The run's plan on the block of ports its job id picks (`plan_at(None)`; block 0
    outside a job), or, when another run on this host holds that block, on the next free
    one: lock files in this host's temp folder over the ports it plans, held for this
    process's life, and every port planned on this host free. Two runs on one host (local
    runs; jobs of a cluster whose nodes are one host, or that share a node) then keep apart,
    whatever their profiles' port_base; a study in one process keeps its block. Also what
    was passed over and why (None: its own block).
    Every block taken: its own, whose busy ports the orchestrator names."""
    if base in _BLOCK_HELD:
        return plan_at(_BLOCK_HELD[base][0]), None
    first = plan_at(None)
    slots, block = job_port_slots(first.cluster, first.port_span)
    own = (first.router_port - base) // block
    try:
        block_lock(base).parent.mkdir(mode=0o1777, exist_ok=True)
    except OSError:
        return first, None
    passed: list[str] = []
    for slot in [(own + k) % slots for k in range(slots)]:
        plan = first if slot == own else plan_at(slot)
        start = base + slot * block
        try:
            fds = lock_ports(start, plan.port_span)
        except OSError:
            return first, None
        if fds is None:
            passed.append(f"{start}-{start + block - 1} (another run of this launcher)")
            continue
        busy = busy_ports(plan)
        if not busy:
            _BLOCK_HELD[base] = (slot, fds)
            why = None
            if passed:
                why = (f"ports {'; '.join(passed)} are taken on this host: this run plans on "
                       f"{start}-{start + block - 1} (port_base {base} + {slot} x {block})")
            return plan, why
        for fd in fds:
            os.close(fd)
        passed.append(f"{start}-{start + block - 1} ({busy[0]}"
                      + (f" and {len(busy) - 1} more" if len(busy) > 1 else "") + ")")
    return first, None


def port_holder(port: int) -> str:
    """', held by pid N (name)' for a listening port, where this user may see its owner."""
    import psutil

    try:
        for c in psutil.net_connections(kind="inet"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                try:
                    return f", held by pid {c.pid} ({psutil.Process(c.pid).name()})"
                except psutil.Error:
                    return f", held by pid {c.pid}"
    except (psutil.Error, OSError):
        pass
    return ""


def http_ok(url: str, timeout: float = 2.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read(65536).decode("utf-8", "replace")
            return 200 <= resp.status < 300, body
    except (urllib.error.URLError, OSError, ValueError) as e:
        return False, str(getattr(e, "reason", e))


def api_ready(url: str, model: str) -> tuple[bool, str]:
    """vLLM is ready when /health answers and /v1/models lists the served model."""
    ok, why = http_ok(f"{url}/health")
    if not ok:
        return False, f"/health: {why}"
    ok, body = http_ok(f"{url}/v1/models")
    if not ok:
        return False, f"/v1/models: {body}"
    try:
        ids = [m.get("id") for m in json.loads(body).get("data", [])]
    except (json.JSONDecodeError, AttributeError):
        return False, "/v1/models: not JSON"
    return (model in ids), f"/v1/models lists {ids}"
