"""Streamlit dashboard over run directories: runs, overview, sweep, KV cache, TTFT breakdown,
GPUs and hosts, logs; plus a pure bottleneck diagnosis (`dashboard.diagnose`).

Importing this package is cheap (no Streamlit, pandas or pyarrow): the CLI imports it to
start the server, which runs `dashboard/app.py` in its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


def url(host: str = "127.0.0.1", port: int = 8501) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}"


def serve_args(runs_dir: str | Path, host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    """The argv that runs the dashboard on `runs_dir` (no browser, no usage stats, no file
    watcher: it serves run directories, it does not develop itself)."""
    return [sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.address", host, "--server.port", str(port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--server.runOnSave", "false",
            "--", "--runs", str(Path(runs_dir).resolve())]


def start(runs_dir: str | Path, host: str = "127.0.0.1", port: int = 8501,
          **popen_kw) -> subprocess.Popen:
    """Start the dashboard in the background; the caller owns the process."""
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false",
               PD_DASHBOARD_RUNS=str(Path(runs_dir).resolve()))
    return subprocess.Popen(serve_args(runs_dir, host, port), env=env, **popen_kw)


def serve(runs_dir: str | Path, host: str = "127.0.0.1", port: int = 8501) -> int:
    """Run the dashboard in the foreground until Ctrl-C; prints the URL. Returns the exit
    status (0 after Ctrl-C)."""
    print(f"Dashboard on {url(host, port)}  (runs: {Path(runs_dir).resolve()}; Ctrl-C stops)",
          flush=True)
    proc = start(runs_dir, host, port)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 0
