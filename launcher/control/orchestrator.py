"""The orchestrator: one process that runs a prepared run directory to its end.

Inside a Slurm allocation it is the batch step (job.sbatch's `python -m launcher run`,
exec'd by the batch shell so the pre-time-limit signal reaches it) on the first node; on
the `local` profile it runs in the foreground. Stages, each recorded in run.json and
events.jsonl:

    plan (host check of every node, addresses found on the nodes themselves)
    -> preflight (in the engine's container on every node: argv, versions, model, mounts)
    -> agents -> endpoints -> health (+ model-loading progress) -> router (+ workers
    registered, and one request through every prefill endpoint that must move its KV to a
    decode) -> sweep -> hold -> accuracy -> teardown -> report

Any process that exits early, a lost node, or a timeout fails the run at once with one
sentence naming the culprit, its node and the last lines of every process's log. A node is
lost when its slurmd stops answering or Slurm marks it down (launcher.control.watch, asked
before any exited process is blamed). Teardown always runs, inside the time Slurm leaves
(KillWait after scancel, the signal lead before the time limit), and nothing written so far
is removed. Bookkeeping never stops it: a write that fails (full or read-only disk) is said
once and the run goes on; a run directory that takes no write for WRITE_FAIL_S fails the run
(nothing more could be recorded), and a small reserve file freed after teardown leaves room
for the final record. A run directory is written by one attempt only.

This module is the stage control; around it: `allocation` (the allocation's nodes, the plan
made for them), `preflight_stage` (the checks in the engine's container, the run's
identity), `processes` (the run's processes as run.json records them), `lifetime` (which
engines start, stay loaded, restart before a point or stop, in a run and across a study's
configurations), `pd_check` (the P->D path before the sweep), `probes` (this host's ports,
HTTP health), `record` (run.json, events), `watch` (node loss), `backends` (how a process
is started and stopped).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launcher.control import preflight
from launcher.control.allocation import check_allocation, plan_here, raise_open_files
from launcher.control.backends import Backend, Handle, make_backend
from launcher.control.lifetime import EngineLifetime
from launcher.control.pd_check import check_pd_path
from launcher.control.pool import EnginePool
from launcher.control.preflight_stage import run_preflight
from launcher.control.probes import api_ready, busy_ports, http_ok
from launcher.control.processes import Processes
from launcher.control.record import Book, say
from launcher.control.watch import NodeWatch
from launcher.errors import Cancelled, RunFailed, UserError
from launcher.planning import cost, kv_tiers, render, schedulers
from launcher.planning.study import Turn
from launcher.run import rundir
from launcher.run.plandoc import Process
from launcher.run.results import point_failure
from launcher.run.rundir import RunRecord, concurrency_of, tail
from launcher.run.vocab import TEARDOWN_ORDER, Kind, Stage, State
from launcher.schema import cluster as cluster_mod
from launcher.schema import recipe as recipe_mod
from launcher.telemetry import promsd
from launcher.telemetry.statslog import loading_fraction

POLL_S = 0.25
PROGRESS_S = 5.0  # how often loading progress is read from the engines' logs
STEP_TIMEOUT_S = 1800.0  # a preflight step (a container image import can take minutes)
TAIL_LINES = 8
WRITE_FAIL_S = 10.0  # a run directory refusing every write this long fails the run


# How long a failure seen while the job is being cancelled waits for the job's own signal
# (scancel's race: docs/contracts.md, "A cancel is a cancel").
CANCEL_GRACE_S = 3.0
# squeue's words for a job Slurm is ending while its batch step still runs: scancel makes it
# COMPLETING before any node is told to signal a step.
ENDING = ("COMPLETING", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "DEADLINE")


def other_ports(plan) -> str:
    """Advice that moves a run's ports, as a user can follow it: the profile file to copy,
    the port_base to write in the copy, and the --set that points the run at it."""
    from launcher.planning.plan import EPHEMERAL_FLOOR, job_port_slots
    from launcher.schema import cluster as cluster_mod

    # past every block a run of this profile takes before it gives up (they are all taken)
    base = plan.cluster.port_base
    slots, block = job_port_slots(plan.cluster, plan.port_span)
    new = base + slots * block
    if new + plan.port_span > EPHEMERAL_FLOOR:
        new = max(1024, base - slots * block)
    return (f"give it other ports: copy {cluster_mod.file_of(plan.recipe.cluster)}, set "
            f"port_base: {new} in the copy and add --set cluster=COPY.yaml")


def slurm_ending(job: str | None) -> str | None:
    """The job's state when Slurm is ending it; None when it runs (or there is no Slurm)."""
    if not job:
        return None
    from launcher.control.runs import slurm_state

    state = slurm_state(job) or ""
    return state if state.startswith(ENDING) else None


def cancel_behind(reason: Callable[[], str | None], run: rundir.RunDir, job: str | None,
                  sigterm_exit: bool = False) -> str | None:
    """The cancel behind a failure just seen, or None. scancel has Slurm kill the steps on
    every node while the orchestrator's SIGTERM comes from its own node's slurmd, so a step
    can fail (pyxis: "container was not started successfully by another task") before that
    signal arrives, or in the same poll. A signal or `launcher cancel` already there wins;
    while Slurm says it is ending the job (or the step died of SIGTERM), the signal is
    waited for a moment, and Slurm's word stands for it when it does not come."""

    def seen() -> str | None:
        if (found := reason()) is not None:
            return found
        req = run.read_cancel()
        return f"cancelled by `launcher cancel` ({req.by})" if req is not None else None

    if (found := seen()) is not None:
        return found
    ending = slurm_ending(job)
    if ending is None and not sigterm_exit:
        return None
    deadline = time.monotonic() + CANCEL_GRACE_S
    while time.monotonic() < deadline:
        time.sleep(0.1)  # the signal handler runs here
        if (found := seen()) is not None:
            return found
    if ending is None:
        return None
    return (f"cancelled (scancel, the time limit or preemption: Slurm is ending job {job}, "
            f"state {ending})")


# --- the run -----------------------------------------------------------------------------------


