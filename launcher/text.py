"""What the CLI prints: the plan table, a run's status, the runs list, event lines.

No Slurm calls and no writes, so `status` and the dashboard can show the same words; they
read the run's own files (plan.json, the records) and the model cache's state (staging).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from launcher.control import compute_env, prepare, staging, visibility
from launcher.planning import (
    capacity,
    containers,
    cost,
    engine_argv,
    kv_tiers,
    render,
    schedulers,
    study,
    ucx,
)
from launcher.run import lengths, listing, published, rundir
from launcher.run.plandoc import PlanError, option_value, read_plan
from launcher.run.rundir import RunDir, RunStatus
from launcher.run.vocab import Kind, State

if TYPE_CHECKING:
    from pathlib import Path

    from launcher.control.prepare import Prepared


def _ranges(xs: list[int]) -> str:
    if not xs:
        return "-"
    return f"{xs[0]}" if len(xs) == 1 else f"{xs[0]}-{xs[-1]}"


def process_rows(prepared: Prepared) -> list[tuple[str, str, str, str]]:
    """(node, gpus, process, ports) rows in node order, as the plan table shows them."""
    plan = prepared.plan
    eps = {ep.name: ep for ep in plan.endpoints}
    rows = []
    for proc in prepared.rendered.processes:
        if proc.kind == Kind.ENGINE:
            ep = eps[proc.endpoint]
            ranks = proc.dp_ranks
            nixl = [ep.nixl_port_base + r for r in ranks]
            parts = [] if proc.headless else [f"http {urlsplit(proc.url).port}"]
            if ep.spans_nodes:
                rank = [p.node for p in ep.parts].index(proc.node)
                parts.append(f"master {ep.dp_rpc_port}, node rank {rank} of {len(ep.parts)}")
                if ranks and ep.role.disaggregated:
                    parts.append(f"nixl {_ranges(nixl)}")
                pp = ep.pool.pipeline_parallel
                parts.append(f"tp {ep.pool.tensor_parallel}" + (f" x pp {pp}" if pp > 1 else "")
                             + (" headless" if proc.headless else ""))
                rows.append((proc.node, ",".join(map(str, proc.gpus)), proc.name,
                             ", ".join(parts)))
                continue
            if ep.multi_node:
                parts.append(f"dp-rpc {ep.dp_rpc_port}")
            if ep.role.disaggregated:
                parts.append(f"nixl {_ranges(nixl)}")
            parts.append(f"dp ranks {_ranges(ranks)}" + (" headless" if proc.headless else ""))
            ports = ", ".join(parts)
        elif proc.kind == Kind.ROUTER:
            ports = f"http {plan.router_port}, metrics {plan.router_metrics_port}"
        elif proc.kind == Kind.AGENT:
            ports = f"exporter {plan.exporter_ports[proc.node]}"
        elif proc.kind == Kind.STORE:
            m = kv_tiers.master_ports(plan)
            ports = f"rpc {m.rpc}, metadata {m.metadata}, admin {m.admin}"
        else:
            continue
        gpus = ",".join(map(str, proc.gpus)) if proc.gpus else "-"
        rows.append((proc.node, gpus, proc.name, ports))
    order = {n: i for i, n in enumerate(plan.nodes)}
    rows.sort(key=lambda r: (order[r[0]], r[1] == "-"))
    return rows


def launch_lines(plan) -> list[str]:
    """The launch choices a site reads before it submits: the front layout of endpoints over
    several nodes, where the router and clients run, and the profile's step settings."""
    out = []
    for ep in plan.endpoints:
        if ep.spans_nodes:
            pp = ep.pool.pipeline_parallel
            out.append(f"{ep.name}: one engine, tensor parallel {ep.pool.tensor_parallel}"
                       + (f" x pipeline parallel {pp}" if pp > 1 else "") + " over "
                       f"{len(ep.parts)} nodes (--nnodes {len(ep.parts)}): the API server on "
                       f"{ep.head.node}, the other node{'s' if len(ep.parts) > 2 else ''} "
                       "--headless")
        elif ep.multi_node:
            how = (f"an API server on each of its {len(ep.parts)} nodes "
                   "(--data-parallel-hybrid-lb), each a worker of the router"
                   if ep.hybrid_lb else f"one API server on {ep.head.node}, the other "
                   f"node{'s' if len(ep.parts) > 2 else ''} --headless")
            out.append(f"Fronts of {ep.name} ({ep.role}.fronts: {ep.pool.fronts}): {how}")
    out.append(f"Router and clients on {plan.router_node} (router.placement: "
               f"{plan.recipe.router.placement})")
    c = plan.cluster
    site = []
    if opts := c.srun_options + plan.recipe.slurm.srun_options:
        site.append(f"srun options on every step: {render.shell_line(opts)}")
    for role, pool in plan.recipe.pools():
        if pool.srun_options:
            site.append(f"on {role} engines also: {render.shell_line(pool.srun_options)}")
    if c.step_preamble:
        site.append(f"before every step's command: {c.step_preamble}")
    if c.gpu_directive == "none":
        site.append("no GPU request on the job or its steps (gpu_directive: none)")
    if c.imex is not None:
        which = ("an IMEX channel (imex.channel: auto, the job's)" if c.imex.channel == "auto"
                 else f"IMEX channel {c.imex.channel}")
        site.append(f"{which} checked under {c.imex.dir} where the engines run, before they "
                    "start")
    if site:
        out.append(f"Site ({c.name}): " + "; ".join(site))
    return out


