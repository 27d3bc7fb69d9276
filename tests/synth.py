"""Synthetic run directories for the dashboard's tests and benchmark.

Each scenario writes a complete run directory the way the launcher does (plan.json, run.json,
events.jsonl, bench/, accuracy/, logs/) and its telemetry through the store's public writer
(`launcher.telemetry.store.SampleWriter`), with the store's change-point encoding applied
the way the agent applies it, so readers see what a real run leaves behind.

The numbers come from a small queueing model per sweep point (Little's law for queue
lengths, histogram sums = count × mean), so engine-side metrics agree with the client
figures and each bottleneck has the signature of docs/figures.md (TTFT bottleneck decision table):

    healthy       every TTFT part small, KV < 80 %
    prefill       prefill queue time grows with concurrency, prefill waiting > 0
    kv_capacity   decode KV ≥ 95 %, requests waiting for capacity, preemptions, TPOT up
    kv_transfer   NIXL transfer time dominates TTFT, requests deferred on decode

    python tests/synth.py OUT_DIR [--scenario all|healthy|...|large] [--duration S]
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from launcher.run.rundir import ProcessRecord, RunDir, RunRecord, Submission, write_json
from launcher.run.vocab import Kind, Stage, State

ISL, OSL = 8192, 1024
MODEL = "Qwen/Qwen3.5-397B-A17B-NVFP4"
GPUS_PER_NODE = 4
KEYFRAME_S = 60.0
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
NIXL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BLOCK_SIZE = 16
# Decode KV blocks per DP rank the synthetic engines report: about what the healthy model's
# usage implies (~16 requests of ISL+OSL at ~70 % at the top point); the plan's prediction
# is a little lower, as an estimate should be.
DECODE_BLOCKS = 13_000
PREDICTED_BLOCKS = 12_800


@dataclass
class Topology:
    n_prefill: int = 2
    prefill_dp: int = 2
    n_decode: int = 1
    decode_dp: int = 4
    gpus_per_node: int = GPUS_PER_NODE

    @property
    def total_gpus(self) -> int:
        return self.n_prefill * self.prefill_dp + self.n_decode * self.decode_dp


@dataclass
class Scenario:
    name: str
    signature: str = "healthy"        # healthy | prefill | kv_capacity | kv_transfer
    topology: Topology = field(default_factory=Topology)
    concurrencies: tuple[int, ...] = (8, 16, 32, 64)
    duration_s: float = 480.0         # whole telemetry span
    interval_s: float = 1.0
    engine: str = "sim"
    state: str = "succeeded"
    fail_at_point: int | None = None  # index of the point that fails (the run then fails)
    seed: int = 0
    tpot_scale: float = 1.0           # decode speed of this configuration (studies)
    recipe: str | None = None         # recipe name (default synthetic-<signature>)
    gb200: bool = False               # GB200-scale speeds (gb200_speed), for published_study
    spec_tokens: int = 0              # MTP drafts per decode step (vllm:spec_decode_*)
    spec_accept: float = 0.75         # each draft position's acceptance, given the one before
    kv_store: bool = False            # a Mooncake store on the prefills and its master:
                                      # store hits, store ops and master figures (real names)


# --- plan ----------------------------------------------------------------------------------


def make_plan(run_id: str, sc: Scenario) -> dict:
    """plan.json for the topology, made by the real planner and renderer (decode DEP on whole
    nodes, prefill packed onto its own nodes), on a synthetic 4-GPU cluster profile."""
    from launcher.planning import plan as plan_mod
    from launcher.planning import render
    from launcher.schema.cluster import Cluster
    from launcher.schema.recipe import Recipe

    topo = sc.topology
    gpn = topo.gpus_per_node
    recipe = Recipe.model_validate({
        "name": sc.recipe or f"synthetic-{sc.signature}",
        "cluster": "synthetic",
        "engine": sc.engine,
        "model": {"path": MODEL, "served_name": "qwen3.5"},
        "prefill": {"endpoints": topo.n_prefill, "data_parallel": topo.prefill_dp,
                    "expert_parallel": True},
        "decode": {"endpoints": topo.n_decode, "data_parallel": topo.decode_dp,
                   "expert_parallel": True},
        "benchmark": {"concurrency": list(sc.concurrencies), "input_len": ISL,
                      "output_len": OSL, "chat_template": True},  # the published workload
        "telemetry": {"interval_s": sc.interval_s},
    })
    cluster = Cluster(name="synthetic", scheduler="slurm", gpus_per_node=gpn,
                      gpu_memory_gib=184, port_base=8000, dry_run_nodes="node[01-99]")
    need = plan_mod.nodes_needed(recipe, cluster)
    nodes = [f"node{i:02d}" for i in range(1, need + 1)]
    addresses = {n: f"10.0.0.{i}" for i, n in enumerate(nodes, 1)}
    p = plan_mod.make_plan(recipe, cluster, nodes, addresses)
    run_dir = f"/synthetic/{run_id}"
    doc = render.plan_doc(p.at(run_dir), run_id, placeholder_nodes=False).to_json()
    doc["capacity"] = predicted_capacity(doc)
    return doc


def predicted_capacity(plan: dict) -> list[dict]:
    """A KV-capacity estimate per decode endpoint in the shape the planner writes into
    plan.json (launcher.planning.kv.KvCapacity.to_json's keys), for blocks a bit
    below what the synthetic engines report (an estimate errs on the safe side)."""
    out = []
    for ep in plan["endpoints"]:
        if ep["role"] != "decode":
            continue
        blocks = PREDICTED_BLOCKS
        per_rank = blocks * BLOCK_SIZE // (ISL + OSL)
        out.append({
            "name": ep["name"], "tp": ep["tp_size"], "dp": ep["dp_size"],
            "block_size": BLOCK_SIZE, "num_gpu_blocks": blocks,
            "lengths": {"mean_total": ISL + OSL, "max_total": ISL + OSL},
            "per_rank_at_mean_length": per_rank, "per_rank_at_max_length": per_rank,
            "endpoint_at_mean_length": per_rank * ep["dp_size"],
            "endpoint_at_max_length": per_rank * ep["dp_size"],
            "assumptions": ["synthetic: 8 GiB/GPU for activations and CUDA graphs",
                            "every request reaches ISL + OSL tokens"]})
    return out


# --- the per-point model -------------------------------------------------------------------


@dataclass
class PointModel:
    conc: int
    prefill_queue: float
    prefill_compute: float
    kv_transfer: float
    decode_admission: float
    remainder: float
    tpot: float
    decode_kv: float
    prefill_kv: float
    preempt_rate: float       # preemptions/s across decode
    nixl_fail_rate: float

    @property
    def ttft(self) -> float:
        return (self.prefill_queue + self.prefill_compute + self.kv_transfer
                + self.decode_admission + self.remainder)

    @property
    def req_rate(self) -> float:
        return self.conc / (self.ttft + self.tpot * (OSL - 1))


def point_model(sig: str, conc: int, conc_max: int) -> PointModel:
    x = conc / conc_max  # 0..1 load
    m = PointModel(conc=conc, prefill_queue=0.01 + 0.03 * x, prefill_compute=0.30,
                   kv_transfer=0.03, decode_admission=0.005, remainder=0.02,
                   tpot=0.018 + 0.006 * x, decode_kv=0.15 + 0.55 * x, prefill_kv=0.10 + 0.1 * x,
                   preempt_rate=0.0, nixl_fail_rate=0.0)
    if sig == "prefill":
        m.prefill_queue = 0.02 + 3.5 * x ** 2
        m.prefill_kv = 0.2 + 0.5 * x
    elif sig == "kv_capacity":
        m.decode_kv = min(0.995, 0.35 + 0.7 * x)
        if x > 0.4:
            m.decode_admission = 0.01 + 4.0 * (x - 0.4) ** 1.5
            m.preempt_rate = 3.0 * (x - 0.4)
        m.tpot = 0.018 + 0.03 * x ** 2
    elif sig == "kv_transfer":
        m.kv_transfer = 0.03 + 1.6 * x ** 2
        m.prefill_kv = 0.2 + 0.5 * x  # blocks wait longer to be pulled
        m.nixl_fail_rate = 0.05 * x
    return m


# Prefill input tok/s one GPU sustains in the GB200-scale model: about what the published
# 4 x DEP2 plateau (~22k total tok/s per working GPU on 16 GPUs) implies for 8 prefill GPUs.
PREFILL_TOK_S_PER_GPU = 38_000.0


def gb200_speed(m: PointModel, prefill_gpus: int) -> None:
    """A DEP8 decode whose TPOT grows with the batch (12 ms + 5.2 us per request in flight)
    and prefill endpoints that cap the request rate at their input tok/s: beyond the cap the
    requests queue for prefill (Little's law: TTFT = concurrency / rate - decode time)."""
    m.tpot = 0.012 + 5.2e-6 * m.conc
    cap = prefill_gpus * PREFILL_TOK_S_PER_GPU / ISL
    if m.req_rate > cap:
        m.prefill_queue += m.conc / cap - (m.ttft + m.tpot * (OSL - 1))


# --- telemetry generation ------------------------------------------------------------------


@dataclass
class Timeline:
    ts: np.ndarray              # sample times
    point: np.ndarray           # index of the sweep point per sample, -1 idle
    windows: list[tuple[float, float]]


def timeline(sc: Scenario, t0: float) -> Timeline:
    n = int(sc.duration_s / sc.interval_s)
    ts = t0 + np.arange(n) * sc.interval_s
    k = len(sc.concurrencies)
    lead, gap = min(30.0, sc.duration_s * 0.05), min(10.0, sc.duration_s * 0.02)
    span = (sc.duration_s - lead - 10.0 - gap * k) / k
    point = np.full(n, -1, dtype=np.int64)
    windows = []
    for i in range(k):
        a = t0 + lead + i * (span + gap)
        b = a + span
        windows.append((a, b))
        point[(ts >= a) & (ts < b)] = i
        if sc.fail_at_point is not None and i >= sc.fail_at_point:
            break
    return Timeline(ts, point, windows)


def _change_mask(m: np.ndarray, keyframe_every: int) -> np.ndarray:
    """The store's change-point rule, vectorised over series: changes, hold points before a
    change, keyframes, and the last sample (written at close)."""
    changed = np.ones(m.shape, dtype=bool)
    changed[:, 1:] = m[:, 1:] != m[:, :-1]
    hold = np.zeros(m.shape, dtype=bool)
    hold[:, :-1] = changed[:, 1:] & ~changed[:, :-1]
    key = np.zeros(m.shape[1], dtype=bool)
    key[::keyframe_every] = True
    key[-1] = True
    return changed | hold | key[None, :]


class NodeRows:
    """Collects series matrices of one node and writes them as store rows."""

    def __init__(self, node: str, tl: Timeline, keyframe_every: int) -> None:
        self.node = node
        self.tl = tl
        self.keyframe_every = keyframe_every
        self.prefixes: list[str] = []
        self.blocks: list[tuple[int, np.ndarray]] = []  # (first prefix index, matrix)

    def add(self, process: str, engines: list[str], name: str, labels: dict | None,
            matrix: np.ndarray) -> None:
        """`matrix` is [len(engines), len(ts)]."""
        lab = json.dumps(labels or {}, sort_keys=True, separators=(",", ":"))
        first = len(self.prefixes)
        for e in engines:
            self.prefixes.append(f"{self.node}\t{process}\t{e}\t{name}\t{lab}")
        self.blocks.append((first, np.atleast_2d(matrix)))

    def write(self, node_dir: Path) -> int:
        import pyarrow as pa
        import pyarrow.compute as pc

        from launcher.telemetry.store import SampleWriter

        ts_str = pa.array([f"{t:.3f}" for t in self.tl.ts])
        prefixes = pa.array(self.prefixes)
        writer = SampleWriter(node_dir)
        n_rows = 0
        try:
            for first, m in self.blocks:
                mask = _change_mask(m, self.keyframe_every)
                si, ti = np.nonzero(mask)
                if len(si) == 0:
                    continue
                # Rows in time order within the block (a real agent appends as it goes).
                order = np.argsort(ti, kind="stable")
                si, ti = si[order], ti[order]
                vals = m[si, ti]
                for a in range(0, len(si), 1_000_000):
                    sl = slice(a, a + 1_000_000)
                    cols = [ts_str.take(pa.array(ti[sl])),
                            prefixes.take(pa.array(si[sl] + first)),
                            pc.binary_join_element_wise(
                                pc.cast(pa.array(vals[sl]), pa.string()), "\n", "")]
                    joined = pc.binary_join_element_wise(*cols, "\t")
                    writer.write_lines([_concat(joined)])
                    writer.flush()
                    n_rows += len(vals[sl])
        finally:
            writer.close()
        return n_rows


def _concat(arr) -> str:
    """All strings of an arrow string array as one str (its data buffer, no per-row work)."""
    import pyarrow as pa

    arr = arr.cast(pa.large_string()) if arr.type != pa.large_string() else arr
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int64)
    lo, hi = offs[arr.offset], offs[arr.offset + len(arr)]
    return arr.buffers()[2].to_pybytes()[lo:hi].decode()


def _noise(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    return np.exp(rng.normal(0.0, sigma, shape) - sigma * sigma / 2)


def _bucket_fracs(bounds: tuple[float, ...], means: np.ndarray) -> np.ndarray:
    """Cumulative share of observations ≤ each bound for a gamma(k=2) latency of each mean:
    [len(means), len(bounds)+1] (+Inf last)."""
    b = np.asarray(bounds)[None, :]
    mu = np.maximum(means[:, None], 1e-6)
    z = 2.0 * b / mu  # gamma(k=2, theta=mu/2): CDF = 1 - e^-z (1 + z)
    cdf = 1.0 - np.exp(-z) * (1.0 + z)
    return np.concatenate([cdf, np.ones((len(means), 1))], axis=1)


def engine_telemetry(sc: Scenario, plan: dict, tl: Timeline, models: list[PointModel],
                     rng: np.random.Generator, rows: dict[str, NodeRows]) -> None:
    """vLLM /metrics series of every engine, on the endpoint's head node (one scrape per API
    server holds all its DP engines, labelled `engine`)."""
    n_t = len(tl.ts)
    dt = sc.interval_s
    active = tl.point >= 0
    pidx = np.where(active, tl.point, 0)

    def per_point(attr: str) -> np.ndarray:
        v = np.array([getattr(m, attr) for m in models] or [0.0])
        return np.where(active, v[pidx], 0.0)

    req = per_point("req_rate")
    n_pre = sum(e["dp_size"] for e in plan["endpoints"] if e["role"] == "prefill")
    n_dec = sum(e["dp_size"] for e in plan["endpoints"] if e["role"] == "decode")
    for ep in plan["endpoints"]:
        role, dp = ep["role"], ep["dp_size"]
        head = ep["nodes"][0]
        proc = f"{ep['name']}@{head}"
        engines = [str(i) for i in range(dp)]
        share = 1.0 / (n_pre if role == "prefill" else n_dec)
        # Per-engine skew: DP balance is never perfect.
        skew = 1.0 + 0.08 * rng.standard_normal((dp, 1))
        r = req[None, :] * share * skew * _noise(rng, (dp, n_t), 0.15)  # requests/s

        def counter(rate: np.ndarray, integer: bool = True) -> np.ndarray:
            c = np.cumsum(rate * dt, axis=1)
            return np.floor(c) if integer else np.round(c, 4)

        nr = rows[head]
        add = nr.add
        count = counter(r)
        inc = np.diff(count, axis=1, prepend=0.0)

        def hist(base: str, mean_t: np.ndarray, buckets: tuple[float, ...] | None,
                 nr: NodeRows = nr, proc: str = proc, engines: list[str] = engines,
                 count: np.ndarray = count, inc: np.ndarray = inc, dp: int = dp) -> None:
            mt = mean_t[None, :] * _noise(rng, (dp, n_t), 0.1)
            nr.add(proc, engines, base + "_count", None, count)
            nr.add(proc, engines, base + "_sum", None,
                   np.round(np.cumsum(inc * mt, axis=1), 4))
            if buckets:
                fr = _bucket_fracs(buckets, mean_t)
                for j, le in enumerate((*[str(float(b)) for b in buckets], "+Inf")):
                    # Rounded, capped by the count: bucket counts never exceed +Inf's.
                    nr.add(proc, engines, base + "_bucket", {"le": le},
                           np.minimum(np.round(np.cumsum(inc * fr[None, :, j], axis=1)), count))

        if role == "prefill":
            q, c = per_point("prefill_queue"), per_point("prefill_compute")
            hist("vllm:request_queue_time_seconds", q, None)
            hist("vllm:request_prefill_time_seconds", c, None)
            hist("vllm:time_to_first_token_seconds", q + c, TTFT_BUCKETS)
            kv = per_point("prefill_kv")
            waiting = r * q[None, :]
            running = r * c[None, :]
            add(proc, engines, "vllm:prompt_tokens_by_source_total",
                {"source": "local_compute"}, counter(r * ISL))
            add(proc, engines, "vllm:prompt_tokens_by_source_total",
                {"source": "local_cache_hit"}, counter(r * ISL * 0.02))
            if sc.kv_store:
                store_engine(add, proc, engines, r, counter, pidx, active, len(models))
            add(proc, engines, "vllm:generation_tokens_total", None, count)
            add(proc, engines, "vllm:nixl_num_kv_expired_reqs_total", None,
                np.zeros((dp, n_t)))
            wc = waiting
            wd = np.zeros_like(waiting)
            pre = np.zeros((dp, n_t))
        else:
            a, x = per_point("decode_admission"), per_point("kv_transfer")
            hist("vllm:request_queue_time_seconds", a, None)
            hist("vllm:time_to_first_token_seconds", a + x + per_point("tpot"), TTFT_BUCKETS)
            hist("vllm:nixl_xfer_time_seconds", x, NIXL_BUCKETS)
            kv_bytes = counter(r * ISL * 34_000.0, integer=False)  # ~34 KB KV+state per token
            add(proc, engines, "vllm:nixl_bytes_transferred_count", None, count)
            add(proc, engines, "vllm:nixl_bytes_transferred_sum", None, kv_bytes)
            add(proc, engines, "vllm:nixl_num_failed_transfers_total", None,
                counter(per_point("nixl_fail_rate")[None, :] * share * np.ones((dp, 1))))
            kv = per_point("decode_kv")
            running = r * (per_point("tpot") * (OSL - 1))[None, :]
            wc = r * a[None, :]
            wd = r * x[None, :]
            waiting = wc + wd
            add(proc, engines, "vllm:num_requests_kv_fetch_by_stage",
                {"stage": "waiting_to_start"}, np.round(wd * 0.3))
            add(proc, engines, "vllm:num_requests_kv_fetch_by_stage",
                {"stage": "in_progress"}, np.round(wd * 0.6))
            add(proc, engines, "vllm:num_requests_kv_fetch_by_stage",
                {"stage": "completed_waiting"}, np.round(wd * 0.1))
            add(proc, engines, "vllm:prompt_tokens_by_source_total",
                {"source": "external_kv_transfer"}, counter(r * ISL))
            if sc.kv_store:  # vLLM names NIXL's tokens p2p (docs/kv-store.md)
                add(proc, engines, "vllm:prompt_tokens_cached_by_source_total",
                    {"source": "p2p"}, counter(r * ISL))
            add(proc, engines, "vllm:prompt_tokens_by_source_total",
                {"source": "local_compute"}, counter(r))
            add(proc, engines, "vllm:generation_tokens_total", None, counter(r * OSL))
            if sc.spec_tokens:  # each draft's tokens: the target's own + the accepted run
                pos = [sc.spec_accept ** (i + 1) for i in range(sc.spec_tokens)]
                drafts = r * OSL / (1 + sum(pos))
                add(proc, engines, "vllm:spec_decode_num_drafts_total", None, counter(drafts))
                add(proc, engines, "vllm:spec_decode_num_draft_tokens_total", None,
                    counter(drafts * sc.spec_tokens))
                add(proc, engines, "vllm:spec_decode_num_accepted_tokens_total", None,
                    counter(drafts * sum(pos)))
                for i, rate in enumerate(pos):
                    add(proc, engines, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                        {"position": str(i)}, counter(drafts * rate))
            pre = per_point("preempt_rate")[None, :] * share * _noise(rng, (dp, n_t), 0.3)
        add(proc, engines, "vllm:num_preemptions_total", None, counter(pre))
        kvm = np.clip(kv[None, :] * (skew ** 0.5) + 0.01 * rng.standard_normal((dp, n_t)),
                      0.0, 0.999)
        kvm[:, ~active] = np.clip(kvm[:, ~active] * 0.05, 0, 1)
        add(proc, engines, "vllm:kv_cache_usage_perc", None, np.round(kvm, 4))
        add(proc, engines, "vllm:num_requests_running", None, np.round(running))
        add(proc, engines, "vllm:num_requests_waiting", None, np.round(waiting))
        add(proc, engines, "vllm:num_requests_waiting_by_reason", {"reason": "capacity"},
            np.round(wc))
        add(proc, engines, "vllm:num_requests_waiting_by_reason", {"reason": "deferred"},
            np.round(wd))
        blocks = DECODE_BLOCKS if role == "decode" else 60_000
        for e in engines:
            add(proc, [e], "vllm:cache_config_info",
                {"block_size": str(BLOCK_SIZE), "cache_dtype": "fp8", "enable_prefix_caching":
                 "False", "gpu_memory_utilization": "0.9", "num_gpu_blocks": str(blocks)},
                np.ones((1, n_t)))


STORE_SHARE = (0.2, 0.3, 0.4, 0.3)  # prompt tokens a prefill found in the store, per point
STORE_KEY_BYTES = 2 << 20           # bytes of one stored block
STORE_THEORETICAL = 0.45            # the hit rate the trace offers (an unbounded cache)


def store_engine(add, proc: str, engines: list[str], r: np.ndarray, counter, pidx: np.ndarray,
                 active: np.ndarray, n_points: int) -> None:
    """A prefill with MooncakeStoreConnector: its store hits (vLLM counts them external and,
    by tier, external_unspecified), its get and put operations, and at the top point gets
    slow and some puts failing."""
    share = np.where(active, np.array(STORE_SHARE)[pidx % len(STORE_SHARE)], 0.0)
    top = active & (pidx == n_points - 1)
    hits = r * ISL * share[None, :]
    add(proc, engines, "vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"},
        counter(hits))
    add(proc, engines, "vllm:prompt_tokens_cached_by_source_total", {"source": "device"},
        counter(r * ISL * 0.02))
    add(proc, engines, "vllm:prompt_tokens_cached_by_source_total",
        {"source": "external_unspecified"}, counter(hits))
    op = "vllm:mooncake_store_operation"
    get_s = np.where(top, 0.8, 0.004)[None, :]  # seconds per get call
    put_keys = r * ISL * (1 - share[None, :]) / (BLOCK_SIZE * 64)
    for name, calls, keys, secs, failed in (
            ("load_get", r, hits / (BLOCK_SIZE * 64), r * get_s, 0 * r),
            ("save_put", r, put_keys, r * 0.01, put_keys * 0.05 * top[None, :])):
        lab = {"operation": name, "status": "ok"}
        add(proc, engines, f"{op}_total", lab, counter(calls))
        add(proc, engines, f"{op}_time_seconds_count", lab, counter(calls))
        add(proc, engines, f"{op}_time_seconds_sum", lab, counter(secs, integer=False))
        add(proc, engines, f"{op}_keys_total", lab, counter(keys))
        add(proc, engines, f"{op}_bytes_total", lab, counter(keys * STORE_KEY_BYTES))
        add(proc, engines, f"{op}_failed_keys_total", lab, counter(failed))


def master_telemetry(plan: dict, tl: Timeline, models: list[PointModel],
                     rows: dict[str, NodeRows]) -> None:
    """The mooncake_master's admin /metrics (names as the real binary exports them,
    tests/data/mooncake_master): it fills to its 0.9 watermark, evicts from then on, and at
    the top point refuses puts."""
    head = plan["nodes"][0]["name"]
    active = tl.point >= 0
    pidx = np.where(active, tl.point, 0)
    rate = np.array([m.req_rate for m in models] or [0.0])[pidx] * active
    put = np.cumsum(rate * ISL * 0.7 / (BLOCK_SIZE * 64) * STORE_KEY_BYTES
                    * np.gradient(tl.ts))
    cap = float(np.round(put[-1] / 2.5 / 2**30) * 2**30 or 2**30)  # full before the end
    alloc = np.minimum(put, 0.9 * cap)
    evicted = np.round((put - alloc) / STORE_KEY_BYTES)
    top = active & (pidx == len(models) - 1)
    refused = np.cumsum(top * rate * 0.5)
    puts = np.cumsum(rate * 4)
    alloc = np.where(top, cap, alloc)
    nr = rows[head]
    for name, m in (("master_total_capacity_bytes", np.full(len(tl.ts), cap)),
                    ("master_allocated_bytes", alloc),
                    ("master_key_count", np.round(alloc / STORE_KEY_BYTES)),
                    ("master_evicted_key_count", evicted),
                    ("master_evicted_size_bytes", evicted * STORE_KEY_BYTES),
                    ("master_successful_evictions_total", np.round(evicted / 8)),
                    ("master_attempted_evictions_total", np.round(evicted / 8 + refused)),
                    ("master_put_start_requests_total", np.round(puts)),
                    ("master_put_start_alloc_failures_total", np.round(refused))):
        nr.add("mooncake-master", [""], name, None, m[None, :])


def gpu_host_telemetry(sc: Scenario, plan: dict, tl: Timeline, models: list[PointModel],
                       rng: np.random.Generator, rows: dict[str, NodeRows]) -> None:
    """NVML-style per-GPU series (process = the process pinned to the GPU) and host series."""
    n_t = len(tl.ts)
    active = tl.point >= 0
    load = np.where(active, 0.5 + 0.5 * np.where(active, tl.point, 0) /
                    max(1, len(sc.concurrencies) - 1), 0.02)
    pinned = {}
    for p in plan["processes"]:
        for g in p.get("gpus") or []:
            pinned[(p["node"], g)] = p["name"]
    for node in plan["nodes"]:
        nr = rows[node["name"]]
        for g in range(node["gpus"]):
            proc = pinned.get((node["name"], g), "")
            lab = {"index": str(g), "uuid": f"GPU-{node['name']}-{g:02d}"}
            u = np.clip(load * 100 * _noise(rng, (n_t,), 0.05), 0, 100)
            nr.add(proc, [""], "gpu:util_pct", lab, np.round(u[None, :]))
            power = 180 + 900 * load * _noise(rng, (n_t,), 0.04)
            nr.add(proc, [""], "gpu:power_w", lab, np.round(power[None, :], 1))
            nr.add(proc, [""], "gpu:sm_clock_mhz", lab,
                   np.where(power > 1000, 1700, 1965)[None, :].astype(float))
            nr.add(proc, [""], "gpu:temp_c", lab,
                   np.round(35 + 40 * load + rng.normal(0, 0.5, n_t))[None, :])
            nr.add(proc, [""], "gpu:mem_used_bytes", lab,
                   np.full((1, n_t), 170e9 if proc else 1e9))
            # Energy since driver load (mJ), a counter: the page draws its rate (≈ power).
            nr.add(proc, [""], "gpu:energy_mj", lab,
                   np.round(5e9 + np.cumsum(power * 1000.0 * sc.interval_s))[None, :])
        cpu = np.clip(5 + 30 * load * _noise(rng, (n_t,), 0.1), 0, 100)
        nr.add("", [""], "host:cpu_util_pct", None, np.round(cpu[None, :], 1))
        nr.add("", [""], "host:mem_used_bytes", None,
               np.round(200e9 + 5e9 * load[None, :], -6))
        for d in ("recv", "sent"):
            nr.add("", [""], f"host:net_{d}_bytes", {"nic": "ib0"},
                   np.cumsum(1e8 * load * _noise(rng, (n_t,), 0.2))[None, :].round())


# --- files other than telemetry ------------------------------------------------------------


def bench_result(sc: Scenario, m: PointModel, window: tuple[float, float],
                 failed: bool) -> dict:
    """One bench file: vLLM bench-serve keys and units plus the launcher's window/status."""
    a, b = window
    dur = b - a
    completed = 0 if failed else int(m.req_rate * dur)
    res: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.gmtime(a)), "endpoint_type": "openai",
        "backend": "openai", "label": None, "model_id": MODEL, "tokenizer_id": MODEL,
        "num_prompts": max(completed, m.conc * 10), "request_rate": "inf", "burstiness": 1.0,
        "max_concurrency": m.conc, "duration": dur, "completed": completed,
        "failed": m.conc * 10 if failed else 0,
        "total_input_tokens": completed * ISL, "total_output_tokens": completed * OSL,
        "request_throughput": completed / dur, "request_goodput": None,
        "output_throughput": completed * OSL / dur,
        "total_token_throughput": completed * (ISL + OSL) / dur,
        # every request's lengths, kept by both drivers (fixed lengths in these scenarios)
        "input_lens": [ISL] * completed, "output_lens": [OSL] * completed,
        "window_start": a, "window_end": b, "driver": "builtin",
        "status": "failed" if failed else "ok",
        "failure_reason": ("every request failed: decode-0 stopped answering (HTTP 503)"
                           if failed else None),
    }
    for key, mean in (("ttft", m.ttft), ("tpot", m.tpot), ("itl", m.tpot),
                      ("e2el", m.ttft + m.tpot * (OSL - 1))):
        if failed:
            mean = 0.0
        ms = mean * 1000.0
        res[f"mean_{key}_ms"] = ms
        res[f"median_{key}_ms"] = ms * 0.92
        res[f"std_{key}_ms"] = ms * 0.3
        res[f"p90_{key}_ms"] = ms * 1.5
        res[f"p99_{key}_ms"] = ms * (2.4 if key == "ttft" else 1.3)
    return res


