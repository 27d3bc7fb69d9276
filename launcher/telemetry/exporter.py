"""Prometheus exporter of the agent's GPU and host samples, so a site's Prometheus/Grafana can
scrape the job.

Names follow Prometheus's conventions: a `pd_` prefix, base units in the name (`_seconds`,
`_bytes`, `_watts`, `_hertz`, `_celsius`, `_joules`, `_ratio` for 0-1 fractions), `_total` on
counters, and one metric with a label where samples are parts of one whole (`mode` of CPU
time, `type` of context switches). Each telemetry sample name maps to one exported series
through `SERIES` (docs/prometheus.md lists them all); a name without an entry is still exported,
as a gauge named after it. Values are each series' latest sample, converted to the base unit
(percent -> ratio, MHz -> Hz, mJ -> J, KiB/s and MiB/s -> bytes/s, ns -> s).

Labels: `process` (the process a GPU is pinned to, or the process measured; absent for host
series), `gpu` (NVML index) and `uuid` on GPU series, and the sample's own labels (`nic`,
`device`, `port`, `reason`). The node, run, recipe and the rest are target labels that
Prometheus adds from the file-SD targets (launcher.telemetry.promsd), so the exporter does not
repeat them. Its own registry: nothing else leaks in. A series not updated for `stale_after_s`
(a process that ended) is no longer exported.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

_BAD = re.compile(r"[^a-zA-Z0-9_]")

GAUGE, COUNTER = "gauge", "counter"


@dataclass(frozen=True)
class Family:
    """One exported metric: its name (counters end in `_total`), type and help text."""

    name: str
    type: str
    help: str


@dataclass(frozen=True)
class Series:
    """Where one telemetry sample name goes: a family, a factor to its base unit, and the
    labels that tell it apart from the family's other members."""

    family: Family
    scale: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)


def _f(name: str, type_: str, help_: str) -> Family:
    return Family(name, type_, help_)


PCT = 0.01  # percent -> ratio
# sample label -> exported label
LABEL_NAMES = {"index": "gpu"}

_CPU = _f("pd_host_cpu_seconds_total", COUNTER,
          "CPU time of the node, summed over its CPUs, by mode (psutil cpu_times).")
_CTX = _f("pd_proc_context_switches_total", COUNTER,
          "Context switches of the process's PIDs, by type.")
_ECC = _f("pd_gpu_ecc_volatile_errors_total", COUNTER,
          "ECC errors since the driver loaded, by type (corrected, uncorrected).")
_ECC_BITS = _f("pd_gpu_ecc_volatile_bit_errors_total", COUNTER,
               "ECC errors since the driver loaded, by bits (single, double).")
_REMAP = _f("pd_gpu_remapped_rows", GAUGE,
            "Memory rows remapped (NVML row remapping), by cause.")
_VIOLATION = _f("pd_gpu_violation_seconds_total", COUNTER,
                "Time the GPU's clocks were held down by a policy (NVML violation status), "
                "by reason.")