def engine_lines(prepared: Prepared) -> list[str]:
    """One engine command line per role (its head part), as it will run; commands.sh has
    every process with its environment."""
    seen, out = set(), []
    for proc in prepared.rendered.processes:
        if proc.kind != Kind.ENGINE or proc.headless or proc.role in seen:
            continue
        seen.add(proc.role)
        out.append(f"{proc.role} ({proc.name}): {render.shell_line(proc.argv)}")
        steps = getattr(prepared.plan.recipe, str(proc.role)).args_from_concurrency
        for r in proc.restarts:
            c = r["from_concurrency"]
            out.append(f"  restarted before concurrency {c} ({proc.role}.args_from_concurrency, "
                       f"the other engines stay loaded), adding: "
                       f"{render.shell_line(render.flags(steps[c]))}")
    if out:
        out.append("(the other engines differ in ports, ranks and addresses; commands.sh has "
                   "every process with its environment)")
    return out


def study_plan_text(runs: list[Prepared]) -> str:
    """A study's runs: the first in full, the others without the lines it already showed
    (one warning once), then what the study reserves in all."""
    first = plan_text(runs[0]).splitlines()
    shown = set(first)
    out = first
    for r in runs[1:]:
        out.append("")
        out += [line for line in plan_text(r).splitlines() if line not in shown]
    costs = [cost.estimate(r.plan) for r in runs]
    shared, cmp = runs[0].shared, runs[0].compared
    out += ["", f"Study: {len(runs)} configurations (lines the same as the first one's are "
            f"shown once): {sum(c.gpus_working for c in costs)} GPUs working over them; "
            f"{sum(c.requests for c in costs):,} requests"
            + (f" ({warm:,} of them warm-up)" if (warm := sum(c.warmups for c in costs)) else "")]
    choice = runs[0].choice
    if cmp is not None:
        out += study_ways(cmp, shared is not None, len(runs))
    if choice is not None:
        out += choice.reason()
    if shared is not None:
        out += [f"Order in the allocation ({shared.nodes} nodes"
                + (f", time limit {cost.duration(shared.minutes * 60)}" if shared.minutes else "")
                + f"; {len(shared.turns)} visit{'s' * (len(shared.turns) != 1)}, "
                f"{cmp.one_rounds} load round{'s' * (cmp.one_rounds != 1)}: each "
                "configuration's points grouped by the engine settings they need):"]
        by_run = {r.run.run_id: r for r in runs}
        for i, t in enumerate(shared.turns, 1):
            procs = by_run[t.run].rendered.processes
            points = list(t.points or by_run[t.run].plan.recipe.benchmark.points)
            within = [] if t.points else sorted({c for p in procs for c in _changes(p, points)})
            moved = sorted({p.endpoint for p in procs if p.restarts and p.endpoint})
            parts = [_points(t.points) if t.points else "",
                     f"starts {', '.join(t.start)}" if t.start else "",
                     f"restarts {', '.join(t.restart)} (another command line)" if t.restart else "",
                     f"keeps {', '.join(t.keep)} loaded" if t.keep else "",
                     f"leaves {', '.join(t.idle)} idle (not counted)" if t.idle else "",
                     f"stops {', '.join(t.stop)} (on GPUs or ports it needs)" if t.stop else "",
                     f"its sweep restarts {', '.join(moved)} before concurrency "
                     f"{', '.join(map(str, within))} (args_from_concurrency)" if within else "",
                     _gate(t)]
            out.append(f"  {i}. {t.run}: " + "; ".join(x for x in parts if x) + "; a router of "
                       "its own")
        out.append(f"Study folder: {shared.path}  (study.json"
                   + (", job.sbatch: the one job of every configuration" if shared.sbatch
                      else "") + ")")
    else:  # the Cost lines above, added up
        shares = [(c.work_s, c.loads, c.gpus_allocated) for c in costs]
        load = cmp.load_s if cmp is not None else max(c.load_expected_s for c in costs)
        out.append(f"As {len(runs)} jobs: the Cost lines above added up, " + cost.spend(
            shares, load, max(c.load_bound_s for c in costs)).replace(
                " of work", " of job time", 1))
    if choice is not None and (changed := choice.changes()):
        out.append("What this submission changes from what was asked:")
        out += [f"  - {x}" for x in changed]
    return "\n".join(out)


def _visit_detail(c: cost.Cost, turns, last: bool) -> str:
    """The phases of a configuration's visits: its gate only where one of them runs it
    (one gate per engine set), the teardown where the allocation's last visit is its."""
    gates = any(t.gate for t in turns)
    parts = ", ".join(f"{name} {cost.duration(s)}" for name, s in c.phases
                      if s and name != cost.RESTARTS and (last or name != "teardown")
                      and (gates or name != "accuracy gate"))
    return f"{parts}; per request from {c.basis or 'no request'}"


def _points(points: tuple[int, ...]) -> str:
    return f"concurrency {', '.join(map(str, points))}"


def _gate(t) -> str:
    """What a visit does of the accuracy gate (the plan of turns runs one per engine set)."""
    others = [r for r in t.gate if r != t.run]
    if others:
        return ("then the accuracy gate on these engines, for "
                + ("itself and " if t.run in t.gate else "") + ", ".join(others))
    if t.gate:
        return "then its accuracy gate"
    return ""


def _changes(proc, points: list[int]) -> list[int]:
    """The points, in sweep order, before which this engine restarts."""
    out, cur = [], proc.argv_at(points[0]) if points else proc.argv
    for c in points[1:]:
        if proc.argv_at(c) != cur:
            out.append(c)
            cur = proc.argv_at(c)
    return out


def _shares(shares) -> list[tuple[float, int, int]]:
    return [(x.work_s, x.rounds, x.gpus) for x in shares]