LOG_TS = "%m-%d %H:%M:%S"


def write_logs(rd: RunDir, sc: Scenario, plan: dict, tl: Timeline,
               models: list[PointModel], failed_at: float | None) -> None:
    rd.logs.mkdir(parents=True, exist_ok=True)
    t0 = float(tl.ts[0])
    for p in plan["processes"]:
        lines = []
        pid = 1000 + len(p["name"])
        stamp = time.strftime(LOG_TS, time.localtime(t0))
        lines.append(f"(APIServer pid={pid}) INFO {stamp} [api_server.py:100] "
                     f"started {p['name']} on {p['node']}")
        if p["kind"] == "engine" and not p["headless"]:
            for k, (a, _b) in enumerate(tl.windows[: len(models)]):
                s = time.strftime(LOG_TS, time.localtime(a + 5))
                kvp = (models[k].decode_kv if p["role"] == "decode" else models[k].prefill_kv)
                lines.append(f"(APIServer pid={pid}) INFO {s} [loggers.py:335] Engine 000: "
                             f"Avg prompt throughput: 0.0 tokens/s, Avg generation throughput:"
                             f" 100.0 tokens/s, Running: {models[k].conc} reqs, Waiting: 0 "
                             f"reqs, GPU KV cache usage: {kvp * 100:.1f}%")
            lines.append(f"(APIServer pid={pid}) WARNING {stamp} [config.py:500] "
                         "max_num_batched_tokens is below the prompt length; chunked prefill on")
        if failed_at is not None and p["name"].startswith("decode-0@"):
            s = time.strftime(LOG_TS, time.localtime(failed_at))
            lines += [f"(EngineCore_DP0 pid={pid}) ERROR {s} [core.py:700] EngineCore "
                      "encountered a fatal error.",
                      "Traceback (most recent call last):",
                      '  File "vllm/v1/engine/core.py", line 701, in run_engine_core',
                      "RuntimeError: CUDA error: an illegal memory access was encountered"]
        (rd.logs / f"{p['name']}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")


