"""A study in one allocation against one job per configuration, measured: GPU-seconds,
wall time and engine loads, as ratios. Aim: fewer GPU-seconds and one load per engine.

    python benchmarks/bench_study.py [--load-s 10] [--profile devcluster|local]

The study is the seed's shape at toy size: one decode endpoint, 1..3 prefill endpoints,
simulated engines with a model-load delay of --load-s seconds. It runs twice: `--allocation
one` (one job) and `--allocation each` (a job per configuration; on the dev cluster they
are submitted one after the other so both ways have the host to themselves). GPU-seconds:
the allocation's GPUs x its wall time (allocation.json) against the sum over the jobs of
each job's GPUs x its time (summary.json lifecycle). Loads: engine starts counted from the
process records (a start is a record without started_by).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETS = ["accuracy.enabled=false", "sim.speed=2", "benchmark.concurrency=[8,32]",
        "benchmark.prompts_multiplier=2"]
VALUES = (1, 2, 3)


def launcher(cwd: Path, *args: str) -> None:
    p = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                       text=True, timeout=1800, cwd=cwd)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(args)}\n{p.stdout[-3000:]}"
                         f"\n{p.stderr[-2000:]}")


def starts(runs: list[Path]) -> dict[str, int]:
    from launcher.run.rundir import RunDir

    out: dict[str, int] = {}
    for r in runs:
        for name, p in RunDir(r).read_record().processes.items():
            if p.kind == "engine" and p.started_by is None:
                out[name] = out.get(name, 0) + 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load-s", type=float, default=10.0)
    ap.add_argument("--profile", choices=("devcluster", "local"),
                    default="devcluster" if shutil.which("sbatch") else "local")
    a = ap.parse_args()
    recipe = f"{a.profile}-sim"
    sets = [x for s in [*SETS, f"sim.start_delay_s={a.load_s:g}"] for x in ("--set", s)]
    wait = ["--wait"] if a.profile == "devcluster" else []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        t0 = time.monotonic()
        launcher(t, "submit", recipe, *sets, "--runs-dir", str(t / "one"), "--sweep",
                 f"prefill.endpoints={','.join(map(str, VALUES))}", "--allocation", "one",
                 *wait)
        one_wall_cli = time.monotonic() - t0
        (study,) = [p.parent for p in (t / "one").glob("*/allocation.json")]
        alloc = json.loads((study / "allocation.json").read_text())
        one_runs = [study / c["run"] for c in alloc["configurations"]]
        one_s = alloc["summary"]["wall_s"]
        one_gpu_s = alloc["summary"]["gpu_hours"] * 3600
        each_runs, each_s, each_gpu_s = [], 0.0, 0.0
        t0 = time.monotonic()
        for n in VALUES:  # one after the other
            out = t / f"each{n}"
            launcher(t, "submit", recipe, *sets, "--set", f"prefill.endpoints={n}",
                     "--runs-dir", str(out), *wait)
            (run,) = [p.parent for p in out.glob("*/summary.json")]
            lc = json.loads((run / "summary.json").read_text())["lifecycle"]
            each_runs.append(run)
            each_s += lc["seconds"]
            each_gpu_s += lc["gpu_hours"] * 3600
        each_wall_cli = time.monotonic() - t0
        one_loads, each_loads = starts(one_runs), starts(each_runs)
    print(f"study: {recipe}, prefill.endpoints={','.join(map(str, VALUES))}, model load "
          f"{a.load_s:g} s (simulated)")
    print(f"wall time      one allocation {one_s:7.1f} s   one job each {each_s:7.1f} s   "
          f"ratio {one_s / each_s:.2f}   (submit to end: {one_wall_cli:.0f} s vs "
          f"{each_wall_cli:.0f} s)")
    print(f"GPU-seconds    one allocation {one_gpu_s:7.0f}     one job each {each_gpu_s:7.0f}     "
          f"ratio {one_gpu_s / each_gpu_s:.2f}")
    for name in sorted(each_loads):
        print(f"loads of {name:20} one allocation {one_loads.get(name, 0)}   one job each "
              f"{each_loads[name]}   ratio {one_loads.get(name, 0) / each_loads[name]:.2f}")
    print(f"engine starts  one allocation {sum(one_loads.values())}   one job each "
          f"{sum(each_loads.values())}   ratio "
          f"{sum(one_loads.values()) / sum(each_loads.values()):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
