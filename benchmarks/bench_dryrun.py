"""Dry-run wall time as a ratio to a bare `python -c pass` (target: under 5x).

    python benchmarks/bench_dryrun.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

# As a user's shell runs it: bytecode cached after the first run (a CI or test environment
# may set PYTHONDONTWRITEBYTECODE, which would time the compiler instead).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(cmd: list[str], repeat: int, cwd: str) -> float:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd, env=ENV)  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cwd, env=ENV)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--recipe", default="qwen3.5-397b-gb200-disagg")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bare = wall([sys.executable, "-c", "pass"], a.repeat, tmp)
        dry = wall(
            [sys.executable, "-m", "launcher", "submit", a.recipe, "--dry-run"], a.repeat, tmp
        )
    print(f"python -c pass:       {bare * 1000:7.1f} ms (median of {a.repeat})")
    print(f"submit --dry-run:     {dry * 1000:7.1f} ms (median of {a.repeat}, {a.recipe})")
    print(f"ratio dry-run / bare: {dry / bare:7.2f}x  (target < 5x)")


if __name__ == "__main__":
    main()
