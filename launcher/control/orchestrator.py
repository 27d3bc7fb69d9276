"""The orchestrator: one process that runs a prepared run directory to its end.

Inside a Slurm allocation it is the batch step (submitit's payload) on the first node; on the
`local` profile it runs in the foreground. Stages, each recorded in run.json and
events.jsonl: agents -> endpoints -> health -> router -> sweep -> accuracy -> report ->
teardown. Any process that exits early, or a health timeout, fails the run at once with the
process, its node, its exit status and its last log lines; everything else is stopped and
nothing collected so far is removed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launcher.control.backends import Backend, Handle, make_backend
from launcher.control.prepare import write_run_files
from launcher.errors import UserError
from launcher.planning import render
from launcher.planning.plan import Plan, make_plan, nodes_needed
from launcher.run import rundir
from launcher.run.plandoc import Process
from launcher.run.results import point_failure
from launcher.run.rundir import ProcessRecord, RunRecord, tail
from launcher.run.vocab import TEARDOWN_ORDER, Kind, Stage, State
from launcher.spec import cluster as cluster_mod
from launcher.spec import recipe as recipe_mod

POLL_S = 0.25


class RunFailed(Exception):
    pass


class Cancelled(Exception):
    pass


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- where am I --------------------------------------------------------------------------------


def allocation_nodes() -> list[str] | None:
    """The allocation's node names in Slurm's order, or None outside an allocation."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        return out.split()
    except (OSError, subprocess.SubprocessError):
        return cluster_mod.expand_nodelist(nodelist)


def resolve(nodes: list[str]) -> dict[str, str]:
    """Node name -> IP: NIXL's side channel binds and advertises an address, not a name."""
    out = {}
    for n in nodes:
        try:
            out[n] = socket.gethostbyname(n)
        except OSError:
            out[n] = n
    return out


def plan_here(run: rundir.RunDir) -> Plan:
    """Plan again on the real nodes (same pure function as the dry-run) and record it."""
    recipe = recipe_mod.load(str(run.recipe))
    cluster = cluster_mod.load(recipe.cluster)
    if cluster.scheduler == "slurm":
        nodes = allocation_nodes()
        if nodes is None:
            raise UserError(
                f"recipe {recipe.name} is for Slurm cluster {cluster.name}: run it inside an "
                f"allocation (submit does that), or use a recipe for the local profile"
            )
        plan = make_plan(recipe, cluster, nodes, resolve(nodes))
    else:
        plan = make_plan(
            recipe, cluster, cluster_mod.profile_nodes(cluster, nodes_needed(recipe, cluster))
        )
    # job.sbatch stays as it was submitted; the rest now names the real nodes.
    write_run_files(run, plan, placeholder_nodes=False, with_sbatch=False)
    return plan