SERIES: dict[str, Series] = {
    # --- host (launcher/telemetry/host.py) ---
    "host:cpu_util_pct": Series(_f("pd_host_cpu_utilization_ratio", GAUGE,
                                   "Busy fraction of all CPUs over the last sample interval "
                                   "(0-1)."), PCT),
    "host:cpu_user_s": Series(_CPU, labels={"mode": "user"}),
    "host:cpu_system_s": Series(_CPU, labels={"mode": "system"}),
    "host:cpu_iowait_s": Series(_CPU, labels={"mode": "iowait"}),
    "host:cpu_steal_s": Series(_CPU, labels={"mode": "steal"}),
    "host:cpu_count": Series(_f("pd_host_cpus", GAUGE, "Logical CPUs of the node.")),
    "host:load_1m": Series(_f("pd_host_load1", GAUGE, "1-minute load average.")),
    "host:mem_total_bytes": Series(_f("pd_host_memory_total_bytes", GAUGE,
                                      "Physical memory of the node.")),
    "host:mem_used_bytes": Series(_f("pd_host_memory_used_bytes", GAUGE,
                                     "Memory in use (psutil virtual_memory().used).")),
    "host:mem_available_bytes": Series(_f("pd_host_memory_available_bytes", GAUGE,
                                          "Memory available to new processes without "
                                          "swapping.")),
    "host:swap_used_bytes": Series(_f("pd_host_swap_used_bytes", GAUGE, "Swap in use.")),
    "host:net_sent_bytes": Series(_f("pd_host_network_transmit_bytes_total", COUNTER,
                                     "Bytes sent, per NIC (loopback excluded).")),
    "host:net_recv_bytes": Series(_f("pd_host_network_receive_bytes_total", COUNTER,
                                     "Bytes received, per NIC (loopback excluded).")),
    "host:net_packets_sent": Series(_f("pd_host_network_transmit_packets_total", COUNTER,
                                       "Packets sent, per NIC.")),
    "host:net_packets_recv": Series(_f("pd_host_network_receive_packets_total", COUNTER,
                                       "Packets received, per NIC.")),
    "host:net_errout": Series(_f("pd_host_network_transmit_errors_total", COUNTER,
                                 "Transmit errors, per NIC.")),
    "host:net_errin": Series(_f("pd_host_network_receive_errors_total", COUNTER,
                                "Receive errors, per NIC.")),
    "host:net_dropout": Series(_f("pd_host_network_transmit_drops_total", COUNTER,
                                  "Outgoing packets dropped, per NIC.")),
    "host:net_dropin": Series(_f("pd_host_network_receive_drops_total", COUNTER,
                                 "Incoming packets dropped, per NIC.")),
    "host:ib_xmit_bytes": Series(_f("pd_host_infiniband_transmit_bytes_total", COUNTER,
                                    "Bytes sent by an InfiniBand port (port_xmit_data x 4).")),
    "host:ib_rcv_bytes": Series(_f("pd_host_infiniband_receive_bytes_total", COUNTER,
                                   "Bytes received by an InfiniBand port (port_rcv_data x 4).")),
    # --- per launcher-started process (host.py; all PIDs carrying its PD_PROCESS) ---
    "proc:num_pids": Series(_f("pd_proc_pids", GAUGE, "PIDs attributed to the process.")),
    "proc:cpu_s": Series(_f("pd_proc_cpu_seconds_total", COUNTER,
                            "User + system CPU time of the process's PIDs.")),
    "proc:cpu_pct": Series(_f("pd_proc_cpu_utilization_ratio", GAUGE,
                              "CPU seconds per second of the process's PIDs over the last "
                              "interval (1 = one CPU busy)."), PCT),
    "proc:max_pid_cpu_pct": Series(_f("pd_proc_max_pid_cpu_utilization_ratio", GAUGE,
                                      "CPU seconds per second of its busiest single PID (a "
                                      "busy-polling engine core shows here)."), PCT),
    "proc:rss_bytes": Series(_f("pd_proc_resident_memory_bytes", GAUGE,
                                "Resident memory of the process's PIDs.")),
    "proc:threads": Series(_f("pd_proc_threads", GAUGE, "Threads of the process's PIDs.")),
    "proc:open_fds": Series(_f("pd_proc_open_fds", GAUGE,
                               "Open file descriptors of the process's PIDs.")),
    "proc:ctx_switches_voluntary": Series(_CTX, labels={"type": "voluntary"}),
    "proc:ctx_switches_involuntary": Series(_CTX, labels={"type": "involuntary"}),
    # --- GPU (launcher/telemetry/gpu.py, NVML) ---
    "gpu:util_pct": Series(_f("pd_gpu_utilization_ratio", GAUGE,
                              "Fraction of the last sample period a kernel ran (NVML "
                              "utilization.gpu)."), PCT),
    "gpu:mem_util_pct": Series(_f("pd_gpu_memory_utilization_ratio", GAUGE,
                                  "Fraction of the last sample period device memory was read "
                                  "or written (NVML utilization.memory)."), PCT),
    "gpu:mem_used_bytes": Series(_f("pd_gpu_memory_used_bytes", GAUGE,
                                    "Device memory in use.")),
    "gpu:mem_total_bytes": Series(_f("pd_gpu_memory_total_bytes", GAUGE,
                                     "Device memory in total.")),
    "gpu:power_w": Series(_f("pd_gpu_power_watts", GAUGE,
                             "Power draw (NVML power usage, averaged by the driver).")),
    "gpu:power_instant_w": Series(_f("pd_gpu_power_instant_watts", GAUGE,
                                     "Instantaneous power draw.")),
    "gpu:power_limit_w": Series(_f("pd_gpu_power_limit_watts", GAUGE,
                                   "Enforced power limit.")),
    "gpu:sm_clock_mhz": Series(_f("pd_gpu_sm_clock_hertz", GAUGE, "SM clock."), 1e6),
    "gpu:mem_clock_mhz": Series(_f("pd_gpu_memory_clock_hertz", GAUGE, "Memory clock."), 1e6),
    "gpu:temp_c": Series(_f("pd_gpu_temperature_celsius", GAUGE, "GPU die temperature.")),
    "gpu:mem_temp_c": Series(_f("pd_gpu_memory_temperature_celsius", GAUGE,
                                "Memory (HBM) temperature.")),
    "gpu:clock_event_reasons": Series(_f("pd_gpu_clock_event_reasons", GAUGE,
                                         "NVML clock event (throttle) reason bitmask.")),
    "gpu:clock_event_active": Series(_f("pd_gpu_clock_event_active", GAUGE,
                                        "1 while a clock event (throttle) reason is active, "
                                        "by reason.")),
    "gpu:nvlink_tx_bytes": Series(_f("pd_gpu_nvlink_transmit_bytes_total", COUNTER,
                                     "Bytes sent over NVLink, all links.")),
    "gpu:nvlink_rx_bytes": Series(_f("pd_gpu_nvlink_receive_bytes_total", COUNTER,
                                     "Bytes received over NVLink, all links.")),
    "gpu:gpm_sm_util_pct": Series(_f("pd_gpu_gpm_sm_utilization_ratio", GAUGE,
                                     "Fraction of SMs busy (NVML GPM)."), PCT),
    "gpu:gpm_sm_occupancy_pct": Series(_f("pd_gpu_gpm_sm_occupancy_ratio", GAUGE,
                                          "SM warp occupancy (NVML GPM)."), PCT),
    "gpu:gpm_tensor_util_pct": Series(_f("pd_gpu_gpm_tensor_utilization_ratio", GAUGE,
                                         "Tensor core activity (NVML GPM)."), PCT),
    "gpu:gpm_dram_bw_util_pct": Series(_f("pd_gpu_gpm_dram_bandwidth_utilization_ratio", GAUGE,
                                          "Fraction of peak DRAM bandwidth used (NVML GPM)."),
                                       PCT),
    "gpu:gpm_pcie_tx_mib_s": Series(_f("pd_gpu_gpm_pcie_transmit_bytes_per_second", GAUGE,
                                       "PCIe bytes sent per second (NVML GPM)."), 2.0**20),
    "gpu:gpm_pcie_rx_mib_s": Series(_f("pd_gpu_gpm_pcie_receive_bytes_per_second", GAUGE,
                                       "PCIe bytes received per second (NVML GPM)."), 2.0**20),
    "gpu:gpm_nvlink_tx_mib_s": Series(_f("pd_gpu_gpm_nvlink_transmit_bytes_per_second", GAUGE,
                                         "NVLink bytes sent per second (NVML GPM)."), 2.0**20),
    "gpu:gpm_nvlink_rx_mib_s": Series(_f("pd_gpu_gpm_nvlink_receive_bytes_per_second", GAUGE,
                                         "NVLink bytes received per second (NVML GPM)."),
                                      2.0**20),
    "gpu:xid_events_total": Series(_f("pd_gpu_xid_errors_total", COUNTER,
                                      "Xid error events seen since the agent started.")),
    "gpu:xid_last": Series(_f("pd_gpu_xid_last_code", GAUGE, "The last Xid error code seen.")),
    "gpu:energy_mj": Series(_f("pd_gpu_energy_joules_total", COUNTER,
                               "Energy used since the driver loaded."), 1e-3),
    "gpu:pcie_tx_kib_s": Series(_f("pd_gpu_pcie_transmit_bytes_per_second", GAUGE,
                                   "PCIe bytes sent per second (NVML PCIe throughput, a 20 ms "
                                   "window)."), 1024.0),
    "gpu:pcie_rx_kib_s": Series(_f("pd_gpu_pcie_receive_bytes_per_second", GAUGE,
                                   "PCIe bytes received per second (NVML PCIe throughput, a "
                                   "20 ms window)."), 1024.0),
    "gpu:ecc_corrected_volatile_total": Series(_ECC, labels={"type": "corrected"}),
    "gpu:ecc_uncorrected_volatile_total": Series(_ECC, labels={"type": "uncorrected"}),
    "gpu:ecc_sbe_volatile_total": Series(_ECC_BITS, labels={"bits": "single"}),
    "gpu:ecc_dbe_volatile_total": Series(_ECC_BITS, labels={"bits": "double"}),
    "gpu:remapped_rows_correctable": Series(_REMAP, labels={"cause": "correctable"}),
    "gpu:remapped_rows_uncorrectable": Series(_REMAP, labels={"cause": "uncorrectable"}),
    "gpu:remapped_rows_pending": Series(_f("pd_gpu_row_remapping_pending", GAUGE,
                                           "1 while a row remapping waits for a GPU reset.")),
    "gpu:remapped_rows_failed": Series(_f("pd_gpu_row_remapping_failed", GAUGE,
                                          "1 if a row remapping has failed.")),
    "gpu:violation_power_ns": Series(_VIOLATION, 1e-9, {"reason": "power"}),
    "gpu:violation_thermal_ns": Series(_VIOLATION, 1e-9, {"reason": "thermal"}),
    "gpu:pcie_replay_total": Series(_f("pd_gpu_pcie_replays_total", COUNTER,
                                       "PCIe replays (link-level retransmissions).")),
    "gpu:nvlink_link_count": Series(_f("pd_gpu_nvlink_links", GAUGE, "NVLink links.")),
    "gpu:c2c_link_count": Series(_f("pd_gpu_c2c_links", GAUGE, "C2C (CPU-GPU) links.")),
    "gpu:c2c_link_status": Series(_f("pd_gpu_c2c_link_status", GAUGE,
                                     "C2C link status (NVML field value).")),
    "gpu:recovery_action": Series(_f("pd_gpu_recovery_action", GAUGE,
                                     "Recovery action the driver asks for (0 none, 1 GPU "
                                     "reset, 2 node reboot, 3 drain P2P, 4 drain and reset).")),
    "gpu:fabric_state": Series(_f("pd_gpu_fabric_state", GAUGE,
                                  "NVLink fabric state (0 not supported, 1 not started, 2 in "
                                  "progress, 3 completed).")),
}