class Orchestrator:
    def __init__(self, run: rundir.RunDir, rendered: render.Rendered, backend: Backend,
                 book: Book, pool: EnginePool | None = None, visit: Turn | None = None):
        self.run = run
        self.book = book
        self.record = book.record
        self.plan = rendered.plan
        self.backend = backend
        self.planned = rendered.processes  # what the plan runs
        self.doc = rendered.doc
        self.processes = Processes(run, book, backend)  # those started: handles and record
        # a study's visit of this configuration: the points it measures on the engines it
        # holds, whether it is the first (preflight) and last (gate's verdict, summary), and
        # the configurations whose gate it runs (None: a run of its own, all of it at once)
        self.visit = visit
        if visit is not None and not visit.first:
            self.processes.earlier = dict(book.record.processes)
        # `pool`: a study in one allocation, its engines kept loaded across configurations
        self.lifetime = EngineLifetime(run, self.plan, book, self.processes, pool)
        self.cancel_reason: str | None = None
        self.teardown_budget_s: float = 60.0
        self.failed_points: list[str] = [  # those of its earlier visits
            f"{e.get('process')}: {e.get('reason')}" for e in run.events()
            if e.get("event") == "sweep_point" and e.get("status") == "failed"
        ] if visit is not None and not visit.first else []
        self.bench_failure: RunFailed | None = None  # a custom benchmark's non-zero exit
        self.watch = NodeWatch(list(self.plan.nodes), schedulers.of(self.plan.cluster).allocates)
        self.partial: dict[str, str] = {}  # node -> why its telemetry is partial (noted once)

    # --- bookkeeping ---
    def save(self) -> None:
        self.book.save()

    def stage(self, name: Stage) -> None:
        self.record.stage = name
        self.save()
        self.book.event("stage", stage=name)
        say(f"stage {name}")

    def node_loss(self, exited: list[Handle] | None = None) -> dict[str, str]:
        """{lost node: why}, empty when none was lost.
        Every node is asked when a process exited (a lost node's own sruns may not end for
        minutes; the first to exit is often a healthy process on another node)."""
        lost = self.watch.confirm() if exited is not None else dict(self.watch.lost)
        for h in self.processes.handles:
            if h.proc.node in lost:
                h.lost = True
        return lost

    def node_lost(self, lost: dict[str, str]) -> RunFailed:
        node = min(lost)
        detail = "; ".join(f"{n} ({why})" for n, why in sorted(lost.items()))
        gone = [h.proc.name for h in self.processes.handles if h.lost and h.proc.node == node]
        self.book.event("node_lost", node=node, detail=detail, processes=gone)
        return RunFailed(
            f"node lost: {detail}; with it went {', '.join(gone) or 'no process yet'}: check "
            f"the node (scontrol show node {node}) and submit again",
            culprit=node,
        )

    def check_processes(self, allowed: Callable[[Handle], bool] = lambda h: False) -> None:
        """Fail the run if a process that should be running has exited, a node is lost, or
        the run directory takes no more writes."""
        if self.cancel_reason is None and (req := self.run.read_cancel()) is not None:
            self.cancel_reason = f"cancelled by `launcher cancel` ({req.by})"
            say(self.cancel_reason + "; tearing down")
        if self.cancel_reason:
            raise Cancelled(self.cancel_reason)
        self.book.heartbeat()
        if self.book.failing_for() >= WRITE_FAIL_S:
            raise RunFailed(
                f"the run directory takes no writes: {self.book.last_error} for "
                f"{self.book.failing_for():.0f} s; the run stops since nothing more could be "
                f"recorded: free space or fix {self.run.path}'s filesystem and submit again",
                culprit=str(self.run.path),
            )
        self.note_partial_telemetry()
        lost = self.node_loss()
        if lost:
            raise self.node_lost(lost)
        exited = [
            h for h in self.processes.handles
            if h.exit_code() is not None and not h.stopped and not allowed(h)
        ]  # fmt: skip
        if not exited:
            return
        lost = self.node_loss(exited)
        if lost:
            raise self.node_lost(lost)
        for h in exited:
            code = h.exit_code()
            if h.proc.kind == Kind.AGENT:
                # Telemetry is best effort: losing an agent must not lose the benchmark, but
                # it is said, with its exit status, in status, events and the summary.
                h.stopped = h.died = True
                self.book.event("agent_died", process=h.proc.name, node=h.proc.node,
                                exit_code=code)
                self.book.note(
                    f"{h.proc.name} exited with status {code} at "
                    f"{time.strftime('%H:%M:%S')}: telemetry of {h.proc.node} stops there "
                    f"(see {h.proc.log})"
                )
                self.processes.write()
                continue
            if self.cancel_behind(sigterm_exit=code in (128 + signal.SIGTERM, -signal.SIGTERM)):
                raise Cancelled(self.cancel_reason)
            lines = tail(h.log_path, 15)
            self.book.event(
                "process_exited", process=h.proc.name, node=h.proc.node, exit_code=code,
                log_tail=lines,
            )  # fmt: skip
            raise RunFailed(
                f"{h.proc.name} on {h.proc.node} exited with status {code}; last lines of "
                f"{h.proc.log}:\n" + "\n".join(f"  | {x}" for x in lines),
                culprit=h.proc.name,
            )

    def cancel_behind(self, sigterm_exit: bool = False) -> bool:
        """Whether the failure just seen is a cancel's doing; cancel_reason then says whose.
        A cancel must read as cancelled, not as the failure of the step it interrupted."""
        found = cancel_behind(lambda: self.cancel_reason, self.run, self.plan.job_id,
                              sigterm_exit)
        if found is not None and self.cancel_reason is None:
            self.cancel_reason = found
            say(found + "; tearing down")
        return found is not None

    def note_partial_telemetry(self, final: bool = False) -> None:
        """A node whose agent cannot write its telemetry directory is said once in the run's
        notes (from the agent's exporter while it runs; from its agent.json at the end)."""
        found: dict[str, dict] = dict(self.watch.writes)
        if final:
            try:
                from launcher.telemetry.store import read_agent_info

                for node, info in read_agent_info(self.run.path).items():
                    w = info.get("writes") if isinstance(info, dict) else None
                    if isinstance(w, dict) and (w.get("write_errors") or w.get("dropped_rows")):
                        found[node] = {**w, "error": (w.get("last_error") or "")}
            except Exception:  # noqa: BLE001 - a note must never stop the end of a run
                pass
        for node, w in sorted(found.items()):
            if node in self.partial or not (w.get("failing") or w.get("dropped_rows")
                                            or (final and w.get("write_errors"))):
                continue
            agent = f"agent@{node}"
            error = w.get("error") or w.get("last_error") or "write error"
            why = (f"telemetry of {node} is partial: {agent} could not write "
                   f"{rundir.TELEMETRY}/{node} ({error.split(' (')[0]}) at "
                   f"{time.strftime('%H:%M:%S')}; it kept sampling and retrying, and counts "
                   f"what it could not write in agent.json and the last line of its log")
            self.partial[node] = why
            self.book.event("telemetry_partial", node=node, process=agent, error=error, **{
                k: w.get(k) for k in ("dropped_rows", "write_errors", "pending_rows")})
            self.book.note(why + f" (logs/{agent}.log)")

    def wait_ready(
        self, targets: list[tuple[Process, str]], timeout_s: float, what: str,
        probe: Callable[[str], tuple[bool, str]] | None = None,
    ) -> None:
        """Poll every target until ready (`probe`: vLLM's API by default), failing fast on a
        dead process or the timeout."""
        model = self.plan.recipe.model.name
        ready = probe or (lambda url: api_ready(url, model))
        pending = {p.name: (p, url) for p, url in targets}
        reasons: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        last_report = last_progress = 0.0
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(pending)))) as pool:
            while pending:
                self.check_processes()
                results = dict(
                    zip(
                        pending,
                        pool.map(lambda t: ready(t[1]), pending.values()),
                        strict=False,
                    )
                )
                for name, (ok, why) in results.items():
                    reasons[name] = why
                    if ok:
                        del pending[name]
                        self.book.event("ready", process=name)
                        self.processes.healthy.add(name)
                now = time.monotonic()
                if now - last_progress > PROGRESS_S:
                    last_progress = now
                    self.note_loading()
                if pending and now > deadline:
                    names = ", ".join(f"{n} on {pending[n][0].node} ({reasons.get(n)})" for n in sorted(pending))
                    raise RunFailed(
                        f"{what}: not healthy within {timeout_s:g} s: {names}\n"
                        + self.processes.tails(),
                        culprit=sorted(pending)[0],
                    )
                if pending and now - last_report > 10:
                    last_report = now
                    say(f"{what}: waiting for {', '.join(sorted(pending))}")
                if pending:
                    time.sleep(POLL_S)

    def publish_targets(self) -> None:
        """Prometheus file-SD: the healthy processes' /metrics (best effort: monitoring must
        never stop the benchmark)."""
        try:
            promsd.publish(self.run, self.doc, self.processes.healthy,
                           self.plan.cluster.prometheus_sd_dir)
        except OSError as e:
            self.book.note(f"could not write Prometheus targets: {e}")

    def note_loading(self) -> None:
        """Each engine's model-loading progress, from vLLM's own log lines (a 200 GB load
        takes most of the 40 minutes a user waits)."""
        # A fraction once seen is kept, and the whole tail read (tail() stops at 256 KB):
        # after the weights vLLM logs on (compile, KV cache, CUDA graphs), and more than 40
        # lines can pass between two looks.
        loading = dict(self.record.progress.get("loading") or {})
        for h in self.processes.handles:
            if h.proc.kind == Kind.ENGINE:
                frac = loading_fraction("\n".join(tail(h.log_path, 5000)))
                if frac is not None:
                    loading[h.proc.name] = round(frac, 3)
        if loading != self.record.progress.get("loading"):
            self.record.progress["loading"] = loading
            self.save()

    # --- stages ---
    def run_step(self, name: str, commands: list[list[str]]) -> bool:
        def cancelled() -> None:
            if self.cancel_reason or self.run.read_cancel() is not None:
                self.check_processes()  # raises Cancelled, naming whose

        return run_step(self.backend, self.run, self.book, name, commands, cancelled)

    def run_all(self) -> None:
        r = self.plan.recipe
        agents = [p for p in self.planned if p.kind == Kind.AGENT]
        engines = [p for p in self.planned if p.kind == Kind.ENGINE]
        router = next(p for p in self.planned if p.kind == Kind.ROUTER)
        self.stage(Stage.PREFLIGHT)
        if self.visit is None or self.visit.first:
            run_preflight(self.run, self.plan, self.doc, self.book, self.run_step)
        else:  # the same engines' image and nodes, checked in its first visit
            self.book.event("preflight_done_before", why="checked in this configuration's "
                            "first visit")
        self.lifetime.take_over(engines, self.first_point())  # before the agents: they read where logs stand
        if agents:
            self.stage(Stage.AGENTS)
            for p in agents:
                self.processes.start(p)
        self.stage(Stage.ENDPOINTS)
        store = next((p for p in self.planned if p.kind == Kind.STORE), None)
        if store is not None:
            self.start_store(store)
        self.lifetime.start(engines)
        self.stage(Stage.HEALTH)
        t0 = time.monotonic()
        self.wait_ready([(p, p.url) for p in engines if p.url], r.health.timeout_s, "endpoints")
        self.note_loading()
        self.book.event("endpoints_healthy", seconds=round(time.monotonic() - t0, 2))
        self.processes.healthy |= {p.name for p in agents
                                   if p.metrics_url and http_ok(p.metrics_url)[0]}
        # each node's agent is its heartbeat from here on (and says how its writes go); one
        # still starting counts too (engines kept loaded are healthy at once): its silence
        # has its node's slurmd knocked on, not ignored
        self.watch.start({p.node: p.metrics_url for p in agents if p.metrics_url})
        self.publish_targets()
        self.stage(Stage.ROUTER)
        self.processes.start(router)
        self.wait_ready([(router, router.url)], r.health.router_timeout_s, "router")
        self.wait_registered(router, r.health.router_timeout_s)
        if r.mode == "disagg" and r.health.pd_check:
            check_pd_path(self.plan, self.doc, self.book, self.processes.handles,
                          self.check_processes)
        self.record.serving, self.record.router_url = True, router.url
        self.save()
        self.publish_targets()
        self.book.event("serving", url=router.url)
        say(f"serving at {router.url}")
        if r.benchmark.enabled:
            self.stage(Stage.SWEEP)
            if r.benchmark.custom is not None:
                self.custom_benchmark()
            else:
                self.sweep()
        if r.hold_s:
            self.hold(r.hold_s)
        if r.accuracy.enabled:
            try:
                self.accuracy()
            except RunFailed as e:
                if self.bench_failure is None:
                    raise
                b = self.bench_failure  # both are said, the benchmark's first
                raise RunFailed(f"{b}\nand the {e}", b.culprit, stage=b.stage) from None
        if self.bench_failure is not None:
            raise self.bench_failure
        if self.failed_points and (self.visit is None or self.visit.last):
            raise RunFailed(
                f"{len(self.failed_points)} sweep point(s) failed: " + "; ".join(self.failed_points),
                stage=Stage.SWEEP)

    def start_store(self, proc: Process) -> None:
        """The KV store's master before the engines: its config written with this
        allocation's addresses, then its admin /health (a master that dies later ends the
        run, as any server does)."""
        rundir.write_atomic(self.run.path / kv_tiers.CONFIG_FILE,
                            kv_tiers.store_config_text(self.plan))
        self.processes.start(proc)
        self.wait_ready([(proc, proc.url)], self.plan.recipe.health.router_timeout_s,
                        "KV store master", probe=lambda url: http_ok(f"{url}/health"))
        say(f"KV store master up at {kv_tiers.master_address(self.plan)}")

    def wait_registered(self, router: Process, timeout_s: float) -> None:
        """The router lists every endpoint as a healthy worker of its role."""
        deadline = time.monotonic() + timeout_s
        while missing := preflight.unregistered(self.doc, router.url):
            self.check_processes()
            if time.monotonic() > deadline:
                raise RunFailed(
                    f"router: {', '.join(missing)} not registered as healthy workers within "
                    f"{timeout_s:g} s (GET {router.url}/workers)\n" + self.processes.tails(),
                    culprit=missing[0],
                )
            time.sleep(1.0)

    def run_client(self, proc: Process) -> int:
        """Run a client process (bench, accuracy) to its end while watching the servers."""
        h = self.processes.start(proc)
        while h.exit_code() is None:
            self.check_processes(allowed=lambda x: x is h)
            time.sleep(POLL_S)
        self.check_processes(allowed=lambda x: x is h)
        h.stopped = True  # a client that ended is done, not a failure of the deployment
        self.processes.write()
        code = h.exit_code() or 0
        if code and self.cancel_behind(sigterm_exit=code in (128 + signal.SIGTERM,
                                                              -signal.SIGTERM)):
            raise Cancelled(self.cancel_reason)
        return code

    def sweep(self) -> None:
        b = self.plan.recipe.benchmark
        points = self.points()
        planned, load_s = self.planned_points()
        self.book.event("sweep_planned", points=[
            {**p.to_json(), "concurrency": c} for c, p in planned.items()],
            restart_load_s=load_s)
        if b.slo is not None:
            self.slo_search(planned)
            return
        conc = [concurrency_of(p.result) for p in points]
        plan_s = [planned[c].seconds if c in planned else None for c in conc]
        loads = restart_loads([p for p in self.planned if p.kind == Kind.ENGINE], conc, load_s)
        took: list[float] = []
        for i, proc in enumerate(points):
            left = eta(plan_s[i:], plan_s[:i], took)
            left = None if left is None else left + sum(loads[i:])
            took.append(self.measure(proc, i + 1, len(points), plan_s[i], left)[1])
        self.record.progress["sweep"] = {**self.record.progress["sweep"], "seconds_left": 0}

    def measure(self, proc: Process, index: int, total: int | None, planned_s: float | None,
                left: float | None, **extra) -> tuple[str | None, float, dict | None]:
        """One sweep point: its engines as its concurrency needs them, its client to its
        end, its `sweep_point` event (with `extra`): (why it failed or None, its seconds,
        its verdict against benchmark.slo or None). A failing point of an SLO search is one
        of the search's, not a failure of the run."""
        b = self.plan.recipe.benchmark
        c = concurrency_of(proc.result)
        self.record.progress["sweep"] = {
            "index": index, "total": total, "concurrency": c,
            "started": time.time(), "seconds_left": round(left) if left else None,
            **({"search": extra["search"]} if "search" in extra else {}),
        }  # fmt: skip
        self.save()
        self.follow_concurrency(c)
        start = time.time()
        code = self.run_client(proc)
        end = time.time()
        result_file = self.run.path / proc.result
        failure = point_failure(result_file, code)
        if failure and self.cancel_behind():  # the deployment was ended under it
            raise Cancelled(self.cancel_reason)
        if b.driver == "vllm" and result_file.exists():
            write_window(result_file, end)
        verdict = None
        if b.slo is not None:
            from launcher.run import slo
            from launcher.run.results import load_result

            verdict = slo.judge(load_result(result_file) or {"max_concurrency": c},
                                b.slo.parsed(), failure)
            extra = {**extra, "slo": verdict.to_json()}
        self.book.event(
            "sweep_point", process=proc.name, status="failed" if failure else "ok",
            reason=failure, seconds=round(end - start, 2), start=round(start, 3),
            engines=self.engine_starts(), concurrency=c,
            planned_s=None if planned_s is None else round(planned_s, 1), **extra,
        )  # fmt: skip
        if failure and verdict is not None:
            say(f"{proc.name}: FAILED: {failure} (a failing point of the SLO search)")
        elif failure:
            self.failed_points.append(f"{proc.name}: {failure}")
            say(f"{proc.name}: FAILED: {failure}")
            if b.on_failure == "stop":
                raise RunFailed(f"sweep point {proc.name} failed: {failure}", proc.name,
                                stage=Stage.SWEEP)
        else:
            say(f"{proc.name}: done in {end - start:.1f} s"
                + (f"; SLO: {verdict.why}" if verdict is not None else ""))
        return failure, end - start, None if verdict is None else verdict.to_json()

    def slo_search(self, planned: dict[int, cost.PointTime]) -> None:
        """benchmark.slo: the highest concurrency meeting every limit, probing up from the
        first concurrency by doubling, then bisecting between the last passing and the first
        failing point (launcher.run.slo.next_concurrency), on the engines that run: only a
        point whose engine settings differ (args_from_concurrency) restarts them. A point
        that fails in any way is a failing point; the search goes on below it."""
        from launcher.run import slo

        b = self.plan.recipe.benchmark
        top, precision = b.slo_top, b.slo.precision
        tried: dict[int, bool] = {}
        failures: dict[int, str | None] = {}
        while (c := slo.next_concurrency(tried, b.concurrency[0], top, precision)) is not None:
            proc = self.point_process(c)
            phase = "probe" if slo.bracket(tried).failing is None else "bisect"
            failure, _, verdict = self.measure(
                proc, len(tried) + 1, None, planned[c].seconds if c in planned else None,
                None, search=phase)
            tried[c] = failure is None and bool(verdict and verdict["passed"])
            failures[c] = failure
        said = slo.outcome(tried, top, precision)
        self.book.event("slo_search", limits=b.slo.limits, precision=precision, top=top,
                        tried={str(k): v for k, v in sorted(tried.items())},
                        **slo.bracket(tried).__dict__, outcome=said)
        say(f"SLO search ({slo.text_of(b.slo.parsed())}): {said}")
        low = min(tried) if tried else None
        if not any(tried.values()) and low is not None and failures.get(low):
            # not even the lowest point served cleanly: the deployment, not the limits
            self.failed_points.append(f"bench-c{low}: {failures[low]}")
        self.record.progress["sweep"] = {**self.record.progress["sweep"], "seconds_left": 0}

    def point_process(self, c: int) -> Process:
        """The client run of the sweep point at concurrency `c`: the planned one, else one
        made as the plan makes them (a point the SLO search picks as it runs). The search
        itself knows no benchmark kind: it reads each point's verdict."""
        return next((p for p in self.planned if p.kind == Kind.BENCH
                     and concurrency_of(p.result) == c), None) \
            or render.bench_process(self.plan, c)

    def custom_benchmark(self) -> None:
        """benchmark.custom: its command to its end while the servers are watched; its
        output is its log, its outcome custom-bench.json. A non-zero exit fails the run at
        this stage, after the accuracy gate (as a failed sweep point does) unless
        benchmark.on_failure is stop."""
        proc = next(p for p in self.planned if p.kind == Kind.BENCH)
        command = self.plan.recipe.benchmark.custom.command
        start = time.time()
        code = self.run_client(proc)
        end = time.time()
        lines = tail(self.run.path / proc.log, TAIL_LINES * 2)
        rundir.write_json(self.run.path / proc.result, {
            "command": command, "exit_code": code, "started": start, "ended": end,
            "seconds": round(end - start, 2), "log": proc.log, "last_lines": lines})
        self.book.event("custom_benchmark", process=proc.name, exit_code=code,
                        seconds=round(end - start, 2))
        if not code:
            say(f"custom benchmark: done in {end - start:.1f} s")
            return
        shown = " ".join(command.split())
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        self.bench_failure = RunFailed(
            f"the custom benchmark (benchmark.custom: {shown}) exited with status {code}; "
            f"last lines of {proc.log}:\n" + "\n".join(f"  | {x}" for x in lines),
            culprit=proc.name, stage=Stage.SWEEP)
        say(f"custom benchmark: FAILED with exit status {code} (see {proc.log})")
        if self.plan.recipe.benchmark.on_failure == "stop":
            raise self.bench_failure

    def planned_points(self) -> tuple[dict[int, cost.PointTime], float]:
        """The plan's time of each sweep point (the dry-run's Cost line model), by
        concurrency, and its load time; none when it cannot be made here (then no ETA, the
        sweep goes on)."""
        try:
            c = cost.estimate(self.plan)
        except Exception as e:  # noqa: BLE001 - an estimate never stops a run
            say(f"no planned point times, so no ETA: {e}")
            return {}, 0.0
        return {p.concurrency: p for p in c.points}, c.load_expected_s

    def points(self) -> list[Process]:
        """The sweep's points this run (or this visit of a study's configuration) measures."""
        points = [p for p in self.planned if p.kind == Kind.BENCH]
        if self.visit is None or not self.visit.points:
            return points
        return [p for p in points if concurrency_of(p.result) in self.visit.points]

    def first_point(self) -> int | None:
        """The concurrency of the first point measured here: its engines start as it needs
        them (args_from_concurrency); None where nothing is measured."""
        b = self.plan.recipe.benchmark
        points = self.points() if b.sweeps else []
        return concurrency_of(points[0].result) if points else None

    def engine_starts(self) -> dict[str, dict]:
        """Each engine process a point ran on: when it started, and by which run (a study's
        configurations share them)."""
        return {h.proc.name: {"started": round(h.started or 0, 3),
                              "started_by": self.processes.started_by.get(h.proc.name,
                                                                          self.run.run_id)}
                for h in self.processes.handles if h.proc.kind == Kind.ENGINE}

    def follow_concurrency(self, c: int) -> None:
        """Before a sweep point: restart the endpoints whose command line at this
        concurrency differs from the one running (args_from_concurrency), whole endpoints,
        while the others stay loaded; then health, the router's registration and the P->D
        path again, so no point is measured on a half-started deployment."""
        eps = self.lifetime.changed_at(c)
        if not eps:
            return
        r = self.plan.recipe
        say(f"concurrency {c}: restarting {', '.join(eps)} with its command line from "
            f"{self.lifetime.sources_at(eps, c)}; the other engines stay loaded")
        t0 = time.monotonic()
        self.stage(Stage.RESTART)
        started = self.lifetime.restart(eps, c)
        self.wait_ready([(h.proc, h.proc.url) for h in started if h.proc.url],
                        r.health.timeout_s, f"endpoints restarted for concurrency {c}")
        router = next(p for p in self.planned if p.kind == Kind.ROUTER)
        self.wait_registered(router, r.health.router_timeout_s)
        if r.mode == "disagg" and r.health.pd_check:
            check_pd_path(self.plan, self.doc, self.book, self.processes.handles,
                          self.check_processes)
        seconds = round(time.monotonic() - t0, 2)
        self.book.event("engines_restarted", concurrency=c, endpoints=eps, seconds=seconds,
                        processes=[h.proc.name for h in started])
        say(f"concurrency {c}: {', '.join(eps)} healthy again after {seconds:g} s")
        self.stage(Stage.SWEEP)

    def hold(self, seconds: float) -> None:
        self.stage(Stage.HOLD)
        say(f"holding the deployment up for {seconds:g} s (hold_s)")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check_processes()
            time.sleep(POLL_S)

    def accuracy(self) -> None:
        """The gate: run here (a run of its own; in a study, the visit the plan of turns
        gives it, once per engine set, recorded for every configuration it covers), and
        judged in the configuration's last visit."""
        a = self.plan.recipe.accuracy
        proc = next(p for p in self.planned if p.kind == Kind.ACCURACY)
        own = self.run.path / proc.result
        v = self.visit
        here = v is None or bool(v.gate) or (v.last and not own.exists())
        if here:
            self.stage(Stage.ACCURACY)
            code = self.run_client(proc)
            result = rundir.read_json(own)
            if (not isinstance(result, dict) or result.get("failure_reason")) \
                    and self.cancel_behind():
                raise Cancelled(self.cancel_reason)
            if not isinstance(result, dict):
                raise RunFailed(
                    f"the accuracy gate wrote no result (exit status {code}); see {proc.log}",
                    culprit=proc.name,
                )
            if v is not None:
                self.record_gate(proc, result)
        if v is not None and not v.last:
            return
        result = rundir.read_json(own)
        if not isinstance(result, dict):  # pragma: no cover - written above or by its gate
            raise RunFailed(f"the accuracy gate wrote no result; see {proc.log}", proc.name)
        score = result.get("accuracy")
        self.record.accuracy, self.record.accuracy_passed = score, bool(result.get("passed"))
        self.save()
        self.book.event(
            "accuracy", score=score, threshold=a.threshold, passed=result.get("passed"),
            **({"gate_run": result["gate_run"]} if result.get("gate_run") else {}),
        )
        if result.get("failure_reason"):
            raise RunFailed(f"accuracy gate failed: {result['failure_reason']}", proc.name)
        what = (f"{a.task} {a.metric}" if a.harness == "lm-eval" else
                f"{a.task} (vllm harness{f', mean of {a.repeat} runs' if a.repeat > 1 else ''})")
        by = (f", the gate {result['gate_run']} ran on the same engines"
              if result.get("gate_run") not in (None, self.run.run_id) else "")
        say(f"accuracy {what}: {score:.3f} (threshold {a.threshold:g}{by})")
        if not result.get("passed"):
            raise RunFailed(
                f"accuracy gate failed: {what} scored {score:.3f}, below the "
                f"threshold {a.threshold:g}{by} (the sweep's results are kept and labelled)",
                culprit=proc.name,
            )

    def record_gate(self, proc: Process, result: dict) -> None:
        """A study's gate, run here on engines other configurations use as they are: its
        result written into each configuration it covers (`gate_run` names where it ran)."""
        v = self.visit
        doc = {**result, "gate_run": self.run.run_id,
               "gate_covers": list(v.gate or (self.run.run_id,))}
        for run_id in v.gate or (self.run.run_id,):
            dest = self.run.path.parent / run_id / proc.result
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                rundir.write_json(dest, doc)
            except OSError as e:
                self.book.note(f"could not record the accuracy gate in {dest}: {e}")
        if v.gate and self.run.run_id not in v.gate:  # its own gate runs on other engines
            (self.run.path / proc.result).unlink(missing_ok=True)
        self.book.event("accuracy_gate", covers=list(v.gate or (self.run.run_id,)))

    def report(self, state: State, error: str | None) -> None:
        try:
            from launcher.run import figures
            from launcher.telemetry import signals

            summary = figures.summary(self.run.path, state, error, notes=self.record.notes,
                                      log_signals=signals.scan_run(self.run.path, self.doc))
            rundir.write_json(self.run.summary, summary)
            print(figures.summary_table(summary), flush=True)
        except Exception as e:  # a report problem must not hide the run's own outcome
            self.book.note(f"could not write the summary: {e!r}")

    def teardown(self, keep_engines: bool = False) -> None:
        """Every process, in order (clients, router, engines, agents last), inside the
        budget Slurm leaves; nothing here can raise. `keep_engines`: a study's allocation
        goes on, so healthy engines stay loaded for its next configuration."""
        self.stage(Stage.TEARDOWN)
        self.lifetime.leave_loaded(keep_engines)
        try:
            promsd.withdraw(self.run, self.plan.cluster.prometheus_sd_dir)
        except OSError as e:
            self.book.note(f"could not remove Prometheus targets: {e}")
        budget = self.teardown_budget_s
        share = {Kind.ENGINE: 0.45, Kind.AGENT: 0.2, Kind.ROUTER: 0.15, Kind.BENCH: 0.2}
        try:  # the last words of the agents that are still there, before they stop
            self.watch.stop()
            # the servers' counters as the run left them: the agents' periodic beat may come
            # only after the servers are gone (a gate of a few questions ends within a beat)
            alive = [h.proc.node for h in self.processes.handles
                     if h.proc.kind == Kind.AGENT and not (h.died or h.lost)]
            missed = self.watch.sample(alive, timeout=min(5.0, max(1.0, 0.1 * budget)))
            if missed:
                self.book.note(f"no last sample from the agents of {', '.join(missed)}: "
                               "their servers' counters end up to one beat early")
            self.watch.beat(knock_too=False, timeout=1.0)
            self.note_partial_telemetry()
        except Exception as e:  # noqa: BLE001
            say(f"warning: could not ask the agents how their writes went: {e!r}")
        # Processes of a lost node: their srun cannot reach them; kill it and move on (Slurm
        # ends the steps when it ends the job).
        lost = [h for h in self.processes.handles if h.lost]
        if lost:
            try:
                self.backend.abandon(lost)
            except Exception as e:  # noqa: BLE001
                say(f"warning: abandoning {[h.proc.name for h in lost]} failed: {e!r}")
        self.processes.mark_stops()
        left_loaded = self.processes.left_loaded
        for kinds in TEARDOWN_ORDER:
            group = [h for h in self.processes.handles if h.proc.kind in kinds and not h.lost
                     and h.proc.name not in left_loaded]
            # the agents take one last sample when told to stop (the servers are gone by then)
            grace = max(1.0, budget * share.get(kinds[0], 0.2))
            try:
                # a study's next configuration starts sruns right after: let killed ones'
                # steps end first; a run's last teardown keeps to its budget instead
                self.backend.stop(group, grace_s=grace, gentle=not lost, settle=keep_engines)
            except Exception as e:  # a stop that fails must not leave the rest running
                say(f"warning: stopping {[h.proc.name for h in group]} failed: {e!r}")
        for h in self.processes.handles:
            if h.proc.name in left_loaded:
                self.book.event("process_kept_loaded", process=h.proc.name)
                continue
            self.book.event("process_stopped", process=h.proc.name, exit_code=h.exit_code(),
                            **({"lost": True} if h.lost else {}))
        self.lifetime.drop_stopped()
        self.processes.write()


