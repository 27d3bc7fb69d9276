"""Prometheus exporter of the agent's GPU and host samples, so a site's Prometheus/Grafana can
scrape the job: `gpu:power_w` becomes `pd_gpu_power_w{node,process,index,uuid}`, `host:` and
`proc:` likewise. Values are the latest sample (gauges). Its own registry: nothing else leaks in.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

_BAD = re.compile(r"[^a-zA-Z0-9_]")


def prom_name(name: str) -> str:
    """`gpu:power_w` -> `pd_gpu_power_w` (colons are for recording rules in Prometheus)."""
    return "pd_" + _BAD.sub("_", name)


class Exporter:
    def __init__(self, node: str, port: int, *, addr: str = "0.0.0.0") -> None:  # noqa: S104
        from prometheus_client import CollectorRegistry, start_http_server

        self.node = node
        self.addr = addr
        self._lock = threading.Lock()
        # metric name -> {(process, labels json): value}
        self._latest: dict[str, dict[tuple[str, str], float]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = self._server.server_address[1]  # the real one when asked for port 0

    def update(self, rows: list[tuple]) -> None:
        with self._lock:
            for r in rows:
                self._latest.setdefault(r[4], {})[(r[2], r[5] if isinstance(r[5], str)
                                                  else json.dumps(r[5], sort_keys=True))] = r[6]

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            snapshot = {k: dict(v) for k, v in self._latest.items()}
        for name, series in sorted(snapshot.items()):
            parsed = [(proc, json.loads(lab), v) for (proc, lab), v in series.items()]
            keys = sorted({_BAD.sub("_", k) for _, lab, _ in parsed for k in lab}
                          - {"node", "process"})
            fam = GaugeMetricFamily(prom_name(name), f"{name} (pd-launcher telemetry agent)",
                                    labels=["node", "process", *keys])
            for proc, lab, v in parsed:
                clean = {_BAD.sub("_", k): str(x) for k, x in lab.items()}
                fam.add_metric([self.node, proc, *(clean.get(k, "") for k in keys)], v)
            yield fam

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
