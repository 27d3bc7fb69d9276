"""Streamlit dashboard over run directories: runs, overview, sweep, KV cache, TTFT breakdown,
GPUs and hosts, logs; plus a pure bottleneck diagnosis (`launcher.analysis.diagnose`).

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
    watcher, no developer toolbar: it serves run directories, it does not develop itself)."""
    return [sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.address", host, "--server.port", str(port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--server.runOnSave", "false",
            # Users see the app, not Streamlit's developer toolbar (Deploy, rerun, settings).
            "--client.toolbarMode", "viewer",
            "--", "--runs", str(Path(runs_dir).resolve())]


def _env(runs_dir: str | Path) -> dict[str, str]:
    return dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false",
                PD_DASHBOARD_RUNS=str(Path(runs_dir).resolve()))


def start(runs_dir: str | Path, host: str = "127.0.0.1", port: int = 8501,
          **popen_kw) -> subprocess.Popen:
    """Start the dashboard in the background; the caller owns (and stops) the process."""
    return subprocess.Popen(serve_args(runs_dir, host, port), env=_env(runs_dir), **popen_kw)


def serve(runs_dir: str | Path, host: str = "127.0.0.1", port: int = 8501) -> int:
    """Print the URL, then become the Streamlit server (exec): Ctrl-C and SIGTERM reach the
    server itself and no orphan is left behind. Returns only if the exec fails."""
    print(f"Dashboard on {url(host, port)}  (runs: {Path(runs_dir).resolve()}; Ctrl-C stops)",
          flush=True)
    argv = serve_args(runs_dir, host, port)
    try:
        os.execve(argv[0], argv, _env(runs_dir))
    except OSError as e:
        print(f"error: could not start Streamlit ({e}); is it installed in {sys.prefix}?",
              file=sys.stderr)
        return 1
    return 0  # not reached: execve replaced this process