# --- scenarios -----------------------------------------------------------------------------


def write_run(root: Path, sc: Scenario, *, t0: float | None = None,
              run_id: str | None = None) -> Path:
    """Write one synthetic run directory under `root`; returns its path."""
    t0 = float(t0 if t0 is not None else 1_764_400_000.0)
    run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(t0))}-{sc.name}"
    rd = RunDir(Path(root) / run_id)
    rd.path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(sc.seed)
    plan = make_plan(run_id, sc)
    write_json(rd.plan, plan)
    tl = timeline(sc, t0)
    cmax = max(sc.concurrencies)
    models = [point_model(sc.signature, c, cmax) for c in sc.concurrencies]
    for m in models:
        m.tpot *= sc.tpot_scale
        if sc.gb200:
            gb200_speed(m, sc.topology.n_prefill * sc.topology.prefill_dp)
    n_points = len(models) if sc.fail_at_point is None else sc.fail_at_point + 1
    models = models[:n_points]
    failed_at = tl.windows[sc.fail_at_point][0] + 20 if sc.fail_at_point is not None else None

    # bench/
    rd.bench.mkdir(parents=True, exist_ok=True)
    for k, m in enumerate(models):
        fail = sc.fail_at_point is not None and k == sc.fail_at_point
        res = bench_result(sc, m, tl.windows[k], fail)
        if sc.kv_store:  # the trace's theoretical hit rate, as an agentic point records it
            res["agentic"] = {"sessions": m.conc, "trace_hit_rate": STORE_THEORETICAL,
                              "prefix_hit_rate": 0.02}
        write_json(rd.bench_result(m.conc), res)

    # telemetry/
    keyframe_every = max(1, int(KEYFRAME_S / sc.interval_s))
    end = len(tl.ts) if failed_at is None else int(np.searchsorted(tl.ts, failed_at + 30))
    tl_w = Timeline(tl.ts[:end], tl.point[:end], tl.windows)
    rows = {n["name"]: NodeRows(n["name"], tl_w, keyframe_every) for n in plan["nodes"]}
    engine_telemetry(sc, plan, tl_w, models, rng, rows)
    if sc.kv_store:
        master_telemetry(plan, tl_w, models, rows)
    gpu_host_telemetry(sc, plan, tl_w, models, rng, rows)
    from launcher.telemetry.store import write_agent_info

    for node, nr in rows.items():
        nd = rd.telemetry(node)
        nr.write(nd)
        write_agent_info(nd, {"node": node, "synthetic": True, "interval_s": sc.interval_s,
                              "notices": ["synthetic telemetry written by dashboard.synth"]})

    # events, state, accuracy, logs
    t_end = float(tl_w.ts[-1])
    stages = [("agents", t0 - 120), ("endpoints", t0 - 110), ("health", t0 - 60),
              ("router", t0 - 20), ("warmup", t0 - 10), ("sweep", t0)]
    if failed_at is None:
        stages += [("accuracy", t_end - 5), ("report", t_end - 2), ("teardown", t_end - 1)]
    with open(rd.events_file, "w", encoding="utf-8") as f:
        f.write(json.dumps({"ts": t0 - 130, "event": "run_started"}) + "\n")
        for st, ts in stages:
            f.write(json.dumps({"ts": ts, "event": "stage", "stage": st}) + "\n")
        for k, m in enumerate(models):
            a, b = tl.windows[k]
            f.write(json.dumps({"ts": a, "event": "point_started", "stage": "sweep",
                                "max_concurrency": m.conc}) + "\n")
            f.write(json.dumps({"ts": b, "event": "point_finished", "stage": "sweep",
                                "max_concurrency": m.conc}) + "\n")
        if failed_at is not None:
            f.write(json.dumps({"ts": failed_at, "event": "process_exited",
                                "process": f"decode-0@{plan['endpoints'][0]['nodes'][0]}",
                                "returncode": 1}) + "\n")
            f.write(json.dumps({"ts": failed_at + 5, "event": "run_failed",
                                "stage": "sweep"}) + "\n")
        else:
            f.write(json.dumps({"ts": t_end, "event": "run_finished"}) + "\n")
    record = RunRecord(state=State.SUCCEEDED, stage=None, started=t0 - 130, ended=t_end,
                       slurm_job_id="4242")
    if failed_at is not None:
        culprit = f"decode-0@{plan['endpoints'][0]['nodes'][0]}"
        record.state, record.ended, record.culprit = State.FAILED, failed_at + 5, culprit
        record.error = (f"{culprit} exited with code 1 during the sweep (CUDA error: an "
                        "illegal memory access)")
    elif sc.state != "succeeded":
        record.state, record.ended, record.stage = State(sc.state), None, Stage.SWEEP
    record.processes = {
        p["name"]: ProcessRecord(node=p["node"], kind=Kind(p["kind"]), started=t0 - 120,
                                 exit_code=None if record.state == State.RUNNING else 0,
                                 stopped=record.state != State.RUNNING, log=p["log"])
        for p in plan["processes"] if p["kind"] != Kind.BENCH
    }
    rd.write_record(record)
    rd.write_submission(Submission(created=t0 - 140, slurm_job_id="4242", submitted=t0 - 135))
    if failed_at is None:
        write_json(rd.accuracy / "gsm8k.json", {
            "task": "gsm8k", "accuracy": 0.893, "threshold": 0.88, "passed": True,
            "num_questions": 1319, "num_shots": 5, "invalid_rate": 0.002,
            "timestamp": t_end})
    write_logs(rd, sc, plan, tl, models, failed_at)
    return rd.path