def busy_ports(plan: Plan) -> list[str]:
    """Planned ports already taken on this host, for the nodes that are this host (local
    and dev-cluster runs: a run still up, or another program, would make ours fail late)."""
    here = {"127.0.0.1", "localhost", socket.gethostname()}
    try:
        here.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    local = {n for n in plan.nodes if plan.address(n) in here or plan.address(n).startswith("127.")}
    wanted: list[tuple[int, str]] = []
    if plan.nodes[0] in local:
        wanted += [(plan.router_port, "router http"), (plan.router_metrics_port, "router metrics")]
    wanted += [(p, f"agent@{n} exporter") for n, p in plan.exporter_ports.items() if n in local]
    for ep in plan.endpoints:
        for part in ep.parts:
            if part.node not in local:
                continue
            if part.head:
                wanted.append((ep.http_port, f"{ep.name} http"))
            if ep.role != "agg":
                wanted += [
                    (ep.nixl_port_base + r, f"{ep.name} nixl rank {r}") for r in part.dp_ranks
                ]
        if ep.multi_node and ep.head.node in local:
            wanted.append((ep.dp_rpc_port, f"{ep.name} dp rpc"))
    busy = []
    for port, what in sorted(set(wanted)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # Servers set SO_REUSEADDR too: a recent run's TIME_WAIT connections are no clash.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((plan.cluster.bind_host, port))
            except OSError:
                busy.append(f"{port} ({what})")
    return busy


# --- HTTP checks -------------------------------------------------------------------------------


def http_ok(url: str, timeout: float = 2.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read(65536).decode("utf-8", "replace")
            return 200 <= resp.status < 300, body
    except (urllib.error.URLError, OSError, ValueError) as e:
        return False, str(getattr(e, "reason", e))


def api_ready(url: str, model: str) -> tuple[bool, str]:
    """vLLM is ready when /health answers and /v1/models lists the served model."""
    ok, why = http_ok(f"{url}/health")
    if not ok:
        return False, f"/health: {why}"
    ok, body = http_ok(f"{url}/v1/models")
    if not ok:
        return False, f"/v1/models: {body}"
    try:
        ids = [m.get("id") for m in json.loads(body).get("data", [])]
    except (json.JSONDecodeError, AttributeError):
        return False, "/v1/models: not JSON"
    return (model in ids), f"/v1/models lists {ids}"


# --- the run -----------------------------------------------------------------------------------


class Orchestrator:
    def __init__(self, run: rundir.RunDir, plan: Plan, backend: Backend, record: RunRecord):
        self.run = run
        self.record = record
        self.plan = plan
        self.backend = backend
        self.handles: list[Handle] = []
        self.procs = render.processes(plan, str(run.path))
        self.cancel_reason: str | None = None
        self.failed_points: list[str] = []

    # --- bookkeeping ---
    def save(self) -> None:
        self.run.write_record(self.record)

    def stage(self, name: Stage) -> None:
        self.record.stage = name
        self.save()
        self.run.event("stage", stage=name)
        say(f"stage {name}")

    def start(self, proc: Process) -> Handle:
        missing = [n for n in proc.env_from_host if n not in os.environ]
        if missing:
            self.run.event("warning", process=proc.name, message=f"not set here: {missing}")
        h = self.backend.start(proc)
        self.handles.append(h)
        self.run.event("process_started", process=proc.name, node=proc.node, pid=h.pid)
        self._write_processes()
        return h

    def _write_processes(self) -> None:
        self.record.processes = {
            h.proc.name: ProcessRecord(
                node=h.proc.node, kind=h.proc.kind, pid=h.pid, started=h.started,
                exit_code=h.exit_code(), stopped=h.stopped, log=h.proc.log,
            )  # fmt: skip
            for h in self.handles
        }
        self.save()

    def check_processes(self, allowed: Callable[[Handle], bool] = lambda h: False) -> None:
        """Fail the run if a process that should be running has exited."""
        if self.cancel_reason is None and (req := self.run.read_cancel()) is not None:
            self.cancel_reason = f"cancelled by `launcher cancel` ({req.by})"
            say(self.cancel_reason + "; tearing down")
        if self.cancel_reason:
            raise Cancelled(self.cancel_reason)
        for h in self.handles:
            code = h.exit_code()
            if code is None or h.stopped or allowed(h):
                continue
            if h.proc.kind == Kind.AGENT:
                # Telemetry is best effort: losing an agent must not lose the benchmark.
                h.stopped = True
                self.run.event("warning", process=h.proc.name, message=f"agent exited {code}")
                say(
                    f"warning: {h.proc.name} exited with status {code}; telemetry of that node stops"
                )
                continue
            lines = tail(h.log_path, 15)
            self.run.event(
                "process_exited", process=h.proc.name, node=h.proc.node, exit_code=code,
                log_tail=lines,
            )  # fmt: skip
            raise RunFailed(
                f"{h.proc.name} on {h.proc.node} exited with status {code}; last lines of "
                f"{h.proc.log}:\n" + "\n".join(f"  | {x}" for x in lines)
            )

    def wait_ready(
        self, targets: list[tuple[Process, str]], timeout_s: float, what: str
    ) -> None:
        """Poll every target until ready, failing fast on a dead process or the timeout."""
        model = self.plan.recipe.model.name
        pending = {p.name: (p, url) for p, url in targets}
        reasons: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        last_report = 0.0
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
                        self.run.event("ready", process=name)
                now = time.monotonic()
                if pending and now > deadline:
                    names = sorted(pending)
                    details = []
                    for n in names:
                        proc = pending[n][0]
                        lines = tail(self.run.path / proc.log, 10)
                        details.append(
                            f"{n} on {proc.node} ({reasons.get(n)}); last lines of {proc.log}:\n"
                            + "\n".join(f"  | {x}" for x in lines)
                        )
                    raise RunFailed(
                        f"{what}: not healthy within {timeout_s:g} s: " + "\n".join(details)
                    )
                if pending and now - last_report > 10:
                    last_report = now
                    say(f"{what}: waiting for {', '.join(sorted(pending))}")
                if pending:
                    time.sleep(POLL_S)

    # --- stages ---
    def preflight(self) -> None:
        """What would fail late, checked before anything starts."""
        a = self.plan.recipe.accuracy
        if a.enabled and (not a.data or not Path(a.data).is_file()):
            raise RunFailed(
                f"accuracy.data: {a.data or '(not set)'} is not a file on "
                f"{socket.gethostname()}: give a local GSM8K jsonl (compute nodes may have no "
                "internet), or set accuracy.enabled=false"
            )

    def run_all(self) -> None:
        r = self.plan.recipe
        self.preflight()
        agents = [p for p in self.procs if p.kind == Kind.AGENT]
        engines = [p for p in self.procs if p.kind == Kind.ENGINE]
        router = next(p for p in self.procs if p.kind == Kind.ROUTER)
        if agents:
            self.stage(Stage.AGENTS)
            for p in agents:
                self.start(p)
        self.stage(Stage.ENDPOINTS)
        for p in engines:
            self.start(p)
        self.stage(Stage.HEALTH)
        t0 = time.monotonic()
        self.wait_ready([(p, p.url) for p in engines if p.url], r.health.timeout_s, "endpoints")
        self.run.event("endpoints_healthy", seconds=round(time.monotonic() - t0, 2))
        self.stage(Stage.ROUTER)
        self.start(router)
        self.wait_ready([(router, router.url)], r.health.router_timeout_s, "router")
        self.record.serving, self.record.router_url = True, router.url
        self.save()
        self.run.event("serving", url=router.url)
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

    def run_client(self, proc: Process) -> int:
        """Run a client process (bench, accuracy) to its end while watching the servers."""
        h = self.start(proc)
        while h.exit_code() is None:
            self.check_processes(allowed=lambda x: x is h)
            time.sleep(POLL_S)
        self.check_processes(allowed=lambda x: x is h)
        h.stopped = True  # a client that ended is done, not a failure of the deployment
        self._write_processes()
        return h.exit_code() or 0

    def sweep(self) -> None:
        b = self.plan.recipe.benchmark
        for proc in [p for p in self.procs if p.kind == Kind.BENCH]:
            start = time.time()
            code = self.run_client(proc)
            end = time.time()
            result_file = self.run.path / proc.result
            failure = point_failure(result_file, code)
            if b.driver == "vllm" and result_file.exists():
                # vllm bench serve records no window; the client's lifetime bounds it.
                rundir.write_json(
                    result_file.with_suffix(".window.json"),
                    {"window_start": start, "window_end": end},
                )
            self.run.event(
                "sweep_point", process=proc.name, status="failed" if failure else "ok",
                reason=failure, seconds=round(end - start, 2),
            )  # fmt: skip
            if failure:
                self.failed_points.append(f"{proc.name}: {failure}")
                say(f"{proc.name}: FAILED: {failure}")
                if b.on_failure == "stop":
                    raise RunFailed(f"sweep point {proc.name} failed: {failure}")
            else:
                say(f"{proc.name}: done in {end - start:.1f} s")

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
        if code != 0 or not result:
            raise RunFailed(f"accuracy client exited with status {code}; see {proc.log}")
        score = result.get("accuracy")
        self.record.accuracy, self.record.accuracy_passed = score, result.get("passed")
        self.save()
        self.run.event("accuracy", score=score, threshold=a.threshold, passed=result.get("passed"))
        say(f"accuracy {a.task}: {score:.3f} (threshold {a.threshold:g})")
        if not result.get("passed"):
            raise RunFailed(
                f"accuracy gate failed: {a.task} scored {score:.3f}, below the threshold "
                f"{a.threshold:g} (the sweep's results are kept and labelled)"
            )

    def report(self, state: State, error: str | None) -> None:
        try:
            from launcher.run import figures

            summary = figures.summary(self.run.path, state, error)
            rundir.write_json(self.run.summary, summary)
            print(figures.summary_table(summary), flush=True)
        except Exception as e:  # a report problem must not hide the run's own outcome
            self.run.event("warning", message=f"summary failed: {e!r}")
            say(f"warning: could not write the summary: {e!r}")

    def teardown(self) -> None:
        self.stage(Stage.TEARDOWN)
        for kinds in TEARDOWN_ORDER:
            group = [h for h in self.handles if h.proc.kind in kinds]
            if Kind.AGENT in kinds and any(h.exit_code() is None for h in group):
                # One more sample after the servers are gone, so the end is on record too.
                time.sleep(min(self.plan.recipe.telemetry.interval_s * 1.5, 5.0))
            self.backend.stop(group, grace_s=15.0)
        for h in self.handles:
            self.run.event("process_stopped", process=h.proc.name, exit_code=h.exit_code())
        self._write_processes()


def _install_signals(orch: Orchestrator) -> None:
    def handler(signum, _frame):
        reason = {
            signal.SIGTERM: "cancelled (SIGTERM: scancel or shutdown)",
            signal.SIGINT: "cancelled (Ctrl-C)",
            signal.SIGUSR2: "stopped: the Slurm time limit is near",
        }.get(signum, f"signal {signum}")
        if orch.cancel_reason is None:
            orch.cancel_reason = reason
            say(reason + "; tearing down")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(sig, handler)


def run(run_dir: Path) -> int:
    """Run a prepared run directory to its end. Returns 0 only if the run succeeded."""
    run = rundir.RunDir(Path(run_dir))
    if not run.recipe.exists():
        raise UserError(f"{run_dir} is not a prepared run directory (no recipe.yaml)")
    record = RunRecord(
        state=State.RUNNING, stage=Stage.PLAN, started=time.time(), host=socket.gethostname(),
        orchestrator_pid=os.getpid(), slurm_job_id=os.environ.get("SLURM_JOB_ID"),
    )  # fmt: skip
    run.write_record(record)

    def fail_early(error: str) -> None:
        record.state, record.error, record.ended = State.FAILED, error, time.time()
        run.write_record(record)
        run.event("failed", error=error)

    try:
        plan = plan_here(run)
    except UserError as e:
        fail_early(str(e))
        raise
    busy = busy_ports(plan)
    if busy:
        error = (
            f"ports in use on this host: {', '.join(busy[:6])}"
            + (f" and {len(busy) - 6} more" if len(busy) > 6 else "")
            + ": is another run still up? (python -m launcher runs), or change the cluster "
            "profile's port_base"
        )
        fail_early(error)
        raise UserError(error)
    orch = Orchestrator(run, plan, make_backend(plan, run.path), record)
    _install_signals(orch)
    if plan.recipe.engine == "sim":
        say("engine: SIMULATED (launcher.sim): no model runs, timings come from the speed model")
    state, error = State.SUCCEEDED, None
    try:
        orch.run_all()
    except RunFailed as e:
        state, error = State.FAILED, str(e)
    except Cancelled as e:
        state, error = State.CANCELLED, str(e)
    except Exception as e:  # an orchestrator bug still tears down and says so
        state, error = State.FAILED, f"orchestrator error: {e!r}"
        import traceback

        traceback.print_exc()
    finally:
        if state != State.SUCCEEDED:
            record.failed_stage = record.stage
        # A second signal during teardown must not abort the teardown itself.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        orch.teardown()
        if state != State.CANCELLED or orch.plan.recipe.benchmark.enabled:
            orch.stage(Stage.REPORT)
            orch.report(state, error)
    if error:
        say(f"run {state}: {error}")
        run.event(state, error=error)
    else:
        run.event("succeeded")
        say("run succeeded")
    record.state, record.error, record.ended = state, error, time.time()
    record.stage, record.serving = None, False
    run.write_record(record)
    say(f"run directory: {run.path}")
    return 0 if state == State.SUCCEEDED else 1


def run_in_allocation(run_dir: str) -> int:
    """submitit's payload: the batch step on the allocation's first node."""
    code = run(Path(run_dir))
    if code:
        sys.exit(code)  # a failed run is a failed Slurm job
    return code