LAST_SAMPLE = Family("pd_telemetry_last_sample_timestamp_seconds", GAUGE,
                     "Unix time of the agent's latest sample, by source (host, gpu).")
# The agent's own writes to its node directory (store.SampleWriter.status()).
WRITES = (
    (Family("pd_telemetry_dropped_rows_total", COUNTER,
            "Telemetry rows the agent gave up on because its node directory could not be "
            "written (disk full, read-only, I/O error)."), "dropped_rows"),
    (Family("pd_telemetry_write_errors_total", COUNTER,
            "Failed writes to the node directory; each is retried on the next beat."),
     "write_errors"),
    (Family("pd_telemetry_pending_rows", GAUGE,
            "Rows held in memory until a write to the node directory succeeds."),
     "pending_rows"),
)
WRITE_FAILING = Family("pd_telemetry_write_failing", GAUGE,
                       "1 while writes to the node directory fail, with the error.")


def label_name(key: str) -> str:
    name = LABEL_NAMES.get(key) or _BAD.sub("_", key)
    return name if name[:1].isalpha() or name[:1] == "_" and name[:2] != "__" else "l_" + name


def series_for(name: str) -> Series:
    """The exported series of a telemetry sample name (a gauge named after it if unmapped)."""
    s = SERIES.get(name)
    if s is not None:
        return s
    return Series(Family("pd_" + _BAD.sub("_", name), GAUGE,
                         f"{name} (pd-launcher telemetry; unit as recorded)"))