def healthy(root: Path, **kw: Any) -> Path:
    return write_run(root, Scenario("healthy", "healthy", **kw))


def prefill_bound(root: Path, **kw: Any) -> Path:
    return write_run(root, Scenario("prefill-bound", "prefill", **kw))


def kv_capacity_bound(root: Path, **kw: Any) -> Path:
    return write_run(root, Scenario("kv-capacity-bound", "kv_capacity", **kw))


def kv_transfer_bound(root: Path, **kw: Any) -> Path:
    return write_run(root, Scenario("kv-transfer-bound", "kv_transfer", **kw))


def kv_store(root: Path, **kw: Any) -> Path:
    """A healthy P/D run whose prefills share a Mooncake store: its hits, its operations and
    its master fill, evict and, at the top point, refuse puts and serve gets slowly."""
    return write_run(root, Scenario("kv-store", "healthy", kv_store=True, **kw))


def failed(root: Path, **kw: Any) -> Path:
    return write_run(root, Scenario("failed", "healthy", fail_at_point=2, **kw))


def empty(root: Path, name: str = "20251129-000000-empty") -> Path:
    """A run directory with only its recipe (a submission that died before planning)."""
    p = Path(root) / name
    p.mkdir(parents=True, exist_ok=True)
    (p / "recipe.yaml").write_text("name: empty\n", encoding="utf-8")
    return p


