"""Looking at runs from outside: find, reconcile with Slurm, logs, cancel, follow.

A run's files say what its orchestrator last wrote. When the orchestrator died without
recording its end (killed, node lost, out of memory), Slurm's record (or, on the local
profile, its vanished pid) is the truth: `reconcile` writes that down once in
reconciled.json, so the CLI and the dashboard show the same ended run, writes the summary's
honest verdict, and on the local profile stops what the dead orchestrator left running
(on Slurm, the end of the job ends its steps).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher.errors import UserError
from launcher.run import listing
from launcher.run.rundir import (
    RESERVE,
    RUN,
    CancelRecord,
    Reconciled,
    RunDir,
    RunStatus,
    plain,
    tail,
    tail_of,
)
from launcher.run.vocab import State

# Slurm job states in which the batch step may still be alive.
SLURM_LIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUE",
              "RESIZING", "SIGNALING", "STAGE_OUT")  # fmt: skip


def find(runs_dir: Path, ref: str | None) -> RunDir:
    """A run by path, by (a prefix of) its id, or the newest."""
    if ref:
        p = Path(ref)
        if RunDir(p).exists():
            return RunDir(p)
        runs = listing.all_runs(runs_dir)
        exact = [r for r in runs if r.run_id == ref]
        matches = exact or [r for r in runs if r.run_id.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names = ", ".join(m.run_id for m in matches[:5])
            raise UserError(f"{ref!r} matches several runs ({names}): give more of the name")
        from launcher.schema.wording import did_you_mean

        hint = did_you_mean(ref, [r.run_id for r in runs])
        raise UserError(f"no run {ref!r} under {runs_dir} ({hint + '; ' if hint else ''}see: "
                        "python -m launcher runs)")
    runs = listing.all_runs(runs_dir)
    if not runs:
        raise UserError(f"no runs under {runs_dir}: submit a recipe first")
    return runs[0]


def find_study(runs_dir: Path, ref: str | None) -> listing.Study | None:
    """The study `ref` names (its folder's path or exact name), or None when it names none."""
    if not ref:
        return None
    for p in (Path(ref), Path(runs_dir) / ref.rstrip("/")):
        if listing.is_study(p):
            return listing.entries(p)[0]  # type: ignore[return-value]
    return None


def _cancel_turn(run: RunDir, grace_s: float) -> int:
    """One configuration of a study in one allocation: it stops at its next check (or is
    skipped at its turn); the allocation goes on with the next."""
    if run.read_record() is None:
        print(f"run {run.run_id}: its study's allocation skips it when its turn comes")
        return 0
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reconcile(run).final:
            print(f"cancelled {run.run_id}: it tore down and recorded why; its study's "
                  "allocation goes on with the next configuration")
            return 0
        time.sleep(0.5)
    print(f"run {run.run_id}: asked to stop; its study's allocation is still tearing it down "
          f"(cancel the study to end the allocation)")
    return 0


def _cancel_allocation(study: listing.Study, live: list[RunDir]) -> int:
    """A study in one allocation: every configuration not ended is marked, then the one job
    gets scancel (or, on the local profile, the study's process SIGTERM): the configuration
    in progress tears down, the rest are recorded as not run."""
    by = f"{os.environ.get('USER', 'someone')}@{socket.gethostname()}"
    for r in live:
        r.write_cancel(CancelRecord(by=by, ts=time.time()))
    job = next((j for j in (r.read_submission().slurm_job_id for r in live) if j), None)
    if job:
        subprocess.run(["scancel", str(job)], capture_output=True, timeout=30)
        print(f"study {study.name}: cancelled its allocation, slurm job {job} (scancel); "
              f"{len(live)} configuration(s) had not ended")
        return 0
    rec, why = study.allocation_or_why()
    if why:
        raise UserError(f"{why}: which process runs its allocation is not known, so none was "
                        f"signalled; {len(live)} configuration(s) marked cancelled")
    pid = rec.pid if rec is not None else None
    if pid is not None and rec.host == socket.gethostname() and _pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        print(f"study {study.name}: sent SIGTERM to its allocation's process (pid {pid})")
        return 0
    print(f"study {study.name}: no allocation was running; {len(live)} configuration(s) "
          "marked cancelled")
    return 0


def cancel_study(study: listing.Study, grace_s: float = 45.0) -> int:
    """Cancel every run of the study that has not ended, together (one grace period)."""
    import threading

    if study.damaged:  # one allocation or one job each: not known, so nothing is touched
        raise UserError(f"{study.damaged}: how study {study.name} runs is not known, so nothing "
                        "was cancelled; cancel its runs by name, or its Slurm job (scancel)")
    codes: list[int] = []
    status = {r.run_id: reconcile(r) for r in study.runs}
    live = [r for r in study.runs if not status[r.run_id].final and not status[r.run_id].dry_run]
    if not live:
        for why in study.problems():  # allocation.json's: nothing here needs it, it is said
            print(f"warning: {why}")
        dry = sum(st.dry_run for st in status.values())
        print(f"study {study.name}: nothing to cancel ("
              + (f"{dry} dry-run(s), " if dry else "")
              + f"{len(study.runs) - dry} run(s) already ended)")
        return 0
    if study.in_one_allocation:
        return _cancel_allocation(study, live)
    threads = [threading.Thread(target=lambda r=r: codes.append(cancel(r, grace_s)))
               for r in live]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"study {study.name}: {len(live)} run(s) cancelled, "
          f"{len(study.runs) - len(live)} had already ended")
    return max(codes, default=0)


