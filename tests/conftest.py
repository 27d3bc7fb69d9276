import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@pytest.fixture
def cli(tmp_path):
    """Run `python -m launcher ...` as a user would; returns (exit code, stdout, stderr)."""
    import subprocess

    def run(*args, env=None, timeout=120):
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.run(
            [sys.executable, "-m", "launcher", *args],
            capture_output=True, text=True, cwd=tmp_path, env=e, timeout=timeout,
        )  # fmt: skip
        return p.returncode, p.stdout, p.stderr

    return run
