"""How fast a mistake fails: time from `submit` to the recorded failure for an engine flag
value vLLM rejects, as a ratio to the health timeout a GB200 run would otherwise wait out
(the seed recipe's health.timeout_s, 2,400 s; target: under 0.02).

    python benchmarks/bench_preflight.py [--profile local|devcluster] [--repeat 3]

The local profile runs the simulator's parser (as strict as vLLM 0.33's); the dev cluster
adds the Slurm steps and the pyxis containers of a real site's preflight.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one(recipe: str, extra: list[str], tmp: Path) -> tuple[float, str]:
    t = time.perf_counter()
    argv = [sys.executable, "-m", "launcher", "submit", recipe, "--runs-dir", str(tmp),
            "--set", "vllm_args.gdn-prefill-backend=auto", *extra]  # fmt: skip
    subprocess.run(argv, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t
    from launcher.run import listing

    (run,) = listing.all_runs(tmp)[:1]
    return took, run.status().error or ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", choices=("local", "devcluster"), default="local")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from launcher.schema import recipe

    health = recipe.load("qwen3.5-397b-gb200-disagg").health.timeout_s
    name = "local-sim" if a.profile == "local" else "devcluster-sim"
    extra = ["--wait"] if a.profile == "devcluster" else []
    times = []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            took, error = one(name, extra, Path(tmp))
        if "invalid choice: 'auto'" not in error:
            raise SystemExit(f"the run did not fail on the flag: {error[:300]}")
        times.append(took)
    t = statistics.median(times)
    print(f"{name}: bad flag refused in {t:.1f} s (median of {a.repeat}, submit to recorded end)")
    print(f"GB200 health timeout it replaces: {health:g} s")
    print(f"ratio time-to-failure / health timeout: {t / health:.4f}  (target < 0.02)")


if __name__ == "__main__":
    main()