LARGE_TOPOLOGY = Topology(n_prefill=20, prefill_dp=2, n_decode=2, decode_dp=16)


def large(root: Path, duration_s: float = 7200.0, **kw: Any) -> Path:
    """72 GPUs on 18 nodes: 2 decode DEP16 (4 nodes each) + 20 prefill DEP2 (2 per node),
    72 engines, 1 s sampling; 8 sweep points 64..5120 over `duration_s`; MTP with 2 draft
    tokens on the decodes."""
    kw.setdefault("spec_tokens", 2)
    sc = Scenario("large72", "kv_capacity", topology=LARGE_TOPOLOGY,
                  concurrencies=(64, 128, 256, 512, 1024, 2048, 4096, 5120),
                  duration_s=duration_s, **kw)
    return write_run(root, sc)


STUDY_PREFILL = (1, 2, 3)


def study(root: Path, prefill_endpoints: tuple[int, ...] = STUDY_PREFILL,
          duration_s: float = 300.0, name: str | None = None, decode_dp: int = 4,
          concurrencies: tuple[int, ...] | None = None, gb200: bool = False,
          recipe: str = "synthetic-study", **kw: Any) -> Path:
    """A `--sweep prefill.endpoints=1,2,3` study: a directory with study.json and one run
    per configuration, each planned by the real planner (1 decode DEP`decode_dp` + N
    prefill DEP2, 4 GPUs per node). Fewer prefill endpoints make prefill the bottleneck and
    leave decode less batched (faster TPOT); more make decode the slower side. `gb200`:
    the GB200-scale speed model instead (`gb200_speed`). Returns the study directory."""
    t0 = 1_764_500_000.0
    name = name or f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(t0))}-synthetic-study"
    sdir = Path(root) / name
    sdir.mkdir(parents=True, exist_ok=True)
    runs = []
    for k, n in enumerate(prefill_endpoints):
        sig = "prefill" if n == min(prefill_endpoints) and len(prefill_endpoints) > 1 \
            and not gb200 else "healthy"
        extra = {"concurrencies": concurrencies} if concurrencies else {}
        sc = Scenario(f"study-p{n}", sig, topology=Topology(n_prefill=n, decode_dp=decode_dp),
                      duration_s=duration_s, tpot_scale=1.0 if gb200 else 0.8 + 0.15 * k,
                      seed=k, recipe=recipe, gb200=gb200, **extra, **kw)
        start = t0 + k * (duration_s + 240.0)
        run_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(start))}-synthetic-study-p{n}"
        path = write_run(sdir, sc, t0=start, run_id=run_id)
        runs.append({"run": path.name, "values": {"prefill.endpoints": n}})
    write_json(sdir / "study.json", {"study": name, "recipe": recipe,
                                     "axes": {"prefill.endpoints": list(prefill_endpoints)},
                                     "runs": runs})
    return sdir