def run_step(backend: Backend, run: rundir.RunDir, book: Book, name: str,
             commands: list[list[str]], cancelled: Callable[[], None]) -> bool:
    """A preflight step to its end, its output in logs/<name>.log; whether every command of
    it exited 0. `cancelled` raises when the run is being cancelled; the step's processes are
    killed on any way out but their own end, a hung one (a node's stuck mount) included."""
    t0 = time.monotonic()
    # one command per node on the local profile: together, as srun runs them on Slurm
    popens = [backend.spawn(cmd, run.log(name)) for cmd in commands]
    try:
        while any(p.poll() is None for p in popens):
            cancelled()
            if time.monotonic() - t0 > STEP_TIMEOUT_S:
                raise RunFailed(f"{name} did not finish in {STEP_TIMEOUT_S:g} s; see "
                                f"logs/{name}.log")
            time.sleep(POLL_S)
    finally:
        for p in popens:
            if p.poll() is None:
                backend.kill(p)
    ok = all(p.returncode == 0 for p in popens)
    book.event("preflight_step", step=name, ok=ok, seconds=round(time.monotonic() - t0, 2))
    return ok


def restart_loads(engines: list[Process], points: list[int], load_s: float) -> list[float]:
    """Per point in sweep order, the load before it: `load_s` where an engine's command line
    changes from the point before (args_from_concurrency restarts it), else 0."""
    return [0.0] + [load_s if any(e.argv_at(b) != e.argv_at(a) for e in engines) else 0.0
                    for a, b in zip(points, points[1:], strict=False)]