def study_ways(cmp, one: bool, n: int) -> list[str]:
    """Both ways of running a study, side by side, and which one this submission takes."""
    return [
        f"  one allocation:  {cmp.one_nodes} nodes x "
        + cost.spend(_shares(cmp.turn_costs), cmp.load_s, cmp.load_bound_s)
        + f"; {cmp.one_loads} engine start(s)" + (" <- this submission" if one else ""),
        f"  one job each:    {n} jobs, "
        + cost.spend(_shares(cmp.job_costs), cmp.load_s, cmp.load_bound_s).replace(
            " of work", " of job time in all", 1)
        + f"; {cmp.each_loads} engine start(s)" + ("" if one else " <- this submission"),
        f"  (an engine start taken as {cost.duration(cmp.load_s)}: {cmp.load_basis})",
        useful_line(cmp),
    ]


def useful_line(cmp) -> str:
    """GPU-seconds inside measured windows over GPU-seconds allocated, both ways: at the
    health timeout (every load at its bound) and at the site's load time (the profile's
    load_time_s), else at the load assumed above."""
    loads = [(cmp.load_bound_s, "health.timeout_s")]
    site = cmp.site_load_s
    if site and site != cmp.load_bound_s:
        loads.append((site, "load_time_s, the cluster profile's"))
    elif not site and cmp.load_s < cmp.load_bound_s:
        loads.append((cmp.load_s, "the engine start assumed above"))
    at = lambda one: ", ".join(  # noqa: E731
        f"{cmp.useful(s, one):.2f} at a {cost.duration(s)} load ({why})" for s, why in loads)
    return ("  useful GPU time (GPU-seconds inside measured windows / GPU-seconds allocated): "
            f"one allocation {at(True)}; one job each {at(False)}")


def cost_line(prepared: Prepared, c: cost.Cost) -> str:
    """The run's Cost line; in a study, what it adds to the way the study is submitted: its
    job (at the study's load time), or its turn in the one allocation."""
    cmp = prepared.compared
    if cmp is None:
        return cost.text(c)
    if prepared.shared is None:
        return cost.text(c, load_s=cmp.load_s)
    run = prepared.run.run_id
    mine = [(i, t) for i, t in enumerate(cmp.turn_costs) if t.run == run]
    share = study.Share(run, sum(t.work_s for _, t in mine), sum(t.rounds for _, t in mine),
                        mine[0][1].gpus)
    turns = [prepared.shared.turns[i] for i, _ in mine]
    starts = sum(1 for t in turns if t.loads)
    within = share.rounds - starts
    why = ", ".join(x for x in [
        ("its engines' start" if len(mine) == 1 else
         f"{starts} of its visits start{'s' * (starts == 1)} or restart{'s' * (starts == 1)} "
         "engines") if starts else "",
        f"{within} restart{'s' * (within > 1)}, args_from_concurrency" if within else ""]
        if x)
    last = mine[-1][0] == len(cmp.turn_costs) - 1
    where = ", ".join(str(i + 1) for i, _ in mine)
    return (f"Cost, its {'visits' if len(mine) > 1 else 'turn'} in the one allocation "
            f"({where} of {len(cmp.turn_costs)}; "
            f"{cmp.one_nodes} nodes, {share.gpus} GPUs allocated, {c.gpus_working} working"
            + ("" if share.rounds else ", its engines kept loaded") + "): "
            + cost.spend(_shares([share]), cmp.load_s, cmp.load_bound_s,
                         _visit_detail(c, turns, last), why)
            + "; " + cost.requests_text(c))


def length_range(b) -> str:
    """The token lengths the recipe's rule draws from."""
    return lengths.of_benchmark(b).text()


def driver_note(plan) -> str:
    """How the driver sends the rule's lengths, where it is not literally the recipe's."""
    b = plan.recipe.benchmark
    if b.driver == "vllm" and b.length_rule == "sa-bench":
        n_in, n_out, r = lengths.vllm_window(b.lengths())
        got = lengths.lengths("vllm", n_in, n_out, r)
        return (f" (vllm bench serve draws by vLLM's rule: --random-input-len {n_in} "
                f"--random-output-len {n_out} give {got.text()}, inside sa-bench's bounds)")
    return ""


def custom_bench_lines(prepared: Prepared) -> list[str]:
    """benchmark.custom: the command where it runs, the contract it gets, and which
    published benchmark it is when the builtin sweep runs it natively."""
    from launcher.schema import native_bench

    cb = prepared.plan.recipe.benchmark.custom
    proc = next(p for p in prepared.rendered.processes if p.kind == Kind.BENCH)
    where = f"on {proc.node}" + (" in the container" if proc.container else "")
    if proc.container and containers.of(prepared.plan.cluster).isolated:
        mounted = {(s, d) for s, d, _ in containers.mounts(prepared.plan)}
        where += "".join(f", {s} at {d}" for s, d, _ in
                         containers.srt_slurm_mounts(prepared.plan) if (s, d) in mounted)
        if prepared.plan.mount_dir:
            where += " (no /logs in a study's one allocation: write under $PD_RUN_DIR)"
    contract = render.custom_contract_env(prepared.plan)
    out = [f"Custom benchmark (benchmark.custom) in place of the sweep, {where}, its output in "
           f"{proc.log}, its exit status the benchmark's: {render.shell_line(proc.argv)}",
           "  with srt-slurm's environment (docs/custom-benchmark.md): "
           + " ".join(f"{k}={v}" for k, v in contract.items())
           + (f"; its own: {' '.join(f'{k}={v}' for k, v in cb.env.items())}" if cb.env else "")
           + " (commands.sh has all of it); its own time is not in the cost below"]
    if (native := native_bench.recognise(cb.command, cb.env)) is not None:
        out.append("  " + native.text())
    return out


