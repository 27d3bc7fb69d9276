"""What a job reserves and about how long it holds it, before it is submitted.

The estimate is phases in sequence: preflight, loading, each sweep point's warm-up and
measured requests, the accuracy gate, teardown (docs/duration.md). A sweep point's time is
one model (`point_times`), read by the Cost line, the time-limit check, the live ETA and the
report's planned-against-measured: the published per-point figures where the recipe is the
published configuration, else the simulator's speed model for the plan's shape; each figure
says where it came from. A load round (the start, each args_from_concurrency restart) is
taken at the profile's `load_time_s` (the simulator's own start for engine sim), bounded by
health.timeout_s, the worst case said apart. A planning figure, not a measurement.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.run import engines

if TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.planning.schedulers import Partition

# Each engine kind's preflight, client and teardown times and GSM8K answer length are its
# cost table (launcher.run.engines.Costs): a sweep point's client process is its start
# (Python, the tokenizer) and its last request's tail, around the requests (the demo's
# points took ~1.5 s more than their requests).
GSM8K_TEST_QUESTIONS = 1319  # the test split, when num_questions is unset
GSM8K_SHOT_TOKENS = 150  # a 5-shot prompt is ~6 question-answer pairs of ~150 tokens
# Real vLLM on a CPU (tiny models): assumed, the simulator models GPUs (docs/vllm-cpu.md
# measured 0.2-0.37 s for 8 tokens at a quiet moment, more under load).
CPU_TTFT_S, CPU_TPOT_S = 2.0, 0.2
RESTARTS = "engine restarts"  # the phase of args_from_concurrency's restarts


@dataclass(frozen=True)
class Cost:
    nodes: int
    gpus_per_node: int
    gpus_working: int
    load_expected_s: float  # what loading is assumed to take
    load_bound_s: float  # health.timeout_s: the most it may take before the run fails
    phases: tuple[tuple[str, float], ...]  # (name, seconds) after loading
    requests: int
    tokens: int
    basis: str
    restarts: int = 0  # restart rounds in the sweep (args_from_concurrency), a load each
    restart_loads: int = 0  # endpoint starts they take (a DP endpoint counts once)
    warmups: int = 0  # of `requests`: warm-up requests, not measured
    sources: tuple[tuple[str, str], ...] = ()  # (phase, where its figure comes from)
    load_basis: str = ""  # where load_expected_s comes from
    points: tuple[PointTime, ...] = ()  # the sweep, point by point
    estimates: tuple[str, ...] = ()  # phases from figures not made for this model (firm_s)

    @property
    def gpus_allocated(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def loads(self) -> int:
        """Load rounds: the start, and a restart round each."""
        return 1 + self.restarts

    @property
    def work_s(self) -> float:
        """Everything but loading: what the request times estimate."""
        return sum(s for name, s in self.phases if name != RESTARTS)

    @property
    def expected_s(self) -> float:
        return self.load_expected_s + sum(s for _, s in self.phases)

    @property
    def worst_s(self) -> float:
        extra = self.restarts * (self.load_bound_s - self.load_expected_s)
        return self.load_bound_s + extra + sum(s for _, s in self.phases)

    @property
    def after_load_s(self) -> float:
        return sum(s for _, s in self.phases if s and _ != "preflight")

    @property
    def firm_s(self) -> float:
        """expected_s less the phases estimated by figures not made for this model (the
        simulator's default knobs for a real engine, a CPU assumption): what a time limit is
        refused on; the rest only warns."""
        return self.expected_s - sum(s for name, s in self.phases if name in self.estimates)

    def gpu_hours(self, seconds: float | None = None) -> float:
        return self.gpus_allocated * (self.expected_s if seconds is None else seconds) / 3600

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "gpus_allocated": self.gpus_allocated,
                "gpus_working": self.gpus_working, "expected_s": round(self.expected_s, 1),
                "worst_s": round(self.worst_s, 1), "load_bound_s": self.load_bound_s,
                "phases_s": {name: round(sec, 1) for name, sec in self.phases},
                "gpu_hours": round(self.gpu_hours(), 2), "requests": self.requests,
                "sweep_tokens": self.tokens, "basis": self.basis,
                "work_s": round(self.work_s, 1), "loads": self.loads,
                "load_expected_s": self.load_expected_s, "warmup_requests": self.warmups,
                "load_basis": self.load_basis, "sources": dict(self.sources),
                "points": [p.to_json() for p in self.points]}


PUBLISHED = "the published per-point figures"
SIM_DEFAULT = "the simulator's speed model (default knobs)"  # a real engine, another model
SIM_RECIPE = "the simulator's speed model (the recipe's sim knobs)"  # engine sim: the model
ASSUMED_CPU = "assumed"  # the basis of a CPU engine's request times starts with it
ASSUMED_AGENTIC = "assumed from the recipe"  # an agentic point's time: its duration
CPU_BASIS = f"{ASSUMED_CPU} TTFT {CPU_TTFT_S:g} s and TPOT {CPU_TPOT_S * 1000:g} ms on CPU"


@dataclass(frozen=True)
class PointTime:
    """One sweep point as planned: its warm-up and measured requests and how long they take."""

    concurrency: int
    requests: int  # warm-ups + measured
    seconds: float
    source: str  # PUBLISHED, SIM_RECIPE, SIM_DEFAULT or ASSUMED_CPU

    def to_json(self) -> dict:
        return {"concurrency": self.concurrency, "requests": self.requests,
                "planned_s": round(self.seconds, 1), "source": self.source}


def _knobs(plan: Plan) -> dict:
    from dataclasses import fields

    from launcher.sim.knobs import Knobs

    knobs = {f.name: f.default for f in fields(Knobs)}
    knobs.update(plan.recipe.sim.model_dump(exclude_none=True))
    return knobs


def _ranks(plan: Plan, role: str) -> int:
    return sum(ep.pool.data_parallel for ep in plan.endpoints if ep.role == role)


def _batched_tokens(plan: Plan, role: str) -> int:
    """A prefilling rank's token budget per step (--max-num-batched-tokens, vLLM's 8192
    default for online serving)."""
    from launcher.planning.plan import engine_args

    for ep in plan.endpoints:
        if ep.role == role:
            v = engine_args(plan.recipe, ep.pool).get("max-num-batched-tokens")
            try:
                return max(1, int(v))
            except (TypeError, ValueError):  # unset, or "16k": vLLM's parser judges it
                return 8192
    return 8192


def sim_batch_s(plan: Plan, n: int, concurrency: int, mean_in: float, mean_out: float,
                ctx: float) -> float:
    """`n` requests kept `concurrency` at a time, by the simulator's speed model
    (launcher/sim/engine.py: a step takes step_base_ms + running x decode_per_seq_ms +
    context/1000 x decode_per_ktoken_ms + prompt tokens x 1000 / prefill_tokens_per_s, a KV
    transfer its bytes over kv_bandwidth_gbps, all divided by `speed`) for this plan's
    shape: its prefill, decode and aggregated DP ranks."""
    if not n:
        return 0.0
    k = _knobs(plan)
    speed = k["speed"]
    prefill, decode, agg = (_ranks(plan, "prefill"), _ranks(plan, "decode"),
                            _ranks(plan, "agg"))
    serving = decode or agg or 1
    per_rank = max(1.0, concurrency / serving)
    step_s = (k["step_base_ms"] + k["decode_per_seq_ms"] * per_rank
              + k["decode_per_ktoken_ms"] * per_rank * ctx / 1000) / 1000 / speed
    if prefill:  # disaggregated: prompts on the prefill ranks, then a KV transfer
        budget = _batched_tokens(plan, "prefill")
        step_p = (k["step_base_ms"] / 1000 + budget / k["prefill_tokens_per_s"]) / speed
        prompt_tps = budget / step_p  # one prefill rank, steps full
        transfer = ((mean_in * k["kv_bytes_per_token"] + k["kv_state_bytes"])
                    / (k["kv_bandwidth_gbps"] * 1e9) + k["kv_post_ms"] / 1000) / speed
        latency = mean_in / prompt_tps + transfer + mean_out * step_s
        rate = min(concurrency / latency, prefill * prompt_tps / mean_in)
    else:  # aggregated: a rank's steps carry its prompts and its decodes
        prompt_s = mean_in / k["prefill_tokens_per_s"] / speed
        latency = prompt_s * per_rank + mean_out * step_s
        rate = concurrency / latency
    return max(math.ceil(n / concurrency) * latency, n / rate + latency)


def cpu_batch_s(n: int, concurrency: int, out_tokens: float) -> float:
    """`n` requests in waves of `concurrency`, each the assumed CPU TTFT + output x TPOT."""
    return math.ceil(n / concurrency) * (CPU_TTFT_S + out_tokens * CPU_TPOT_S) if n else 0.0


def _cpu_batch_s(plan: Plan, n: int, concurrency: int, mean_in: float, mean_out: float,
                 ctx: float) -> float:
    return cpu_batch_s(n, concurrency, mean_out)


@dataclass(frozen=True)
class Speed:
    """One way to plan request times, named by an engine kind's cost table (Costs.speed)."""

    source: str  # a point's source (PointTime.source)
    basis: str  # the sweep's basis in words
    gate: str  # the accuracy gate's source ({q}, {prompt} and {out} filled in)
    batch_s: Callable[[Plan, int, int, float, float, float], float]  # n, held, in, out, ctx