def eta(ahead: list[float | None], behind: list[float | None], took: list[float],
        ) -> float | None:
    """Seconds left in the sweep at the start of a point: the planned time of the points
    ahead (this one included), scaled by measured / planned of the points done (1 before
    any); None where a point has no planned time."""
    if not ahead or any(p is None for p in ahead + behind):
        return None
    planned_done = sum(behind)
    ratio = sum(took) / planned_done if took and planned_done > 0 else 1.0
    return ratio * sum(ahead)


def write_window(result_file: Path, ended: float) -> None:
    """`vllm bench serve` records its measured `duration` but no start: the window ends when
    it wrote its file and starts `duration` before, so the client's start-up (and container
    creation) stays outside it."""
    from launcher.run.results import WINDOW_SUFFIX, load_result

    res = load_result(result_file) or {}
    try:
        end = min(result_file.stat().st_mtime, ended)
    except OSError:
        end = ended
    duration = res.get("duration")
    if isinstance(duration, int | float) and duration > 0:
        rundir.write_json(
            result_file.with_name(result_file.stem + WINDOW_SUFFIX),
            {"window_start": end - duration, "window_end": end},
        )
    # --save-detailed was for the lengths sent: the per-token arrays go (they grow with
    # requests x output tokens), every request's input and output length stays
    if res.get("itls") is not None or res.get("generated_texts") is not None:
        raw = rundir.read_json(result_file)
        if isinstance(raw, dict):
            for key in ("itls", "generated_texts", "ttfts", "start_times"):
                raw.pop(key, None)
            rundir.write_json(result_file, raw)