PUBLISHED_PREFILL = (4, 5, 6, 7, 8)
PUBLISHED_CONCURRENCY = (64, 128, 256, 512, 1024, 2048, 3072, 4096)


def published_study(root: Path, prefill_endpoints: tuple[int, ...] = PUBLISHED_PREFILL,
                    concurrencies: tuple[int, ...] = PUBLISHED_CONCURRENCY,
                    duration_s: float = 240.0, name: str | None = None) -> Path:
    """The published study's five configurations, simulated: 4..8 prefill DEP2 + 1 decode
    DEP8 (2 nodes) on 4-GPU nodes, Qwen3.5-397B-A17B-NVFP4 at ISL/OSL 8192/1024, engine sim,
    GB200-scale speeds. 5 x and 7 x DEP2 leave 2 GPUs of a prefill node idle."""
    return study(root, prefill_endpoints, duration_s=duration_s, decode_dp=8,
                 concurrencies=concurrencies, gb200=True,
                 name=name or "20251130-160000-published-seed-study",
                 recipe="qwen3.5-397b-gb200-disagg-sim")


def live(root: Path, index: int = 1, total: int = 4, **kw: Any) -> Path:
    """A healthy run that is still sweeping: run.json says running, stage sweep, with the
    orchestrator's progress (sweep point `index` of `total`, engines loaded). Advance it
    with `set_progress`."""
    path = healthy(root, **kw)
    rd = RunDir(path)
    rec = rd.read_record()
    rec.state, rec.stage, rec.ended = State.RUNNING, Stage.SWEEP, None
    for p in rec.processes.values():
        p.exit_code, p.stopped = None, False
    rd.write_record(rec)
    set_progress(path, index, total)
    return path