_GATE = ", {q:,} prompts of ~{prompt:,} tokens and {out} out"
SPEEDS = {
    engines.SPEED_DEFAULT: Speed(
        SIM_DEFAULT, SIM_DEFAULT + " for this shape: Qwen3.5-397B-ish per GB200 DP rank, not "
        "measured for this model; no published figures for this recipe", SIM_DEFAULT + _GATE,
        sim_batch_s),
    engines.SPEED_SIM_KNOBS: Speed(SIM_RECIPE, SIM_RECIPE, SIM_RECIPE + _GATE, sim_batch_s),
    engines.SPEED_CPU: Speed(ASSUMED_CPU, CPU_BASIS, CPU_BASIS, _cpu_batch_s),
}  # fmt: skip


def _sim_start(plan: Plan, bound: float) -> tuple[float, str]:
    return (min(bound, float(plan.recipe.sim.start_delay_s or 0) + 5),
            "the simulator's start, sim.start_delay_s + 5 s")


def _profile_load(plan: Plan, bound: float) -> tuple[float, str]:
    if plan.cluster.load_time_s:
        return min(bound, plan.cluster.load_time_s), f"{plan.cluster.name}'s load_time_s"
    return bound, f"health.timeout_s ({plan.cluster.name} states no load_time_s)"