# --- signals ---------------------------------------------------------------------------------


REASONS = {
    signal.SIGTERM: "cancelled (SIGTERM: scancel or shutdown)",
    signal.SIGINT: "cancelled (Ctrl-C)",
    signal.SIGUSR2: "stopped: the Slurm time limit is near",
}


class Signals:
    """The first SIGTERM/SIGINT/USR2 becomes the run's cancel reason and the teardown's
    budget: what Slurm leaves before it kills (KillWait after scancel, the signal lead
    before the time limit)."""

    def __init__(self, kill_wait_s: float, lead_s: float):
        self.reason: str | None = None
        self.budget_s: float | None = None
        self.orch: Orchestrator | None = None
        self.kill_wait_s, self.lead_s = kill_wait_s, lead_s
        for sig in REASONS:
            signal.signal(sig, self.handler)

    @classmethod
    def for_recipe(cls, recipe: Path) -> Signals:
        """With the limits of the recipe's Slurm settings and its cluster profile (KillWait,
        the signal lead); Slurm's defaults when either cannot be read."""
        try:
            r = recipe_mod.load(str(recipe))
            return cls(cluster_mod.load(r.cluster).kill_wait_s, r.slurm.signal_lead_s)
        except UserError:
            return cls(30.0, 120.0)

    def handler(self, signum, _frame) -> None:
        if self.reason is not None:
            return
        self.reason = REASONS.get(signum, f"signal {signum}")
        limit = self.lead_s if signum == signal.SIGUSR2 else self.kill_wait_s
        self.budget_s = max(3.0, limit * 0.6)
        say(self.reason + "; tearing down")
        if self.orch is not None:
            self.orch.cancel_reason = self.reason
            self.orch.teardown_budget_s = self.budget_s

    @staticmethod
    def ignore() -> None:
        """A second signal during teardown must not abort the teardown itself."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


@dataclasses.dataclass
class InStudy:
    """What a configuration of a study run in one allocation shares with the others."""

    pool: EnginePool
    signals: Signals
    port_span: int  # the largest configuration's: every configuration plans the same ports
    study_dir: str  # what container steps mount for the run directory (see Plan.mount_dir)
    more: bool = True  # configurations follow: healthy engines stay loaded at the end
    # nodes lost in this configuration -> whether the study goes on without them
    lose: Callable[[dict[str, str], str], bool] = lambda lost, run: False
    visit: Turn | None = None  # this configuration's visit (its points, first, last, gate)


def starting_record(run: rundir.RunDir, later: bool) -> RunRecord:
    """A run's record as it starts; a later visit of a study's configuration goes on with
    the one its first visit began."""
    record = RunRecord(
        state=State.RUNNING, stage=Stage.PLAN, started=time.time(), host=socket.gethostname(),
        orchestrator_pid=os.getpid(), slurm_job_id=os.environ.get("SLURM_JOB_ID"),
    )  # fmt: skip
    if later:
        record = run.read_record() or record
        record.stage, record.orchestrator_pid = Stage.PLAN, os.getpid()
    return record


def run(run_dir: Path, shared: InStudy | None = None) -> int:
    """Run a prepared run directory to its end. Returns 0 only if the run succeeded."""
    run = rundir.RunDir(Path(run_dir))
    if not run.recipe.exists():
        raise UserError(f"{run_dir} is not a prepared run directory (no recipe.yaml)")
    visit = shared.visit if shared is not None else None
    later = visit is not None and not visit.first and run.read_record() is not None
    if not later:
        refuse_second_attempt(run)
    if shared is None:  # a study's allocation was checked for its largest configuration
        prepared = rundir.read_json(run.plan)
        prepared = prepared if isinstance(prepared, dict) else {}
        check_allocation(run.recipe, len(prepared.get("nodes") or []),
                         prepared.get("runtime"), "this run")
    book = Book(run, starting_record(run, later))
    record = book.record
    book.save()
    if visit is not None:
        book.event("visit_start", points=list(visit.points), first=visit.first, last=visit.last)
    book.make_reserve()
    signals = shared.signals if shared is not None else Signals.for_recipe(run.recipe)
    raise_open_files(65536)

    def early_step(name: str, commands: list[list[str]]) -> None:
        """A step before the orchestrator exists (the host check): cancellable by signal."""
        def cancelled() -> None:
            if signals.reason:
                raise Cancelled(signals.reason)

        run_step(Backend.for_steps(run.path), run, book, name, commands, cancelled)

    def finish_early(state: State, error: str, culprit: str | None = None) -> None:
        record.state, record.error, record.culprit = state, error, culprit
        record.failed_stage, record.ended = record.stage, time.time()
        book.event(str(state), error=error)  # before the final state: readers wait for that
        book.save()
        say(f"run {state}: {error}")

    try:
        rendered = plan_here(run, book, early_step,
                             study_span=shared.port_span if shared else None,
                             mount_dir=shared.study_dir if shared else None)
    except UserError as e:
        finish_early(State.FAILED, str(e))
        book.drop_reserve()
        raise
    except OSError as e:  # plan.json or commands.sh could not be written: nothing started yet
        book.drop_reserve()
        finish_early(State.FAILED, f"could not write the run directory: {e.strerror or e} "
                                   f"({e.filename or run.path}); free space or fix its "
                                   "filesystem and submit again", str(run.path))
        return 1
    except RunFailed as e:
        if (why := cancel_behind(lambda: signals.reason, run, record.slurm_job_id)) is not None:
            book.event("interrupted", by=why, failure=str(e))
            finish_early(State.CANCELLED, why)
        else:
            finish_early(State.FAILED, str(e), e.culprit)
        book.drop_reserve()
        return 1
    except Cancelled as e:
        finish_early(State.CANCELLED, str(e))
        book.drop_reserve()
        return 1
    plan = rendered.plan
    busy = busy_ports(plan, shared.pool.ports() if shared else frozenset())
    if busy:
        error = (
            f"ports in use on this host: {', '.join(busy[:6])}"
            + (f" and {len(busy) - 6} more" if len(busy) > 6 else "")
            + ": is another run still up? (python -m launcher runs), or "
            + other_ports(plan)
        )
        finish_early(State.FAILED, error)
        book.drop_reserve()
        raise UserError(error)
    raise_open_files(plan.cluster.nofile)
    orch = Orchestrator(run, rendered, make_backend(plan, run.path), book,
                        pool=shared.pool if shared else None, visit=visit)
    signals.orch = orch
    if signals.reason:
        orch.cancel_reason, orch.teardown_budget_s = signals.reason, signals.budget_s or 30
    if plan.recipe.engine_kind.banner:
        say(plan.recipe.engine_kind.banner)
    state, error, culprit = State.SUCCEEDED, None, None
    failed_stage = None  # a failure that names its stage (the benchmark's, after the gate)
    try:
        orch.run_all()
    except (RunFailed, Cancelled) as e:
        state, error, culprit = State.FAILED, str(e), getattr(e, "culprit", None)
        failed_stage = getattr(e, "stage", None)
        if isinstance(e, RunFailed) and not orch.watch.lost and orch.cancel_behind():
            # a step the cancel ended, seen before the cancel itself (docs/contracts.md)
            book.event("interrupted", by=orch.cancel_reason, failure=error)
            e = Cancelled(orch.cancel_reason)
        if isinstance(e, Cancelled):
            state, error, culprit = State.CANCELLED, str(e), None
            lost = orch.node_loss([])
            if lost:  # Slurm ends a job whose node died with SIGTERM: say what really happened
                failed = orch.node_lost(lost)
                state, error, culprit = State.FAILED, str(failed), failed.culprit
    except Exception as e:  # an orchestrator bug still tears down and says so
        state, error = State.FAILED, f"orchestrator error: {e!r}"
        try:
            import traceback

            traceback.print_exc()
        except (OSError, ValueError):
            pass
    finally:
        # Teardown first, whatever happened; what follows is bookkeeping, best effort.
        # a lost node ends a study only when Slurm will not keep the job on the others;
        # asked before teardown, well inside the SlurmdTimeout that ends the job otherwise
        lost = orch.node_loss([]) if shared is not None and state != State.SUCCEEDED else {}
        ending = shared is None or not shared.more or bool(signals.reason) or bool(
            lost and not shared.lose(lost, run.run_id))
        if ending:
            Signals.ignore()
        if state != State.SUCCEEDED:
            record.failed_stage = (failed_stage if state == State.FAILED and failed_stage
                                   else record.stage)
        orch.teardown(keep_engines=not ending)
        book.drop_reserve()  # room for the record of the end, on a disk that filled up
        orch.note_partial_telemetry(final=True)
        if visit is not None and not visit.last and state == State.SUCCEEDED:
            pass  # its summary is written in its last visit
        elif state != State.CANCELLED or plan.recipe.benchmark.enabled:
            orch.stage(Stage.REPORT)
            orch.report(state, error)
    if visit is not None and not visit.last and state == State.SUCCEEDED:
        return visit_done(book, visit)
    if error:
        say(f"run {state}: {error}")
        book.event(str(state), error=error)
    else:
        book.event("succeeded")
        say("run succeeded")
    record.state, record.error, record.culprit, record.ended = state, error, culprit, time.time()
    record.stage, record.serving = None, False
    if not book.save():
        say(f"could not record the end of the run in {run.state_file} ({book.last_error}): "
            f"`python -m launcher status` will say what Slurm or the process table knows")
    say(f"run directory: {run.path}")
    return 0 if state == State.SUCCEEDED else 1


def visit_done(book: Book, visit: Turn) -> int:
    """A study's configuration whose points of this visit are measured: it stays running
    (no summary yet) and goes on in a later visit."""
    book.record.stage, book.record.serving = None, False
    book.event("visit_end", points=list(visit.points))
    book.save()
    say(f"visit done: concurrency {', '.join(map(str, visit.points))}; this configuration "
        "goes on in a later visit")
    return 0


def refuse_second_attempt(run: rundir.RunDir) -> None:
    """A run directory is written by one attempt only: a requeued job (or a second `launcher
    run`) must not rewrite an earlier attempt's plan, logs and results."""
    prior = run.read_record()
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    if prior is None and restarts in ("", "0"):
        return
    what = (f"an earlier attempt (state {prior.state}, started "
            f"{time.strftime('%H:%M:%S', time.localtime(prior.started or 0))}"
            + (f", Slurm job {prior.slurm_job_id}" if prior.slurm_job_id else "") + ")"
            if prior else f"Slurm's attempt {restarts} of this job (a requeue)")
    raise UserError(
        f"{run.path} already holds {what}: a run directory is written by one attempt only, so "
        f"this one stops without touching it; submit the recipe again for a new run"
    )
