"""The simulator's /metrics page: CPU per render, as a ratio (not a timed test).

    .venv/bin/python benchmarks/bench_sim_metrics.py [--dp 2] [--renders 200]

The agent asks every engine for its page every 0.5-1 s, so the simulated engines of one suite
run render it about 30,000 times. Each render formats every series; label sets and most values
repeat from one render to the next, so `launcher.sim.metrics` formats each once and looks it up
after. Printed: ms per render with those lookups warm (what an engine pays from its second
page on), and cold (the caches emptied before each render: what every page cost before them),
for a DP-N API server whose counters move between renders as a loaded engine's do.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.sim import metrics  # noqa: E402


class Engine:
    """What render() reads of an engine: its rank, its Prometheus state and its gauges."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.stats = metrics.EngineStats(max_model_len=8192)

    def gauges(self) -> dict:
        return {"running": 3, "waiting": 1, "waiting_by_reason": {"capacity": 1, "deferred": 0},
                "kv_fetch": {"waiting_to_start": 0, "in_progress": 0, "completed_waiting": 0},
                "sleep": {"awake": 1, "weights_offloaded": 0, "discard_all": 0},
                "kv_usage": 0.42}

    def cache_config(self) -> dict[str, str]:
        return {"block_size": "16", "cache_dtype": "auto"}

    def step(self, rng: random.Random) -> None:
        """A loaded engine between two scrapes: every counter and histogram moves."""
        for k in self.stats.counters:
            self.stats.counters[k] += rng.randint(1, 50)
        for h in self.stats.hists.values():
            h.observe(rng.random() * 2.0)


def per_render(engines: list[Engine], renders: int, cold: bool) -> float:
    rng = random.Random(0)
    render = lambda: metrics.render(engines, "bench-model", nixl=True,  # noqa: E731
                                    consumer=True, multiproc=False)
    render()
    t = 0.0
    for _ in range(renders):
        for e in engines:
            e.step(rng)
        if cold:
            metrics._go_float.cache_clear()
            metrics._label_text.cache_clear()
        t0 = time.process_time()
        render()
        t += time.process_time() - t0
    return t / renders


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--renders", type=int, default=200)
    a = ap.parse_args()
    engines = [Engine(r) for r in range(a.dp)]
    page = metrics.render(engines, "bench-model", nixl=True, consumer=True, multiproc=False)
    warm = per_render(engines, a.renders, cold=False)
    cold = per_render(engines, a.renders, cold=True)
    print(f"page: DP {a.dp}, {len(page) / 1024:.0f} KB, {page.count(chr(10))} lines")
    print(f"render, formats looked up (warm): {warm * 1e3:6.2f} ms CPU")
    print(f"render, formatted anew (cold)   : {cold * 1e3:6.2f} ms CPU")
    print(f"ratio warm / cold = {warm / cold:.2f}")


if __name__ == "__main__":
    main()