# How long an engine start is planned to take, named by a kind's cost table (Costs.load).
LOADS = {engines.LOAD_SIM_START: _sim_start, engines.LOAD_PROFILE: _profile_load}


def _published_config(plan: Plan) -> dict | None:
    """The published configuration this plan runs (as many DEP2 prefill endpoints and the
    DEP8 decode, the published workload's model and lengths), or None."""
    from launcher.run import published

    r = plan.recipe
    w = published.reference()["workload"]
    b = r.benchmark
    model = r.model.path.lower()
    if (published.MODEL_MARK not in model or published.QUANT_MARK not in model
            or r.mode != "disagg"
            or (b.input_len, b.output_len, b.length_rule, b.range_ratio)
            != (w["input_len"], w["output_len"], w["length_rule"], w["range_ratio"])):
        return None
    pre = [ep for ep in plan.endpoints if ep.role == "prefill"]
    dec = [ep for ep in plan.endpoints if ep.role == "decode"]
    config = published.config_by_prefill(len(pre))
    if (config is None or len(dec) != config["decode_endpoints"]
            or any(ep.pool.data_parallel != config["prefill_dp"] for ep in pre)
            or any(ep.pool.data_parallel != config["decode_dp"] for ep in dec)):
        return None
    return config


def published_rate(config: dict, concurrency: int) -> float:
    """Total tok/s per working GPU at `concurrency`: the published point, linear between
    two, the nearest end outside them."""
    pts = sorted((p["concurrency"], p["total_tokens_per_s_per_gpu"]) for p in config["points"])
    if concurrency <= pts[0][0]:
        return pts[0][1]
    for (c0, y0), (c1, y1) in zip(pts, pts[1:], strict=False):  # neighbours
        if concurrency <= c1:
            return y0 + (y1 - y0) * (concurrency - c0) / (c1 - c0)
    return pts[-1][1]


