"""Time to render the KV-cache page of a 72-GPU, 2-hour, 1 s-sampling run, divided by the
time to just read that run's telemetry files. Aim: under 3.

    python benchmarks/bench_dashboard.py [--runs DIR] [--duration 7200]

The run is tests/synth.py's 72-GPU topology (18 nodes × 4 GPUs: 2 decode DEP16 + 20
prefill DEP2 = 72 engines), written through the telemetry store with its change-point
encoding. "Render" is the page's script run under Streamlit's AppTest with every cache
cleared (what the first visitor waits for), and again warm (what every rerun costs).
"Read" is `launcher.telemetry.store.read_samples(run)` for all series (the reader API; the
faster of its plain and categorical modes), and, for reference, pyarrow reading the parquet
files with no conversion at all.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # synthetic runs are test support


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=None,
                    help="reuse (or create) the synthetic run under this directory")
    ap.add_argument("--duration", type=float, default=7200.0)
    a = ap.parse_args()

    import synth

    root = a.runs or Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    existing = sorted(root.glob("*-large72")) if root.exists() else []
    if existing:
        run = existing[0]
        print(f"run: {run} (reused)")
    else:
        t = time.perf_counter()
        run = synth.large(root, duration_s=a.duration)
        print(f"run: {run} (written in {time.perf_counter() - t:.1f} s)")
    files = glob.glob(str(run / "telemetry" / "*" / "samples-*"))
    size = sum(os.path.getsize(f) for f in files)
    print(f"telemetry: {len(files)} files, {size / 2**20:.1f} MiB")

    import pyarrow.parquet as pq

    from launcher.telemetry import store

    store.read_samples(run, names=["vllm:kv_cache_usage_perc"])  # warm the OS file cache
    t = time.perf_counter()
    df = store.read_samples(run)
    read_s = time.perf_counter() - t
    n_rows = len(df)
    del df
    t = time.perf_counter()
    df = store.read_samples(run, categorical=True)
    read_cat_s = time.perf_counter() - t
    del df
    t = time.perf_counter()
    raw_rows = sum(pq.read_table(f).num_rows for f in files if f.endswith(".parquet"))
    raw_s = time.perf_counter() - t
    print(f"read all telemetry (store.read_samples): {read_s:.2f} s, {n_rows:,} rows")
    print(f"read all telemetry (store.read_samples, categorical=True): {read_cat_s:.2f} s")
    print(f"read parquet files (pyarrow, no conversion): {raw_s:.2f} s, {raw_rows:,} rows")
    # The stricter of the reader's two modes is the denominator.
    read_s = min(read_s, read_cat_s)

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    os.environ["PD_DASHBOARD_RUNS"] = str(root)
    st.cache_data.clear()
    st.cache_resource.clear()
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=600)
    at.query_params["run"] = run.name
    at.run()  # the runs page: not part of the measurement
    t = time.perf_counter()
    at.switch_page("app_pages/kv_cache.py").run()
    cold_s = time.perf_counter() - t
    if at.exception:
        print("KV page raised:", at.exception[0].value)
        return 1
    n_charts = len(at.get("vega_lite_chart"))
    t = time.perf_counter()
    at.run()
    warm_s = time.perf_counter() - t
    print(f"render KV page, cold caches: {cold_s:.2f} s ({n_charts} charts)")
    print(f"render KV page, warm (rerun): {warm_s:.2f} s")
    ratio = cold_s / read_s
    print(f"ratio KV page render / read telemetry = {ratio:.2f} (aim < 3)"
          f"{'  OK' if ratio < 3 else '  ABOVE AIM'}")
    print(f"ratio vs raw parquet read = {cold_s / raw_s:.2f}; warm ratio = "
          f"{warm_s / read_s:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