def agentic_lines(prepared: Prepared) -> list[str]:
    """benchmark.agentic: the trace, the live sessions, AIPerf, the routing, where the
    files go (docs/agentic.md)."""
    from launcher.control import datasets

    plan = prepared.plan
    r = plan.recipe
    ag = r.benchmark.agentic
    _, note = datasets.check(r, plan.cluster)
    what = (f"AIPerf's public corpus {ag.corpus}" if ag.corpus else
            f"{ag.trace} ({ag.trace_format})")
    length = (f"{ag.duration_s:g} s a point" if ag.duration_s else
              f"{ag.sessions_per_point} sessions a point" if ag.sessions_per_point else
              "every session of the trace once a point")
    policies = render.session_policies(r)
    routing = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in policies.items()) or \
        "vllm-router's default"
    sticky = all(v == "consistent_hash" for v in policies.values()) and policies
    _, tool = datasets.aiperf_check(plan)
    out = [f"Agentic benchmark (benchmark.agentic, docs/agentic.md): AIPerf replays {what} at {', '.join(map(str, r.benchmark.concurrency))} live sessions, "
           f"{length}, seed {ag.seed}, warm-up {ag.warmup_requests} requests"
           + (f", scenario {ag.scenario}" if ag.scenario else "")
           + (f", sessions longer than {ag.max_context:,} tokens dropped"
              if ag.max_context else ""),
           (f"  AIPerf: {tool}" if tool else "  AIPerf: see the blocker below")
           + ("; its own settings: " + ", ".join(f"{k}={v}" for k, v in ag.env.items())
              if ag.env else ""),
           f"  trace: {note}" if note else "  trace: see the blocker below",
           f"  sessions: AIPerf sends each session's id in {ag.session_header}; the router "
           f"runs {routing}" + (" (every turn of a session to one prefill and one decode, "
                                "so its prefix is found in KV)" if sticky else ""),
           *_sessions_held(plan, r),
           "  per point: AIPerf's own files kept whole in bench/aiperf-cNNNNN/, the point's "
           "figures in bench/cNNNNN.json, then every engine drained before the next (no "
           "restart; AIPerf's first-turn cache-bust keeps points apart)"]
    return out


def _sessions_held(plan, r) -> list[str]:
    """The live sessions the decode KV holds at the workload's contexts (the same estimate
    as the KV lines below, at that length)."""
    from launcher.control import datasets

    ctx = datasets.context_of(r)
    if ctx is None:
        return []
    held = capacity.sessions_held(plan, ctx[0])
    if not held:
        return [f"  KV: no estimate of the live sessions the decode holds at {ctx[0]:,} "
                f"tokens ({ctx[1]})"]
    top = max(r.benchmark.concurrency)
    total = sum(n for _, n in held)
    return [f"  KV: the decode side holds about {total:,} live sessions' contexts at once at "
            f"{ctx[0]:,} tokens each ({ctx[1]}; "
            + ", ".join(f"{name} {n:,}" for name, n in held) + ")"
            + (f"; above that ({top:,} live sessions at the top point) a returning session "
               "finds its prefix evicted and prefills it again" if top > total else "")]


def tokenizer_note(plan) -> str:
    """How the client loads the tokenizer for the chat template, where not plainly."""
    b = plan.recipe.benchmark
    if not (b.chat_template and render.chat_template_applies(plan)):
        return ""
    flags = render.tokenizer_flags(plan)
    said = []
    if mode := option_value(flags, "--tokenizer-mode"):
        said.append(f"the template rendered by vLLM's own {mode} tokenizer from the image, "
                    "as the engines' tokenizer-mode names it and sa-bench's custom_tokenizer "
                    "loads it")
    if "--trust-remote-code" in flags:
        said.append("the tokenizer's own code trusted, as the engines' trust-remote-code")
    if rev := option_value(flags, "--tokenizer-revision"):
        said.append(f"at revision {rev}")
    return f" ({'; '.join(said)})" if said else ""


def slo_line(b) -> str:
    """What the SLO search will do (docs/slo.md)."""
    from launcher.run import slo

    return (f"SLO search: the highest concurrency meeting every limit of "
            f"{slo.text_of(b.slo.parsed())}: probes {', '.join(map(str, b.points))} (doubling "
            f"from the first, to {b.slo_top}) until a point fails, then bisects between the "
            f"last passing and the first failing point until they are within "
            f"{b.slo.precision:.0%} (benchmark.slo.precision), on the same engines; a point "
            "that fails in any other way (errors, zero tokens, the accuracy gate) never passes")