def point_times(plan: Plan) -> tuple[list[PointTime], str]:
    """Each sweep point's planned time (warm-ups and measured requests), and where the figures
    come from in words. The one model of a point's time: the cost, the time-limit check, the
    live ETA and the report's planned-against-measured all read it."""
    r = plan.recipe
    b = r.benchmark
    if not b.sweeps:  # no sweep, or a custom command in its place (its time is its own)
        return [], ""
    if b.agentic is not None:
        return agentic_point_times(plan)
    n = b.lengths()
    costs = r.engine_kind.costs
    speed = SPEEDS[costs.speed]
    config = _published_config(plan) if costs.published else None
    room = kv_room(plan)
    out = []
    for c in b.points:
        reqs = b.warmups(c) + b.prompts(c)
        if config is not None:  # measured at this concurrency: KV waits included
            tps = published_rate(config, c) * plan.gpu_count()["total"]
            out.append(PointTime(c, reqs, costs.client_s + reqs * n.mean_total / tps,
                                 PUBLISHED))
            continue
        held = min(c, room) if room else c  # the rest wait for KV (or a slot)
        s = speed.batch_s(plan, reqs, held, n.mean_input, n.mean_output, n.in_flight_mean)
        out.append(PointTime(c, reqs, costs.client_s + s, speed.source))
    if config is not None:
        basis = (f"{PUBLISHED} ({config['name']}'s total tok/s per working GPU at each "
                 f"concurrency, launcher/data/published_pareto_qwen35_gb200.json, linear "
                 f"between its points, x {plan.gpu_count()['total']} working GPUs)")
    else:
        basis = speed.basis
    if room and max(b.points) > room and config is None:
        basis += (f"; at most {room:,} requests run at once on the decode side (its KV "
                  "estimate and max-num-seqs)")
    return out, basis


AGENTIC_START_S = 30.0  # AIPerf's start (dataset load, workers) and the drain after a point
AGENTIC_ONCE_S = 600.0  # a trace played once: its length is its sessions', unknown here


def agentic_point_times(plan: Plan) -> tuple[list[PointTime], str]:
    """An agentic point lasts its duration_s plus AIPerf's start and the drain; a trace
    played once is assumed AGENTIC_ONCE_S (its recorded think times decide)."""
    ag = plan.recipe.benchmark.agentic
    length = ag.duration_s or AGENTIC_ONCE_S
    out = [PointTime(c, ag.warmup_requests, length + AGENTIC_START_S, ASSUMED_AGENTIC)
           for c in plan.recipe.benchmark.concurrency]
    basis = (f"{ASSUMED_AGENTIC}: benchmark.agentic.duration_s {ag.duration_s:g} s a point"
             if ag.duration_s else f"{ASSUMED_AGENTIC}: {AGENTIC_ONCE_S:g} s a point for a "
             "trace played once (set benchmark.agentic.duration_s to bound it)")
    return out, basis + f" + {AGENTIC_START_S:g} s for AIPerf's start and the drain"


