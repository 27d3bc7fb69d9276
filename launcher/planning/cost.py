"""What a job reserves and about how long it holds it, before it is submitted.

The estimate is phases in sequence: preflight, loading (bounded by the health timeout), each
sweep point's warm-up and measured requests, the accuracy gate, teardown. A request's time
is TTFT + output tokens x TPOT; where those come from is said in ``basis``: the simulator's
own speed model (engine sim), the published Pareto's tokens/s/user (the published workload),
or an assumption stated in the text (anything else). It is a planning figure, not a
measurement: its use is catching a time limit that cannot fit and showing GPU-hours.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.planning.plan import Plan

PREFLIGHT_S = {"sim": 2.0, "vllm": 60.0}
TEARDOWN_S = {"sim": 5.0, "vllm": 30.0}
GSM8K_TEST_QUESTIONS = 1319  # the test split, when num_questions is unset
GSM8K_ANSWER_TOKENS = {"vllm": 200, "sim": 20}  # a model's 5-shot answer: ~100-250 tokens;
# the simulator's is the key's "... #### N"
# Assumed where nothing better is known: a busy GPU decode step and a long prompt's prefill.
ASSUMED_TPOT_S = {"gpu": 0.025, "cpu": 0.2}
ASSUMED_TTFT_S = {"gpu": 1.5, "cpu": 2.0}
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
    # each sweep point: (concurrency, its seconds: its client's run, warm-up and measured
    # requests, the window the point is measured in)
    points: tuple[tuple[int, float], ...] = ()

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
                "load_expected_s": self.load_expected_s, "warmup_requests": self.warmups}


def _sim_times(plan: Plan, concurrency: int) -> tuple[float, float]:
    """(TTFT s, TPOT s) from the simulator's speed model for one decode rank's share."""
    from dataclasses import fields

    from launcher.sim.knobs import Knobs

    knobs = {f.name: f.default for f in fields(Knobs)}
    knobs.update(plan.recipe.sim.model_dump(exclude_none=True))
    r = plan.recipe
    ranks = sum(ep.pool.data_parallel for ep in plan.endpoints if ep.role != "prefill") or 1
    per_rank = max(1.0, concurrency / ranks)
    b = r.benchmark
    n = b.lengths()  # the rule's lengths: the context a running request holds on average
    ctx = n.in_flight_mean
    tpot_ms = (knobs["step_base_ms"] + knobs["decode_per_seq_ms"] * per_rank
               + knobs["decode_per_ktoken_ms"] * per_rank * ctx / 1000)
    prefill_ranks = sum(ep.pool.data_parallel for ep in plan.endpoints
                        if ep.role != "decode") or 1
    arrivals = max(1.0, concurrency / prefill_ranks)
    ttft = n.mean_input / knobs["prefill_tokens_per_s"] * min(arrivals, 4)
    speed = knobs["speed"]
    return ttft / speed, tpot_ms / 1000 / speed


def _published_tpot(plan: Plan, concurrency: int) -> float | None:
    """1 / the published tokens/s/user at the nearest concurrency, for the published
    workload's model and lengths (the configuration with as many prefill endpoints, else the
    nearest)."""
    from launcher.run import published

    r = plan.recipe
    model = r.model.path.lower()
    w = published.reference()["workload"]
    if published.MODEL_MARK not in model or (r.benchmark.input_len, r.benchmark.output_len) != (
            w["input_len"], w["output_len"]):
        return None
    n = sum(1 for ep in plan.endpoints if ep.role == "prefill")
    configs = published.configurations()
    config = min(configs, key=lambda c: abs(c["prefill_endpoints"] - n))
    point = min(config["points"], key=lambda p: abs(p["concurrency"] - concurrency))
    return 1.0 / point["tokens_per_s_per_user"]


def _times(plan: Plan, concurrency: int) -> tuple[float, float, str]:
    r = plan.recipe
    if r.engine_kind.simulated:
        return (*_sim_times(plan, concurrency), "the simulator's speed model")
    tpot = _published_tpot(plan, concurrency)
    if tpot is not None:
        return ASSUMED_TTFT_S["gpu"], tpot, "the published Pareto's tokens/s/user"
    p = r.engine_platform
    return (ASSUMED_TTFT_S[p], ASSUMED_TPOT_S[p],
            f"assumed TTFT {ASSUMED_TTFT_S[p]:g} s and TPOT {ASSUMED_TPOT_S[p] * 1000:g} ms")


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


def _batch_s(n: int, concurrency: int, ttft: float, tpot: float, out_tokens: float) -> float:
    """n requests kept `concurrency` at a time."""
    return math.ceil(n / concurrency) * (ttft + out_tokens * tpot) if n else 0.0


def estimate(plan: Plan) -> Cost:
    r = plan.recipe
    b, a = r.benchmark, r.accuracy
    phases: list[tuple[str, float]] = [("preflight", PREFLIGHT_S[r.engine])]
    requests = tokens = 0
    basis = ""
    points: list[tuple[int, float]] = []
    if b.enabled:
        sweep = 0.0
        room = kv_room(plan)
        for c in b.concurrency:
            held = min(c, room) if room else c  # the rest wait for KV (or a slot)
            ttft, tpot, basis = _times(plan, held)
            n = b.warmups(c) + b.prompts(c)
            took = _batch_s(n, held, ttft, tpot, b.lengths().mean_output)
            points.append((c, took))
            sweep += took
            requests += n
            tokens += round(n * b.lengths().mean_total)
        if room and max(b.concurrency) > room:
            basis += (f"; at most {room:,} requests run at once on the decode side (its KV "
                      "estimate and max-num-seqs)")
        phases.append(("sweep", sweep))
    if r.hold_s:
        phases.append(("hold", float(r.hold_s)))
    if a.enabled:
        q = (a.num_questions or _lines(a.data) or GSM8K_TEST_QUESTIONS) * a.repeat
        ttft, tpot, basis2 = _times(plan, a.concurrency)
        basis = basis or basis2
        out = min(a.max_tokens, GSM8K_ANSWER_TOKENS[r.engine])
        phases.append(("accuracy gate", _batch_s(q, a.concurrency, ttft, tpot, out)))
        requests += q
    warmups = sum(b.warmups(c) for c in b.concurrency) if b.enabled else 0
    bound = r.health.timeout_s
    load = (min(bound, float(r.sim.start_delay_s or 0) + 5) if r.engine_kind.simulated
            else bound)
    restarts = len(r.restart_points())  # none without a sweep
    restart_loads = sum(pool.endpoints for c in r.restart_points() for _, pool in r.pools()
                        if c in pool.args_from_concurrency)
    if restarts:  # a load of the restarted engines each (the others stay loaded meanwhile)
        phases.append((RESTARTS, restarts * load))
    phases.append(("teardown", TEARDOWN_S[r.engine]))
    return Cost(
        nodes=len(plan.nodes), gpus_per_node=plan.cluster.gpus_per_node,
        gpus_working=plan.gpu_count()["total"], load_expected_s=load, load_bound_s=bound,
        phases=tuple(phases), requests=requests, tokens=tokens, basis=basis,
        restarts=restarts, restart_loads=restart_loads, warmups=warmups, points=tuple(points),
    )  # fmt: skip


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
    assumption), else the estimate's."""
    idle = cost.gpus_allocated - cost.gpus_working
    why = "the start" + (f" and {cost.restarts} restart{'s' * (cost.restarts > 1)}, "
                         "args_from_concurrency" if cost.restarts else "")
    return (f"Cost: {_nodes(cost.nodes)}, {cost.gpus_allocated} GPUs allocated, "
            f"{cost.gpus_working} working" + (f" ({idle} idle)" if idle else "") + "; "
            + spend([(cost.work_s, cost.loads, cost.gpus_allocated)],
                    cost.load_expected_s if load_s is None else load_s, cost.load_bound_s,
                    detail(cost), why)
            + "; " + requests_text(cost))


