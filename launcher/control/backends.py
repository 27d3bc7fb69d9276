"""Process backends: how a rendered Process is started and stopped.

Both run exactly the line commands.sh shows (`[srun ...] env K=V ... argv`), so the dry-run
and the real run cannot drift apart: local runs it as a child process group, Slurm as an
`srun --overlap` step inside the allocation. How a step is told to stop, besides its process
group, is its scheduler's (launcher.control.scheduling).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.control import scheduling
from launcher.planning.plan import Plan
from launcher.planning.render import Process, command_line


def child_env() -> dict[str, str]:
    """The orchestrator's environment with its own interpreter's bin first on PATH, so
    `python -m launcher...` and `vllm-router` resolve to the launcher's installation."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class Handle:
    proc: Process
    popen: subprocess.Popen
    log_path: Path
    started: float = field(default_factory=time.time)
    stopped: bool = False  # nothing more is expected of it (stopped, finished, or noted dead)
    died: bool = False  # exited on its own before teardown (an agent: noted, not fatal)
    lost: bool = False  # its node was lost
    argv: list[str] | None = None  # what it runs, where not proc.argv (a restart's)

    @property
    def running_argv(self) -> list[str]:
        return self.proc.argv if self.argv is None else self.argv

    def exit_code(self) -> int | None:
        return self.popen.poll()

    @property
    def pid(self) -> int:
        return self.popen.pid


class Backend:
    """Starts processes as their own process group; stop() ends the whole group, after the
    scheduler's own way where it has one.

    On Slurm a step is stopped with `scancel --signal=TERM JOB.STEP`, which reaches its tasks
    as SIGTERM: srun itself turns a SIGTERM it receives into SIGKILL of the tasks ("forcing
    job termination"), which would leave no agent its last sample and no engine its shutdown.
    srun then ends with its tasks; one still there after the grace is SIGKILLed, and its step
    cancelled by name. Not `gentle` (a node of the job is lost): Slurm's controller would
    wait on the dead node for every scancel, so srun's own SIGTERM (a SIGKILL of the tasks)
    ends the steps, and Slurm cleans up when the job ends (it kills every step then, whatever
    happens here)."""

    def __init__(self, plan: Plan | None, run_dir: Path):
        self.plan = plan
        self.run_dir = run_dir
        self.env = child_env()
        # only rendered commands before the plan is final: their process groups alone
        self.sched = scheduling.of(plan.cluster) if plan is not None else scheduling.LOCAL

    @classmethod
    def for_steps(cls, run_dir: Path) -> Backend:
        """A backend that only runs rendered commands (before the plan is final)."""
        return cls(None, run_dir)

    def kill(self, popen: subprocess.Popen) -> None:
        """SIGTERM the group, SIGKILL what is left of it after 5 s."""
        _signal_group(popen, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not _ended(popen) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _ended(popen):
            _signal_group(popen, signal.SIGKILL)
            _reap([popen], 5)

    def spawn(self, argv: list[str], log_path: Path) -> subprocess.Popen:
        """`argv` in its own process group, stdout and stderr appended to `log_path`."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.run_dir,
                start_new_session=True,
            )
        finally:
            log.close()

    def start(self, proc: Process, argv: list[str] | None = None) -> Handle:
        """`proc` as commands.sh shows it; `argv`: one of its restarts' command lines."""
        log_path = self.run_dir / proc.log
        line = command_line(self.plan, proc if argv is None else
                            dataclasses.replace(proc, argv=argv))
        return Handle(proc, self.spawn(line, log_path), log_path, argv=argv)

    def abandon(self, handles: list[Handle]) -> None:
        """Processes whose node is lost: nothing can be asked of them; SIGKILL what runs here
        for them (the srun) without waiting."""
        for h in handles:
            h.stopped = True
            if h.exit_code() is None:
                _signal_group(h.popen, signal.SIGKILL)
        _reap([h.popen for h in handles], 2)

    def stop(self, handles: list[Handle], grace_s: float = 10.0, gentle: bool = True,
             settle: bool = True) -> None:
        """SIGTERM every group at once (or the scheduler's step), then SIGKILL what is left
        after `grace_s`. `settle`: more sruns of this job follow, so return only once the
        steps of SIGKILLed sruns have ended (SlurmActions.cancel_steps)."""
        live = [h for h in handles if h.exit_code() is None]
        told = self.sched.signal_steps({h.proc.name for h in live}) if gentle else set()
        for h in live:  # stopped by us, even if one ends before _terminate looks
            h.stopped = True
        # A step the scheduler did not tell gets its group's SIGTERM (srun's own way).
        _terminate(handles, grace_s, signalled=told)
        killed = {h.proc.name for h in handles if h.popen.returncode == -signal.SIGKILL}
        if killed and gentle:
            self.sched.cancel_steps(killed, wait=settle)


def _terminate(
    handles: list[Handle], grace_s: float, signalled: set[str] | frozenset[str] = frozenset()
) -> None:
    """SIGTERM each live process group (except those in `signalled`, told another way), wait
    up to `grace_s` for all of them, SIGKILL what is left, and reap."""
    live = [h for h in handles if not _ended(h.popen)]
    for h in live:
        h.stopped = True
        if h.proc.name not in signalled:
            _signal_group(h.popen, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = [h for h in live if not _ended(h.popen)]
        time.sleep(0.05)
    for h in live:
        _signal_group(h.popen, signal.SIGKILL)
    _reap([h.popen for h in handles], 5)


def _ended(popen: subprocess.Popen) -> bool:
    """The process and every other member of its group are gone. A leader's exit is not
    enough: vLLM's API server can end (or crash on exit) while its engine core, worker or
    multiprocessing resource tracker still runs in its group."""
    return popen.poll() is not None and not _group_runs(popen.pid)


def _group_runs(pgid: int) -> bool:
    """A process of group `pgid` runs. A zombie does not: it only waits for its parent (a
    SIGKILLed member reparented to a pid 1 that is slow to reap)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


def _reap(popens: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait for each process (no zombies) and the rest of its group, at most `timeout_s`
    each."""
    for popen in popens:
        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + timeout_s
        while _group_runs(popen.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def make_backend(plan: Plan, run_dir: Path) -> Backend:
    return Backend(plan, run_dir)
