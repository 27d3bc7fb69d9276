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
made for them), `probes` (this host's ports, HTTP health), `record` (run.json, events),
`watch` (node loss), `backends` (how a process is started and stopped).
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
from launcher.control.pool import STOP_GRACE_S, EnginePool
from launcher.control.probes import api_ready, busy_ports, http_ok
from launcher.control.record import Book, say
from launcher.control.watch import NodeWatch
from launcher.errors import Cancelled, RunFailed, UserError
from launcher.planning import containers, render, schedulers
from launcher.planning.plan import Plan
from launcher.planning.study import best_start, changed
from launcher.planning.study import signatures as study_signatures
from launcher.run import rundir
from launcher.run.plandoc import Process
from launcher.run.results import point_failure
from launcher.run.rundir import ProcessRecord, RunRecord, concurrency_of, tail
from launcher.run.vocab import TEARDOWN_ORDER, Kind, Role, Stage, State
from launcher.schema import cluster as cluster_mod
from launcher.schema import recipe as recipe_mod
from launcher.telemetry import promsd
from launcher.telemetry.statslog import loading_fraction, ucx_transports

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
                 book: Book, pool: EnginePool | None = None):
        self.run = run
        self.book = book
        self.record = book.record
        self.plan = rendered.plan
        self.backend = backend
        self.handles: list[Handle] = []
        self.procs = rendered.processes
        self.doc = rendered.doc
        self.healthy: set[str] = set()
        self.cancel_reason: str | None = None
        self.teardown_budget_s: float = 60.0
        self.failed_points: list[str] = []
        self.watch = NodeWatch(list(self.plan.nodes), schedulers.of(self.plan.cluster).allocates)
        self.partial: dict[str, str] = {}  # node -> why its telemetry is partial (noted once)
        self.image_digest: str | None = None  # the registry's, from the image step
        self.stop_marks: dict[str, int] = {}  # process -> its log's size when told to stop
        # a study in one allocation: the engines kept loaded across its configurations
        self.pool = pool
        self.kept_from: dict[str, str] = {}  # process -> the run that started it
        self.start_marks: dict[str, int] = {}  # kept process -> its log's size here at start
        self.left_loaded: set[str] = set()  # processes left running for the next configuration
        self.descending = False  # the sweep from its top point down (Orchestrator.direction)

    # --- bookkeeping ---
    def save(self) -> None:
        self.book.save()

    def stage(self, name: Stage) -> None:
        self.record.stage = name
        self.save()
        self.book.event("stage", stage=name)
        say(f"stage {name}")

    def start(self, proc: Process, argv: list[str] | None = None) -> Handle:
        missing = [n for n in proc.env_from_host if n not in os.environ]
        if missing:
            self.book.event("warning", process=proc.name, message=f"not set here: {missing}")
        h = self.backend.start(proc, argv)
        self.handles.append(h)
        self.book.event("process_started", process=proc.name, node=proc.node, pid=h.pid)
        self._write_processes()
        return h

    def _write_processes(self) -> None:
        self.record.processes = {
            h.proc.name: ProcessRecord(
                node=h.proc.node, kind=h.proc.kind, pid=h.pid, started=h.started,
                exit_code=h.exit_code(), stopped=h.stopped and not h.died, log=h.proc.log,
                lost=h.lost, log_bytes_at_stop=self.stop_marks.get(h.proc.name),
                started_by=self.kept_from.get(h.proc.name),
                log_bytes_at_start=self.start_marks.get(h.proc.name),
                kept=h.proc.name in self.left_loaded,
            )  # fmt: skip
            for h in self.handles
        }
        self.save()

    def tails(self, kinds: tuple[Kind, ...] = (Kind.ENGINE, Kind.ROUTER)) -> str:
        """The last lines of every process of these kinds on every node: where a hung NCCL
        or MNNVL initialisation on a headless rank shows, not only on the head."""
        out = []
        for h in self.handles:
            if h.proc.kind in kinds:
                lines = tail(h.log_path, TAIL_LINES)
                out.append(
                    f"last lines of {h.proc.log} ({h.proc.node}):\n"
                    + ("\n".join(f"  | {x}" for x in lines) or "  | (empty)")
                )
        return "\n".join(out)

    def node_loss(self, exited: list[Handle] | None = None) -> dict[str, str]:
        """{lost node: why}, empty when none was lost.
        Every node is asked when a process exited (a lost node's own sruns may not end for
        minutes; the first to exit is often a healthy process on another node)."""
        lost = self.watch.confirm() if exited is not None else dict(self.watch.lost)
        for h in self.handles:
            if h.proc.node in lost:
                h.lost = True
        return lost

    def node_lost(self, lost: dict[str, str]) -> RunFailed:
        node = min(lost)
        detail = "; ".join(f"{n} ({why})" for n, why in sorted(lost.items()))
        gone = [h.proc.name for h in self.handles if h.lost and h.proc.node == node]
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
            h for h in self.handles
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
                self._write_processes()
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
        self, targets: list[tuple[Process, str]], timeout_s: float, what: str
    ) -> None:
        """Poll every target until ready, failing fast on a dead process or the timeout."""
        model = self.plan.recipe.model.name
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
                        pool.map(lambda t: api_ready(t[1], model), pending.values()),
                        strict=False,
                    )
                )
                for name, (ok, why) in results.items():
                    reasons[name] = why
                    if ok:
                        del pending[name]
                        self.book.event("ready", process=name)
                        self.healthy.add(name)
                now = time.monotonic()
                if now - last_progress > PROGRESS_S:
                    last_progress = now
                    self.note_loading()
                if pending and now > deadline:
                    names = ", ".join(f"{n} on {pending[n][0].node} ({reasons.get(n)})" for n in sorted(pending))
                    raise RunFailed(
                        f"{what}: not healthy within {timeout_s:g} s: {names}\n" + self.tails(),
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
            promsd.publish(self.run, self.doc, self.healthy, self.plan.cluster.prometheus_sd_dir)
        except OSError as e:
            self.book.note(f"could not write Prometheus targets: {e}")

    def note_loading(self) -> None:
        """Each engine's model-loading progress, from vLLM's own log lines (a 200 GB load
        takes most of the 40 minutes a user waits)."""
        # A fraction once seen is kept, and the whole tail read (tail() stops at 256 KB):
        # after the weights vLLM logs on (compile, KV cache, CUDA graphs), and more than 40
        # lines can pass between two looks.
        loading = dict(self.record.progress.get("loading") or {})
        for h in self.handles:
            if h.proc.kind == Kind.ENGINE:
                frac = loading_fraction("\n".join(tail(h.log_path, 5000)))
                if frac is not None:
                    loading[h.proc.name] = round(frac, 3)
        if loading != self.record.progress.get("loading"):
            self.record.progress["loading"] = loading
            self.save()

    # --- stages ---
    def run_step(self, name: str, commands: list[list[str]]) -> bool:
        """A preflight step to its end (cancellable), its output in logs/<name>.log; whether
        every command of it exited 0."""
        log = self.run.log(name)
        # one command per node on the local profile: together, as srun runs them on Slurm
        popens = [self.backend.spawn(cmd, log) for cmd in commands]
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while any(p.poll() is None for p in popens):
            if self.cancel_reason or self.run.read_cancel() is not None:
                for p in popens:
                    self.backend.kill(p)
                self.check_processes()
            if time.monotonic() > deadline:
                for p in popens:
                    self.backend.kill(p)
                raise RunFailed(f"{name} did not finish in {STEP_TIMEOUT_S:g} s; see {log}")
            time.sleep(POLL_S)
        return all(p.returncode == 0 for p in popens)

    def preflight(self) -> None:
        """Inside the engine's container on every node, before any model loads."""
        t0 = time.monotonic()
        unexplained = None  # the container check's log tail when it failed for no known cause
        for name, commands in render.check_steps(self.plan)[1:]:
            if not self.run_step(name, commands):
                log = self.run.log(name)
                text = log.read_text(errors="replace") if log.is_file() else ""
                if problems := preflight.step_failures(name, text, self.plan):
                    raise RunFailed("preflight: " + "; ".join(problems),
                                    culprit=problems[0].culprit)
                if name.startswith("stage-"):
                    raise RunFailed(f"preflight: {name} failed on {self.plan.nodes[0]}: "
                                    + " | ".join(tail(log, 5)), culprit=self.plan.nodes[0])
                if name == "preflight-container":
                    unexplained = " | ".join(tail(log, 3)) or "its log is empty"
            elif name == "stage-image":
                self.note_image(self.run.log(name))
        self.image_digest = self.image_digest or self.tag_digest()
        facts = preflight.read_facts(self.run.path, list(self.plan.nodes), "container")
        hosts = preflight.read_facts(self.run.path, list(self.plan.nodes), "host")
        problems = preflight.judge_container(
            self.plan, self.doc, facts, self.plan.recipe.engine_version, hosts, unexplained)
        if problems:
            raise RunFailed("preflight: " + "; ".join(problems), culprit=problems[0].culprit)
        took = time.monotonic() - t0
        self.record.identity = identity(self.plan, facts, hosts, self.image_digest)
        self.save()
        self.book.event("preflight_ok", seconds=round(took, 2))
        say(f"preflight passed on {len(self.plan.nodes)} node(s) in {took:.1f} s")

    def tag_digest(self) -> str | None:
        """Without an image cache pyxis pulls on each node and nobody reports a digest: ask
        the registry what the tag names now, just before the engines pull it."""
        ref = containers.registry_image(self.plan)
        if (ref is None or "@sha256:" in ref or not containers.of(self.plan.cluster).isolated
                or containers.cached_image(self.plan)):
            return None
        from launcher.control import image

        return image.registry_digest(containers.enroot_uri(ref), timeout=5.0)

    def note_image(self, log: Path) -> None:
        """The image step's one JSON line (imported, or found in the cache) as an event."""
        import json

        for line in reversed(tail(log, 20)):
            if line.startswith("{"):
                try:
                    doc = json.loads(line)
                except ValueError:
                    return
                self.image_digest = doc.get("digest")
                self.book.event("image", **doc)
                return

    def run_all(self) -> None:
        r = self.plan.recipe
        agents = [p for p in self.procs if p.kind == Kind.AGENT]
        engines = [p for p in self.procs if p.kind == Kind.ENGINE]
        router = next(p for p in self.procs if p.kind == Kind.ROUTER)
        self.stage(Stage.PREFLIGHT)
        self.preflight()
        want = self.signatures(engines)
        want = self.direction(engines, want)
        kept = self.take_over(engines, want)  # before the agents: they read where logs stand
        if agents:
            self.stage(Stage.AGENTS)
            for p in agents:
                self.start(p)
        self.stage(Stage.ENDPOINTS)
        self.start_engines(engines, kept, want)
        self.stage(Stage.HEALTH)
        t0 = time.monotonic()
        self.wait_ready([(p, p.url) for p in engines if p.url], r.health.timeout_s, "endpoints")
        self.note_loading()
        self.book.event("endpoints_healthy", seconds=round(time.monotonic() - t0, 2))
        self.healthy |= {p.name for p in agents if p.metrics_url and http_ok(p.metrics_url)[0]}
        # each node's agent is its heartbeat from here on (and says how its writes go); one
        # still starting counts too (engines kept loaded are healthy at once): its silence
        # has its node's slurmd knocked on, not ignored
        self.watch.start({p.node: p.metrics_url for p in agents if p.metrics_url})
        self.publish_targets()
        self.stage(Stage.ROUTER)
        self.start(router)
        self.wait_ready([(router, router.url)], r.health.router_timeout_s, "router")
        self.wait_registered(router, r.health.router_timeout_s)
        if r.mode == "disagg" and r.health.pd_check:
            self.check_pd_path()
        self.record.serving, self.record.router_url = True, router.url
        self.save()
        self.publish_targets()
        self.book.event("serving", url=router.url)
        say(f"serving at {router.url}")
        if r.benchmark.enabled:
            self.stage(Stage.SWEEP)
            self.sweep()
        if r.hold_s:
            self.hold(r.hold_s)
        if r.accuracy.enabled:
            self.stage(Stage.ACCURACY)
            self.accuracy()
        if self.failed_points:
            raise RunFailed(
                f"{len(self.failed_points)} sweep point(s) failed: " + "; ".join(self.failed_points)
            )

    def signatures(self, engines: list[Process], at: int | None = None) -> dict[str, tuple]:
        """In a study's allocation: endpoint -> what makes it the same engine (`at`: as it
        runs at that sweep concurrency)."""
        if self.pool is None:
            return {}
        return study_signatures(engines, str(self.run.path), at=at)

    def direction(self, engines: list[Process], want: dict[str, tuple]) -> dict[str, tuple]:
        """In a study's allocation: when the pool holds engines as an earlier sweep left
        them at its top point (args_from_concurrency), this sweep runs from the top down and
        its engines start with their top command lines (the rule of the plan of turns);
        the signatures its engines start with."""
        b = self.plan.recipe.benchmark
        if self.pool is None or not b.enabled or not any(p.restarts for p in engines):
            return want
        top_c = max(b.concurrency)
        top = self.signatures(engines, at=top_c)
        running = {ep: e.signature for ep, e in self.pool.loaded.items() if e.alive()}
        if not best_start(self.run.run_id, want, top, running).descending:
            return want
        self.descending = True
        self.book.event("sweep_order", order="descending", reason="engines loaded as the "
                        "top point's command line")
        say(f"the sweep runs from concurrency {top_c} down: engines are loaded as an earlier "
            "configuration's top point left them (args_from_concurrency)")
        return top

    def first_argv(self, proc: Process) -> list[str] | None:
        """The command line an engine starts with: its top point's on a sweep run
        downwards, else its own (None)."""
        if not self.descending or not proc.restarts:
            return None
        return proc.argv_at(max(self.plan.recipe.benchmark.concurrency))

    def take_over(self, engines: list[Process], want: dict[str, tuple]) -> set[str]:
        """In a study's allocation: the endpoints already loaded as this configuration wants
        them, taken over as its own (what died is dropped, what it wants with another
        command line is stopped)."""
        if self.pool is None:
            return set()
        kept = self.pool.settle(want, self.run.run_id)
        for p in engines:
            if p.endpoint in kept:
                self.adopt(p)
        if kept:
            say(f"engines kept loaded from an earlier configuration: {', '.join(sorted(kept))}")
        return kept

    def start_engines(self, engines: list[Process], kept: set[str],
                      want: dict[str, tuple]) -> None:
        """Every engine not taken over; in a study's allocation each is kept in its pool."""
        for ep in dict.fromkeys(p.endpoint for p in engines):
            if ep in kept:
                continue
            handles = [self.start(p, self.first_argv(p)) for p in engines if p.endpoint == ep]
            if self.pool is not None and ep is not None:
                self.pool.add(ep, handles, want[ep], self.run.run_id, self.backend)

    def adopt(self, proc: Process) -> None:
        """A loaded engine of an earlier configuration, as this run's process: its log is
        linked here and read from where it stands now."""
        assert self.pool is not None
        old = self.pool.handle(proc.name)
        assert old is not None, proc.name
        link = self.run.path / proc.log
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.symlink(os.path.relpath(old.log_path, link.parent), link)
        try:
            self.start_marks[proc.name] = old.log_path.stat().st_size
        except OSError:
            self.start_marks[proc.name] = 0
        self.kept_from[proc.name] = self.pool.loaded[proc.endpoint].started_by
        h = Handle(proc, old.popen, old.log_path, started=old.started, argv=old.argv)
        self.handles.append(h)
        self.book.event("process_kept", process=proc.name, node=proc.node, pid=h.pid,
                        started_by=self.kept_from[proc.name])
        self._write_processes()

    def wait_registered(self, router: Process, timeout_s: float) -> None:
        """The router lists every endpoint as a healthy worker of its role."""
        deadline = time.monotonic() + timeout_s
        while missing := preflight.unregistered(self.doc, router.url):
            self.check_processes()
            if time.monotonic() > deadline:
                raise RunFailed(
                    f"router: {', '.join(missing)} not registered as healthy workers within "
                    f"{timeout_s:g} s (GET {router.url}/workers)\n" + self.tails(),
                    culprit=missing[0],
                )
            time.sleep(1.0)

    def check_pd_path(self) -> None:
        """Every prefill endpoint hands one request's KV to a decode before the sweep. It
        waits as long as vLLM keeps a prefill's blocks for a decode, saying so meanwhile."""
        t0 = time.monotonic()
        r = self.plan.recipe
        wait_s = preflight.pd_wait_s(r.kv_connector, r.health.pd_wait_s)
        checks = preflight.pd_path(self.doc, wait_s, handshake_seen=self.handshake_seen,
                                   watch=self.check_processes, say=say)
        self.check_processes()
        bad = [c for c in checks if not c.ok]
        self.book.event(
            "pd_path", seconds=round(time.monotonic() - t0, 2), wait_s=wait_s,
            checks=[dataclasses.asdict(c) for c in checks],
        )  # fmt: skip
        if bad:
            c = bad[0]
            raise RunFailed(
                f"the P->D path is broken: a request through {c.prefill} did not reach "
                f"{c.decode} with its KV ({c.detail}); check NIXL/UCX between their nodes "
                f"(UCX_TLS, network interface) in their logs"
                + (f"; {len(bad) - 1} more prefill endpoint(s) likewise" if len(bad) > 1 else ""),
                culprit=c.prefill,
            )
        say(f"P/D path: {len(checks)} prefill endpoint(s) moved KV to a decode")
        self.note_transport()

    def handshake_seen(self, endpoint: str) -> bool:
        """Whether any process of this endpoint logged vLLM's NIXL handshake line."""
        return any(
            preflight.HANDSHAKE_LINE in line
            for h in self.handles if h.proc.endpoint == endpoint
            for line in tail(h.log_path, 20000, max_bytes=4 << 20)
        )

    def note_transport(self) -> None:
        """The transport UCX picked for the KV reads (decode logs, UCX_PROTO_INFO): a silent
        fall-back to TCP between racks shows in run.json, status and the dashboard."""
        seen: dict[str, list[str]] = {}
        for h in self.handles:
            if h.proc.kind == Kind.ENGINE and h.proc.role == Role.DECODE:
                found = ucx_transports("\n".join(tail(h.log_path, 400)))
                if found:
                    seen[h.proc.name] = found
        self.record.identity["kv_transport"] = seen
        self.save()
        tcp = sorted(n for n, cfgs in seen.items() if any(c.startswith("tcp/") for c in cfgs))
        if tcp and not self.plan.recipe.engine_kind.on_cpu:  # a CPU engine has no NVLink
            self.book.note(
                f"KV transfers of {', '.join(tcp)} go over TCP (UCX chose "
                f"{next(c for c in seen[tcp[0]] if c.startswith('tcp/'))}): NVLink/RDMA is not in use between P and D; check UCX_TLS "
                f"and the profile's network"
            )

    def run_client(self, proc: Process) -> int:
        """Run a client process (bench, accuracy) to its end while watching the servers."""
        h = self.start(proc)
        while h.exit_code() is None:
            self.check_processes(allowed=lambda x: x is h)
            time.sleep(POLL_S)
        self.check_processes(allowed=lambda x: x is h)
        h.stopped = True  # a client that ended is done, not a failure of the deployment
        self._write_processes()
        code = h.exit_code() or 0
        if code and self.cancel_behind(sigterm_exit=code in (128 + signal.SIGTERM,
                                                              -signal.SIGTERM)):
            raise Cancelled(self.cancel_reason)
        return code

    def sweep(self) -> None:
        b = self.plan.recipe.benchmark
        points = [p for p in self.procs if p.kind == Kind.BENCH]
        if self.descending:
            points.reverse()
        prompts = [b.prompts(concurrency_of(p.result)) for p in points]
        sweep_start = time.time()
        for i, proc in enumerate(points):
            done = sum(prompts[:i])
            elapsed = time.time() - sweep_start
            left = elapsed / done * sum(prompts[i:]) if done else None
            self.record.progress["sweep"] = {
                "index": i + 1, "total": len(points), "concurrency": concurrency_of(proc.result),
                "started": time.time(), "seconds_left": round(left) if left else None,
            }  # fmt: skip
            self.save()
            self.follow_concurrency(concurrency_of(proc.result))
            start = time.time()
            code = self.run_client(proc)
            end = time.time()
            result_file = self.run.path / proc.result
            failure = point_failure(result_file, code)
            if failure and self.cancel_behind():  # the deployment was ended under it
                raise Cancelled(self.cancel_reason)
            if b.driver == "vllm" and result_file.exists():
                write_window(result_file, end)
            self.book.event(
                "sweep_point", process=proc.name, status="failed" if failure else "ok",
                reason=failure, seconds=round(end - start, 2),
            )  # fmt: skip
            if failure:
                self.failed_points.append(f"{proc.name}: {failure}")
                say(f"{proc.name}: FAILED: {failure}")
                if b.on_failure == "stop":
                    raise RunFailed(f"sweep point {proc.name} failed: {failure}", proc.name)
            else:
                say(f"{proc.name}: done in {end - start:.1f} s")
        self.record.progress["sweep"] = {**self.record.progress["sweep"], "seconds_left": 0}

    def follow_concurrency(self, c: int) -> None:
        """Before a sweep point: restart the endpoints whose command line at this
        concurrency differs from the one running (args_from_concurrency), whole endpoints,
        while the others stay loaded; then health, the router's registration and the P->D
        path again, so no point is measured on a half-started deployment."""
        current = {h.proc.name: h for h in self.handles if h.proc.kind == Kind.ENGINE}
        procs = [h.proc for h in current.values() if h.proc.endpoint]
        running = study_signatures([dataclasses.replace(h.proc, argv=h.running_argv)
                                    for h in current.values() if h.proc.endpoint],
                                   str(self.run.path))
        eps = changed(study_signatures(procs, str(self.run.path), at=c), running)
        if not eps:
            return
        old = [h for h in current.values() if h.proc.endpoint in eps]
        r = self.plan.recipe
        steps = {f"{h.proc.role}.args_from_concurrency.{x['from_concurrency']}"
                 for h in old for x in h.proc.restarts if x["from_concurrency"] <= c}
        roles = sorted({f"{h.proc.role}.args" for h in old})
        say(f"concurrency {c}: restarting {', '.join(eps)} with its command line from "
            f"{', '.join(sorted(steps) or roles)}; the other engines stay loaded")
        t0 = time.monotonic()
        self.stage(Stage.RESTART)
        self.backend.stop(old, grace_s=STOP_GRACE_S)
        for h in old:
            self.book.event("process_stopped", process=h.proc.name, exit_code=h.exit_code(),
                            why=f"restart before concurrency {c}")
            self.healthy.discard(h.proc.name)
            # a kept engine is this run's own from here on; its log goes on where it was
            self.kept_from.pop(h.proc.name, None)
        self.handles = [h for h in self.handles if h not in old]
        if self.pool is not None:
            for ep in eps:
                if ep in self.pool.loaded:
                    self.pool.drop(ep, self.run.run_id, f"restarted before concurrency {c}")
        started = [self.start(h.proc, h.proc.argv_at(c)) for h in old]
        if self.pool is not None:
            want = self.signatures([dataclasses.replace(h.proc, argv=h.running_argv)
                                    for h in started])
            for ep in eps:
                self.pool.add(ep, [h for h in started if h.proc.endpoint == ep], want[ep],
                              self.run.run_id, self.backend)
        self.wait_ready([(h.proc, h.proc.url) for h in started if h.proc.url],
                        r.health.timeout_s, f"endpoints restarted for concurrency {c}")
        router = next(p for p in self.procs if p.kind == Kind.ROUTER)
        self.wait_registered(router, r.health.router_timeout_s)
        if r.mode == "disagg" and r.health.pd_check:
            self.check_pd_path()
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
        a = self.plan.recipe.accuracy
        proc = next(p for p in self.procs if p.kind == Kind.ACCURACY)
        code = self.run_client(proc)
        result = rundir.read_json(self.run.path / proc.result)
        if (not isinstance(result, dict) or result.get("failure_reason")) and self.cancel_behind():
            raise Cancelled(self.cancel_reason)
        if not isinstance(result, dict):
            raise RunFailed(
                f"the accuracy gate wrote no result (exit status {code}); see {proc.log}",
                culprit=proc.name,
            )
        score = result.get("accuracy")
        self.record.accuracy, self.record.accuracy_passed = score, bool(result.get("passed"))
        self.save()
        self.book.event(
            "accuracy", score=score, threshold=a.threshold, passed=result.get("passed")
        )
        if result.get("failure_reason"):
            raise RunFailed(f"accuracy gate failed: {result['failure_reason']}", proc.name)
        what = (f"{a.task} {a.metric}" if a.harness == "lm-eval" else
                f"{a.task} (vllm harness{f', mean of {a.repeat} runs' if a.repeat > 1 else ''})")
        say(f"accuracy {what}: {score:.3f} (threshold {a.threshold:g})")
        if not result.get("passed"):
            raise RunFailed(
                f"accuracy gate failed: {what} scored {score:.3f}, below the "
                f"threshold {a.threshold:g} (the sweep's results are kept and labelled)",
                culprit=proc.name,
            )

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

    def keepable(self) -> set[str]:
        """Engines a study's next configuration may use: every part of the endpoint is
        running, and its head answered healthy here."""
        by_ep: dict[str, list[Handle]] = {}
        for h in self.handles:
            if h.proc.kind == Kind.ENGINE and h.proc.endpoint:
                by_ep.setdefault(h.proc.endpoint, []).append(h)
        return {
            h.proc.name for hs in by_ep.values()
            if all(h.exit_code() is None and not h.lost for h in hs)
            and any(h.proc.name in self.healthy for h in hs)
            for h in hs
        }  # fmt: skip

    def teardown(self, keep_engines: bool = False) -> None:
        """Every process, in order (clients, router, engines, agents last), inside the
        budget Slurm leaves; nothing here can raise. `keep_engines`: a study's allocation
        goes on, so healthy engines stay loaded for its next configuration."""
        self.stage(Stage.TEARDOWN)
        self.left_loaded = self.keepable() if keep_engines and self.pool is not None else set()
        try:
            promsd.withdraw(self.run, self.plan.cluster.prometheus_sd_dir)
        except OSError as e:
            self.book.note(f"could not remove Prometheus targets: {e}")
        budget = self.teardown_budget_s
        share = {Kind.ENGINE: 0.45, Kind.AGENT: 0.2, Kind.ROUTER: 0.15, Kind.BENCH: 0.2}
        try:  # the last words of the agents that are still there, before they stop
            self.watch.stop()
            self.watch.beat(knock_too=False, timeout=1.0)
            self.note_partial_telemetry()
        except Exception as e:  # noqa: BLE001
            say(f"warning: could not ask the agents how their writes went: {e!r}")
        # Processes of a lost node: their srun cannot reach them; kill it and move on (Slurm
        # ends the steps when it ends the job).
        lost = [h for h in self.handles if h.lost]
        if lost:
            try:
                self.backend.abandon(lost)
            except Exception as e:  # noqa: BLE001
                say(f"warning: abandoning {[h.proc.name for h in lost]} failed: {e!r}")
        for h in self.handles:  # a process still running now: what it logs next is shutdown
            if h.exit_code() is None:
                try:
                    self.stop_marks[h.proc.name] = h.log_path.stat().st_size
                except OSError:
                    pass
        for kinds in TEARDOWN_ORDER:
            group = [h for h in self.handles if h.proc.kind in kinds and not h.lost
                     and h.proc.name not in self.left_loaded]
            grace = max(1.0, budget * share.get(kinds[0], 0.2))
            if Kind.AGENT in kinds and any(h.exit_code() is None for h in group):
                # One more sample after the servers are gone, so the end is on record too.
                time.sleep(min(self.plan.recipe.telemetry.interval_s * 1.5, grace / 2, 5.0))
            try:
                self.backend.stop(group, grace_s=grace, gentle=not lost)
            except Exception as e:  # a stop that fails must not leave the rest running
                say(f"warning: stopping {[h.proc.name for h in group]} failed: {e!r}")
        for h in self.handles:
            if h.proc.name in self.left_loaded:
                self.book.event("process_kept_loaded", process=h.proc.name)
                continue
            self.book.event("process_stopped", process=h.proc.name, exit_code=h.exit_code(),
                            **({"lost": True} if h.lost else {}))
        if self.pool is not None:  # what this configuration stopped is no longer loaded
            stopped = {h.proc.name for h in self.handles} - self.left_loaded
            for ep, e in list(self.pool.loaded.items()):
                if stopped & {h.proc.name for h in e.handles}:
                    self.pool.drop(ep, self.run.run_id, "stopped at the end of this configuration")
        self._write_processes()


def identity(plan: Plan, facts: dict[str, dict | None],
             hosts: dict[str, dict | None] | None = None,
             image_digest: str | None = None) -> dict:
    """What exactly ran, for anyone comparing two runs: image, engine version as the
    engine's own environment reports it, model and revision, Slurm job and nodes, and the
    fingerprint taken where it ran: every package of the engine's environment (the first
    node's; nodes whose list differs are named), vLLM's commit, torch's CUDA, the nodes'
    driver, GPUs and IMEX channel."""
    found = [f for f in facts.values() if f]
    pkgs = next((f["packages"] for f in found if f.get("packages")), None)
    differ = sorted(n for n, f in facts.items() if f and f.get("packages") not in (None, pkgs))
    nvidia = [(h or {}).get("nvidia") for h in (hosts or {}).values()]
    nvidia = [x for x in nvidia if x]
    versions = sorted({f.get("engine_version") for f in found if f.get("engine_version")})
    commits = sorted({f.get("engine_commit") for f in found if f.get("engine_commit")})
    imex = {n: bool((h or {}).get("imex_channel")) for n, h in (hosts or {}).items() if h}
    revisions = sorted({(f.get("model") or {}).get("revision") for f in found} - {None})
    c = plan.recipe.container
    return {
        "image": c.image if c else None,
        "image_pinned": bool(c and "@sha256:" in c.image),
        # what the registry served for it when it was imported (None: not known)
        "image_digest": image_digest or (c.image.rsplit("@", 1)[1]
                                         if c and "@sha256:" in c.image else None),
        "engine": plan.recipe.engine,
        "engine_version": versions[0] if len(versions) == 1 else versions,
        "engine_commit": commits[0] if len(commits) == 1 else (commits or None),
        "model": plan.recipe.model.path,
        "model_revision": revisions[0] if len(revisions) == 1 else (revisions or None),
        "slurm_job_id": plan.job_id,
        "nodes": {n: plan.address(n) for n in plan.nodes},
        "launcher_python": plan.runtime.python,
        "launcher_source": plan.runtime.src,
        "packages": pkgs,
        "packages_differ_on": differ,
        "torch_cuda": next((f.get("torch_cuda") for f in found if f.get("torch_cuda")), None),
        "driver": sorted({d for x in nvidia for d in x.get("driver") or []}) or None,
        "gpu_models": sorted({m for x in nvidia for m in x.get("gpu_models") or []}) or None,
        # the NVLink fabric's IMEX channel (multi-node NVLink on GB200): every node, none,
        # or the nodes that have it
        "imex_channel": (all(imex.values()) if len(set(imex.values())) < 2
                         else sorted(n for n, v in imex.items() if v)) if imex else None,
    }


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


def run(run_dir: Path, shared: InStudy | None = None) -> int:
    """Run a prepared run directory to its end. Returns 0 only if the run succeeded."""
    run = rundir.RunDir(Path(run_dir))
    if not run.recipe.exists():
        raise UserError(f"{run_dir} is not a prepared run directory (no recipe.yaml)")
    refuse_second_attempt(run)
    if shared is None:  # a study's allocation was checked for its largest configuration
        prepared = rundir.read_json(run.plan)
        prepared = prepared if isinstance(prepared, dict) else {}
        check_allocation(run.recipe, len(prepared.get("nodes") or []),
                         prepared.get("runtime"), "this run")
    record = RunRecord(
        state=State.RUNNING, stage=Stage.PLAN, started=time.time(), host=socket.gethostname(),
        orchestrator_pid=os.getpid(), slurm_job_id=os.environ.get("SLURM_JOB_ID"),
    )  # fmt: skip
    book = Book(run, record)
    book.save()
    book.make_reserve()
    signals = shared.signals if shared is not None else Signals.for_recipe(run.recipe)
    raise_open_files(65536)

    def early_step(name: str, commands: list[list[str]]) -> None:
        """A step before the orchestrator exists (the host check): cancellable by signal."""
        backend = Backend.for_steps(run.path)
        for cmd in commands:
            popen = backend.spawn(cmd, run.log(name))
            while popen.poll() is None:
                if signals.reason:
                    backend.kill(popen)
                    raise Cancelled(signals.reason)
                time.sleep(POLL_S)

    def finish_early(state: State, error: str, culprit: str | None = None) -> None:
        record.state, record.error, record.culprit = state, error, culprit
        record.failed_stage, record.ended = record.stage, time.time()
        book.save()
        book.event(str(state), error=error)
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
    busy = busy_ports(plan, frozenset(shared.pool.loaded) if shared else frozenset())
    if busy:
        error = (
            f"ports in use on this host: {', '.join(busy[:6])}"
            + (f" and {len(busy) - 6} more" if len(busy) > 6 else "")
            + ": is another run still up? (python -m launcher runs), or change the cluster "
            "profile's port_base"
        )
        finish_early(State.FAILED, error)
        book.drop_reserve()
        raise UserError(error)
    raise_open_files(plan.cluster.nofile)
    orch = Orchestrator(run, rendered, make_backend(plan, run.path), book,
                        pool=shared.pool if shared else None)
    signals.orch = orch
    if signals.reason:
        orch.cancel_reason, orch.teardown_budget_s = signals.reason, signals.budget_s or 30
    if plan.recipe.engine_kind.banner:
        say(plan.recipe.engine_kind.banner)
    state, error, culprit = State.SUCCEEDED, None, None
    try:
        orch.run_all()
    except (RunFailed, Cancelled) as e:
        state, error, culprit = State.FAILED, str(e), getattr(e, "culprit", None)
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
            record.failed_stage = record.stage
        orch.teardown(keep_engines=not ending)
        book.drop_reserve()  # room for the record of the end, on a disk that filled up
        orch.note_partial_telemetry(final=True)
        if state != State.CANCELLED or plan.recipe.benchmark.enabled:
            orch.stage(Stage.REPORT)
            orch.report(state, error)
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