def _nodes(n: int) -> str:
    return f"{n} node" + "s" * (n != 1)


def detail(cost: Cost, teardown: bool = True) -> str:
    """The phases after loading and where the request times come from."""
    parts = ", ".join(f"{name} {duration(s)}" for name, s in cost.phases
                      if s and name != RESTARTS and (teardown or name != "teardown"))
    return f"{parts}; per request from {cost.basis or 'no request'}"


def requests_text(cost: Cost) -> str:
    warm = f" ({cost.warmups:,} of them warm-up, not measured)" if cost.warmups else ""
    return f"{cost.requests:,} requests{warm}, {_tokens(cost.tokens)} sweep tokens"


def spend(shares: list[tuple[float, int, int]], load_s: float, bound_s: float,
          detail: str = "", why: str = "") -> str:
    """What is estimated and what is only bounded, for `shares` of (work seconds, load
    rounds, GPUs allocated) one after another: the work (requests, checks, teardown), then
    the load rounds, each at most `bound_s` (health.timeout_s: the run fails past it) and
    taken as `load_s`. A load known only by its bound is not added to the estimate."""
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
    loading = (f"loading ~{duration(load_s)}" if loads == 1 else
               f"loading ~{duration(load_s)} each for {what}")
    return (f"about {duration(work + loads * load_s)} ({loading}" + (f"; {detail}" if detail
                                                                     else "")
            + f"), at most {duration(most)} if each load takes its health.timeout_s "
            f"({duration(bound_s)}): about {hours(load_s)} GPU-hours, at most {hours(bound_s)} "
            "GPU-hours")


def _tokens(n: int) -> str:
    return f"{n / 1e6:,.1f} M" if n >= 1e6 else f"{n / 1e3:,.0f} k" if n >= 1e3 else str(n)


def time_limit_problems(plan: Plan, cost: Cost) -> tuple[str | None, str | None]:
    """(refusal, warning) for the recipe's time limit. Refused when the run cannot fit even
    with an instant load (by the simulator's model or the published figures); warned when a
    load as long as the health timeout would not fit, or when the request times are assumed."""
    from launcher.planning import schedulers

    limit = schedulers.of(plan.cluster).time_limit_s(plan.recipe)
    if limit is None:  # nothing will end the run before it ends
        return None, None
    s = plan.recipe.slurm
    room = limit - s.signal_lead_s
    least = sum(sec for _, sec in cost.phases)
    need = math.ceil((least + cost.load_bound_s + s.signal_lead_s) / 60)
    if room < least:
        why = (f"slurm.time_limit {s.time_limit} ({duration(limit)}) cannot fit this run: "
               f"preflight, sweep and gate take about {duration(least)} (from {cost.basis}) "
               f"before any loading, and the launcher stops {s.signal_lead_s} s before the "
               f"limit; with loading up to health.timeout_s that is {need} minutes: raise "
               "slurm.time_limit or measure fewer points")
        return (None, why) if cost.basis.startswith("assumed") else (why, None)
    if room < cost.worst_s:
        return None, (f"slurm.time_limit {s.time_limit} ({duration(limit)}) leaves "
                      f"{duration(room - least)} for loading, less than health.timeout_s "
                      f"({duration(cost.load_bound_s)}): a slow load ends the job before "
                      f"the sweep ({need} minutes would cover it)")
    return None, None
