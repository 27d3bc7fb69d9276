"""A study in one allocation (pure): which engines each configuration starts, keeps or
restarts, the order that starts the fewest, and what one allocation costs against one job
per configuration.

Every configuration is planned on the same nodes and ports (decode endpoints are placed
first, so a configuration with fewer prefill endpoints is the first nodes of a larger one).
An endpoint is the same engine in two configurations when each of its parts has the same
node, GPUs, argv and environment, the run directory aside: then it is started once and kept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from launcher.planning.cost import duration
from launcher.planning.plan import VLLM_PORT_SPAN
from launcher.run.vocab import Kind

if TYPE_CHECKING:
    from launcher.planning.cost import Cost
    from launcher.run.plandoc import Process

RUN_DIR = "{run_dir}"


STORE_CONFIG_ENV = "MOONCAKE_CONFIG_PATH"


def signatures(procs: list[Process], run_dir: str, at: int | None = None) -> dict[str, tuple]:
    """endpoint -> what makes it the same engine: each part's node, GPUs, argv and env, with
    the run directory written as {run_dir}; `at`: as it runs at that sweep concurrency
    (args_from_concurrency), else as it starts."""
    def neutral(text: str) -> str:
        return text.replace(run_dir, RUN_DIR)

    out: dict[str, list] = {}
    for p in procs:
        if p.kind != Kind.ENGINE or p.endpoint is None:
            continue
        # an engine sharing a KV store is its configuration's, as the store's master is:
        # its store config's path keeps the run directory (docs/kv-store.md)
        env = tuple(sorted((k, v if k == STORE_CONFIG_ENV else neutral(v))
                           for k, v in p.env.items() if k != "PD_RUN_DIR"))
        out.setdefault(p.endpoint, []).append(
            (p.name, p.node, tuple(p.gpus),
             tuple(neutral(a) for a in (p.argv if at is None else p.argv_at(at))), env))
    return {ep: tuple(sorted(parts)) for ep, parts in out.items()}


@dataclass(frozen=True)
class Turn:
    """One visit of a configuration in the allocation: the engines it finds and the sweep
    points it measures on them. A configuration whose points need other engine settings
    (args_from_concurrency) is visited once per setting, so every setting is loaded once
    for the whole study."""

    run: str  # its run id
    start: tuple[str, ...]  # endpoints not running before: started
    restart: tuple[str, ...]  # running with another command line: stopped and started
    keep: tuple[str, ...]  # running and loaded: used as they are
    idle: tuple[str, ...]  # running, not used by this configuration: left loaded
    # running, not used, and holding GPUs or ports this configuration needs: stopped
    stop: tuple[str, ...] = ()
    points: tuple[int, ...] = ()  # the sweep concurrencies measured here; (): its whole sweep
    first: bool = True  # the configuration's first visit: its preflight
    last: bool = True  # its last visit: its gate's verdict, its summary
    # the configurations whose accuracy gate this visit runs, on the engines it holds: each
    # one's engines at its top point are among them, as loaded here (once per engine set)
    gate: tuple[str, ...] = ()

    @property
    def loads(self) -> int:
        return len(self.start) + len(self.restart)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Turn:
        return cls(run=str(d["run"]), first=bool(d.get("first", True)),
                   last=bool(d.get("last", True)),
                   points=tuple(int(c) for c in d.get("points") or ()),
                   **{k: tuple(d.get(k) or ()) for k in ("start", "restart", "keep", "idle",
                                                         "stop", "gate")})


# Ports an engine's part holds on its node: its flags' and, from a base, its environment's
# ranges (vLLM's internal ports from VLLM_PORT; a NIXL side channel per DP rank: the base
# plus the rank, for the part's own ranks).
PORT_FLAGS = ("--port", "--data-parallel-rpc-port", "--master-port")


def _flag(argv: tuple, name: str, default: int) -> int:
    try:
        return int(argv[argv.index(name) + 1])
    except (ValueError, IndexError):
        return default


def holds(signature: tuple, one_host: bool = False) -> set[tuple[str, str]]:
    """(node, "GPU n") and (address, "port n") of every GPU and port an engine's parts hold.
    Ports by the node's address (its NIXL side-channel host), or by none with `one_host`:
    nodes that are one host (the local profile, the dev cluster) share their ports."""
    out: set[tuple[str, str]] = set()
    for part in signature:
        if not (isinstance(part, tuple) and len(part) == 5):
            continue  # a signature that names no parts holds nothing known
        _name, node, gpus, argv, env = part
        e = dict(env)
        host = "" if one_host else e.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or node
        out |= {(node, f"GPU {g}") for g in gpus}
        out |= {(host, f"port {argv[i + 1]}") for i, a in enumerate(argv[:-1])
                if a in PORT_FLAGS}
        if str(e.get("VLLM_PORT", "")).isdigit():
            out |= {(host, f"port {int(e['VLLM_PORT']) + k}") for k in range(VLLM_PORT_SPAN)}
        if str(e.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "")).isdigit():
            first = _flag(argv, "--data-parallel-start-rank", 0)
            local = _flag(argv, "--data-parallel-size-local", 1)
            base = int(e["VLLM_NIXL_SIDE_CHANNEL_PORT"])
            out |= {(host, f"port {base + r}") for r in range(first, first + local)}
    return out


def in_the_way(signature: tuple, wanted: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """What an engine this configuration does not use holds of what it needs: its GPUs or
    ports (configurations of other shapes place other endpoints there). Such an engine is
    stopped, not left loaded."""
    return sorted(wanted & holds(signature))


def same_engine(want: tuple | None, running: tuple | None) -> bool:
    """The one rule for "is this the same engine?", asked by the plan of turns, the pool
    between configurations and the restart before a sweep point: the same signature (every
    part's node, GPUs, command line and environment)."""
    return want is not None and want == running


def changed(want: dict[str, tuple], running: dict[str, tuple]) -> list[str]:
    """The endpoints that run now but not as wanted: stopped and started again."""
    return sorted(ep for ep in want if ep in running and not same_engine(want[ep], running[ep]))


def _turn(run: str, want: dict[str, tuple], running: dict[str, tuple],
          one_host: bool = False, **visit) -> Turn:
    wanted = {h for sig in want.values() for h in holds(sig, one_host)}
    unused = [ep for ep in running if ep not in want]
    stop = tuple(sorted(ep for ep in unused
                        if wanted & holds(running[ep], one_host)))
    return Turn(
        run=run,
        start=tuple(sorted(ep for ep in want if ep not in running)),
        restart=tuple(changed(want, running)),
        keep=tuple(sorted(ep for ep in want if same_engine(want[ep], running.get(ep)))),
        idle=tuple(sorted(ep for ep in unused if ep not in stop)),
        stop=stop, **visit,
    )


Segment = tuple[tuple[int, ...], dict[str, tuple]]  # sweep points, the engines they run on


def segments(points: list[int], at) -> list[Segment]:
    """A configuration's sweep points grouped by the engines they need (`at(c)`: endpoint ->
    signature at concurrency c), in sweep order: one group per engine setting."""
    out: list[tuple[list[int], dict]] = []
    for c in points:
        sig = at(c)
        same = next((g for g in out if g[1] == sig), None)
        if same is None:
            out.append(([c], sig))
        else:
            same[0].append(c)
    return [(tuple(cs), sig) for cs, sig in out]


def schedule(configs: list[tuple[str, dict[str, tuple] | list[Segment]]],
             one_host: bool = False, gates: dict[str, object] | None = None) -> list[Turn]:
    """An order of visits and what each finds. A configuration is its engines (a dict: one
    visit for its whole sweep) or its sweep's segments, one per engine setting the points
    need (`segments`); its points may be measured in several visits.

    The configuration with the most endpoints goes first: every engine it uses loads at
    once, in one load round rather than one per configuration, and its preflight covers
    every node of the allocation. Then, greedily over every segment left, the one that
    restarts the fewest engines from what runs now, then starts the fewest (where it
    restarts some, the one with the most endpoints: its gate can cover the others; the
    given order breaking ties): every configuration's points that need the same engines
    run together, so each engine setting is loaded once for the study.

    `gates`: run -> what its accuracy gate asks (None: no gate); a gate runs once per engine
    set, in the first visit that holds a configuration's top-point engines as they are (the
    same gate settings), recorded for every configuration it covers. Without `gates` each
    configuration runs its own gate in its last visit."""
    todo = [(run, list(segs) if isinstance(segs, list) else [((), segs)])
            for run, segs in configs]
    order = {run: i for i, (run, _) in enumerate(todo)}
    count = {run: len(segs) for run, segs in todo}
    left = {run: list(enumerate(segs)) for run, segs in todo}
    running: dict[str, tuple] = {}
    turns: list[Turn] = []
    wants: list[dict[str, tuple]] = []
    while any(left.values()):
        def visit(run: str, i: int, seg: Segment) -> Turn:
            return _turn(run, seg[1], running, one_host, points=seg[0], first=False,
                         last=False)
        if not turns:
            run = max((r for r in left if left[r]), key=lambda r: (len(left[r][0][1][1]),
                                                                      -order[r]))
            i, seg = left[run][0]
        else:
            _, run, i, seg = min(
                ((visit(r, i, seg), r, i, seg) for r in left for i, seg in left[r]),
                key=lambda x: (len(x[0].restart), len(x[0].start),
                               -len(x[3][1]) if x[0].restart else 0, order[x[1]], x[2]))
        left[run] = [x for x in left[run] if x[0] != i]
        done = count[run] - len(left[run])
        t = _turn(run, seg[1], running, one_host, points=seg[0], first=done == 1,
                  last=not left[run])
        turns.append(t)
        wants.append(seg[1])
        for ep in t.stop:
            running.pop(ep, None)
        running.update(seg[1])
    if gates is None:
        return turns
    # the engines each configuration's gate checks: its top point's (the gate follows its
    # sweep), the last segment's
    top = {run: segs[-1][1] for run, segs in todo}
    by_turn: dict[int, list[str]] = {}
    for run, _ in todo:
        if gates.get(run) is None:
            continue
        first = next(k for k, (t, want) in enumerate(zip(turns, wants, strict=True))
                     if (t.run == run and t.last) or (
                         gates.get(t.run) == gates[run]
                         and all(want.get(ep) == sig for ep, sig in top[run].items())))
        by_turn.setdefault(first, []).append(run)
    return [dataclasses.replace(t, gate=tuple(by_turn.get(k, ()))) for k, t in enumerate(turns)]


@dataclass(frozen=True)
class Share:
    """What one visit (or, as a job, one configuration) takes of a way of running the study:
    its work (everything but loading), its load rounds, and of its work the seconds inside
    measured windows (each sweep point's client run: its warm-up and measured requests)."""

    run: str
    work_s: float
    rounds: int
    gpus: int  # allocated while it runs
    measured_s: float = 0.0


@dataclass(frozen=True)
class Comparison:
    """One allocation against one job per configuration, for the same study."""

    one_nodes: int
    one_s: float  # the allocation's wall time
    one_gpu_s: float
    one_loads: int  # engine starts (a DP endpoint counts once)
    each_s: float  # the jobs' time added up
    each_gpu_s: float
    each_loads: int
    load_s: float  # what one engine start was assumed to take
    load_basis: str
    load_bound_s: float = 0.0  # health.timeout_s: the most one load may take
    turn_costs: tuple[Share, ...] = ()  # one allocation, visit by visit; they add up to it
    job_costs: tuple[Share, ...] = ()  # one job each, in the study's order
    site_load_s: float | None = None  # the profile's load_time_s: the site's measured load

    @property
    def cheaper(self) -> str:
        return "one" if self.one_gpu_s <= self.each_gpu_s else "each"

    @property
    def one_work_s(self) -> float:
        return sum(t.work_s for t in self.turn_costs)

    @property
    def one_rounds(self) -> int:
        return sum(t.rounds for t in self.turn_costs)

    @property
    def one_most_s(self) -> float:
        """The allocation's time if every load round takes the health timeout."""
        return sum(t.work_s + t.rounds * self.load_bound_s for t in self.turn_costs)

    def useful(self, load_s: float, one: bool = True) -> float:
        """GPU-seconds inside measured windows over GPU-seconds allocated, each load round
        taking `load_s`: in the one allocation, or over the jobs of one job each."""
        shares = self.turn_costs if one else self.job_costs
        spent = sum(s.gpus * (s.work_s + s.rounds * load_s) for s in shares)
        return sum(s.gpus * s.measured_s for s in shares) / spent if spent else 0.0

    def longest_job(self, bound: bool = False) -> float:
        """The longest job of one job each (every load at the health timeout: `bound`)."""
        load = self.load_bound_s if bound else self.load_s
        return max((j.work_s + j.rounds * load for j in self.job_costs), default=0.0)

    def to_json(self) -> dict:
        doc = asdict(self)
        for key in ("turn_costs", "job_costs"):
            for share in doc[key]:
                share["work_s"] = round(share["work_s"], 1)
                share["measured_s"] = round(share["measured_s"], 1)
        useful = {"at_health_timeout": round(self.useful(self.load_bound_s), 3)}
        if self.site_load_s:
            useful["at_load_time_s"] = round(self.useful(self.site_load_s), 3)
        return {**doc, "cheaper": self.cheaper, "one_work_s": round(self.one_work_s, 1),
                "one_most_s": round(self.one_most_s, 1), "one_rounds": self.one_rounds,
                "useful_gpu_time": useful,
                "longest_job_s": round(self.longest_job(), 1),
                "longest_job_most_s": round(self.longest_job(bound=True), 1)}


def compare(turns: list[Turn], costs: dict[str, Cost], nodes: int, gpus_per_node: int,
            load_s: float, load_basis: str, site_load_s: float | None = None) -> Comparison:
    """`costs`: each configuration's own estimate (cost.estimate). One allocation runs, visit
    by visit, the points each visit measures; a configuration's preflight in its first
    visit and its gate where the plan of turns puts it (its last visit without one); a load
    round wherever a visit starts an engine, so a visit's points need no restart. Separate
    jobs each load every engine they use, and restart within their sweep. The allocation's
    teardown is its last visit's."""
    shares = []
    gated = {r for t in turns for r in t.gate}
    for i, t in enumerate(turns):
        c = costs[t.run]
        phases = dict(c.phases)
        pts = [p for p in c.points if not t.points or p.concurrency in t.points]
        work = sum(p.seconds for p in pts) + phases.get("hold", 0.0) * t.last
        if t.first:
            work += phases.get("preflight", 0.0)
        gating = t.gate or ((t.run,) if t.last and t.run not in gated else ())
        work += max((dict(costs[g].phases).get("accuracy gate", 0.0) for g in gating),
                    default=0.0)
        if i == len(turns) - 1:
            work += max(dict(c.phases).get("teardown", 0.0) for c in costs.values())
        # without points (a configuration visited once), its sweep restarts as its job does
        within = c.restarts if not t.points else 0
        shares.append(Share(t.run, work, (1 if t.loads else 0) + within,
                            nodes * gpus_per_node, sum(p.seconds for p in pts)))
    jobs = tuple(Share(run, c.work_s, c.loads, c.gpus_allocated,
                       sum(p.seconds for p in c.points)) for run, c in costs.items())
    one_s = sum(t.work_s + t.rounds * load_s for t in shares)
    each = [(j.work_s + j.rounds * load_s, j.gpus) for j in jobs]
    within = sum(c.restart_loads for run, c in costs.items()
                 if any(t.run == run and not t.points for t in turns))
    return Comparison(
        one_nodes=nodes, one_s=one_s, one_gpu_s=one_s * nodes * gpus_per_node,
        one_loads=sum(t.loads for t in turns) + within,
        each_s=sum(s for s, _ in each), each_gpu_s=sum(s * g for s, g in each),
        each_loads=sum(len(t.start) + len(t.restart) + len(t.keep) for t in turns if t.first)
        + sum(c.restart_loads for c in costs.values()),
        load_s=load_s, load_basis=load_basis,
        load_bound_s=max(c.load_bound_s for c in costs.values()),
        turn_costs=tuple(shares), job_costs=jobs, site_load_s=site_load_s,
    )  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """The partition's limits as Slurm has them (asked by launcher.control.scheduling), or unknown."""

    known: bool = False
    partition: str | None = None
    max_minutes: int | None = None  # None: no limit
    max_nodes: int | None = None
    max_time: str = ""  # as Slurm writes it

    def text(self) -> str:
        where = f"partition {self.partition}" if self.partition else "the default partition"
        if not self.known:
            return (f"{where}'s MaxTime and MaxNodes are not known here (no Slurm here "
                    "answered for it): `submit --check` asks the scheduler (sbatch --test-only)")
        return (f"{where} (scontrol show partition): MaxTime {self.max_time}, MaxNodes "
                f"{self.max_nodes or 'UNLIMITED'}")


@dataclass(frozen=True)
class Choice:
    """How a study runs and why, and what that changes from what was asked: the time limit,
    the nodes each configuration holds, the way itself when --allocation was not given."""

    way: str  # "one" | "each"
    asked: str | None  # --allocation, None when not given
    cmp: Comparison
    nodes: tuple[int, ...]  # each configuration's own node count
    recipe_minutes: int | None  # the configurations' slurm.time_limit (the largest)
    one_minutes: int | None  # the one allocation's time limit, where there is a scheduler
    lead_s: int = 0  # slurm.signal_lead_s
    limits: Limits | None = None  # None: no scheduler (the local profile)
    fallback: str | None = None  # why one allocation was not taken although cheaper

    def over(self) -> str | None:
        """Why one allocation does not fit the partition, or None."""
        lim = self.limits
        if lim is None or not lim.known or self.one_minutes is None:
            return None
        why = []
        if lim.max_minutes is not None and self.one_minutes > lim.max_minutes:
            why.append(f"a time limit of {_minutes(self.one_minutes)}, longer than "
                       f"partition {lim.partition}'s MaxTime of {_minutes(lim.max_minutes)}")
        if lim.max_nodes is not None and self.cmp.one_nodes > lim.max_nodes:
            why.append(f"{self.cmp.one_nodes} nodes, more than partition {lim.partition}'s "
                       f"MaxNodes of {lim.max_nodes}")
        return ("the study's one allocation would need " + " and ".join(why)) if why else None

    def reason(self) -> list[str]:
        """Lines: the way and why; what each way asks of the queue; the partition's limits."""
        c = self.cmp
        gh = lambda s: f"{s / 3600:,.{2 if s < 36000 else 1}f}"  # noqa: E731
        load = f"every load taken as {_dur(c.load_s)}"
        if self.fallback:
            head = (f"Chosen: one job each, not one allocation ({gh(c.one_gpu_s)} against "
                    f"{gh(c.each_gpu_s)} GPU-hours, {load}), because {self.fallback} "
                    "(--allocation one is refused there)")
        elif self.asked:
            head = f"Asked: {WAYS[self.way]} (--allocation {self.asked})"
        else:
            few, many = ((c.one_gpu_s, c.each_gpu_s) if self.way == "one" else
                         (c.each_gpu_s, c.one_gpu_s))
            other = "one job each" if self.way == "one" else "one allocation"
            head = (f"Chosen: {WAYS[self.way]}, the fewer GPU-hours ({gh(few)} against "
                    f"{gh(many)} as {other}, {100 * (1 - few / many) if many else 0:.0f} % "
                    f"fewer; {load}); --allocation one|each chooses")
        parts = [head]
        if self.one_minutes is not None and self.recipe_minutes is not None:
            parts.append(
                f"queue: the one allocation asks for {c.one_nodes} nodes for "
                f"{_hm(self.one_minutes)} (--time={self.one_minutes}) and runs at most "
                f"{_dur(c.one_most_s)}; one job each asks for "
                f"{_span(self.nodes)} nodes for {_hm(self.recipe_minutes)} each "
                f"(slurm.time_limit), the longest running at most "
                f"{_dur(c.longest_job(bound=True))}"
                + (": a longer job of more nodes may wait longer in the queue"
                   if self.one_minutes > self.recipe_minutes else ""))
        if self.limits is not None:
            parts.append(self.limits.text())
        return [parts[0], *(f"  {x}" for x in parts[1:])]

    def changes(self) -> list[str]:
        """What this submission does other than what was asked, one sentence each."""
        c, n = self.cmp, len(self.nodes)
        if self.way == "each":
            return [f"way: one job each rather than one allocation, the fewer GPU-hours: "
                    f"{self.fallback}"] if self.fallback else []
        out = []
        if self.asked is None:
            out.append(f"way: one allocation for the {n} configurations (no --allocation "
                       "given: the fewer GPU-hours); --allocation each submits a job each")
        if self.one_minutes is not None and self.recipe_minutes is not None \
                and self.one_minutes > self.recipe_minutes:
            out.append(
                f"time limit: {_hm(self.one_minutes)} (--time={self.one_minutes}) for the one "
                f"job, where the recipe says {_hm(self.recipe_minutes)} (slurm.time_limit): "
                f"the {n} configurations in turn, each load round taken at its "
                f"health.timeout_s ({_dur(c.load_bound_s)}), plus the "
                f"{self.lead_s} s signal lead")
        if min(self.nodes) < c.one_nodes:
            out.append(
                f"nodes: {c.one_nodes} nodes held for every configuration, where they need "
                f"{_span(self.nodes)}: the largest's; a smaller one leaves the rest loaded and "
                "idle (not counted in its figures, counted in its GPU-hours)")
        return out

    def to_json(self) -> dict:
        return {"way": self.way, "asked": self.asked,
                "reason": "; ".join(x.strip() for x in self.reason()),
                "changes": self.changes(), "time_minutes": self.one_minutes,
                "recipe_minutes": self.recipe_minutes,
                "limits": asdict(self.limits) if self.limits else None}


WAYS = {"one": "one allocation", "each": "one job each"}


_dur = duration


def _hm(minutes: int) -> str:
    return duration(minutes * 60)


def _minutes(m: int) -> str:
    """'11 h 04 min (664 min)': both, where Slurm's minutes are not the duration's."""
    return _hm(m) + (f" ({m} min)" if m >= 60 else "")


def _span(nodes: tuple[int, ...]) -> str:
    lo, hi = min(nodes), max(nodes)
    return f"{lo}" if lo == hi else f"{lo} to {hi}"
