"""The orchestrator's stages driven with a fake backend: no process, no port, no HTTP.

The fake backend plays every process from a script (healthy, exits with a status after a
while, writes its result file) and the preflight steps (it writes the facts nodecheck
would); the engines' HTTP checks are answered from the same script. What is checked is the
orchestrator's own logic: stage order, which failure is named, that teardown stops every
process whatever happened, and what run.json and events.jsonl say.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from launcher.control import orchestrator, preflight
from launcher.control.backends import Backend, Handle
from launcher.control.prepare import prepare
from launcher.planning.plan import Plan
from launcher.run.plandoc import Process
from launcher.run.rundir import RunDir, RunRecord
from launcher.run.vocab import Kind, Stage, State
from launcher.schema import recipe as recipe_mod


class FakePopen:
    """A process that runs until stopped, or exits with `code` after `after_s`."""

    def __init__(self, code: int | None = None, after_s: float = 0.0, on_exit=None):
        self.pid = 4242
        self.code, self.deadline = code, time.monotonic() + after_s
        self.returncode: int | None = None
        self.on_exit = on_exit

    def poll(self) -> int | None:
        if self.returncode is None and self.code is not None and time.monotonic() >= self.deadline:
            if self.on_exit:
                self.on_exit()
            self.returncode = self.code
        return self.returncode

    def wait(self, timeout=None) -> int | None:
        return self.poll()


class FakeBackend(Backend):
    """Scripted processes: `script[name] = (exit code or None, after seconds)`."""

    def __init__(self, plan: Plan, run_dir: Path, script: dict[str, tuple[int | None, float]]):
        super().__init__(plan, run_dir)
        self.script = script
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.settles: list[bool] = []  # each stop's `settle`

    def spawn(self, argv: list[str], log_path: Path) -> FakePopen:
        """Preflight steps: write what nodecheck would find, everything fine."""
        where = argv[argv.index("--where") + 1]
        nodes = [argv[i + 1] for i, a in enumerate(argv) if a == "--node"] or self.plan.nodes[:1]
        for node in nodes:
            facts = {"node": node, "resolved": "127.0.0.1", "gpus": {"count": 4},
                     "nofile": {"hard": 1 << 20}, "engine_version": "simulator",
                     "argv_checks": [], "files": [], "aiohttp": True}  # fmt: skip
            out = preflight.facts_file(self.run_dir, node, where)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(facts))
        return FakePopen(0)

    def start(self, proc: Process, argv: list[str] | None = None) -> Handle:
        self.started.append(proc.name)
        code, after = self.script.get(proc.name, (None, 0.0))
        if proc.kind.client and proc.name not in self.script:
            code, after = 0, 0.05

        def result() -> None:
            if proc.result and code == 0:
                write_result(self.run_dir / proc.result, proc)

        log = self.run_dir / proc.log
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"{proc.name} starting\n")
        return Handle(proc, FakePopen(code, after, result), log)

    def stop(self, handles: list[Handle], grace_s: float = 10.0, gentle: bool = True,
             settle: bool = True) -> None:
        self.settles.append(settle)
        for h in handles:
            if h.exit_code() is None:
                h.popen.returncode = -15
                h.stopped = True
                self.stopped.append(h.proc.name)


def write_result(path: Path, proc: Process) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if proc.kind == Kind.ACCURACY:
        path.write_text(json.dumps({"task": "gsm8k", "accuracy": 0.9, "threshold": 0.7,
                                    "passed": True, "num_questions": 30}))  # fmt: skip
        return
    c = int(proc.argv[proc.argv.index("--max-concurrency") + 1])
    path.write_text(json.dumps({
        "completed": 10, "failed": 0, "num_prompts": 10, "max_concurrency": c,
        "duration": 1.0, "total_input_tokens": 5120, "total_output_tokens": 640,
        "status": "ok", "driver": "builtin", "window_start": 1.0, "window_end": 2.0,
    }))  # fmt: skip


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A prepared local-sim run, its orchestrator on a fake backend, HTTP answered fake."""
    alive: dict[str, bool] = {}
    monkeypatch.setattr(orchestrator, "api_ready", lambda url, model: (alive.get(url, True), ""))
    monkeypatch.setattr(orchestrator, "http_ok", lambda url, timeout=2.0: (True, ""))
    monkeypatch.setattr(preflight, "unregistered", lambda doc, url: [])
    monkeypatch.setattr(
        preflight, "pd_path",
        lambda doc, wait_s, **_: [preflight.PathCheck(e.name, "decode-0", True, "1 KV transfer(s)")
                     for e in doc.endpoints if e.role == "prefill"],
    )  # fmt: skip
    monkeypatch.setattr(orchestrator, "POLL_S", 0.01)

    def make(script=None, *sets):
        p = prepare(recipe_mod.load("local-sim", ["telemetry.interval_s=0.05", *sets]),
                    tmp_path / "runs")
        run = p.run
        book = orchestrator.Book(run, RunRecord(state=State.RUNNING, started=time.time()))
        backend = FakeBackend(p.plan, run.path, script or {})
        orch = orchestrator.Orchestrator(run, p.rendered, backend, book)
        return orch, backend, run, alive

    return make


