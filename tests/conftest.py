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


# --- the suite measures itself --------------------------------------------------------------
# At the end of every run: the slowest tests and modules with their share of the wall time
# (setup + call + teardown; a module fixture's end-to-end run is charged to its first test).
_TIMES: dict[str, float] = {}
_T0: list[float] = []


def pytest_configure(config):
    import time

    _T0.append(time.monotonic())


def pytest_runtest_logreport(report):
    _TIMES[report.nodeid] = _TIMES.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    import time

    if not _TIMES or not _T0:
        return
    wall = time.monotonic() - _T0[0]
    tests = sorted(_TIMES.items(), key=lambda kv: -kv[1])
    modules: dict[str, float] = {}
    for nodeid, sec in _TIMES.items():
        mod = nodeid.split("::")[0]
        modules[mod] = modules.get(mod, 0.0) + sec
    w = terminalreporter.write_line
    w("")
    w(f"suite timing: {len(_TIMES)} tests in {wall:.0f} s wall ({wall / 60:.1f} min); "
      f"{sum(_TIMES.values()):.0f} s inside tests")
    w("slowest modules (share of the wall time):")
    for mod, sec in sorted(modules.items(), key=lambda kv: -kv[1])[:12]:
        w(f"  {sec:7.1f} s  {100 * sec / wall:5.1f} %  {mod}")
    w("slowest tests:")
    for nodeid, sec in tests[:15]:
        w(f"  {sec:7.1f} s  {100 * sec / wall:5.1f} %  {nodeid}")
    # every test's time, for comparing runs: .pytest_cache/timing.tsv (seconds, node id)
    cache = Path(terminalreporter.config.rootpath) / ".pytest_cache"
    if cache.is_dir():
        (cache / "timing.tsv").write_text("".join(f"{s:.2f}\t{n}\n" for n, s in tests))
