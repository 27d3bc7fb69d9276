"""How many concurrent streams one sim process sustains before its own overhead dominates.

Starts one ``python -m launcher.sim serve`` (DP 1, --stream-interval 100, SIM_SPEED 1) and,
for each concurrency N, opens N streaming completions (short prompts, long outputs), waits
until all have their first token, then measures for a window:

* overhead = measured inter-token latency (from the sim's own /metrics) divided by the
  step time the speed model asks for at that batch size and context (1.00 = no overhead);
* the sim process's CPU use (one asyncio loop: 100 % of a core is its ceiling).

The figure is the largest N whose overhead stays below 1.10. Run:

    .venv/bin/python benchmarks/bench_sim_streams.py [--levels 250,500,1000,2000,4000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # test support

from simprocs import sample, scrape, start_sim  # noqa: E402

from launcher.sim.knobs import Knobs  # noqa: E402

PROMPT = 64
THRESHOLD = 1.10


async def _stream(session: aiohttp.ClientSession, url: str, max_tokens: int,
                  first: asyncio.Event, counter: list[int], n: int) -> None:
    body = {"prompt": list(range(PROMPT)), "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    seen = False
    async with session.post(url + "/v1/completions", json=body) as r:
        async for _ in r.content.iter_any():
            if not seen:
                seen = True
                counter[0] += 1
                if counter[0] == n:
                    first.set()


def _modelled_step_s(k: Knobs, n: int, mean_ctx: float) -> float:
    """Decode step duration of the speed model (launcher.sim.engine) for n sequences."""
    return (k.step_base_ms + n * k.decode_per_seq_ms
            + n * mean_ctx / 1000 * k.decode_per_ktoken_ms) / 1000 / k.speed


async def _level(url: str, proc: psutil.Process, n: int, window: float,
                 speed: float) -> dict[str, float]:
    k = Knobs(speed=speed)
    # long enough outputs to outlast ramp-up and the window at this batch size
    step = _modelled_step_s(k, n, PROMPT + 500)
    max_tokens = int((window + 20 + n / 200) / step) + 50
    base_gen = sample(scrape(url), "vllm:generation_tokens_total")  # earlier levels' tokens
    first = asyncio.Event()
    counter = [0]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=None)) as s:
        tasks = [asyncio.create_task(_stream(s, url, max_tokens, first, counter, n))
                 for _ in range(n)]
        await asyncio.wait_for(first.wait(), 120)
        await asyncio.sleep(1.0)
        t0_text = scrape(url)
        cpu0, t0 = proc.cpu_times(), time.monotonic()
        await asyncio.sleep(window)
        t1_text = scrape(url)
        cpu1, t1 = proc.cpu_times(), time.monotonic()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def delta(name: str) -> float:
        return sample(t1_text, name) - sample(t0_text, name)

    itl = delta("vllm:inter_token_latency_seconds_sum") / \
        max(1.0, delta("vllm:inter_token_latency_seconds_count"))
    gen0 = sample(t0_text, "vllm:generation_tokens_total")
    gen1 = sample(t1_text, "vllm:generation_tokens_total")
    mean_ctx = PROMPT + ((gen0 + gen1) / 2 - base_gen) / n
    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (t1 - t0)
    running = sample(t1_text, "vllm:num_requests_running")
    return {"n": n, "running": running, "itl_ms": itl * 1000,
            "model_ms": _modelled_step_s(k, n, mean_ctx) * 1000,
            "overhead": itl / _modelled_step_s(k, n, mean_ctx), "cpu": cpu,
            "tok_s": (gen1 - gen0) / (t1 - t0), "rss_mb": proc.memory_info().rss / 2**20}


async def _wait_idle(url: str, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        text = scrape(url)
        if sample(text, "vllm:num_requests_running") == 0 and \
                sample(text, "vllm:num_requests_waiting") == 0:
            return
        await asyncio.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="250,500,1000,2000,4000")
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--stream-interval", type=int, default=100)
    ap.add_argument("--speed", type=float, default=1.0, help="SIM_SPEED of the sim")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        sim = start_sim(Path(tmp), "bench", "m", "--stream-interval", str(args.stream_interval),
                        "--max-num-seqs", str(max(levels)), "--api-server-count", "1",
                        "--max-model-len", "1000000", SIM_SPEED=str(args.speed))
        try:
            sim.wait_healthy(30)
            proc = psutil.Process(sim.proc.pid)
            print(f"SIM_SPEED {args.speed:g}, --stream-interval {args.stream_interval}")
            print(f"{'streams':>8} {'running':>8} {'ITL ms':>8} {'model ms':>9} "
                  f"{'overhead':>9} {'sim CPU':>8} {'tok/s':>9} {'RSS MB':>7}")
            best = 0
            for n in levels:
                r = asyncio.run(_level(sim.url, proc, n, args.window, args.speed))
                print(f"{r['n']:>8} {r['running']:>8.0f} {r['itl_ms']:>8.1f} "
                      f"{r['model_ms']:>9.1f} {r['overhead']:>9.3f} {r['cpu']:>7.0%} "
                      f"{r['tok_s']:>9.0f} {r['rss_mb']:>7.0f}", flush=True)
                if r["overhead"] < THRESHOLD and r["running"] >= n:
                    best = max(best, n)
                asyncio.run(_wait_idle(sim.url))
            print(f"\nsustained concurrent streams per sim process at --stream-interval "
                  f"{args.stream_interval}, SIM_SPEED {args.speed:g} (overhead < "
                  f"{THRESHOLD:.2f}x the speed model): {best}")
        finally:
            sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
