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


def fixtures_dir() -> Path:
    """vLLM 0.33 /metrics and log samples: the shared/ folder beside the checkout (CI puts
    a copy there), else the workplace's copy. Missing fixtures fail tests, never skip them."""
    repo = Path(__file__).resolve().parents[1]
    for candidate in (repo.parent / "shared" / "fixtures", Path("/work/shared/fixtures")):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no shared/fixtures beside {repo}: the tests need vLLM's samples")


FIXTURES = fixtures_dir()