def _source(name: str) -> str:
    return "gpu" if name.startswith("gpu:") else "host"


SAMPLE_PATH = "/sample"
SAMPLE_MAX_WAIT_S = 30.0


class Exporter:
    """`GET /metrics` (any path but one): the latest samples. `POST /sample?timeout=S`: one
    sample taken now by `on_sample` (the agent's), answered with its time once written, so the
    teardown records the servers' last counters before it stops them (503 when it took longer
    than S; 404 without `on_sample`)."""

    def __init__(self, node: str, port: int, *, addr: str = "0.0.0.0",  # noqa: S104
                 stale_after_s: float = 60.0,
                 on_sample: Callable[[float], float | None] | None = None) -> None:
        from prometheus_client import CollectorRegistry, make_wsgi_app

        self.node = node
        self.addr = addr
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        # sample name -> {(process, labels json): (value, updated monotonic)}
        self._latest: dict[str, dict[tuple[str, str], tuple[float, float]]] = {}
        self._last_ts: dict[str, float] = {}  # source -> latest sample time
        self._writes: dict[str, Any] = {}  # the writer's status (set_writes)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.on_sample = on_sample
        self._metrics_app = make_wsgi_app(self.registry)
        self._server = _serve(addr, port, self._app)
        self.port = self._server.server_address[1]  # the real one when asked for port 0

    def _app(self, environ: dict, start_response: Callable) -> list[bytes]:
        if environ.get("PATH_INFO") != SAMPLE_PATH:
            return self._metrics_app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST":
            return _answer(start_response, "405 Method Not Allowed", {"error": "POST only"})
        if self.on_sample is None:
            return _answer(start_response, "404 Not Found", {"error": "no sampler"})
        query = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            wait = min(SAMPLE_MAX_WAIT_S, max(0.0, float(query.get("timeout", ["5"])[0])))
        except ValueError:
            return _answer(start_response, "400 Bad Request", {"error": "timeout: seconds"})
        ts = self.on_sample(wait)
        if ts is None:
            return _answer(start_response, "503 Service Unavailable",
                           {"error": f"no sample within {wait:g} s"})
        return _answer(start_response, "200 OK", {"ts": ts})

    def update(self, rows: list[tuple]) -> None:
        """Rows `(ts, node, process, engine, name, labels, value)` of one sample."""
        now = time.monotonic()
        with self._lock:
            for r in rows:
                lab = r[5] if isinstance(r[5], str) else json.dumps(r[5], sort_keys=True)
                self._latest.setdefault(r[4], {})[(r[2], lab)] = (r[6], now)
                src = _source(r[4])
                if r[0] > self._last_ts.get(src, 0.0):
                    self._last_ts[src] = r[0]

    def set_writes(self, status: dict[str, Any]) -> None:
        """The node directory writer's counts (store.SampleWriter.status())."""
        with self._lock:
            self._writes = dict(status)

    def describe(self) -> list:
        """The agent's own write counts, by name, so `/metrics?name[]=pd_telemetry_...` (what
        the orchestrator asks every few seconds) serves only those; the telemetry families
        vary with what is sampled and are not declared."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        out: list = []
        for fam, _ in WRITES:
            if fam.type == COUNTER:
                out.append(CounterMetricFamily(fam.name.removesuffix("_total"), fam.help))
            else:
                out.append(GaugeMetricFamily(fam.name, fam.help))
        out.append(GaugeMetricFamily(WRITE_FAILING.name, WRITE_FAILING.help, labels=["error"]))
        return out

    def _snapshot(self) -> tuple[dict, dict]:
        cutoff = time.monotonic() - self.stale_after_s
        with self._lock:
            for series in self._latest.values():
                for k in [k for k, (_, t) in series.items() if t < cutoff]:
                    del series[k]
            snap = {k: dict(v) for k, v in self._latest.items() if v}
            return snap, dict(self._last_ts)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshot, last_ts = self._snapshot()
        # family name -> (Family, [(labels dict, value)])
        families: dict[str, tuple[Family, list[tuple[dict[str, str], float]]]] = {}
        for name, series in snapshot.items():
            s = series_for(name)
            out = families.setdefault(s.family.name, (s.family, []))[1]
            for (proc, lab), (v, _) in series.items():
                labels = {label_name(k): str(x) for k, x in json.loads(lab).items()}
                labels.pop("node", None)  # a target label (promsd)
                labels.update(s.labels)
                if proc:
                    labels["process"] = proc
                out.append((labels, v * s.scale))
        for fname in sorted(families):
            fam, samples = families[fname]
            keys = sorted({k for lab, _ in samples for k in lab})
            if fam.type == COUNTER:
                m = CounterMetricFamily(fam.name.removesuffix("_total"), fam.help, labels=keys)
            else:
                m = GaugeMetricFamily(fam.name, fam.help, labels=keys)
            for lab, v in samples:
                m.add_metric([lab.get(k, "") for k in keys], v)
            yield m
        if last_ts:
            m = GaugeMetricFamily(LAST_SAMPLE.name, LAST_SAMPLE.help, labels=["source"])
            for src in sorted(last_ts):
                m.add_metric([src], last_ts[src])
            yield m
        with self._lock:
            writes = dict(self._writes)
        if writes:
            for fam, key in WRITES:
                cls = CounterMetricFamily if fam.type == COUNTER else GaugeMetricFamily
                name = fam.name.removesuffix("_total") if fam.type == COUNTER else fam.name
                yield cls(name, fam.help, value=float(writes.get(key) or 0))
            m = GaugeMetricFamily(WRITE_FAILING.name, WRITE_FAILING.help, labels=["error"])
            failing = bool(writes.get("failing"))
            error = (writes.get("last_error") or "").split(" (")[0] if failing else ""
            m.add_metric([error], 1.0 if failing else 0.0)
            yield m

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _answer(start_response: Callable, status: str, doc: dict) -> list[bytes]:
    body = json.dumps(doc).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body)))])
    return [body]


def _serve(addr: str, port: int, app: Callable) -> Any:
    """A threaded WSGI server for `app` in a daemon thread; IPv6 addresses too."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    family, _, _, _, sockaddr = socket.getaddrinfo(
        addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True  # a slow client never holds the agent's exit

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # the agent's log is for the run, not for every scrape

    server = make_server(sockaddr[0], port, app, Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="exporter", daemon=True).start()
    return server
