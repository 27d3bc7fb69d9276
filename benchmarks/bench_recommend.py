"""How far `recommend`'s prediction is from a run of what it recommends, against the
simulator's own run-to-run spread. Aim: the error within the spread.

    python benchmarks/bench_recommend.py [--repeats 2]

The study is test_recommend's (local profile, simulated engines, prefill-bound at one
prefill endpoint). One run with 1 prefill endpoint; `recommend` on it at the test's
tok/s/user target; then the recommended configuration at the recommended concurrencies,
`--repeats` times. Printed: predicted and measured tok/s/GPU at the target, the error as a
ratio, and the spread of the repeats as a ratio (max / min).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the study recipe is test support


def submit(tmp: Path, recipe: Path, *sets: str) -> Path:
    runs = tmp / f"runs-{len(list(tmp.glob('runs-*')))}"
    args = [sys.executable, "-m", "launcher", "submit", str(recipe), "--runs-dir", str(runs)]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp)
    if p.returncode != 0:
        raise SystemExit(f"run failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}")
    (run,) = [r.parent for r in runs.glob("*/summary.json")]
    return run


def measured_at(run: Path, target: float) -> float:
    from launcher.analysis import recommend

    points = json.loads((run / "summary.json").read_text())["points"]
    return recommend.tok_s_gpu_at_target(points, target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    from test_recommend import TARGET, _study_recipe

    from launcher.analysis import recommend

    tmp = Path(tempfile.mkdtemp(prefix="bench-recommend-"))
    recipe = _study_recipe(tmp)
    first = submit(tmp, recipe, "prefill.endpoints=1")
    rec = recommend.recommend(first, TARGET)
    if rec is None:
        raise SystemExit(f"no recommendation: {recommend.why_not(first, TARGET)}")
    P = rec["prefill_endpoints"]
    predicted = next(c["total_tokens_per_s_per_gpu"] for c in rec["candidates"]
                     if c["prefill_endpoints"] == P)
    concs = ",".join(map(str, rec["next_concurrency"]))
    got = [measured_at(submit(tmp, recipe, f"prefill.endpoints={P}",
                              f"benchmark.concurrency=[{concs}]"), TARGET)
           for _ in range(a.repeats)]
    mean = sum(got) / len(got)
    spread = max(got) / min(got) if min(got) > 0 else float("inf")
    error = predicted / mean if mean > 0 else float("inf")
    print(f"first run: 1 prefill endpoint, {measured_at(first, TARGET):,.0f} tok/s/GPU at "
          f">= {TARGET:g} tok/s/user; recommended {P} ({rec['confidence']} confidence), "
          f"concurrencies {concs}")
    print(f"predicted {predicted:,.0f} tok/s/GPU; measured "
          + ", ".join(f"{g:,.0f}" for g in got) + f" (mean {mean:,.0f})")
    print(f"prediction / measured: {error:.3f}   run-to-run spread (max / min): {spread:.3f}")
    inside = abs(error - 1) <= max(spread - 1, 0.05)
    print("within the spread" if inside else "outside the spread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