def set_progress(path: Path, index: int, total: int = 4, seconds_left: float | None = None,
                 loading: dict[str, float] | None = None) -> None:
    """Write run.json's progress the way the orchestrator does (RunDir.write_record)."""
    rd = RunDir(Path(path))
    rec = rd.read_record()
    conc = (8, 16, 32, 64, 128, 256, 512, 1024)
    if seconds_left is None and index > 1:
        seconds_left = 60.0 * (total - index + 1)
    rec.progress["sweep"] = {"index": index, "total": total,
                             "concurrency": conc[min(index - 1, len(conc) - 1)],
                             "started": time.time(), "seconds_left": seconds_left}
    if loading is not None:
        rec.progress["loading"] = loading
    else:
        plan = json.loads(rd.plan.read_text())
        rec.progress.setdefault("loading", {p["name"]: 1.0 for p in plan["processes"]
                                            if p["kind"] == "engine"})
    rd.write_record(rec)


_DEMO: list[Path] = []  # the local demo run of this test session (it takes ~30 s)


def local_demo(tmp_root: Path) -> Path:
    """The local demo exactly as a user runs it (`python -m launcher submit local-sim`: sim
    engines, the real router, agents, bench client, GSM8K gate), once per test session, on
    the local profile with a free port block. Returns the run directory; what the command
    printed is in `demo.out` beside `runs/`."""
    import fcntl
    import os

    if _DEMO and _DEMO[0].is_dir():
        return _DEMO[0]
    tmp = Path(tmp_root)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # basetemp/popen-gwN/NAME -> basetemp/NAME: one demo for every worker of the session
        tmp = tmp.parent.parent / tmp.name
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker runs it, the others wait and read
        if (tmp / "demo.failed").exists():
            raise RuntimeError((tmp / "demo.failed").read_text())
        if not (tmp / "demo.ok").exists():
            _run_demo(tmp)
    (run,) = [r.parent for r in (tmp / "runs").glob("*/run.json")]
    _DEMO[:] = [run]
    return run