def plan_text(prepared: Prepared) -> str:
    """What `submit` (and `--dry-run`) prints: the plan table, the sweep, the estimate."""
    plan, r = prepared.plan, prepared.plan.recipe
    c = plan.gpu_count()
    lines = [
        f"Recipe {r.name} on {plan.cluster.name}: {prepared.nodes} nodes x "
        f"{plan.cluster.gpus_per_node} GPUs, engine {r.engine}{r.engine_kind.plan_note}"
        + f", mode {r.mode}, {c['total']} GPUs in use "
        f"(prefill {c['prefill']}, decode {c['decode']}, agg {c['agg']})",
    ]
    if prepared.placeholder_nodes:
        lines.append(
            "Node names are placeholders: the real ones are planned inside the allocation."
        )
    if note := schedulers.of(plan.cluster).port_note(plan):
        lines.append(note)
    rows = [("NODE", "GPUS", "PROCESS", "PORTS")] + process_rows(prepared)
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append(
            "  ".join(x.ljust(w) for x, w in zip(row[:3], widths, strict=False)) + "  " + row[3]
        )
    lines += engine_lines(prepared)
    lines.append(engine_argv.checked_by(plan))
    lines += kv_tiers.summary(plan)
    lines += launch_lines(plan)
    b = r.benchmark
    if b.enabled and b.custom is not None:
        lines += custom_bench_lines(prepared)
    elif b.enabled and b.agentic is not None:
        lines += agentic_lines(prepared)
    elif b.enabled:
        lines.append(
            f"Sweep: concurrency {', '.join(map(str, b.points))} at "
            f"{lengths.workload_text(b, b.chat_template and render.chat_template_applies(plan))}"
            f"; driver {b.driver}" + driver_note(plan) + tokenizer_note(plan)
        )
        if b.slo is not None:
            lines.append(slo_line(b))
    a = r.accuracy
    if a.enabled and a.harness == "vllm":
        runs = f", {a.repeat} runs" if a.repeat > 1 else ""
        lines.append(
            f"Accuracy gate: {a.task} {a.num_shots}-shot as vLLM's own GSM8K harness scores "
            f"it (harness vllm: the first {a.num_shots} train rows as examples, the last "
            f"integer of the output), {a.num_questions or 'all'} questions{runs}, pass at "
            f"{'mean ' if a.repeat > 1 else ''}>= {a.threshold:g}"
        )
    elif a.enabled:
        lines.append(
            f"Accuracy gate: {a.task} {a.num_shots}-shot "
            f"{a.metric} as lm-eval scores it, "
            f"{a.num_questions or 'all'} questions"
            + ("" if a.train else " (examples from the test file: NOT comparable "
               "with lm-eval; set accuracy.train)")
            + f", pass at >= {a.threshold:g}"
        )
    match, _ = published.comparable(prepared.rendered.doc)
    if prepared.capacity and b.enabled and (b.custom is not None or b.agentic is not None):
        lines.append("KV capacity below: for benchmark.input_len/output_len "
                     f"({b.input_len}/{b.output_len}); the "
                     + ("custom command" if b.custom is not None else "session trace")
                     + " sends its own lengths")
    for cap in prepared.capacity:
        lines.append(cap.describe())
        if match is not None and cap.name.startswith("decode"):
            lines.append(f"  {published.kv_capacity_text()}")
    if (gap := capacity.missing(plan, prepared.capacity)) is not None:
        lines.append(gap)
    for warning in capacity.warnings(plan, prepared.capacity):
        if match is not None and "on the decode side" in warning:
            warning += (f"; the published {published.kv_capacity_concurrency():,} is that run's "
                        "top concurrency, not a measured capacity (docs/kv-capacity.md "
                        "section 11: what it is and why the estimate differs)")
        lines.append(f"warning: {warning}")
    for warning in visibility.input_warnings(plan):
        lines.append(f"warning: {warning}")
    for warning in ucx.ucx_lines(plan)[0] + prepare.setup_script_lines(prepared)[0]:
        lines.append(f"warning: {warning}")
    if script := render.setup_script_path(plan):
        lines.append(f"Setup script: {r.setup_script}, run from {script} with bash in each "
                     "engine's container before it starts and in the preflight's container "
                     "check (as srt-slurm runs its setup_script)")
    spend = cost.estimate(plan)
    lines.append(cost_line(prepared, spend))
    if planned := cost.points_text(spend):
        lines.append(planned)
    if (late := cost.time_limit_problems(plan, spend)[1]) is not None:
        lines.append(f"warning: {late}")
    rt = plan.runtime
    lines.append(f"Launcher programs on the compute nodes: {compute_env.describe(rt)}")
    if r.container is not None:
        lines.append(containers.of(plan.cluster).describe(plan))
    refuse, note = staging.check(r, plan.cluster)
    if note:  # a refusal is a blocker, below
        lines.append(f"Model: {note}")
    files = [rundir.RECIPE, rundir.PLAN, rundir.COMMANDS] + (
        [rundir.SBATCH] if prepared.rendered.sbatch else [])
    lines.append(f"Run directory: {prepared.run.path}  ({', '.join(files)})")
    lines += [f"{BLOCKER}{b}" for b in prepared.blockers]
    return "\n".join(lines)


BLOCKER = "blocker: submit will refuse this run: "


def not_submittable(runs: list[Prepared]) -> str | None:
    """The dry-run's last line when submit would refuse what it planned."""
    n = len({b for r in runs for b in r.blockers})
    if not n:
        return None
    return (f"Not submittable as it is: submit refuses it (exit 2) for the blocker"
            f"{'s' * (n > 1)} above; --dry-run wrote everything and exits 0, "
            "--check exits 2 on a blocker")


def plan_json(prepared: Prepared) -> dict:
    """`submit --format json`: the same as plan_text, for programs."""
    return {
        "run_dir": str(prepared.run.path),
        "study": prepared.study,
        "nodes": prepared.nodes,
        "placeholder_nodes": prepared.placeholder_nodes,
        "plan": rundir.read_json(prepared.run.plan),
        "sbatch": prepared.sbatch,
        "capacity": [c.to_json() for c in prepared.capacity],
        "cost": cost.estimate(prepared.plan).to_json(),
        "blockers": list(prepared.blockers),  # what submit will refuse
        # a study: its way, why, and what that changes from what was asked
        "study_choice": prepared.choice.to_json() if prepared.choice else None,
    }


# --- runs --------------------------------------------------------------------------------


