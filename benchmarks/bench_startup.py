"""Orchestration overhead at start-up, on the dev cluster (slurm/devcluster/up.sh first).

Prints (time from the job's start to all endpoints healthy) / (the slowest engine's own
start-up time), aim < 1.1. The engines' own start-up is measured by starting exactly the
rendered engine command lines here, all at once, with no Slurm and no orchestrator, and
polling /health every 20 ms. SIM_START_DELAY_S stands in for model loading (real vLLM takes
minutes, which would make any fixed overhead look small); pass --load-s to change it.

    python benchmarks/bench_startup.py [--load-s 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

RECIPE = "devcluster-sim"


def launcher(*args: str, cwd: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=True,
    ).stdout


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=0.5) as r:
            return r.status == 200
    except OSError:
        return False


def standalone_startup(plan: dict, load_s: float, tmp: str) -> float:
    """Start every engine of the plan here at once; seconds until the last API server is up."""
    env = dict(os.environ, SIM_START_DELAY_S=str(load_s))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    engines = [p for p in plan["processes"] if p["kind"] == "engine"]
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            ["env", *[f"{k}={v}" for k, v in p["env"].items()], *p["argv"]],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
            start_new_session=True,
        )  # fmt: skip
        for p in engines
    ]
    pending = [p["url"] for p in engines if p["url"]]
    try:
        while pending:
            pending = [u for u in pending if not healthy(u)]
            if time.monotonic() - t0 > 300:
                raise SystemExit("engines did not start within 300 s")
            time.sleep(0.02)
        return time.monotonic() - t0
    finally:
        for p in procs:
            os.killpg(p.pid, 15)
        for p in procs:
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load-s", type=float, default=10.0, help="simulated model load time")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sets = ["--set", "benchmark.enabled=false", "--set", "accuracy.enabled=false",
                "--set", f"sim.start_delay_s={a.load_s:g}", "--runs-dir", f"{tmp}/runs"]  # fmt: skip
        out = launcher("submit", RECIPE, *sets, "--wait", cwd=tmp)
        (run,) = [p.parent for p in Path(tmp, "runs").glob("*/run.json")]
        state = json.loads((run / "run.json").read_text())
        events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        healthy_at = next(e["ts"] for e in events if e["event"] == "endpoints_healthy")
        job = healthy_at - state["started"]
        plan = json.loads((run / "plan.json").read_text())
        own = standalone_startup(plan, a.load_s, tmp)
    print(f"simulated model load (SIM_START_DELAY_S): {a.load_s:g} s")
    print(f"job start -> all endpoints healthy (Slurm, orchestrator): {job:6.2f} s")
    print(f"slowest engine's own start-up (all engines, no Slurm):     {own:6.2f} s")
    print(f"ratio: {job / own:.3f}  (aim < 1.1)")
    if state["state"] != "succeeded":
        print("warning: the run did not succeed: " + str(state.get("error")), file=sys.stderr)
        print(shlex.join(["output:", out[-2000:]]), file=sys.stderr)


if __name__ == "__main__":
    main()
