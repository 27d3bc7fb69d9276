"""GPU telemetry through NVML (nvidia-ml-py), keyed by host + GPU UUID.

Probe once, collect what the driver supports, record what it does not, never crash:

- `GpuCollector.open()` initialises NVML; without NVML (CI, a CPU node) it returns one notice
  ("no NVML: ...") and every later call is a no-op, so the agent goes on with the rest.
- Each call is tried once per GPU at open; a call that raises is recorded in `info["gpus"][i]
  ["unsupported"]` with NVML's reason (e.g. "Not Supported") and never called again.
- Calls that pass hand-built ctypes structs (GPM, GPU fabric info) can kill the process on a
  driver/binding mismatch (docs/telemetry-costs.md): they are first tried in a child process
  (`python -m launcher.telemetry.gpu --probe-risky`); only what survived there runs here.
- Slow calls (energy counter ~4 ms, PCIe throughput ~21 ms) run on slower cadences.

Sample names (`gpu:` family, labels {"uuid", "index"} plus the extra label noted):
fast: util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes, power_w, sm_clock_mhz,
mem_clock_mhz, temp_c, clock_event_reasons (bitmask), clock_event_active {reason} (0/1),
power_instant_w, mem_temp_c, nvlink_tx_bytes / nvlink_rx_bytes (counters, all links),
gpm_sm_util_pct, gpm_sm_occupancy_pct, gpm_tensor_util_pct, gpm_dram_bw_util_pct,
gpm_nvlink_rx_mib_s, gpm_nvlink_tx_mib_s, gpm_pcie_rx_mib_s, gpm_pcie_tx_mib_s,
xid_events_total, xid_last;
slow: energy_mj (counter since driver load), power_limit_w, pcie_tx_kib_s, pcie_rx_kib_s,
ecc_corrected_volatile_total, ecc_uncorrected_volatile_total, ecc_sbe_volatile_total,
ecc_dbe_volatile_total, remapped_rows_correctable, remapped_rows_uncorrectable,
remapped_rows_pending, remapped_rows_failed, violation_power_ns, violation_thermal_ns,
pcie_replay_total, nvlink_link_count, c2c_link_count, c2c_link_status, recovery_action,
fabric_state (0 not supported, 1 not started, 2 in progress, 3 completed; clique and cluster
UUID go to the agent info).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# clock-event (throttle) reason bits, from NVML's nvmlClocksEventReason* constants
CLOCK_EVENT_BITS: dict[str, int] = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
    "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# GPM metric ids (nvmlGpmMetricId_t) -> sample field
GPM_METRICS: dict[int, str] = {
    2: "gpm_sm_util_pct", 3: "gpm_sm_occupancy_pct", 5: "gpm_tensor_util_pct",
    10: "gpm_dram_bw_util_pct", 20: "gpm_pcie_tx_mib_s", 21: "gpm_pcie_rx_mib_s",
    60: "gpm_nvlink_rx_mib_s", 61: "gpm_nvlink_tx_mib_s",
}
# scalar field values read in one nvmlDeviceGetFieldValues call: name, field id, scale
FAST_FIELDS: list[tuple[str, int, float]] = [
    ("power_instant_w", 186, 1e-3),  # NVML_FI_DEV_POWER_INSTANT, mW
    ("mem_temp_c", 82, 1.0),  # NVML_FI_DEV_MEMORY_TEMP
]
SLOW_FIELDS: list[tuple[str, int, float]] = [
    ("ecc_sbe_volatile_total", 3, 1.0), ("ecc_dbe_volatile_total", 4, 1.0),
    ("pcie_replay_total", 94, 1.0), ("nvlink_link_count", 91, 1.0),
    ("c2c_link_count", 170, 1.0), ("c2c_link_status", 171, 1.0),
    ("recovery_action", 230, 1.0),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
]
# per-link NVLink byte counters: (tx field, rx field, scale to bytes); first supported wins
NVLINK_COUNTERS: list[tuple[int, int, float]] = [
    (202, 204, 1.0),  # NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES / _RCV_BYTES
    (138, 139, 1024.0),  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX, KiB
]
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def _err(e: BaseException) -> str:
    s = str(e).strip()
    return s or type(e).__name__


@dataclass
class Gpu:
    index: int
    handle: Any
    uuid: str
    name: str
    process: str
    labels: str  # canonical JSON {"index","uuid"}
    fast: dict[str, Callable] = field(default_factory=dict)
    slow: dict[str, Callable] = field(default_factory=dict)
    fast_fields: list[tuple[str, int, float]] = field(default_factory=list)
    slow_fields: list[tuple[str, int, float]] = field(default_factory=list)
    nvlink: tuple[int, int, float, int] | None = None  # tx id, rx id, scale, links
    gpm: bool = False
    gpm_samples: list = field(default_factory=list)
    gpm_prev: int = -1
    unsupported: dict[str, str] = field(default_factory=dict)
    supported: list[str] = field(default_factory=list)
    xid_total: int = 0
    last_pcie: float = 0.0
    xid_last: int = 0


class GpuCollector:
    """NVML sampler for the GPUs of one node. Not thread-safe: use it from one thread."""

    def __init__(self, node: str, gpu_processes: dict[int, str] | None = None, *,
                 probe_risky: bool = True, pcie_every_s: float = 30.0) -> None:
        self.node = node
        self.gpu_processes = gpu_processes or {}
        self.probe_risky = probe_risky
        self.pcie_every_s = pcie_every_s
        self.available = False
        self.gpus: list[Gpu] = []
        self.info: dict[str, Any] = {"available": False, "notices": []}
        self._nvml: Any = None
        self._events: Any = None
        self.sample_errors: dict[str, str] = {}

    # --- open / probe --------------------------------------------------------------------
    def open(self) -> dict[str, Any]:
        try:
            import pynvml
        except ImportError as e:
            return self._no_nvml(f"nvidia-ml-py is not installed ({e})")
        try:
            pynvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - any NVML failure means: no GPU telemetry
            return self._no_nvml(_err(e))
        self._nvml = pynvml
        nv = pynvml
        info = self.info
        info["available"] = True
        for key, fn in (("driver_version", nv.nvmlSystemGetDriverVersion),
                        ("nvml_version", nv.nvmlSystemGetNVMLVersion),
                        ("cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion_v2)):
            try:
                v = fn()
                info[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:  # noqa: BLE001
                info[key] = None
                info.setdefault("unsupported_system", {})[key] = _err(e)
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001
            return self._no_nvml(f"nvmlDeviceGetCount failed: {_err(e)}")
        risky = self._probe_risky_in_child() if self.probe_risky else {}
        info["risky_probe"] = risky.get("_status", "skipped")
        info["gpus"] = []
        for i in range(count):
            try:
                gpu = self._open_gpu(i, risky.get(str(i), {}))
            except Exception as e:  # noqa: BLE001 - a GPU that fails identity is skipped
                info["notices"].append(f"GPU {i}: cannot open ({_err(e)})")
                continue
            self.gpus.append(gpu)
        self._open_events()
        self.available = True
        return info

    def _no_nvml(self, reason: str) -> dict[str, Any]:
        self.available = False
        self.info["available"] = False
        self.info["notices"].append(f"no NVML: {reason}; GPU telemetry is off on this node, "
                                    "host and vLLM telemetry continue")
        return self.info

    def _open_gpu(self, i: int, risky: dict) -> Gpu:
        nv = self._nvml
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = nv.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        name = nv.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
        labels = json.dumps({"index": str(i), "uuid": uuid}, sort_keys=True,
                            separators=(",", ":"))
        gpu = Gpu(i, h, uuid, name, self.gpu_processes.get(i, ""), labels)
        desc: dict[str, Any] = {"index": i, "uuid": uuid, "name": name,
                                "process": gpu.process}
        for key, fn in (("pci_bus_id", lambda: nv.nvmlDeviceGetPciInfo(h).busId),
                        ("serial", lambda: nv.nvmlDeviceGetSerial(h)),
                        ("architecture", lambda: nv.nvmlDeviceGetArchitecture(h)),
                        ("vbios", lambda: nv.nvmlDeviceGetVbiosVersion(h))):
            try:
                v = fn()
                desc[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as e:  # noqa: BLE001
                gpu.unsupported[key] = _err(e)

        fast: dict[str, Callable] = {
            "util": lambda: nv.nvmlDeviceGetUtilizationRates(h),
            "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h),
            "power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "temp_c": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "clock_event_reasons": lambda: _clock_events(nv, h),
        }
        slow: dict[str, Callable] = {
            "energy_mj": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
            "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "ecc_corrected_volatile_total": lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_uncorrected_volatile_total": lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            "remapped_rows": lambda: nv.nvmlDeviceGetRemappedRows(h),
            "violation_power_ns": lambda: nv.nvmlDeviceGetViolationStatus(
                h, nv.NVML_PERF_POLICY_POWER).violationTime,
            "violation_thermal_ns": lambda: nv.nvmlDeviceGetViolationStatus(
                h, nv.NVML_PERF_POLICY_THERMAL).violationTime,
            "pcie": lambda: (nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
                             nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES)),
        }
        for group, target in ((fast, gpu.fast), (slow, gpu.slow)):
            for key, fn in group.items():
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - NotSupported and friends
                    gpu.unsupported[key] = _err(e)
                    continue
                target[key] = fn
                gpu.supported.append(key)
        for wanted, target in ((FAST_FIELDS, gpu.fast_fields), (SLOW_FIELDS, gpu.slow_fields)):
            ok, bad = self._probe_fields(h, [(fid, 0) for _, fid, _ in wanted])
            for (fname, fid, scale) in wanted:
                if (fid, 0) in ok:
                    target.append((fname, fid, scale))
                    gpu.supported.append(fname)
                else:
                    gpu.unsupported[fname] = bad.get((fid, 0), "no value")
        links = self._link_count(h)
        desc["nvlink_links"] = links
        if links:
            for tx, rx, scale in NVLINK_COUNTERS:
                ok, bad = self._probe_fields(h, [(tx, 0), (rx, 0)])
                if (tx, 0) in ok and (rx, 0) in ok:
                    gpu.nvlink = (tx, rx, scale, links)
                    gpu.supported.append(f"nvlink_bytes(fields {tx}/{rx})")
                    break
                gpu.unsupported[f"nvlink_bytes(fields {tx}/{rx})"] = bad.get((tx, 0), "?")
        else:
            gpu.unsupported["nvlink_bytes"] = "no NVLink links reported"
        # risky calls: only what the child process survived
        gpm = risky.get("gpm")
        if gpm is True:
            try:
                gpu.gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                gpu.gpm = True
                gpu.supported.append("gpm")
                desc["gpm_metrics"] = risky.get("gpm_metrics", {})
            except Exception as e:  # noqa: BLE001
                gpu.unsupported["gpm"] = _err(e)
        else:
            gpu.unsupported["gpm"] = str(gpm if gpm is not None else risky.get("_error",
                                                                            "not probed"))
        fabric = risky.get("fabric")
        if isinstance(fabric, dict):
            desc["fabric"] = fabric
            gpu.supported.append("fabric")
        else:
            gpu.unsupported["fabric"] = str(fabric if fabric is not None else "not probed")
        desc["supported"] = gpu.supported
        desc["unsupported"] = gpu.unsupported
        self.info["gpus"].append(desc)
        return gpu

    def _probe_fields(self, h: Any, ids: list[tuple[int, int]]) -> tuple[set, dict]:
        ok: set = set()
        bad: dict = {}
        try:
            vals = self._nvml.nvmlDeviceGetFieldValues(h, ids)
        except Exception as e:  # noqa: BLE001
            return ok, {i: _err(e) for i in ids}
        for key, v in zip(ids, vals, strict=True):
            if v.nvmlReturn == 0:
                ok.add(key)
            else:
                bad[key] = _nvml_ret_name(self._nvml, v.nvmlReturn)
        return ok, bad

    def _link_count(self, h: Any) -> int:
        ok, _ = self._probe_fields(h, [(91, 0)])
        if not ok:
            return 0
        try:
            v = self._nvml.nvmlDeviceGetFieldValues(h, [(91, 0)])[0]
            return int(_field_value(v))
        except Exception:  # noqa: BLE001
            return 0

    def _open_events(self) -> None:
        nv = self._nvml
        try:
            es = nv.nvmlEventSetCreate()
        except Exception as e:  # noqa: BLE001
            self.info["xid_events"] = f"unavailable: {_err(e)}"
            return
        registered = 0
        for gpu in self.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, nv.nvmlEventTypeXidCriticalError, es)
                registered += 1
                gpu.supported.append("xid_events")
            except Exception as e:  # noqa: BLE001
                gpu.unsupported["xid_events"] = _err(e)
        for desc, gpu in zip(self.info["gpus"], self.gpus, strict=False):
            desc["supported"], desc["unsupported"] = gpu.supported, gpu.unsupported
        if registered:
            self._events = es
            self.info["xid_events"] = f"registered on {registered} GPU(s)"
        else:
            self.info["xid_events"] = "unavailable on every GPU"
            try:
                nv.nvmlEventSetFree(es)
            except Exception:  # noqa: BLE001, S110 - nothing to free
                pass

    def _probe_risky_in_child(self) -> dict:
        """Run the struct-passing calls in a child; a segfault there costs nothing here."""
        try:
            p = subprocess.run([sys.executable, "-m", "launcher.telemetry.gpu", "--probe-risky"],
                               check=False, capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PYTHONPATH": _pythonpath()})
        except (subprocess.TimeoutExpired, OSError) as e:
            return {"_status": f"child probe failed: {_err(e)}", "_error": "probe failed"}
        if p.returncode != 0:
            why = (f"killed by signal {-p.returncode}" if p.returncode < 0
                   else f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
            return {"_status": f"child probe crashed ({why})",
                    "_error": f"risky probe crashed ({why})"}
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            return {"_status": "child probe printed no result", "_error": "no probe result"}
        out["_status"] = "ok"
        return out

    # --- sampling ------------------------------------------------------------------------
    def sample(self, ts: float | None = None, *, slow: bool = False) -> list[tuple]:
        """Rows `(ts, node, process, engine, name, labels, value)`; `slow=True` adds the slow
        calls (energy, ECC, PCIe throughput at its own cadence, ...)."""
        if not self.available:
            return []
        ts = time.time() if ts is None else ts
        rows: list[tuple] = []
        for gpu in self.gpus:
            self._sample_gpu(gpu, ts, rows, slow)
        self._drain_events()
        for gpu in self.gpus:
            if "xid_events" in gpu.supported:
                self._row(rows, gpu, ts, "xid_events_total", gpu.xid_total)
                self._row(rows, gpu, ts, "xid_last", gpu.xid_last)
        return rows

    def _row(self, rows: list, gpu: Gpu, ts: float, name: str, value: float,
             extra: dict | None = None) -> None:
        labels = gpu.labels
        if extra:
            labels = json.dumps({"index": str(gpu.index), "uuid": gpu.uuid, **extra},
                                sort_keys=True, separators=(",", ":"))
        rows.append((ts, self.node, gpu.process, "", "gpu:" + name, labels, float(value)))

    def _call(self, gpu: Gpu, key: str, fn: Callable) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one failed read never stops a sample
            self.sample_errors[f"{gpu.index}:{key}"] = _err(e)
            return None

    def _sample_gpu(self, gpu: Gpu, ts: float, rows: list, slow: bool) -> None:
        f = gpu.fast
        for key, fn in f.items():
            v = self._call(gpu, key, fn)
            if v is None:
                continue
            if key == "util":
                self._row(rows, gpu, ts, "util_pct", v.gpu)
                self._row(rows, gpu, ts, "mem_util_pct", v.memory)
            elif key == "memory":
                self._row(rows, gpu, ts, "mem_used_bytes", v.used)
                self._row(rows, gpu, ts, "mem_total_bytes", v.total)
            elif key == "clock_event_reasons":
                self._row(rows, gpu, ts, "clock_event_reasons", v)
                for reason, bit in CLOCK_EVENT_BITS.items():
                    self._row(rows, gpu, ts, "clock_event_active", 1.0 if v & bit else 0.0,
                              {"reason": reason})
            else:
                self._row(rows, gpu, ts, key, v)
        self._fields(gpu, ts, rows, gpu.fast_fields)
        if gpu.nvlink is not None:
            tx, rx, scale, links = gpu.nvlink
            ids = [(tx, k) for k in range(links)] + [(rx, k) for k in range(links)]
            try:
                vals = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, ids)
                tot_tx = sum(_field_value(v) for v in vals[:links] if v.nvmlReturn == 0)
                tot_rx = sum(_field_value(v) for v in vals[links:] if v.nvmlReturn == 0)
                self._row(rows, gpu, ts, "nvlink_tx_bytes", tot_tx * scale)
                self._row(rows, gpu, ts, "nvlink_rx_bytes", tot_rx * scale)
            except Exception as e:  # noqa: BLE001
                self.sample_errors[f"{gpu.index}:nvlink"] = _err(e)
        if gpu.gpm:
            self._gpm(gpu, ts, rows)
        if not slow:
            return
        for key, fn in gpu.slow.items():
            if key == "pcie":
                if ts - gpu.last_pcie < self.pcie_every_s:
                    continue  # ~21 ms per direction: its own slow cadence
                gpu.last_pcie = ts
            v = self._call(gpu, key, fn)
            if v is None:
                continue
            if key == "remapped_rows":
                # (correctable, uncorrectable, pending, failure occurred)
                for name, x in zip(("correctable", "uncorrectable", "pending", "failed"), v,
                                   strict=False):
                    self._row(rows, gpu, ts, f"remapped_rows_{name}", float(x))
            elif key == "pcie":
                self._row(rows, gpu, ts, "pcie_tx_kib_s", v[0])
                self._row(rows, gpu, ts, "pcie_rx_kib_s", v[1])
            else:
                self._row(rows, gpu, ts, key, v)
        self._fields(gpu, ts, rows, gpu.slow_fields)

    def _fields(self, gpu: Gpu, ts: float, rows: list,
                fields: list[tuple[str, int, float]]) -> None:
        if not fields:
            return
        try:
            vals = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, [(fid, 0)
                                                                   for _, fid, _ in fields])
        except Exception as e:  # noqa: BLE001
            self.sample_errors[f"{gpu.index}:fields"] = _err(e)
            return
        for (name, _, scale), v in zip(fields, vals, strict=True):
            if v.nvmlReturn == 0:
                self._row(rows, gpu, ts, name, _field_value(v) * scale)

    def _gpm(self, gpu: Gpu, ts: float, rows: list) -> None:
        nv = self._nvml
        cur = 0 if gpu.gpm_prev != 0 else 1
        try:
            nv.nvmlGpmSampleGet(gpu.handle, gpu.gpm_samples[cur])
        except Exception as e:  # noqa: BLE001
            self.sample_errors[f"{gpu.index}:gpm"] = _err(e)
            return
        if gpu.gpm_prev >= 0:
            try:
                for mid, value in _gpm_metrics(nv, gpu.gpm_samples[gpu.gpm_prev],
                                               gpu.gpm_samples[cur]).items():
                    self._row(rows, gpu, ts, GPM_METRICS[mid], value)
            except Exception as e:  # noqa: BLE001
                self.sample_errors[f"{gpu.index}:gpm"] = _err(e)
        gpu.gpm_prev = cur

    def _drain_events(self) -> None:
        if self._events is None:
            return
        nv = self._nvml
        for _ in range(64):  # bounded: a storm of events never stalls the sampler
            try:
                ev = nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: no event pending
                return
            try:
                idx = nv.nvmlDeviceGetIndex(ev.device)
            except Exception:  # noqa: BLE001
                idx = -1
            for gpu in self.gpus:
                if gpu.index == idx:
                    gpu.xid_total += 1
                    gpu.xid_last = int(ev.eventData)

    def close(self) -> None:
        if self._nvml is None:
            return
        nv = self._nvml
        for gpu in self.gpus:
            for s in gpu.gpm_samples:
                try:
                    nv.nvmlGpmSampleFree(s)
                except Exception:  # noqa: BLE001, S110 - shutting down anyway
                    pass
            gpu.gpm_samples = []
            gpu.gpm = False
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except Exception:  # noqa: BLE001, S110
                pass
            self._events = None
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110
            pass
        self._nvml = None
        self.available = False


def _clock_events(nv: Any, h: Any) -> int:
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is None:  # older bindings: the former name
        fn = nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(h))


def _field_value(v: Any) -> float:
    t = v.valueType
    u = v.value
    return float({0: u.dVal, 1: u.uiVal, 2: u.ulVal, 3: u.ullVal, 4: u.sllVal, 5: u.siVal,
                  6: u.usVal}.get(t, u.ullVal))


def _nvml_ret_name(nv: Any, code: int) -> str:
    try:
        s = nv.nvmlErrorString(code)  # e.g. "Not Supported"
        return s.decode() if isinstance(s, bytes) else str(s)
    except Exception:  # noqa: BLE001
        return f"NVML error {code}"


def _gpm_metrics(nv: Any, s1: Any, s2: Any) -> dict[int, float]:
    mg = nv.c_nvmlGpmMetricsGet_t()
    mg.version = nv.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(GPM_METRICS)
    mg.sample1 = s1
    mg.sample2 = s2
    for i, mid in enumerate(GPM_METRICS):
        mg.metrics[i].metricId = mid
    nv.nvmlGpmMetricsGet(mg)
    out = {}
    for i, mid in enumerate(GPM_METRICS):
        if mg.metrics[i].nvmlReturn == 0:
            out[mid] = float(mg.metrics[i].value)
    return out


def _pythonpath() -> str:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    old = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + old if old else "")


def probe_risky() -> dict:
    """Child-process side: GPM support + one GPM metrics read, and GPU fabric info, per GPU."""
    import pynvml as nv

    nv.nvmlInit()
    out: dict[str, Any] = {}
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        res: dict[str, Any] = {}
        try:
            sup = nv.nvmlGpmQueryDeviceSupport(h)
            if not sup.isSupportedDevice:
                res["gpm"] = "GPM not supported by this device"
            else:
                s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
                nv.nvmlGpmSampleGet(h, s1)
                time.sleep(0.2)
                nv.nvmlGpmSampleGet(h, s2)
                metrics = _gpm_metrics(nv, s1, s2)
                nv.nvmlGpmSampleFree(s1)
                nv.nvmlGpmSampleFree(s2)
                res["gpm"] = True
                res["gpm_metrics"] = {GPM_METRICS[m]: v for m, v in metrics.items()}
        except Exception as e:  # noqa: BLE001
            res["gpm"] = _err(e)
        try:
            try:
                fi = nv.c_nvmlGpuFabricInfoV_t()
                nv.nvmlDeviceGetGpuFabricInfoV(h, byref_or_self(fi))
            except nv.NVMLError_FunctionNotFound:  # older driver: the unversioned call
                fi = nv.c_nvmlGpuFabricInfo_t()
                nv.nvmlDeviceGetGpuFabricInfo(h, byref_or_self(fi))
            res["fabric"] = {
                "state": FABRIC_STATES.get(int(fi.state), str(fi.state)),
                "state_code": int(fi.state), "status": _nvml_ret_name(nv, int(fi.status)),
                "clique_id": int(fi.cliqueId),
                "cluster_uuid": bytes(fi.clusterUuid).hex(),
                "health_mask": int(getattr(fi, "healthMask", 0)),
            }
        except Exception as e:  # noqa: BLE001
            res["fabric"] = _err(e)
        out[str(i)] = res
    nv.nvmlShutdown()
    return out


def byref_or_self(obj: Any) -> Any:
    """nvmlDeviceGetGpuFabricInfoV passes its argument straight to C: give it a pointer."""
    import ctypes

    return ctypes.byref(obj)


def fabric_rows(collector: GpuCollector, ts: float) -> list[tuple]:
    """One `gpu:fabric_state` row per GPU whose fabric info was read (recorded at start)."""
    rows: list[tuple] = []
    for desc, gpu in zip(collector.info.get("gpus", []), collector.gpus, strict=False):
        fab = desc.get("fabric")
        if isinstance(fab, dict):
            collector._row(rows, gpu, ts, "fabric_state", fab.get("state_code", -1))
    return rows


class GpuSampler(threading.Thread):
    """Runs a collector in its own thread (NVML calls block; the energy counter takes ~4 ms)
    and hands rows to `sink` every `interval`; slow calls every `slow_every` samples."""

    def __init__(self, collector: GpuCollector, sink: Callable[[list[tuple]], None],
                 interval: float, slow_every_s: float = 5.0) -> None:
        super().__init__(name="telemetry-gpu", daemon=True)
        self.collector = collector
        self.sink = sink
        self.interval = interval
        self.slow_every_s = slow_every_s
        self.stop_event = threading.Event()
        self.cpu_s = 0.0

    def run(self) -> None:
        next_t = time.time()
        last_slow = 0.0
        first = True
        while not self.stop_event.is_set():
            ts = time.time()
            slow = ts - last_slow >= self.slow_every_s
            if slow:
                last_slow = ts
            c0 = time.thread_time()
            try:
                rows = self.collector.sample(ts, slow=slow)
                if first:
                    rows += fabric_rows(self.collector, ts)
                    first = False
                self.sink(rows)
            except Exception as e:  # noqa: BLE001 - the sampler thread must not die
                self.collector.sample_errors["sampler"] = _err(e)
            self.cpu_s += time.thread_time() - c0
            next_t += self.interval
            delay = next_t - time.time()
            if delay < 0:  # fell behind: skip missed ticks rather than burst
                next_t = time.time()
                delay = 0
            self.stop_event.wait(delay)

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        self.join(timeout)


def _timing(c: GpuCollector, n: int) -> dict[str, float]:
    """Wall and CPU ms per fast and per slow sample (all GPUs), averaged over n."""
    out = {}
    for slow in (False, True):
        w, t = time.perf_counter(), time.process_time()
        for _ in range(n):
            c.sample(slow=slow)
            for g in c.gpus:
                g.last_pcie = 0.0  # time the PCIe calls too
        out[f"{'slow' if slow else 'fast'}_wall_ms"] = (time.perf_counter() - w) / n * 1e3
        out[f"{'slow' if slow else 'fast'}_cpu_ms"] = (time.process_time() - t) / n * 1e3
    return out


if __name__ == "__main__":
    if "--probe-risky" in sys.argv:
        print(json.dumps(probe_risky()))
    else:
        # `python -m launcher.telemetry.gpu [--time N]` prints what NVML reports here
        c = GpuCollector(os.uname().nodename)
        info = c.open()
        c.sample(slow=True)
        time.sleep(0.5)
        rows = c.sample(slow=True)
        out: dict[str, Any] = {"info": info, "sample": [(r[4], r[5], r[6]) for r in rows],
                               "sample_errors": c.sample_errors}
        if "--time" in sys.argv and c.available:
            out["timing"] = _timing(c, int(sys.argv[sys.argv.index("--time") + 1]))
        print(json.dumps(out, indent=1, default=str))
        c.close()
