"""Telemetry cost, printed as ratios (not a timed test).

    .venv/bin/python benchmarks/bench_telemetry.py [--seconds 30] [--endpoints 4]

1. Parse rate of our /metrics path vs prometheus_client's text parser on a DP-8-sized payload
   (the decode DP-2 fixture with engine "1" cloned to engines 2..7, as in docs/telemetry-costs.md).
3. The reader: one node's store after `--reader-minutes` of 4 DP-8 endpoints at 1 Hz (the same
   mutation model, written through the agent's scrape path and compacted): rows and bytes
   stored, and read_samples time for one metric, one histogram family, and everything.
2. The agent's CPU time per second of wall time while it scrapes N endpoints serving that
   payload at 1 Hz (the servers run in another process and mutate values every request: all
   gauges, counters, sums and counts, and a fifth of the histogram buckets change each scrape,
   a loaded engine). Target: under 2% of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIX = REPO / "tests" / "data" / "vllm_samples"  # vLLM 0.33 samples, with their sources
DECODE = FIX / "vllm_metrics_v0.33.0_generated_decode_dp2_nixl.prom"


def dp8_payload() -> str:
    """Engine "1" lines cloned to engines 2..7 right after the original (families stay
    grouped, as prometheus_client prints them)."""
    out = []
    for line in DECODE.read_text().splitlines():
        out.append(line)
        if 'engine="1"' in line and not line.startswith("#"):
            out.extend(line.replace('engine="1"', f'engine="{e}"') for e in range(2, 8))
    return "\n".join(out) + "\n"


SERVER = r'''
import random, re, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
text = open(sys.argv[1]).read().splitlines()
n = int(sys.argv[2])
rng = random.Random(1)
state = {"lines": text, "lock": threading.Lock()}

def mutate():
    out = []
    for line in state["lines"]:
        if line.startswith("#") or not line:
            out.append(line); continue
        key, _, val = line.rpartition(" ")
        p = 0.2 if "_bucket{" in key else 0.8
        if rng.random() < p:
            try:
                val = repr(float(val) + rng.randint(1, 9))
            except ValueError:
                pass
        out.append(key + " " + val)
    state["lines"] = out
    return ("\n".join(out) + "\n").encode()

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        with state["lock"]:
            body = mutate()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

servers = []
for _ in range(n):
    s = ThreadingHTTPServer(("127.0.0.1", 0), H)
    servers.append(s)
    threading.Thread(target=s.serve_forever, daemon=True).start()
print(" ".join(str(s.server_address[1]) for s in servers), flush=True)
sys.stdin.read()
'''


def bench_parse(text: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from launcher.telemetry.scrape import MetricsParser, Target, TargetState, rows_from_text

    def timeit(fn, n: int) -> float:  # noqa: ANN001
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    ref = timeit(lambda: [s for f in text_string_to_metric_families(text) for s in f.samples], 5)
    cold = timeit(lambda: MetricsParser().parse(text), 5)
    warm_p = MetricsParser()
    warm = timeit(lambda: warm_p.parse(text), 20)
    # the agent's real path: split + change filter + rows for changed lines only
    st = TargetState(Target("p", "u"), "n")
    ts = [1000.0]

    def agent_path() -> None:
        ts[0] += 1
        rows_from_text(st, ts[0], text)

    steady = timeit(agent_path, 20)
    n_samples = len(warm_p.parse(text))
    print(f"payload: {len(text) / 1024:.0f} KB, {text.count(chr(10))} lines, "
          f"{n_samples} samples (DP-8)")
    print(f"prometheus_client text parser : {ref * 1e3:8.2f} ms/scrape")
    print(f"ours, cold (first scrape)     : {cold * 1e3:8.2f} ms/scrape   "
          f"ratio {ref / cold:6.1f}x faster")
    print(f"ours, warm key cache          : {warm * 1e3:8.2f} ms/scrape   "
          f"ratio {ref / warm:6.1f}x faster")
    print(f"agent path, unchanged payload : {steady * 1e3:8.2f} ms/scrape   "
          f"ratio {ref / steady:6.1f}x faster (split + change filter, no rows)")


def bench_agent(text: str, seconds: float, endpoints: int) -> None:
    import psutil

    tmp = Path(tempfile.mkdtemp(prefix="bench-telemetry-"))
    payload = tmp / "dp8.prom"
    payload.write_text(text)
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(payload), str(endpoints)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert srv.stdout is not None
    ports = [int(p) for p in srv.stdout.readline().split()]
    run = tmp / "run"
    (run / "logs").mkdir(parents=True)
    from launcher.run.plandoc import NodeDoc, PlanDoc, Process
    from launcher.run.vocab import Kind

    procs = [Process(name=f"decode-{i}@bench", kind=Kind.ENGINE, node="bench", argv=[], env={},
                     gpus=[i], metrics_url=f"http://127.0.0.1:{p}/metrics",
                     log=f"logs/decode-{i}.log") for i, p in enumerate(ports)]
    doc = PlanDoc(run_id="bench", recipe="bench", cluster="local", engine="sim", mode="disagg",
                  model_path="m", served_name="m", telemetry_interval_s=1.0,
                  nodes=[NodeDoc("bench", "127.0.0.1", len(ports))], endpoints=[],
                  processes=procs, router_url="http://127.0.0.1:9",
                  router_metrics_url="http://127.0.0.1:9/metrics", gpu_count={"total": len(ports)})
    (run / "plan.json").write_text(json.dumps(doc.to_json()))
    env = {**os.environ, "PYTHONPATH": str(REPO), "PD_PROCESS": "agent@bench",
           "PD_RUN_DIR": str(run)}
    agent = subprocess.Popen([sys.executable, "-m", "launcher.telemetry.agent", "--run-dir",
                              str(run), "--node", "bench", "--interval", "1"],
                             cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    try:
        p = psutil.Process(agent.pid)
        time.sleep(5.0)  # start-up (imports, first scrapes, NVML probe) is not steady state
        c0, w0 = sum(p.cpu_times()[:2]), time.time()
        time.sleep(seconds)
        c1, w1 = sum(p.cpu_times()[:2]), time.time()
        agent.terminate()
        agent.wait(60)
    finally:
        if agent.poll() is None:
            agent.kill()
        srv.kill()
    info = json.loads((run / "telemetry" / "bench" / "agent.json").read_text())
    size = sum(f.stat().st_size for f in (run / "telemetry" / "bench").glob("samples-*"))
    raw = sum(f.stat().st_size for f in (run / "telemetry" / "bench").glob("raw-*"))
    frac = (c1 - c0) / (w1 - w0)
    ok = [t["ok_scrapes"] for t in info["scrape_targets"]]
    print(f"agent: {endpoints} endpoints x DP-8 at 1 Hz for {w1 - w0:.0f} s: "
          f"CPU {100 * frac:.2f}% of one core ({(c1 - c0) * 1e3 / (w1 - w0):.1f} ms CPU per s)"
          f"  target < 2%  {'OK' if frac < 0.02 else 'OVER'}")
    # rotated segments are compacted in the background (every 64 MiB or 10 min): add its
    # cost per text byte, measured here on a segment of the same rows
    rate = info["rows"]["text_bytes"] / max(info["ticks"], 1)  # bytes per s at 1 Hz
    per_byte = compaction_cpu_per_byte(text, endpoints)
    amort = rate * per_byte
    print(f"  + amortised compaction of {rate / 1024:.0f} KiB/s of text rows: "
          f"{100 * amort:.2f}% -> {100 * (frac + amort):.2f}% of one core in all")
    print(f"  scrapes ok per endpoint: {ok}, late ticks: {info['late_ticks']}, "
          f"GPU: {'on' if info['gpu']['available'] else 'off (no NVML here)'}")
    print(f"  stored: {size / 1024:.0f} KB of samples (compacted), {raw / 1024:.0f} KB raw "
          f"text for {info['ticks']} ticks")


def compaction_cpu_per_byte(text: str, endpoints: int, ticks: int = 60) -> float:
    from launcher.telemetry.scrape import Target, TargetState
    from launcher.telemetry.store import SampleWriter, compact_segment

    tmp = Path(tempfile.mkdtemp(prefix="bench-compact-"))
    w = SampleWriter(tmp, compact=False)
    rng = random.Random(5)
    lines = text.splitlines()
    states = [TargetState(Target(f"d{i}@n", ""), "n", 60.0, 5.0) for i in range(endpoints)]
    for k in range(ticks):
        out = []
        for line in lines:
            if line and not line.startswith("#") and \
                    rng.random() < (0.2 if "_bucket{" in line else 0.8):
                key, _, val = line.rpartition(" ")
                line = key + " " + repr(float(val) + 1)
            out.append(line)
        lines = out
        payload = "\n".join(lines) + "\n"
        for st in states:
            w.write_lines(st.ingest(1.8e9 + k, payload))
        w.flush()
    w.close()
    seg = next(tmp.glob("samples-*.tsv"))
    size = seg.stat().st_size
    t = time.process_time()
    compact_segment(seg)
    return (time.process_time() - t) / size


def bench_reader(text: str, minutes: float, endpoints: int) -> None:
    from launcher.telemetry.scrape import Target, TargetState
    from launcher.telemetry.store import SampleWriter, read_samples

    rng = random.Random(2)
    lines = text.splitlines()

    def mutate() -> str:
        out = []
        for line in lines:
            if line.startswith("#") or not line:
                out.append(line)
                continue
            key, _, val = line.rpartition(" ")
            if rng.random() < (0.2 if "_bucket{" in key else 0.8):
                val = repr(float(val) + rng.randint(1, 9))
            out.append(key + " " + val)
        lines[:] = out
        return "\n".join(out) + "\n"

    tmp = Path(tempfile.mkdtemp(prefix="bench-reader-"))
    node_dir = tmp / "telemetry" / "n1"
    w = SampleWriter(node_dir, rotate_bytes=8 << 20)
    states = [TargetState(Target(f"decode-{i}@n1", ""), "n1", 60.0, 5.0)
              for i in range(endpoints)]
    t0 = 1.8e9
    ticks = int(minutes * 60)
    for k in range(ticks):
        payload = mutate()  # the same payload for every endpoint: the cost is per row anyway
        for st in states:
            w.write_lines(st.ingest(t0 + k, payload))
        w.flush()
    for st in states:
        w.write_lines(st.pending())
    w.close()
    size = sum(f.stat().st_size for f in node_dir.glob("samples-*.parquet"))

    def timed(**kw) -> tuple[float, int]:  # noqa: ANN003
        t = time.perf_counter()
        df = read_samples(tmp, **kw)
        return time.perf_counter() - t, len(df)

    all_t, all_n = timed()
    one_t, one_n = timed(names=["vllm:kv_cache_usage_perc"])
    fam_t, fam_n = timed(name_prefix="vllm:time_to_first_token_seconds")
    win_t, win_n = timed(name_prefix="vllm:", start=t0 + ticks / 2, end=t0 + ticks / 2 + 60)
    raw_rows = ticks * endpoints * sum(1 for x in lines if x and not x.startswith("#")
                                       and "_created" not in x)
    print(f"reader: one node, {endpoints} DP-8 endpoints, {minutes:g} min at 1 Hz: "
          f"{all_n:,} rows stored of {raw_rows:,} scraped samples "
          f"({raw_rows / max(all_n, 1):.1f}x fewer), {size / 2**20:.1f} MiB parquet")
    print(f"  read everything              : {all_t:6.2f} s ({all_n / all_t / 1e6:.1f} M rows/s)")
    print(f"  read one metric (kv usage)   : {one_t:6.3f} s ({one_n:,} rows)")
    print(f"  read one histogram family    : {fam_t:6.3f} s ({fam_n:,} rows)")
    print(f"  read vllm:* in a 60 s window : {win_t:6.3f} s ({win_n:,} rows, with state at start)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--endpoints", type=int, default=4)
    ap.add_argument("--skip-agent", action="store_true")
    ap.add_argument("--reader-minutes", type=float, default=10.0, help="0: skip the reader")
    a = ap.parse_args()
    random.seed(0)
    text = dp8_payload()
    assert re.search(r'engine="7"', text)
    bench_parse(text)
    if not a.skip_agent:
        bench_agent(text, a.seconds, a.endpoints)
    if a.reader_minutes > 0:
        bench_reader(text, a.reader_minutes, a.endpoints)


if __name__ == "__main__":
    main()