def kv_room(plan: Plan) -> int | None:
    """Requests the decode side runs at once by the KV estimate of the model being run
    (max-num-seqs included); None without an estimate for every decode endpoint."""
    if plan.model is None:
        return None
    from launcher.planning import capacity

    caps = capacity.estimates(plan)
    if not caps or capacity.missing(plan, caps):
        return None
    return sum(c.endpoint_at_mean_length for c in caps) or None


def _lines(path: str | None) -> int:
    """Questions in a GSM8K jsonl readable here (0 when it is not: the test split is assumed)."""
    try:
        if not path or not os.path.isfile(path):  # a FIFO or /dev/zero would never end
            return 0
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except (OSError, ValueError):
        return 0


def estimate(plan: Plan) -> Cost:
    r = plan.recipe
    b, a = r.benchmark, r.accuracy
    costs = r.engine_kind.costs
    phases: list[tuple[str, float]] = [("preflight", costs.preflight_s)]
    sources: list[tuple[str, str]] = []
    requests = tokens = 0
    points, basis = point_times(plan)
    if points:
        phases.append(("sweep", sum(p.seconds for p in points)))
        sources.append(("sweep", basis))
        requests = sum(p.requests for p in points)
        tokens = 0 if b.agentic else round(requests * b.lengths().mean_total)
    if r.hold_s:
        phases.append(("hold", float(r.hold_s)))
    if a.enabled:
        q = (a.num_questions or _lines(a.data) or GSM8K_TEST_QUESTIONS) * a.repeat
        out = min(a.max_tokens, costs.gsm8k_answer_tokens)
        prompt = GSM8K_SHOT_TOKENS * (a.num_shots + 1)
        room = kv_room(plan)
        held = min(a.concurrency, room) if room else a.concurrency
        speed = SPEEDS[costs.speed]
        gate = speed.batch_s(plan, q, held, prompt, out, prompt + out / 2)
        sources.append(("accuracy gate", speed.gate.format(q=q, prompt=prompt, out=out)))
        phases.append(("accuracy gate", gate))
        requests += q
    warmups = sum(p.requests - (0 if b.agentic else b.prompts(p.concurrency))
                  for p in points)
    bound = r.health.timeout_s
    load, load_basis = LOADS[costs.load](plan, bound)
    restarts = len(r.restart_points())  # none without a sweep
    restart_loads = sum(pool.endpoints for c in r.restart_points() for _, pool in r.pools()
                        if c in pool.args_from_concurrency)
    if restarts:  # a load of the restarted engines each (the others stay loaded meanwhile)
        phases.append((RESTARTS, restarts * load))
    phases.append(("teardown", costs.teardown_s))
    return Cost(
        nodes=len(plan.nodes), gpus_per_node=plan.cluster.gpus_per_node,
        gpus_working=plan.gpu_count()["total"], load_expected_s=load, load_bound_s=bound,
        phases=tuple(phases), requests=requests, tokens=tokens, basis=basis,
        restarts=restarts, restart_loads=restart_loads, warmups=warmups,
        sources=tuple(sources), load_basis=load_basis, points=tuple(points),
        estimates=tuple(name for name, src in sources
                        if not src.startswith((PUBLISHED, SIM_RECIPE))),
    )  # fmt: skip


def partition_blockers(plan: Plan, nodes: int, part: Partition | None) -> list[str]:
    """Why the partition would not start a job of its own for this run (its time limit or
    node count past the partition's limits); none where no limits are known."""
    s = plan.recipe.slurm
    if part is None:  # no limits known (none asked, or no scheduler to hold it to any)
        return []
    out = []
    if part.max_minutes is not None and s.minutes > part.max_minutes:
        out.append(
            f"slurm.time_limit {s.time_limit} ({duration(s.minutes * 60)}, "
            f"{s.minutes} min) is longer than partition {part.name}'s MaxTime of "
            f"{duration(part.max_minutes * 60)} ({part.max_minutes} min) (scontrol "
            "show partition): Slurm would not start it; lower slurm.time_limit or name "
            "another slurm.partition")
    if part.max_nodes is not None and nodes > part.max_nodes:
        out.append(
            f"the run needs {nodes} nodes, more than partition {part.name}'s MaxNodes "
            f"of {part.max_nodes} (scontrol show partition): name another "
            "slurm.partition or plan fewer endpoints")
    return out