def allocation_live(study: listing.Study) -> tuple[bool | None, str | None]:
    """(whether a one-allocation study's allocation lives, why not when its record says it
    does); (None, None) for a study of one job each. Its record (allocation.json) says
    running until its end; a process gone from this host, or a job Slurm no longer runs,
    ended it without a word. (None, the sentence) when allocation.json is damaged."""
    if not study.in_one_allocation:
        return None, None
    rec, why = study.allocation_or_why()
    if why:
        return None, why
    if rec is None or not rec.running:
        return False, None
    job, pid = rec.slurm_job_id, rec.pid
    if job:
        s = slurm_state(job)
        if s is not None and not any(x in s for x in SLURM_LIVE):
            return False, f"its job {job} ended ({s}) without recording its end"
    elif pid is not None and rec.host == socket.gethostname() and not _pid_alive(pid):
        return False, (f"its process (pid {pid} on {rec.host}) is gone without recording "
                       "its end")
    return True, None


def slurm_state(job_id: str | None) -> str | None:
    """The job's state from squeue, then scontrol (no accounting database needed)."""
    return slurm_job(job_id)[0]


def slurm_job(job_id: str | None) -> tuple[str | None, str | None]:
    """(state, exit code "status:signal") from squeue, then scontrol; (None, None) when Slurm
    does not answer, ("GONE", None) when it forgot the job."""
    if not job_id:
        return None, None
    try:
        out = subprocess.run(
            ["squeue", "--noheader", f"--jobs={job_id}", "--format=%T"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        if out and any(x in out.splitlines()[0] for x in SLURM_LIVE):
            return out.splitlines()[0], None
        out = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, None  # no Slurm here, or it did not answer: nothing to reconcile with
    fields = dict(w.split("=", 1) for w in out.split() if "=" in w)
    if "JobState" not in fields:
        return "GONE", None
    return fields["JobState"], fields.get("ExitCode")


def wait_job_gone(job_id: str, bound_s: float = 180.0, poll_s: float = 1.0,
                  say=print, quiet_s: float = 5.0) -> str | None:
    """Until Slurm has let go of a job whose run already ended: a job the batch step has left
    can stay COMPLETING while Slurm kills what is left of it and runs the epilog on its nodes,
    and those nodes are not free for the next job until then. Returns None once it has left,
    else the state it was still in after `bound_s` (said once, with what to look at)."""
    t0 = time.monotonic()
    told = False
    while True:
        s = slurm_state(job_id)
        if s is None or not any(x in s for x in SLURM_LIVE):
            return None
        waited = time.monotonic() - t0
        if waited >= bound_s:
            say(f"job {job_id} is still {s} {waited:.0f} s after its run ended: Slurm has not "
                f"released its nodes yet (see: scontrol show job {job_id})")
            return s
        if not told and waited >= quiet_s:
            say(f"waiting for Slurm to release job {job_id} ({s}: its epilog and the last "
                f"processes on its nodes; up to {bound_s:.0f} s)")
            told = True
        time.sleep(poll_s)


def _pid_alive(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"launcher" in cmd or b"submitit" in cmd


def batch_output(run: RunDir, job: str | None) -> list[str]:
    """The last lines of the batch step's own output (where a dying orchestrator speaks)."""
    if not job:
        return []
    lines: list[str] = []
    for f in sorted(run.slurm.glob(f"{job}_*_log.out")):
        lines += tail(f, 15)
    return lines


def reconcile(run: RunDir) -> RunStatus:
    """The run's status, corrected (and recorded) when its orchestrator is gone."""
    st = run.status()
    if st.final or st.state == State.PLANNED or RUN in st.damaged:
        return st  # a damaged run.json may hold an end: write nothing over what is there
    rec = st.record
    stage = f"; stage was {rec.stage}" if rec and rec.stage else ""
    if st.slurm_job_id:
        s, exit_code = slurm_job(st.slurm_job_id)
        if s is None or any(x in s for x in SLURM_LIVE):
            return st
        state = State.CANCELLED if s.startswith("CANCELLED") else State.FAILED
        if s.startswith("NODE_FAIL"):
            why = "a node of the job failed (Slurm: NODE_FAIL)"
            down = _down_nodes(run)
            if down:
                why = f"node lost: {down}; Slurm ended the job with NODE_FAIL"
        elif s.startswith("TIMEOUT"):
            why = "the job hit its time limit before the orchestrator could record its end"
        else:
            why = f"Slurm says the job is {s}"
            sig = (exit_code or "").partition(":")[2]
            if sig and sig != "0":
                why += f" (its batch step was killed by signal {sig})"
            elif exit_code:
                why += f" (exit code {exit_code})"
        who = f"pid {rec.orchestrator_pid} on {rec.host}, " if rec and rec.orchestrator_pid else ""
        error = (f"the orchestrator ({who}Slurm job {st.slurm_job_id}) ended without "
                 f"recording its end: {why}{stage}")
        out = batch_output(run, st.slurm_job_id)
        if out:
            error += "; last lines of the batch step:\n" + "\n".join(f"  | {x}" for x in out)
        source = "slurm"
    elif rec and rec.orchestrator_pid and rec.host == socket.gethostname():
        if _pid_alive(rec.orchestrator_pid):
            return st
        state = State.FAILED
        error = (
            f"the orchestrator (pid {rec.orchestrator_pid} on {rec.host}) is gone without "
            f"recording its end (killed?){stage}"
        )
        stopped = stop_orphans(run)
        if stopped:
            error += f"; stopped what it left running: {', '.join(stopped)}"
        source = "pid"
    else:
        return st
    try:
        run.write_reconciled(Reconciled(state, error, time.time(), source))
    except OSError:
        pass  # a read-only run directory: still show the truth
    _withdraw_targets(run)
    _honest_summary(run, state, error)
    try:
        (run.path / RESERVE).unlink(missing_ok=True)
    except OSError:
        pass
    return run.status() if run.reconciled_file.exists() else _with(st, state, error)


def _down_nodes(run: RunDir) -> str:
    """The run's nodes Slurm now has down or not responding: 'gb200-01 (Slurm says down*)'."""
    try:
        from launcher.control.watch import slurm_lost
        from launcher.run.plandoc import read_plan

        lost = slurm_lost([n.name for n in read_plan(run.plan).nodes], anywhere=True)
    except Exception:  # noqa: BLE001 - no plan, no Slurm: say what Slurm said
        return ""
    return ", ".join(f"{n} ({why})" for n, why in sorted(lost.items()))


def stop_orphans(run: RunDir, grace_s: float = 5.0) -> list[str]:
    """Processes of this run on this host whose orchestrator is gone (PD_RUN_DIR in their
    environment, or the pids run.json recorded): SIGTERM their process groups, SIGKILL what
    is left after `grace_s`. Their names."""
    try:
        import psutil
    except ImportError:
        return []
    want = str(run.path)
    found: dict[int, str] = {}
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("PD_RUN_DIR") == want:
            found[p.pid] = env.get("PD_PROCESS") or str(p.pid)
    # A process that rewrote its environment (the router sets its title over it) is found
    # by the pid the orchestrator recorded, if it is still that process (its start time).
    rec = run.read_record()
    for name, pr in (rec.processes.items() if rec else []):
        if not pr.pid or pr.pid in found or pr.started is None:
            continue
        try:
            if abs(psutil.Process(pr.pid).create_time() - pr.started) < 5.0:
                found[pr.pid] = name
        except psutil.Error:
            continue
    for pid in found:
        try:  # each was started as its own process group: the group takes its children along
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + grace_s
    alive = set(found)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if psutil.pid_exists(pid) and not _zombie(pid)}
        time.sleep(0.1)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return sorted(set(found.values()))


def _zombie(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone
        return True


def _honest_summary(run: RunDir, state: State, error: str) -> None:
    """A dead orchestrator wrote no summary (or one of an earlier stage): write the one the
    run's end calls for, so no verdict says more than the run did."""
    try:
        from launcher.run import figures
        from launcher.run.rundir import read_json
        from launcher.telemetry import signals

        old = read_json(run.summary)
        if run.plan.exists() and (not isinstance(old, dict) or old.get("state") != state):
            figures.write_summary(run.path, state, error, signals.scan_run(run.path))
    except Exception:  # noqa: BLE001 - the status must still be shown
        pass


def _withdraw_targets(run: RunDir) -> None:
    """A dead orchestrator never removed its Prometheus targets: do it for it."""
    from launcher.telemetry import promsd

    try:
        from launcher.run.plandoc import read_plan
        from launcher.schema import cluster as cluster_mod

        sd_dir = cluster_mod.load(read_plan(run.plan).cluster).prometheus_sd_dir
    except Exception:  # no plan or profile here: the run-local and runs-dir files still go
        sd_dir = None
    try:
        promsd.withdraw(run, sd_dir)
    except OSError:
        pass


def _with(st: RunStatus, state: State, error: str) -> RunStatus:
    st.state, st.error, st.stage = state, error, None
    return st


def show_logs(run: RunDir, process: str | None, follow: bool, lines: int) -> int:
    files = sorted(run.logs.glob("*.log")) if run.logs.is_dir() else []
    if not process:
        if not files:
            print(f"no logs yet in {run.logs}")
        for f in files:
            print(f"{f.stem:32} {f.stat().st_size:>10} bytes  {f}")
        return 0
    path = run.log(process)
    if not path.exists():
        from launcher.schema.wording import did_you_mean

        close = [f.stem for f in files if process in f.stem]
        hint = f"did you mean {', '.join(close)}" if close else did_you_mean(
            process, [f.stem for f in files])
        hint = f"; {hint}" if hint else ""
        raise UserError(f"no log for process {process!r} in {run.logs}{hint}")
    with open(path, "rb") as f:
        # the tail and the follow read one open file: a line written between them is not lost
        for line in tail_of(f, lines, whole=follow):
            print(line)
        if follow:
            try:
                _follow(run, f)
            except KeyboardInterrupt:
                pass
    return 0


def _follow(run: RunDir, f, poll_s: float = 0.5, check_s: float = 2.0) -> None:
    """Print what is appended to `f` until the run has ended and all of it is printed."""
    sys.stdout.flush()
    next_check = 0.0
    while True:
        chunk = f.read()
        if chunk:
            sys.stdout.write(plain(chunk.decode("utf-8", "replace")))
            sys.stdout.flush()
            continue
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + check_s
            st = reconcile(run)
            if st.final or st.state == State.PLANNED:  # nothing will write to it any more
                rest = f.read()  # what was written between the last read and the check
                if rest:
                    sys.stdout.write(plain(rest.decode("utf-8", "replace")))
                sys.stdout.flush()
                print(f"(run {run.run_id} is {st.state}: nothing more will be written to this "
                      "log)", file=sys.stderr)
                return
        time.sleep(poll_s)


def cancel(run: RunDir, grace_s: float = 45.0) -> int:
    """Ask the orchestrator to tear down (a file it polls: works on any node, no signal to
    route through Slurm); if it does not end in time, scancel or SIGTERM it."""
    st = reconcile(run)
    if st.final:
        print(f"run {run.run_id} already ended: {st.state}")
        return 0
    if st.dry_run:
        print(f"run {run.run_id} is a dry-run: nothing was submitted, nothing to cancel")
        return 0
    by = f"{os.environ.get('USER', 'someone')}@{socket.gethostname()}"
    req = CancelRecord(by=by, ts=time.time())
    if run.read_submission().one_allocation:
        run.write_cancel(req)
        return _cancel_turn(run, grace_s)
    if st.state == State.PLANNED:
        req.outcome = "marked"
        run.write_cancel(req)
        print(f"run {run.run_id} was never submitted; marked cancelled")
        return 0
    run.write_cancel(req)
    job = st.slurm_job_id
    pending = job and "PENDING" in (slurm_state(job) or "")
    deadline = time.monotonic() + (0 if pending else grace_s)
    while time.monotonic() < deadline:
        if reconcile(run).final:
            print(f"cancelled {run.run_id}: it tore down and recorded why")
            return 0
        time.sleep(0.5)
    if job:
        subprocess.run(["scancel", str(job)], capture_output=True, timeout=30)
        req.outcome = "scancel"
        run.write_cancel(req)
        print(f"cancelled slurm job {job} ({run.run_id}) with scancel")
        return 0
    pid = st.record.orchestrator_pid if st.record else None
    if pid and _pid_alive(int(pid)):
        os.kill(int(pid), signal.SIGTERM)
        req.outcome = "signalled"
        run.write_cancel(req)
        print(f"sent SIGTERM to the orchestrator of {run.run_id} (pid {pid})")
        return 0
    req.outcome = "marked"
    run.write_cancel(req)
    print(f"run {run.run_id}: no orchestrator was running; marked cancelled")
    return 0