def stages(run: RunDir) -> list[str]:
    return [e["stage"] for e in run.events() if e["event"] == "stage"]


def test_stages_run_in_order_and_every_process_is_stopped(setup):
    orch, backend, run, _ = setup()
    orch.run_all()
    orch.teardown()
    assert stages(run) == ["preflight", "agents", "endpoints", "health", "router", "sweep",
                           "accuracy", "teardown"]  # fmt: skip
    servers = {p.name for p in orch.planned if not p.kind.client}
    assert servers <= set(backend.stopped), "teardown left a server running"
    # no srun of the job follows a run's last teardown: it keeps to its budget
    assert backend.settles and not any(backend.settles), backend.settles
    assert [p for p in backend.started if p.startswith("bench-")] == [
        "bench-c4", "bench-c16", "bench-c64"
    ]
    assert orch.record.serving and orch.record.progress["sweep"]["index"] == 3
    assert {e["event"] for e in run.events()} >= {"preflight_ok", "pd_path", "serving"}


def test_an_engine_that_dies_in_health_is_named_and_the_rest_torn_down(setup):
    orch, backend, run, alive = setup({"decode-0@local-2": (3, 0.05)})
    alive.update({p.url: False for p in orch.planned if p.url})  # nobody gets healthy
    with pytest.raises(orchestrator.RunFailed) as e:
        orch.run_all()
    assert str(e.value).startswith("decode-0@local-2 on local-2 exited with status 3")
    assert e.value.culprit == "decode-0@local-2"
    orch.teardown()
    assert "router" not in backend.started  # it never got that far
    assert "decode-0@local-1" in backend.stopped


def test_a_failed_sweep_point_goes_on_then_fails_the_run(setup):
    orch, backend, run, _ = setup({"bench-c16": (1, 0.02)})
    with pytest.raises(orchestrator.RunFailed, match="1 sweep point"):
        orch.run_all()
    assert "bench-c64" in backend.started and "accuracy" in backend.started


def test_cancel_request_stops_the_run_at_the_next_check(setup):
    orch, backend, run, _ = setup(None, "hold_s=30", "benchmark.enabled=false")
    from launcher.run.rundir import CancelRecord

    run.write_cancel(CancelRecord(by="tester", ts=time.time()))
    with pytest.raises(orchestrator.Cancelled, match="cancelled by `launcher cancel` \\(tester\\)"):
        orch.run_all()