def duration(seconds: float) -> str:
    """'1 h 05 min', '12 min', '40 s'."""
    s = int(round(seconds))
    if seconds < 1:
        return "<1 s"
    if s < 60:
        return f"{s} s"
    m = math.ceil(s / 60)
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min"


def text(cost: Cost, load_s: float | None = None) -> str:
    """One line for the dry-run; `load_s`: what one load is taken to be (a study's
    assumption, said on its own line), else the estimate's (its basis said here)."""
    idle = cost.gpus_allocated - cost.gpus_working
    why = "the start" + (f" and {cost.restarts} restart{'s' * (cost.restarts > 1)}, "
                         "args_from_concurrency" if cost.restarts else "")
    return (f"Cost: {_nodes(cost.nodes)}, {cost.gpus_allocated} GPUs allocated, "
            f"{cost.gpus_working} working" + (f" ({idle} idle)" if idle else "") + "; "
            + spend([(cost.work_s, cost.loads, cost.gpus_allocated)],
                    cost.load_expected_s if load_s is None else load_s, cost.load_bound_s,
                    detail(cost), why, cost.load_basis if load_s is None else "")
            + "; " + requests_text(cost))


def _nodes(n: int) -> str:
    return f"{n} node" + "s" * (n != 1)


def detail(cost: Cost, teardown: bool = True) -> str:
    """The phases after loading and where each estimated figure comes from."""
    parts = ", ".join(f"{name} {duration(s)}" for name, s in cost.phases
                      if s and name != RESTARTS and (teardown or name != "teardown"))
    whence = "; ".join(f"{name} from {src}" for name, src in cost.sources)
    return f"{parts}; {whence or 'no request'}"


def _phases(cost: Cost) -> str:
    """'sweep 1 h 06 min from the published per-point figures, ...': short, for a refusal."""
    short = {name: next((x for x in (PUBLISHED, SIM_RECIPE, SIM_DEFAULT) if src.startswith(x)),
                        "an assumption") for name, src in cost.sources}
    return ", ".join(f"{name} {duration(s)}" + (f" from {short[name]}" if name in short else "")
                     for name, s in cost.phases if s and name != RESTARTS)


def points_text(cost: Cost) -> str:
    """'Sweep as planned: c=64 1m55s, ...; from ...': each point's planned time."""
    if not cost.points:
        return ""
    return ("Sweep as planned (warm-up and measured requests per point): "
            + ", ".join(f"c={p.concurrency} {clock(p.seconds)}" for p in cost.points)
            + f"; from {cost.basis}")


