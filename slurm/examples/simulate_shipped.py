"""Run shipped recipes end to end on simulated engines at their full shape, on this machine:
`python slurm/examples/simulate_shipped.py [NAME ...] [--runs-dir DIR]` (default: every
srt-slurm recipe in launcher/recipes/srt-slurm/).

Each runs as a user would try it before a GPU is spent: `--set engine=sim --set
cluster=local --set container=null`, a one-point sweep (the recipe's first concurrency, at
most 64) of one prompt per slot, every node and engine of the recipe. The simulator parses
flags as vLLM 0.33 does; a flag of the recipe's older vLLM that 0.33 refuses is set to null
for the simulated run and said in the table (the refusal names the key). Prints one line per
recipe and exits non-zero if any failed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIM = ["engine=sim", "cluster=local", "container=null", "benchmark.prompts_multiplier=1",
       "benchmark.warmup_multiplier=1", "health.timeout_s=300", "sim.speed=20",
       "slurm.time_limit=02:00:00"]
REFUSED = re.compile(r"would refuse the command line of .*?: fix (\S+)")


def launcher(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=1800)


def run_one(name: str, runs: Path) -> dict:
    from launcher.schema import recipe

    r = recipe.load(name)
    point = min(r.benchmark.concurrency[0], 64) if r.benchmark.enabled else None
    sets = SIM + ([f"benchmark.concurrency=[{point}]"] if point else [])
    dropped = []
    for _ in range(4):  # each refusal names one key
        args = [a for s in sets + [f"{k}=null" for k in dropped] for a in ("--set", s)]
        dry = launcher("submit", name, *args, "--dry-run", "--runs-dir", str(runs / "dry"))
        m = REFUSED.search(dry.stderr + dry.stdout)
        if dry.returncode == 0 or not m:
            break
        dropped.append(m.group(1))
    t0 = time.monotonic()
    got = launcher("submit", name, *args, "--runs-dir", str(runs))
    wall = time.monotonic() - t0
    run = max(runs.glob(f"*-{r.name}"), default=None, key=lambda p: p.stat().st_mtime)
    summary = json.loads((run / "summary.json").read_text()) if run and \
        (run / "summary.json").exists() else {}
    plan = json.loads((run / "plan.json").read_text()) if run else {}
    engines = [p for p in plan.get("processes", []) if p.get("kind") == "engine"]
    top = max((p.get("total_tokens_per_s_per_gpu") or 0 for p in summary.get("points", [])),
              default=0)
    last = (got.stdout + got.stderr).strip().splitlines()[-1:] or [""]
    return {"name": name, "ok": got.returncode == 0, "nodes": len(plan.get("nodes", [])),
            "engines": len(engines), "wall_s": round(wall), "tok_s_gpu": round(top),
            "dropped": dropped, "last": last[0][:160], "run": str(run or "")}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from launcher.schema import recipe

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--runs-dir", type=Path)
    a = ap.parse_args(argv)
    names = a.names or [n for n, p in recipe.shipped().items() if "srt-slurm" in p.parts]
    runs = a.runs_dir or Path(tempfile.mkdtemp(prefix="simulate-shipped-"))
    print(f"{'recipe':52} {'result':7} {'nodes':>5} {'engines':>7} {'wall s':>6} "
          f"{'tok/s/GPU (sim)':>15}  flags set to null for vLLM 0.33")
    failed = 0
    for name in names:
        got = run_one(name, runs)
        failed += not got["ok"]
        print(f"{name:52} {'ok' if got['ok'] else 'FAILED':7} {got['nodes']:>5} "
              f"{got['engines']:>7} {got['wall_s']:>6} {got['tok_s_gpu']:>15,}  "
              f"{', '.join(got['dropped']) or '-'}", flush=True)
        if not got["ok"]:
            print(f"  {got['last']} ({got['run']})", flush=True)
    print(f"{len(names) - failed} of {len(names)} ran end to end; runs in {runs}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
