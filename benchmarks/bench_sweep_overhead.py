"""Sweep overhead: the sweep's total wall time over the sum of its measured windows.

Runs a small concurrency sweep with the built-in client against one simulated vLLM
(`python -m launcher.sim serve`, or the test server of tests/test_bench.py with --server
test), the servers kept up across points as the orchestrator does. Everything that is not a
measured window counts as overhead: client start-up, the warmups, result writing.

    .venv/bin/python benchmarks/bench_sweep_overhead.py [--points 4,16,64] [--mode cli]

--mode cli runs each point as its own `python -m launcher.clients.bench` process (what the
orchestrator runs); --mode inproc calls `launcher.clients.bench.run_point` (the client's own
overhead only). Aim: ratio < 1.15.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from launcher.clients import bench
from launcher.run import results

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(kind: str, speed: float, stream_interval: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    if kind == "sim":
        argv = [sys.executable, "-m", "launcher.sim", "serve", "toy-model", "--host",
                "127.0.0.1", "--port", str(port), "--stream-interval", str(stream_interval)]
        env = {**os.environ, "SIM_SPEED": str(speed)}
    else:
        argv = [sys.executable, str(ROOT / "tests" / "test_bench.py"), "serve", "--port",
                str(port), "--stream-interval", str(stream_interval), "--decode-tok-s",
                str(50 * speed), "--ttft-base", "0.05"]
        env = dict(os.environ)
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=1):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the {kind} server did not start on {url}")


def run_sweep(url: str, out: Path, points: list[int], a: argparse.Namespace) -> float:
    """Run every point; return the sweep's wall time."""
    t0 = time.perf_counter()
    for c in points:
        cfg = bench.BenchConfig(
            model="toy-model", base_url=url, random_input_len=a.input_len,
            random_output_len=a.output_len, random_range_ratio=0.5,
            num_prompts=a.prompts_multiplier * c, max_concurrency=c, num_warmups=a.warmups,
            ignore_eos=True, temperature=0.0, percentile_metrics="ttft,tpot,itl,e2el",
            metric_percentiles="50,90,99", save_result=True, result_dir=str(out / "bench"),
            result_filename=f"c{c:05d}.json")
        if a.mode == "cli":
            subprocess.run([sys.executable, "-m", "launcher.clients.bench", *cfg.argv()], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            bench.run_point(cfg)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="4,16,64")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--prompts-multiplier", type=int, default=5)
    ap.add_argument("--warmups", type=int, default=4)
    ap.add_argument("--speed", type=float, default=10.0, help="SIM_SPEED")
    ap.add_argument("--stream-interval", type=int, default=100)
    ap.add_argument("--server", choices=["sim", "test"], default="sim")
    ap.add_argument("--mode", choices=["cli", "inproc"], default="cli")
    a = ap.parse_args()
    points = [int(x) for x in a.points.split(",")]
    proc, url = start_server(a.server, a.speed, a.stream_interval)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wall = run_sweep(url, Path(tmp), points, a)
            points_read = results.load_results(tmp)
    finally:
        proc.terminate()
        proc.wait(10)
    windows = sum(r["window_end"] - r["window_start"] for r in points_read)
    for r in points_read:
        print(f"  c={r['max_concurrency']:<5} window {r['window_end'] - r['window_start']:6.2f} s"
              f"  {r['status']:6}  {r['output_throughput']:9.0f} out tok/s"
              f"  median TTFT {r['median_ttft_ms']:7.1f} ms")
    ratio = wall / windows if windows > 0 else float("inf")
    print(f"sweep ({a.server} server, {a.mode}): wall {wall:.2f} s / measured windows "
          f"{windows:.2f} s = {ratio:.3f}  (aim < 1.15)")
    return 0 if all(r["status"] == "ok" for r in points_read) else 1


if __name__ == "__main__":
    raise SystemExit(main())
