"""Host telemetry through psutil: CPU, memory, network per NIC, InfiniBand port counters, and
per launcher-started process (found by `PD_PROCESS` in its environment, contracts.md).

Sample names:
host: cpu_util_pct, cpu_user_s, cpu_system_s, cpu_iowait_s, cpu_steal_s (cumulative),
      cpu_count, load_1m, mem_total_bytes, mem_used_bytes, mem_available_bytes,
      swap_used_bytes, net_sent_bytes / net_recv_bytes / net_packets_sent / net_packets_recv /
      net_errin / net_errout / net_dropin / net_dropout (counters, label nic),
      ib_xmit_bytes / ib_rcv_bytes (counters, labels device, port; from /sys/class/infiniband)
proc: (process = the PD_PROCESS name; all PIDs carrying it, and their descendants whose
      environment does not show it, are summed: API server, engine cores, workers) num_pids, cpu_s (user+system, cumulative), cpu_pct (over the interval),
      max_pid_cpu_pct (the hottest single PID: a busy-polling engine core shows here), rss_bytes,
      threads, open_fds, ctx_switches_voluntary, ctx_switches_involuntary (cumulative)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

ENV_PROCESS = "PD_PROCESS"
ENV_RUN_DIR = "PD_RUN_DIR"


class HostCollector:
    """psutil sampler. Process discovery reads `/proc/<pid>/environ` only for PIDs not seen
    before (rescanned every `rescan_s`), so a steady state costs a few syscalls per PID."""

    def __init__(self, node: str, *, run_dir: str | None = None, rescan_s: float = 5.0,
                 nics: list[str] | None = None, ib_root: str = "/sys/class/infiniband",
                 port_owners: dict[int, str] | None = None, port_scan_s: float = 10.0) -> None:
        import psutil

        self.psutil = psutil
        self.node = node
        self.run_dir = os.path.realpath(run_dir) if run_dir else None
        self.rescan_s = rescan_s
        self.nics = nics
        self.ib_root = Path(ib_root)
        self._procs: dict[tuple[int, float], tuple[str, Any]] = {}  # (pid, ctime) -> name, Proc
        self._rejected: set[tuple[int, float]] = set()
        self._last_scan = 0.0
        # listening port -> plan process: the fallback for a process whose environment is
        # unreadable (vllm-router renames itself, which blanks /proc/<pid>/environ)
        self.port_owners = dict(port_owners or {})
        self.port_scan_s = port_scan_s
        self._last_port_scan = 0.0
        self.up: set[str] | None = None  # processes known to serve (set by the agent)
        self._prev_cpu: dict[tuple[int, float], tuple[float, float]] = {}
        self.info: dict[str, Any] = {"nics": [], "ib_ports": [], "notices": []}
        psutil.cpu_percent(None)  # prime the interval-based CPU %
        try:
            self.info["nics"] = sorted(psutil.net_io_counters(pernic=True))
        except Exception as e:  # noqa: BLE001
            self.info["notices"].append(f"no per-NIC counters: {e}")
        self._ib = self._ib_ports()  # listed once: ports do not come and go during a job
        self.info["ib_ports"] = [f"{d}/{p}" for d, p, _ in self._ib]

    # --- processes -----------------------------------------------------------------------
    def _scan(self, now: float) -> None:
        ps = self.psutil
        seen = set()
        orphans: list[tuple[tuple[int, float], Any]] = []
        for p in ps.process_iter(["pid", "create_time"]):
            try:
                key = (p.info["pid"], p.info["create_time"])
            except Exception:  # noqa: BLE001
                continue
            seen.add(key)
            if key in self._procs or key in self._rejected:
                continue
            try:
                env = p.environ()
            except (ps.AccessDenied, ps.NoSuchProcess, ps.ZombieProcess, OSError):
                self._rejected.add(key)
                continue
            name = env.get(ENV_PROCESS)
            if not name:
                orphans.append((key, p))  # maybe a child that cleared/overwrote its env
                continue
            if (self.run_dir and env.get(ENV_RUN_DIR) and
                    os.path.realpath(env[ENV_RUN_DIR]) != self.run_dir):
                self._rejected.add(key)  # another run's process
                continue
            self._procs[key] = (name, p)
        # A child without PD_PROCESS in /proc/<pid>/environ belongs to its nearest launcher-
        # started ancestor: e.g. vllm-router's Rust process renames itself ("vllm::router"),
        # which overwrites the memory /proc shows as its environment.
        by_pid = {k[0]: name for k, (name, _) in self._procs.items()}
        for key, p in orphans:
            name = None
            try:
                q = p
                for _ in range(8):
                    ppid = q.ppid()
                    if ppid in by_pid:
                        name = by_pid[ppid]
                        break
                    if ppid <= 1:
                        break
                    q = ps.Process(ppid)
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess, OSError):
                name = None
            if name is None:
                self._rejected.add(key)
            else:
                self._procs[key] = (name, p)
                by_pid[key[0]] = name
        self._scan_ports(now, orphans)
        for key in list(self._procs):
            if key not in seen:
                self._procs.pop(key, None)
                self._prev_cpu.pop(key, None)
        self._rejected &= seen
        self._last_scan = now

    def _scan_ports(self, now: float, orphans: list) -> None:
        found = {name for name, _ in self._procs.values()}
        # only names that answer on their port (when the agent says so): one scan finds them
        missing = {port: name for port, name in self.port_owners.items()
                   if name not in found and (self.up is None or name in self.up)}
        if not missing or now - self._last_port_scan < self.port_scan_s:
            return
        self._last_port_scan = now
        ps = self.psutil
        try:
            conns = ps.net_connections(kind="tcp")
        except (ps.AccessDenied, OSError):
            return
        for c in conns:
            if c.status != ps.CONN_LISTEN or not c.pid or not c.laddr:
                continue
            name = missing.get(c.laddr.port)
            if name is None:
                continue
            try:
                p = ps.Process(c.pid)
                key = (c.pid, p.create_time())
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue
            self._rejected.discard(key)
            self._procs[key] = (name, p)

    def processes(self) -> dict[str, list[int]]:
        """{process name: [pids]} currently attributed."""
        out: dict[str, list[int]] = {}
        for (pid, _), (name, _) in self._procs.items():
            out.setdefault(name, []).append(pid)
        return out

    # --- sampling ------------------------------------------------------------------------
    def sample(self, ts: float | None = None) -> list[tuple]:
        ts = time.time() if ts is None else ts
        ps = self.psutil
        rows: list[tuple] = []
        node = self.node

        def host(name: str, value: float, labels: str = "{}") -> None:
            rows.append((ts, node, "", "", "host:" + name, labels, float(value)))

        host("cpu_util_pct", ps.cpu_percent(None))
        ct = ps.cpu_times()
        host("cpu_user_s", ct.user)
        host("cpu_system_s", ct.system)
        for f in ("iowait", "steal"):
            if hasattr(ct, f):
                host(f"cpu_{f}_s", getattr(ct, f))
        host("cpu_count", ps.cpu_count() or 0)
        try:
            host("load_1m", os.getloadavg()[0])
        except OSError:
            pass
        vm = ps.virtual_memory()
        host("mem_total_bytes", vm.total)
        host("mem_used_bytes", vm.used)
        host("mem_available_bytes", vm.available)
        try:
            host("swap_used_bytes", ps.swap_memory().used)
        except Exception:  # noqa: BLE001, S110 - no swap info in some containers
            pass
        try:
            nics = ps.net_io_counters(pernic=True)
        except Exception:  # noqa: BLE001
            nics = {}
        for nic, c in nics.items():
            if nic == "lo" or (self.nics is not None and nic not in self.nics):
                continue
            lab = '{"nic":"%s"}' % nic.replace('"', "")  # noqa: UP031 - cheap canonical JSON
            host("net_sent_bytes", c.bytes_sent, lab)
            host("net_recv_bytes", c.bytes_recv, lab)
            host("net_packets_sent", c.packets_sent, lab)
            host("net_packets_recv", c.packets_recv, lab)
            host("net_errin", c.errin, lab)
            host("net_errout", c.errout, lab)
            host("net_dropin", c.dropin, lab)
            host("net_dropout", c.dropout, lab)
        for dev, port, counters in self._ib:
            lab = f'{{"device":"{dev}","port":"{port}"}}'
            for fname, sname in (("port_xmit_data", "ib_xmit_bytes"),
                                 ("port_rcv_data", "ib_rcv_bytes")):
                try:
                    # the data counters count 4-byte words (IB spec)
                    host(sname, int((counters / fname).read_text()) * 4, lab)
                except (OSError, ValueError):
                    continue
        if ts - self._last_scan >= self.rescan_s:
            self._scan(ts)
        rows.extend(self._proc_rows(ts))
        return rows

    def _proc_rows(self, ts: float) -> list[tuple]:
        ps = self.psutil
        agg: dict[str, dict[str, float]] = {}
        dead = []
        for key, (name, p) in self._procs.items():
            try:
                with p.oneshot():
                    cpu = p.cpu_times()
                    mem = p.memory_info()
                    threads = p.num_threads()
                    ctx = p.num_ctx_switches()
                    try:
                        fds = p.num_fds()
                    except (AttributeError, ps.AccessDenied):
                        fds = 0
            except (ps.NoSuchProcess, ps.ZombieProcess):
                dead.append(key)
                continue
            except ps.AccessDenied:
                continue
            cpu_s = cpu.user + cpu.system
            prev = self._prev_cpu.get(key)
            pct = 0.0
            if prev is not None and ts > prev[0]:
                pct = 100.0 * (cpu_s - prev[1]) / (ts - prev[0])
            self._prev_cpu[key] = (ts, cpu_s)
            a = agg.setdefault(name, {"num_pids": 0, "cpu_s": 0.0, "cpu_pct": 0.0,
                                      "max_pid_cpu_pct": 0.0, "rss_bytes": 0, "threads": 0,
                                      "open_fds": 0, "ctx_switches_voluntary": 0,
                                      "ctx_switches_involuntary": 0})
            a["num_pids"] += 1
            a["cpu_s"] += cpu_s
            a["cpu_pct"] += pct
            a["max_pid_cpu_pct"] = max(a["max_pid_cpu_pct"], pct)
            a["rss_bytes"] += mem.rss
            a["threads"] += threads
            a["open_fds"] += fds
            a["ctx_switches_voluntary"] += ctx.voluntary
            a["ctx_switches_involuntary"] += ctx.involuntary
        for key in dead:
            self._procs.pop(key, None)
            self._prev_cpu.pop(key, None)
        rows = []
        for name, a in agg.items():
            for field, v in a.items():
                rows.append((ts, self.node, name, "", "proc:" + field, "{}", float(v)))
        return rows

    def _ib_ports(self) -> list[tuple[str, str, Path]]:
        out = []
        try:
            devs = sorted(self.ib_root.iterdir())
        except OSError:
            return out
        for d in devs:
            try:
                ports = sorted((d / "ports").iterdir())
            except OSError:
                continue
            for p in ports:
                c = p / "counters"
                if c.is_dir():
                    out.append((d.name, p.name, c))
        return out
