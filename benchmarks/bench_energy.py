"""Energy per token from NVML's energy counter, through the analysis the reports use, against
power x time, under a real GPU load. Prints the ratio (target: within 5 %).

    python benchmarks/bench_energy.py [--seconds 40] [--slow-every 5]

The agent's own collector samples the GPU (energy on the slow cadence, as a run does); a
matmul loop stands in for the engine and counts "tokens" (one per matmul). The energy over
the measured window comes from `derive.window_evidence` on those rows (the sweep table's
J/output token), the reference from integrating `power_instant_w` (else `power_w`) sampled
every 0.1 s. Without NVML or a GPU it says so: energy is absent, never 0.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load(stop: threading.Event, count: list[int]) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(8):
            a @ b
        torch.cuda.synchronize()
        count[0] += 8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--slow-every", type=float, default=5.0, help="the agent's energy cadence")
    a = ap.parse_args()
    from launcher.telemetry.gpu import GpuCollector

    process = "decode-0@bench"  # the role the window's energy is counted under
    col = GpuCollector("bench", {0: process}, probe_risky=False)
    col.open()
    if not col.available:
        print(f"no NVML here ({'; '.join(col.info.get('notices') or [])}): energy is absent")
        return 0
    stop, count = threading.Event(), [0]
    worker = threading.Thread(target=load, args=(stop, count), daemon=True)
    rows: list[tuple] = []
    power: list[tuple[float, float]] = []
    marks: dict[str, tuple[float, int]] = {}
    t0 = time.time()
    last_slow = 0.0
    worker.start()
    while (now := time.time()) - t0 < a.seconds:
        slow = now - last_slow >= a.slow_every
        if slow:
            last_slow = now
        got = col.sample(now, slow=slow)
        rows += got
        p = {r[4]: r[6] for r in got if r[4] in ("gpu:power_instant_w", "gpu:power_w")}
        w = p.get("gpu:power_instant_w", p.get("gpu:power_w"))
        if w is not None:
            power.append((now, w))
        if "start" not in marks and now - t0 >= 5:
            marks["start"] = (now, count[0])
        if now - t0 >= a.seconds - 5 and "end" not in marks:
            marks["end"] = (now, count[0])
        time.sleep(0.1)
    stop.set()
    worker.join()
    col.close()
    (ta, ca), (tb, cb) = marks["start"], marks["end"]
    tokens = cb - ca

    import numpy as np
    import pandas as pd

    from launcher.analysis import derive

    df = pd.DataFrame(rows, columns=["ts", "node", "process", "engine", "name", "labels",
                                     "value"])
    ss = derive.SeriesSet(df, None)
    ev = derive.window_evidence(derive.Window("bench", ta, tb, None), ss, 1.0)
    ts = np.array([t for t, _ in power])
    ws = np.array([w for _, w in power])
    inside = (ts >= ta) & (ts <= tb)
    x, y = ts[inside], ws[inside]
    ref_j = float(((y[1:] + y[:-1]) / 2 * np.diff(x)).sum())  # trapezoids
    counter_j = ev["energy_j"]
    print(f"GPU: {col.info['gpus'][0].get('name')}; window {tb - ta:.1f} s, {tokens} matmuls, "
          f"mean power {ref_j / (tb - ta):.0f} W")
    print(f"energy counter via derive.window_evidence: {counter_j:.1f} J "
          f"({counter_j / tokens:.3f} J per matmul)")
    print(f"power x time ({'power_instant_w' if any(r[4] == 'gpu:power_instant_w' for r in rows) else 'power_w'}"
          f", {inside.sum()} samples): {ref_j:.1f} J ({ref_j / tokens:.3f} J per matmul)")
    ratio = counter_j / ref_j
    print(f"ratio counter / power x time: {ratio:.4f} ({(ratio - 1) * 100:+.2f} %; target within 5 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
