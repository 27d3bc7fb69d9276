"""Looking at runs: list, status (with Slurm's view even without accounting), logs, cancel."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher import rundir
from launcher.errors import UserError
from launcher.rundir import tail


def all_runs(runs_dir: Path) -> list[Path]:
    """Run directories (those with a run.json), studies included, oldest first."""
    if not runs_dir.is_dir():
        return []
    found = [p.parent for p in runs_dir.glob("*/run.json")]
    found += [p.parent for p in runs_dir.glob("*/*/run.json")]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def find(runs_dir: Path, ref: str | None) -> Path:
    if ref:
        p = Path(ref)
        if (p / "run.json").exists():
            return p
        matches = [r for r in all_runs(runs_dir) if r.name == ref or r.name.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names = ", ".join(m.name for m in matches[:5])
            raise UserError(f"{ref!r} matches several runs ({names}): give more of the name")
        raise UserError(f"no run {ref!r} under {runs_dir} (see: python -m launcher runs)")
    runs = all_runs(runs_dir)
    if not runs:
        raise UserError(f"no runs under {runs_dir}: submit a recipe first")
    return runs[-1]


def slurm_state(job_id: str | None) -> str | None:
    """The job's state from squeue, then scontrol (no accounting database needed)."""
    if not job_id:
        return None
    try:
        out = subprocess.run(
            ["squeue", "--noheader", f"--jobs={job_id}", "--format=%T"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        if out:
            return out.splitlines()[0]
        out = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (Slurm did not answer)"
    for word in out.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return "gone (no longer known to Slurm)"


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    s = int(time.time() - ts)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def status_text(run_path: Path) -> str:
    run = rundir.RunDir(run_path)
    st = run.read_state()
    plan = rundir.read_json(run.plan, {}) or {}
    lines = [f"run {run.run_id}  ({run_path})"]
    sim = " [SIMULATED engines]" if plan.get("engine") == "sim" else ""
    lines.append(
        f"state {st.get('state', '?')}  stage {st.get('stage') or '-'}  "
        f"started {_age(st.get('started'))} ago{sim}"
    )
    job = st.get("slurm_job_id")
    if job:
        lines.append(f"slurm job {job}: {slurm_state(str(job))}")
    if st.get("serving") and st.get("router_url"):
        lines.append(f"serving at {st['router_url']}")
    if st.get("error"):
        lines.append("error: " + st["error"])
    procs = st.get("processes") or {}
    if procs:
        lines.append(f"{'PROCESS':28} {'NODE':16} {'STATE':10} LOG")
        for name, p in procs.items():
            code = p.get("exit_code")
            state = (
                "running" if code is None else ("stopped" if p.get("stopped") else f"exit {code}")
            )
            lines.append(f"{name:28} {p.get('node', ''):16} {state:10} {p.get('log', '')}")
    if st.get("state") in ("submitted", "running") and job:
        s = slurm_state(str(job)) or ""
        if not any(x in s for x in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING")):
            out = sorted(run.slurm.glob(f"{job}_*_log.out"))
            lines.append(
                f"the job is {s} but the run never recorded its end: the batch step died; "
                "its output:"
            )
            for f in out:
                lines += [f"  | {x}" for x in tail(f, 15)]
    return "\n".join(lines)


def list_text(runs_dir: Path) -> str:
    runs = all_runs(runs_dir)
    if not runs:
        return f"no runs under {runs_dir}"
    lines = [f"{'RUN':56} {'STATE':10} {'STAGE':10} {'AGE':>8}  ERROR"]
    for p in runs:
        st = rundir.RunDir(p).read_state()
        name = str(p.relative_to(runs_dir))
        err = (st.get("error") or "").splitlines()[0][:60] if st.get("error") else ""
        lines.append(
            f"{name:56} {st.get('state', '?'):10} {st.get('stage') or '-':10} "
            f"{_age(st.get('created')):>8}  {err}"
        )
    return "\n".join(lines)


def show_logs(run_path: Path, process: str | None, follow: bool, lines: int) -> int:
    logs = rundir.RunDir(run_path).logs
    files = sorted(logs.glob("*.log")) if logs.is_dir() else []
    if not process:
        if not files:
            print(f"no logs yet in {logs}")
        for f in files:
            print(f"{f.stem:32} {f.stat().st_size:>10} bytes  {f}")
        return 0
    path = logs / f"{process}.log"
    if not path.exists():
        close = [f.stem for f in files if process in f.stem]
        hint = f"; did you mean {', '.join(close)}" if close else ""
        raise UserError(f"no log for process {process!r} in {logs}{hint}")
    for line in tail(path, lines):
        print(line)
    if follow:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            try:
                while True:
                    chunk = f.read()
                    if chunk:
                        sys.stdout.write(chunk.decode("utf-8", "replace"))
                        sys.stdout.flush()
                    else:
                        time.sleep(0.5)
            except KeyboardInterrupt:
                pass
    return 0


def cancel(run_path: Path, grace_s: float = 60.0) -> int:
    """Ask the orchestrator to tear down (a file it polls: works on any node, no signals
    to route through Slurm); if it does not end in time, scancel or SIGTERM it."""
    run = rundir.RunDir(run_path)
    st = run.read_state()
    if st.get("state") in rundir.FINAL_STATES:
        print(f"run {run.run_id} already ended: {st['state']}")
        return 0
    by = f"{os.environ.get('USER', 'someone')}@{socket.gethostname()}"
    rundir.write_json(run.cancel_request, {"by": by, "ts": time.time()})
    job = st.get("slurm_job_id")
    pending = job and "PENDING" in (slurm_state(str(job)) or "")
    deadline = time.monotonic() + (0 if pending or st.get("state") == "planned" else grace_s)
    while time.monotonic() < deadline:
        if run.read_state().get("state") in rundir.FINAL_STATES:
            print(f"cancelled {run.run_id}: it tore down and recorded why")
            return 0
        time.sleep(0.5)
    if job:
        subprocess.run(["scancel", str(job)], capture_output=True, timeout=30)
        run.update_state(state="cancelled", error=f"cancelled by {by} (scancel)", ended=time.time())
        print(f"cancelled slurm job {job} ({run.run_id}) with scancel")
        return 0
    pid = st.get("orchestrator_pid")
    if pid:
        try:
            os.kill(int(pid), signal.SIGTERM)
            print(f"sent SIGTERM to the orchestrator of {run.run_id} (pid {pid})")
            return 0
        except ProcessLookupError:
            pass
    run.update_state(state="cancelled", error=f"cancelled by {by}; no orchestrator was running")
    print(f"run {run.run_id}: no orchestrator was running; marked cancelled")
    return 0


def follow(run_path: Path, poll_s: float = 2.0) -> int:
    """Show stage changes until the run ends; 0 only if it succeeded."""
    run = rundir.RunDir(run_path)
    seen = 0
    while True:
        events = run.events()
        for e in events[seen:]:
            detail = e.get("stage") or e.get("process") or e.get("error") or ""
            print(f"[{time.strftime('%H:%M:%S', time.localtime(e['ts']))}] {e['event']} {detail}")
        seen = len(events)
        st = run.read_state()
        if st.get("state") in rundir.FINAL_STATES:
            return 0 if st["state"] == "succeeded" else 1
        s = slurm_state(str(st.get("slurm_job_id") or "")) or ""
        if (
            st.get("slurm_job_id")
            and st.get("state") in ("submitted", "running")
            and not any(x in s for x in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING"))
        ):
            time.sleep(poll_s)  # the final run.json write may trail the job's end
            if run.read_state().get("state") in rundir.FINAL_STATES:
                continue
            print(status_text(run_path))
            return 1
        time.sleep(poll_s)