def _run_demo(tmp: Path) -> None:
    import random
    import subprocess
    import sys

    from helpers import free_port_base, profile_copy

    bases = random.Random().sample(range(27000, 32500, 100), 55)  # apart from other runs
    profile_copy(tmp / "local-demo.yaml", "local", port_base=free_port_base(bases, 200))
    p = subprocess.run([sys.executable, "-m", "launcher", "submit", "local-sim",
                        "--set", f"cluster={tmp / 'local-demo.yaml'}",
                        "--runs-dir", str(tmp / "runs")],
                       capture_output=True, text=True, timeout=300, cwd=tmp)
    (tmp / "demo.out").write_text(p.stdout + p.stderr)  # what the user saw, for the tests
    if p.returncode != 0:
        why = f"the local demo failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
        (tmp / "demo.failed").write_text(why)
        raise RuntimeError(why)
    (tmp / "demo.ok").write_text("")


CHROMIUM = "/usr/bin/chromium"  # Debian's (tests/browser/setup.sh); never `playwright install`
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def screenshot_dir(basetemp: Path) -> Path:
    """Where the browser tests write their screenshots: $PD_SCREENSHOTS, else
    <pytest basetemp>/screenshots. Printed, so a person can look at them."""
    import os

    d = Path(os.environ.get("PD_SCREENSHOTS") or Path(basetemp) / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


SCENARIOS = {"healthy": healthy, "prefill": prefill_bound, "kv_capacity": kv_capacity_bound,
             "kv_transfer": kv_transfer_bound, "failed": failed, "empty": empty,
             "large": large, "study": study, "kv_store": kv_store}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dashboard.synth",
                                 description="Write synthetic run directories.")
    ap.add_argument("out", type=Path)
    ap.add_argument("--scenario", default="all", choices=["all", *SCENARIOS])
    ap.add_argument("--duration", type=float, default=None,
                    help="telemetry span in seconds (large: default 7200)")
    a = ap.parse_args(argv)
    names = [n for n in SCENARIOS if n != "large"] if a.scenario == "all" else [a.scenario]
    for n in names:
        t = time.perf_counter()
        kw = {"duration_s": a.duration} if a.duration and n not in ("empty",) else {}
        p = SCENARIOS[n](a.out, **kw)
        print(f"{n}: {p} ({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def in_one_allocation(root: Path, study_dir: Path) -> Path:
    """The same study as if it had run in one allocation: study.json's allocation (the plan
    of turns, largest first) and allocation.json (the allocation's record) are what the
    launcher writes; the configurations' run directories are left as they are. Moved under
    `root` with a name of its own, its runs keep their names."""
    import shutil

    from launcher.planning import study as study_plan

    dest = Path(root) / (study_dir.name + "-one")
    shutil.move(str(study_dir), dest)
    doc = json.loads((dest / "study.json").read_text())
    runs = [r["run"] for r in doc["runs"]]
    sigs = []
    for run in runs:
        plan = json.loads((dest / run / "plan.json").read_text())
        eps = sorted({p["endpoint"] for p in plan["processes"] if p.get("endpoint")})
        sigs.append((run, {ep: (ep,) for ep in eps}))
    turns = study_plan.schedule(sigs)
    doc["allocation"] = {"mode": "one", "nodes": 4, "time_minutes": 20, "port_span": 300,
                         "turns": [t.to_json() for t in turns],
                         "comparison": {"one_gpu_s": 3600.0, "each_gpu_s": 5400.0,
                                        "one_loads": len(turns[0].start),
                                        "each_loads": sum(len(w) for _, w in sigs)}}
    (dest / "study.json").write_text(json.dumps(doc))
    t0 = min(json.loads((dest / r / "run.json").read_text()).get("started") or 0 for r in runs)
    (dest / "allocation.json").write_text(json.dumps({
        "state": "succeeded", "started": t0, "ended": t0 + 900, "host": "synthetic",
        "slurm_job_id": "4242", "nodes": 4, "gpus_per_node": 4,
        "configurations": [{"run": t.run, "state": "succeeded", "turn": t.to_json()}
                           for t in turns],
        "engines": [{"event": "started", "endpoint": ep, "run": turns[0].run}
                    for ep in turns[0].start],
        "summary": {"wall_s": 900.0, "gpus": 16, "gpu_hours": 4.0,
                    "engine_starts": len(turns[0].start), "succeeded": len(turns),
                    "loading_s": 120.0, "measuring_s": 700.0}}))
    return dest
