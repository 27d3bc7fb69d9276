"""Helpers shared by the end-to-end tests."""

from pathlib import Path

import psutil


def leftovers(run: Path) -> list[str]:
    """Processes still alive that the launcher started for this run (PD_RUN_DIR)."""
    left = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get("PD_RUN_DIR") == str(run):
                left.append(f"{proc.pid} {proc.environ().get('PD_PROCESS')}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left