def clock(seconds: float) -> str:
    """'1m55s', '1h05m', '12s'."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def requests_text(cost: Cost) -> str:
    warm = f" ({cost.warmups:,} of them warm-up, not measured)" if cost.warmups else ""
    return f"{cost.requests:,} requests{warm}, {_tokens(cost.tokens)} sweep tokens"


def spend(shares: list[tuple[float, int, int]], load_s: float, bound_s: float,
          detail: str = "", why: str = "", load_basis: str = "") -> str:
    """What is estimated and what is only bounded, for `shares` of (work seconds, load
    rounds, GPUs allocated) one after another: the work (requests, checks, teardown), then
    the load rounds, each at most `bound_s` (health.timeout_s: the run fails past it) and
    taken as `load_s` (from `load_basis`, when given). A load known only by its bound is not
    added to the estimate."""
    work = sum(w for w, _, _ in shares)
    loads = sum(n for _, n, _ in shares)
    most = work + loads * bound_s
    hours = lambda load: f"{sum(g * (w + n * load) for w, n, g in shares) / 3600:,.1f}"  # noqa: E731
    what = f"{loads} load round{'s' * (loads != 1)}" + (f" ({why})" if why else "")
    more = f" ({detail})" if detail else ""
    if not loads:
        return (f"about {duration(work)} of work{more}, no load round: {hours(0)} GPU-hours "
                f"of work, at most {hours(0)} GPU-hours")
    if load_s >= bound_s:
        return (f"about {duration(work)} of work{more} and loading up to {duration(bound_s)} "
                f"(health.timeout_s) for {'each of ' * (loads > 1)}{what}, so at most "
                f"{duration(most)}: "
                f"{hours(0)} GPU-hours of work, at most {hours(bound_s)} GPU-hours")
    whence = f" ({load_basis})" if load_basis else ""
    loading = (f"loading ~{duration(load_s)}{whence}" if loads == 1 else
               f"loading ~{duration(load_s)}{whence} each for {what}")
    return (f"about {duration(work + loads * load_s)} ({loading}" + (f"; {detail}" if detail
                                                                     else "")
            + f"), at most {duration(most)} if each load takes its health.timeout_s "
            f"({duration(bound_s)}): about {hours(load_s)} GPU-hours, at most {hours(bound_s)} "
            "GPU-hours")


def _tokens(n: int) -> str:
    return f"{n / 1e6:,.1f} M" if n >= 1e6 else f"{n / 1e3:,.0f} k" if n >= 1e3 else str(n)


def time_limit_problems(plan: Plan, cost: Cost) -> tuple[str | None, str | None]:
    """(refusal, warning) for the recipe's time limit, by the same figures as the Cost line.
    Refused when the work and every load round at the stated load time do not fit, counting
    only figures made for this model (published, or the simulator running it); warned when
    the rest (the simulator's default knobs for a real engine, a CPU assumption) tips it
    over, and when it fits but every load at its health timeout (the worst case) would not."""
    from launcher.planning import schedulers

    limit = schedulers.of(plan.cluster).time_limit_s(plan.recipe)
    if limit is None:  # nothing will end the run before it ends
        return None, None
    s = plan.recipe.slurm
    room = limit - s.signal_lead_s
    loads = cost.loads * cost.load_expected_s
    rounds = (f"{cost.loads} load round{'s' * (cost.loads > 1)} at "
              f"{duration(cost.load_expected_s)}{' each' * (cost.loads > 1)} "
              f"({cost.load_basis})")
    lead = f"and the launcher stops {s.signal_lead_s} s before the limit"
    need = math.ceil((cost.expected_s + s.signal_lead_s) / 60)
    why = (f"{duration(cost.work_s)} of work ({_phases(cost)}) and {rounds}, "
           f"{duration(cost.work_s + loads)} in all, {lead}: about {need} minutes are needed")
    if room < cost.firm_s:
        return (f"slurm.time_limit {s.time_limit} ({duration(limit)}) cannot fit this run: "
                f"{why}; raise slurm.time_limit, measure fewer points, or set the profile's "
                "load_time_s if engines load faster here"), None
    if room < cost.expected_s:
        return None, (f"slurm.time_limit {s.time_limit} ({duration(limit)}) may not fit this "
                      f"run: {why} ({', '.join(cost.estimates)} by figures not measured for "
                      "this model: a guess, so not refused)")
    if room < cost.worst_s:
        need = math.ceil((cost.worst_s + s.signal_lead_s) / 60)
        return None, (f"slurm.time_limit {s.time_limit} ({duration(limit)}) fits the work "
                      f"({duration(cost.work_s)}) and {rounds}, but not the worst case: "
                      f"each load at its health.timeout_s ({duration(cost.load_bound_s)}) "
                      f"makes {duration(cost.worst_s)}, {lead}; a slow load ends the job "
                      f"before the sweep ends ({need} minutes would cover it)")
    return None, None