def age(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    s = int((now or time.time()) - ts)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def event_line(e: dict) -> str:
    detail = e.get("stage") or e.get("process") or e.get("error") or ""
    ts = e.get("ts")
    try:  # a line of the wrong types is shown as far as it goes, never a traceback
        when = time.strftime("%H:%M:%S", time.localtime(
            ts if isinstance(ts, int | float) and not isinstance(ts, bool) else 0))
    except (OverflowError, OSError, ValueError):
        when = "--:--:--"
    return f"[{when}] {e.get('event', '?')} {detail}".rstrip()


def status_text(run: RunDir, st: RunStatus, slurm: str | None = None,
                live: tuple[bool | None, str | None] | None = None) -> str:
    """`live`: whether its study's one allocation lives, and why not when its record says
    so (control.runs.allocation_live); None: as its allocation.json says."""
    lines = [f"run {run.run_id}  ({run.path})"]
    study = listing.study_of(run)
    problems = study.problems() if study is not None else []
    if live is None and study is not None and study.in_one_allocation:
        rec, why = study.allocation_or_why()
        live = (None, None) if why else (rec is not None and rec.running, None)
    try:
        plan = read_plan(run.plan)
        sim = plan.engine_kind.status_note
    except PlanError as e:
        plan, sim = None, ""
        if run.plan.exists():
            lines.append(f"note: {e}")
    rec = st.record
    started = rec.started if rec else None
    if st.dry_run and st.submission.checked:
        lines.append(f"state dry-run (checked, nothing was submitted: "
                     f"{st.submission.checked}){sim}")
    elif st.dry_run:
        lines.append(f"state dry-run (planned and written; nothing was submitted){sim}")
    elif st.state == State.REFUSED:
        lines.append(f"state refused: nothing was submitted (the sentence below says why){sim}")
    elif st.state == "planned" and not started:
        lines.append(f"state planned (not submitted yet){sim}")
    else:
        took = (f"  took {cost.duration(rec.ended - started)}"
                if rec and rec.ended and started else "")
        lines.append(f"state {st.state}  stage {st.stage or '-'}  started {age(started)} ago"
                     f"{took}{sim}")
    if st.slurm_job_id:
        lines.append(f"slurm job {st.slurm_job_id}" + (f": {slurm}" if slurm else ""))
    if rec and rec.serving and rec.router_url and not st.final:
        lines.append(f"serving at {rec.router_url}")
    progress = progress_text(rec.progress if rec else {})
    if progress and not st.final:
        lines.append(progress)
    if st.error:
        lines.append("error: " + st.error)
    if st.final:
        lines += result_lines(run)
    for why in st.damaged.values():
        lines.append(f"warning: {why}: left out, so what is shown comes from the other files")
    for why in problems:  # its study's files
        lines.append(f"warning: {why}: left out")
    for note in rec.notes if rec else []:
        lines.append("note: " + note)
    ended = live is not None and live[0] is False
    if rec and rec.processes:
        lines.append(f"{'PROCESS':28} {'NODE':16} {'STATE':12} LOG")
        for name, p in rec.processes.items():
            state = p.status
            if state == "kept loaded" and ended:  # loaded only while the allocation lives
                state = "stopped" if live[1] is None else "gone"
            if state == "stopped" and p.exit_code not in (None, 0):
                state = f"stopped ({p.exit_code})"  # the signal or code it ended with
            lines.append(f"{name:28} {p.node:16} {state:12} {p.log}")
        if ended and any(p.kept for p in rec.processes.values()):
            lines.append(
                "note: the engines it left loaded for the next configuration were stopped at "
                "the end of its study's allocation (allocation.json)" if live[1] is None else
                f"note: its study's allocation ended: {live[1]}; no engine is kept loaded")
    lines.append(next_step(run, st, study))
    return "\n".join(lines)


def _launcher(*words: object) -> str:
    return "python -m launcher " + " ".join(map(str, words))


def _submit_again(command: str | None) -> str:
    """The recorded `submit ... --dry-run` command line, as a submission."""
    import shlex

    try:
        words = shlex.split(command or "")
    except ValueError:
        words = []
    if "submit" not in words:
        return ""
    words = [w for w in words[words.index("submit"):] if w != "--dry-run"]
    return _launcher(*map(shlex.quote, words))


def next_step(run: RunDir, st: RunStatus, study: listing.Study | None = None) -> str:
    """status's last line: what to do next with this run."""
    root = (study.path if study is not None else run.path).parent
    if st.dry_run:
        again = _submit_again(st.submission.command) or _launcher("submit --again", run.path)
        if st.submission.blockers:  # submit would exit 2: its fix comes first
            return (f"next: mend the blocker first: {st.submission.blockers[0]} (submit "
                    f"refuses it until then; after: {again})")
        return "next: submit it: " + again
    if st.state == State.REFUSED:
        return (f"next: mend what the error says, then {_launcher('submit --again', run.path)} "
                "(its exact recipe)")
    if not st.final:
        return (f"next: {_launcher('logs', run.path, '-f')} to follow it, "
                f"{_launcher('cancel', run.path)} to stop it")
    if st.state == State.SUCCEEDED:
        return (f"next: {_launcher('report', run.path)} (one HTML page); "
                f"{_launcher('recommend', run.path)} (the P:D ratio and concurrency to run "
                f"next); {_launcher('dashboard', root)}")
    culprit = (st.record.culprit if st.record else None) or ""
    return (f"next: {_launcher('logs', run.path, culprit).rstrip()} (what it logged), then "
            f"{_launcher('submit --again', run.path)}; {_launcher('report', run.path)} shows "
            "what it measured")


def study_status_text(study: listing.Study, statuses: dict[str, RunStatus], root,
                      live: tuple[bool | None, str | None] = (None, None)) -> str:
    """`status STUDY`: its runs, its allocation (one allocation), and the next step."""
    lines = [runs_text([study], statuses, root)]  # study.json's sentence, if damaged
    rec, why = study.allocation_or_why() if study.in_one_allocation else (None, None)
    sts = [statuses[str(r.path)] for r in study.runs]
    if why:
        lines.append(f"allocation: {why}")
    elif rec is not None:
        confs = rec.configurations
        if live[1]:
            lines.append(f"allocation: {live[1]}")
        elif rec.running:
            where = (f"job {rec.slurm_job_id}" if rec.slurm_job_id else
                     f"pid {rec.pid} on {rec.host}")
            turns = len(study.planned.turns) if study.planned is not None else 0
            what = (f"visit {len(confs)} of {turns}" if turns > len(study.runs) else
                    f"configuration {len(confs)} of {len(study.runs)}")
            lines.append(f"allocation: running ({where}), {what}: "
                         f"{confs[-1].run if confs else '-'}")
        else:
            s = rec.summary
            lines.append(
                f"allocation: {rec.state}: {s.succeeded if s else 0} of {len(study.runs)} "
                f"configuration(s) succeeded; {s.engine_starts if s else 0} engine start(s); "
                f"{s.gpu_hours if s else 0:,.2f} GPU-hours over "
                f"{cost.duration(s.wall_s if s else 0)}; every engine stopped at its end")
        for r in rec.lost_nodes:
            lines.append(f"allocation: {r.node} lost in {r.run} ({r.why}): "
                         + ("Slurm kept the job on the other nodes" if r.released
                            else f"the study ended there ({r.error})"))
    if sts and not all(st.dry_run for st in sts):
        from launcher.run import slo_answer

        ans = slo_answer.answer(study.configurations())
        if ans is not None and any(f.points for f in ans.frontiers):
            lines.append(f"SLO: {ans.sentence}")
    if sts and all(st.dry_run for st in sts):
        again = _submit_again(sts[0].submission.command) or \
            _launcher("submit --again", study.runs[0].path)
        blocked = next((st.submission.blockers[0] for st in sts if st.submission.blockers), None)
        lines.append(f"next: mend the blocker first: {blocked} (submit refuses it until then; "
                     f"after: {again})" if blocked else "next: submit it: " + again)
    elif any(not st.final and not st.dry_run for st in sts) and live[0] is not False:
        lines.append(f"next: {_launcher('logs', '<RUN>', '-f')} follows a configuration; "
                     f"{_launcher('cancel', study.path)} stops the study")
    elif sts and all(st.state == State.REFUSED for st in sts):
        again = _submit_again(sts[0].submission.command)
        lines.append("next: mend what the error says, then submit it again"
                     + (f": {again}" if again else ""))
    elif any(st.state == State.SUCCEEDED for st in sts):
        lines.append(f"next: {_launcher('report', study.path)} (one HTML page of the study); "
                     f"{_launcher('recommend', study.path)} (the P:D ratio to run next); "
                     f"{_launcher('dashboard', study.path.parent)} (its Study page)")
    else:
        bad = next((r for r, st in zip(study.runs, sts, strict=True) if st.final), None)
        lines.append(next_step(bad, statuses[str(bad.path)], study) if bad is not None else
                     f"next: {_launcher('runs', '--runs-dir', study.path.parent)}")
    return "\n".join(lines)


def result_lines(run: RunDir) -> list[str]:
    """A finished run's result from summary.json: verdict, best point, accuracy, report."""
    from launcher.run import figures

    doc = rundir.read_json(run.summary)
    if not isinstance(doc, dict) or figures.summary_problem(doc):
        return []
    out = [f"verdict {doc.get('verdict', '-')}"
           + (": " + "; ".join(doc["verdict_reasons"]) if doc.get("verdict_reasons") else "")]
    h = doc.get("headline") or {}
    if h.get("total_tokens_per_s_per_gpu") is not None:
        out.append(
            f"best {h['total_tokens_per_s_per_gpu']:,.0f} tok/s/GPU (working GPUs"
            + (f"; {h['total_tokens_per_s_per_allocated_gpu']:,.0f} per allocated GPU"
               if h.get("total_tokens_per_s_per_allocated_gpu") is not None else "")
            + f") at concurrency {h.get('max_concurrency')}"
            + (f", {h['tokens_per_s_per_user']:,.1f} tok/s/user"
               if h.get("tokens_per_s_per_user") is not None else "")
            + (f", TTFT p99 {h['ttft_p99_ms']:,.0f} ms" if h.get("ttft_p99_ms") is not None
               else ""))
    a = doc.get("accuracy") or {}
    if a.get("accuracy") is not None:
        out.append(f"accuracy {a.get('task', 'gsm8k')} {a.get('metric') or ''} "
                   f"{a['accuracy']:.3f} (threshold {a.get('threshold', 0):g}, "
                   f"{'passed' if a.get('passed') else 'failed'}; {a.get('harness')} harness)")
    if cost := figures.lifecycle_line(doc.get("lifecycle")):
        out.append(f"cost {cost}")
    if sig := figures.signals_line(doc.get("log_signals")):
        out.append(f"log signals: {sig}")
    report = run.path / "report.html"
    out.append(f"report: {report}" if report.is_file() else
               f"report: python -m launcher report {run.path}")
    return out


def progress_text(progress: dict) -> str:
    """'sweep point 2 of 5 (c=128), about 6m00s left' and engine loading fractions."""
    parts = []
    sweep = progress.get("sweep") if isinstance(progress, dict) else None
    if isinstance(sweep, dict) and sweep.get("search") in ("probe", "bisect"):
        parts.append(f"SLO search point {sweep.get('index', 0)} ({sweep['search']}s, "
                     f"c={sweep.get('concurrency')})")
    elif isinstance(sweep, dict) and sweep.get("total"):
        s = f"sweep point {sweep.get('index', 0)} of {sweep['total']}"
        if sweep.get("concurrency"):
            s += f" (c={sweep['concurrency']})"
        left = sweep.get("seconds_left")
        if isinstance(left, int | float) and isinstance(sweep.get("started"), int | float):
            left = max(0.0, left - (time.time() - sweep["started"]))  # counts down
        if isinstance(left, int | float) and left >= 0:
            s += f", about {int(left) // 60}m{int(left) % 60:02d}s left"
        parts.append(s)
    loading = progress.get("loading") if isinstance(progress, dict) else None
    if isinstance(loading, dict) and loading:
        parts.append("loading " + ", ".join(
            f"{name} {frac:.0%}" for name, frac in sorted(loading.items())
            if isinstance(frac, int | float)
        ))
    return "; ".join(parts)


def engine_word(run: RunDir) -> str:
    """The runs list's ENGINE column: vLLM, vLLM (CPU) or sim (from plan.json)."""
    return _engine_and_problem(run)[0]


def _engine_and_problem(run: RunDir) -> tuple[str, str | None]:
    """The ENGINE column, and why plan.json cannot be read when it exists but is bad."""
    try:
        plan = read_plan(run.plan)
    except PlanError as e:
        return "-", (str(e).replace(f"{run.plan}: ", "") if run.plan.exists() else None)
    return plan.engine_kind.shown_as, None


def headline_figure(run: RunDir) -> str:
    """'6,770 @64': the best tok/s per working GPU and its concurrency, from summary.json."""
    doc = rundir.read_json(run.summary)
    h = doc.get("headline") if isinstance(doc, dict) else None
    v = h.get("total_tokens_per_s_per_gpu") if isinstance(h, dict) else None
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "-"
    return f"{v:,.0f} @{h.get('max_concurrency', '?')}"


def runs_rows(entries: list[listing.Entry], statuses: dict[str, RunStatus]) -> list[dict]:
    """One dict per run (studies' runs after their study), what `runs` shows and exports."""
    out = []

    def row(run: RunDir, study: str) -> dict:
        st = statuses[str(run.path)]
        engine, plan_problem = _engine_and_problem(run)
        # a damaged file comes first: it says how far the rest of the row can be trusted
        err = next(iter(st.damaged.values()), None) or plan_problem or st.error
        created = st.submission.created or (st.record.started if st.record else None)
        return {"run": run.run_id, "study": study, "state": st.shown_state,
                "stage": st.stage or "-", "created": created, "engine": engine,
                "best": headline_figure(run), "error": err.splitlines()[0] if err else ""}

    for e in entries:
        if isinstance(e, listing.Study):
            out += [row(r, e.name) for r in e.runs]
        else:
            out.append(row(e, ""))
    return out


def runs_text(entries: list[listing.Entry], statuses: dict[str, RunStatus], root) -> str:
    """The runs list: runs, and studies with their runs indented under them; columns as wide
    as what they hold, ERROR only when a run has one."""
    if not entries:
        return f"no runs under {root}"
    rows = runs_rows(entries, statuses)
    by_run = {r["run"]: r for r in rows}
    names = [("  " if r["study"] else "") + r["run"] for r in rows] + ["RUN"]
    width = min(max(len(n) for n in names), 72)
    with_error = any(r["error"] for r in rows)
    head = (f"{'RUN':{width}} {'STATE':10} {'STAGE':10} {'AGE':>8}  {'ENGINE':10}  "
            f"{'TOK/S/GPU':>14}" + ("  ERROR" if with_error else ""))
    lines = [head]

    def line(run: RunDir, indent: str) -> str:
        r = by_run[run.run_id]
        name = indent + run.run_id
        if len(name) > width:  # keep the end: a study's runs differ in their last part
            name = indent + "…" + run.run_id[-(width - len(indent) - 1):]
        return (f"{name:{width}} {r['state']:10} {r['stage']:10} {age(r['created']):>8}  "
                f"{r['engine']:10}  {r['best']:>14}"
                + (f"  {r['error'][:60]}" if with_error else "")).rstrip()

    for e in entries:
        if isinstance(e, listing.Study):
            axes = ", ".join(f"{k}={','.join(map(str, v))}" for k, v in e.axes.items())
            damaged = "".join(f"; {why}" for why in e.problems())  # its files' sentences
            one = ", in one allocation" if e.in_one_allocation else ""
            lines.append(f"{e.name}/  (study: {len(e.runs)} runs over {axes or '?'}{one}"
                         f"{damaged})")
            lines += [line(r, "  ") for r in e.runs]
        else:
            lines.append(line(e, ""))
    return "\n".join(lines)


def follow_study(study: Path, job: str | None, poll_s: float = 2.0) -> int:
    """After its configurations: until a study's one allocation has recorded its end (it
    stops the engines left idle last), or its job is gone; 0 only if it succeeded."""
    from launcher.control.runs import SLURM_LIVE, slurm_state
    from launcher.run.studydoc import read_allocation

    while True:
        rec = read_allocation(study)  # a damaged one: its sentence, exit 2
        if rec is not None and not rec.running:
            print(f"study {study.name} {rec.state}: "
                  f"{rec.summary.succeeded if rec.summary else 0} configuration(s) "
                  f"succeeded (allocation.json)")
            return 0 if rec.state == State.SUCCEEDED else 1
        s = slurm_state(job) if job else None
        if job and (s is None or not any(x in s for x in SLURM_LIVE)):
            print(f"study {study.name}: its job {job} ended ({s or 'gone'}) before the study "
                  f"recorded its end")
            return 1
        time.sleep(poll_s)


def follow(run: RunDir, poll_s: float = 2.0) -> int:
    """Show events until the run ends; 0 only if it succeeded."""
    from launcher.control.runs import reconcile

    seen = 0
    while True:
        events = run.events()
        for e in events[seen:]:
            print(event_line(e))
        seen = len(events)
        st = reconcile(run)
        if st.final:
            if st.state != State.SUCCEEDED:
                print(status_text(run, st))
            return 0 if st.state == State.SUCCEEDED else 1
        time.sleep(poll_s)