def test_a_step_ended_by_scancel_before_the_jobs_own_signal_reads_as_cancelled(setup):
    # scancel signals the steps and the batch shell at once: a step's SIGTERM exit (143) may
    # be seen a moment before the orchestrator's own SIGTERM arrives
    import threading

    orch, backend, run, alive = setup({"decode-0@local-2": (143, 0.05)})
    alive.update({p.url: False for p in orch.planned if p.url})
    threading.Timer(0.5, lambda: setattr(orch, "cancel_reason",
                                         "cancelled (SIGTERM: scancel or shutdown)")).start()
    with pytest.raises(orchestrator.Cancelled, match="SIGTERM: scancel"):
        orch.run_all()


def test_a_step_killed_by_sigterm_with_no_cancel_still_fails_the_run(setup, monkeypatch):
    monkeypatch.setattr(orchestrator, "CANCEL_GRACE_S", 0.3)
    orch, backend, run, alive = setup({"decode-0@local-2": (143, 0.05)})
    alive.update({p.url: False for p in orch.planned if p.url})
    with pytest.raises(orchestrator.RunFailed, match="decode-0@local-2 on local-2 exited with "
                                                     "status 143"):
        orch.run_all()


SIGTERM_REASON = "cancelled (SIGTERM: scancel or shutdown)"


def signal_soon(orch, after_s: float = 0.2):
    """What Slurm says of a job scancel is ending (COMPLETING, before any step is signalled),
    with the orchestrator's own SIGTERM landing a moment after it is asked."""
    import threading

    def ending(job):
        threading.Timer(after_s, lambda: setattr(orch, "cancel_reason", SIGTERM_REASON)).start()
        return "COMPLETING"

    return ending


def test_a_sweep_point_failing_as_slurm_ends_the_job_is_the_cancel_not_a_failed_point(
        setup, monkeypatch):
    orch, backend, run, _ = setup({"bench-c16": (1, 0.02)})
    monkeypatch.setattr(orchestrator, "slurm_ending", signal_soon(orch))
    with pytest.raises(orchestrator.Cancelled, match="SIGTERM: scancel"):
        orch.run_all()
    assert "bench-c64" not in backend.started
    assert not [e for e in run.events() if e["event"] == "sweep_point" and
                e["status"] == "failed"], "the point the cancel ended is recorded as failed"


def test_a_step_exiting_1_as_slurm_ends_the_job_reads_as_cancelled(setup, monkeypatch):
    # pyxis's own failure of a step scancel interrupted: not a SIGTERM exit status
    orch, backend, run, alive = setup({"decode-0@local-2": (1, 0.05)})
    alive.update({p.url: False for p in orch.planned if p.url})
    monkeypatch.setattr(orchestrator, "slurm_ending", signal_soon(orch))
    with pytest.raises(orchestrator.Cancelled, match="SIGTERM: scancel"):
        orch.run_all()
    assert not [e for e in run.events() if e["event"] == "process_exited"]


def test_a_failure_while_slurm_ends_the_job_without_a_signal_still_reads_as_cancelled(
        setup, monkeypatch):
    monkeypatch.setattr(orchestrator, "CANCEL_GRACE_S", 0.3)
    monkeypatch.setattr(orchestrator, "slurm_ending", lambda job: "COMPLETING")
    orch, backend, run, _ = setup()
    orch.plan = dataclasses.replace(orch.plan, job_id="77")
    assert orch.cancel_behind()
    assert orch.cancel_reason == ("cancelled (scancel, the time limit or preemption: Slurm is "
                                  "ending job 77, state COMPLETING)")


def test_a_failure_seen_after_the_signal_arrived_is_the_cancel_without_asking_slurm(
        setup, monkeypatch):
    # the step ended in the same poll as the signal: the failure it left is the cancel's
    def never(job):
        raise AssertionError("Slurm asked although the signal had arrived")

    monkeypatch.setattr(orchestrator, "slurm_ending", never)
    orch, backend, run, _ = setup()
    orch.cancel_reason = SIGTERM_REASON
    assert orch.cancel_behind() and orch.cancel_reason == SIGTERM_REASON


