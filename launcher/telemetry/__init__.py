"""Telemetry: one agent per node writes GPU (NVML), host (psutil), vLLM /metrics and stats-log
samples into `runs/<run-id>/telemetry/<node>/`; the dashboard reads them back.

Modules: `store` (files + reader API: read_samples, read_gaps, read_agent_info, read_raw),
`scrape` (/metrics parser and scraper), `statslog` (stats-log parser and tail), `gpu`, `host`,
`agent` (`python -m launcher.telemetry.agent`), `exporter` (Prometheus endpoint).
Nothing heavy is imported here: pandas, pyarrow and pynvml load only where used.
"""
