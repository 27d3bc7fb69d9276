"""Process backends: how a rendered Process is started and stopped.

Both run exactly the line commands.sh shows (`[srun ...] env K=V ... argv`), so the dry-run
and the real run cannot drift apart: local runs it as a child process group, Slurm as an
`srun --overlap` step inside the allocation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    stopped: bool = False

    def exit_code(self) -> int | None:
        return self.popen.poll()

    @property
    def pid(self) -> int:
        return self.popen.pid


class Backend:
    """Starts processes as their own process group; stop() ends the whole group."""

    def __init__(self, plan: Plan | None, run_dir: Path):
        self.plan = plan
        self.run_dir = run_dir
        self.env = child_env()

    @classmethod
    def for_steps(cls, run_dir: Path) -> Backend:
        """A backend that only runs rendered commands (before the plan is final)."""
        return cls(None, run_dir)

    def kill(self, popen: subprocess.Popen) -> None:
        _signal_group(popen, signal.SIGTERM)
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _signal_group(popen, signal.SIGKILL)

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

    def start(self, proc: Process) -> Handle:
        log_path = self.run_dir / proc.log
        return Handle(proc, self.spawn(command_line(self.plan, proc), log_path), log_path)

    def stop(self, handles: list[Handle], grace_s: float = 10.0) -> None:
        """SIGTERM every group at once, then SIGKILL what is left after `grace_s`."""
        live = [h for h in handles if h.exit_code() is None]
        for h in live:
            h.stopped = True
            _signal_group(h.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            live = [h for h in live if h.exit_code() is None]
            time.sleep(0.05)
        for h in live:
            _signal_group(h.popen, signal.SIGKILL)
        for h in handles:
            try:
                h.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


class SrunBackend(Backend):
    """srun steps; Slurm also kills every step when the job ends, whatever happens here."""

    def stop(self, handles: list[Handle], grace_s: float = 10.0) -> None:
        # One SIGTERM: srun forwards it to the step's tasks and waits for them. An srun that
        # had to be SIGKILLed leaves its step running, so such steps are cancelled by name.
        super().stop(handles, grace_s)
        killed = {h.proc.name for h in handles if h.popen.returncode == -signal.SIGKILL}
        if killed:
            cancel_steps(killed)


def cancel_steps(names: set[str]) -> None:
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return
    try:
        out = subprocess.run(
            ["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i %j"],
            capture_output=True, text=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return
    steps = [line.split(None, 1) for line in out.splitlines() if " " in line]
    ids = [sid for sid, name in steps if name.strip() in names]
    if ids:
        subprocess.run(["scancel", "--signal=KILL", *ids], capture_output=True, timeout=10)


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def make_backend(plan: Plan, run_dir: Path) -> Backend:
    return (
        SrunBackend(plan, run_dir) if plan.cluster.scheduler == "slurm" else Backend(plan, run_dir)
    )