def test_a_failure_while_slurm_runs_the_job_is_the_failure_at_once(setup, monkeypatch):
    monkeypatch.setattr(orchestrator, "slurm_ending", lambda job: None)
    orch, backend, run, _ = setup()
    t = time.monotonic()
    assert not orch.cancel_behind() and orch.cancel_reason is None
    assert time.monotonic() - t < 0.5, "a real failure waited for a cancel"


def test_a_dead_agent_is_named_and_the_run_goes_on(setup):
    orch, backend, run, _ = setup({"agent@local-2": (1, 0.0)})
    orch.run_all()
    rec = orch.record.processes["agent@local-2"]
    assert rec.exit_code == 1 and not rec.stopped
    assert any("agent@local-2 exited with status 1" in n for n in orch.record.notes)


def test_a_failing_run_json_write_does_not_stop_the_run(setup, monkeypatch):
    orch, backend, run, _ = setup()

    def full(record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunDir, "write_record", lambda self, record: full(record))
    orch.run_all()  # no exception: bookkeeping is best effort
    orch.teardown()
    assert any("could not write run.json: No space left on device" in n for n in orch.record.notes)
    assert {p.name for p in orch.planned if not p.kind.client} <= set(backend.stopped)


def test_teardown_budget_follows_the_signal(setup):
    sig = orchestrator.Signals(kill_wait_s=30, lead_s=120)
    orch, backend, run, _ = setup()
    sig.orch = orch
    import signal

    sig.handler(signal.SIGTERM, None)
    assert orch.cancel_reason.startswith("cancelled (SIGTERM")
    assert orch.teardown_budget_s == pytest.approx(18.0)  # 60 % of KillWait
    orchestrator.Signals.ignore()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_run_record_survives_a_round_trip():
    rec = RunRecord(state=State.FAILED, stage=Stage.SWEEP, culprit="decode-0@n1")
    again = RunRecord.from_json(json.loads(json.dumps(dataclasses.asdict(rec))))
    assert again == rec


def test_a_preflight_step_that_hangs_or_is_cancelled_is_killed_and_a_finished_one_timed(
        tmp_path, monkeypatch):
    """The host check runs before the orchestrator exists (a node's stuck mount would hang
    it): the same step runner as the container check, with its deadline and its kill."""
    import os

    from launcher.control.record import Book
    from launcher.errors import Cancelled, RunFailed

    run = RunDir(tmp_path)
    book = Book(run, RunRecord())
    backend = Backend.for_steps(tmp_path)
    spawned = []
    spawn = backend.spawn
    monkeypatch.setattr(backend, "spawn", lambda *a: spawned.append(spawn(*a)) or spawned[-1])

    monkeypatch.setattr(orchestrator, "STEP_TIMEOUT_S", 0.5)
    with pytest.raises(RunFailed, match=r"preflight-host did not finish in 0.5 s; see "
                                        r"logs/preflight-host.log"):
        orchestrator.run_step(backend, run, book, "preflight-host",
                              [["sleep", "30"], ["sleep", "30"]], lambda: None)
    assert len(spawned) == 2 and all(p.poll() is not None for p in spawned)  # both, together

    def cancel():
        raise Cancelled("cancelled by SIGTERM")

    monkeypatch.setattr(orchestrator, "STEP_TIMEOUT_S", 60.0)
    with pytest.raises(Cancelled):
        orchestrator.run_step(backend, run, book, "preflight-host", [["sleep", "30"]], cancel)
    assert spawned[-1].poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(spawned[-1].pid, 0)

    assert orchestrator.run_step(backend, run, book, "preflight-container",
                                 [["true"], ["sh", "-c", "sleep 0.3"]], lambda: None)
    assert not orchestrator.run_step(backend, run, book, "preflight-container", [["false"]],
                                     lambda: None)
    steps = [e for e in run.events() if e["event"] == "preflight_step"]
    assert [(e["step"], e["ok"]) for e in steps] == [("preflight-container", True),
                                                     ("preflight-container", False)]
    assert 0.3 <= steps[0]["seconds"] < 10, steps
