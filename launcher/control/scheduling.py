"""What a scheduler does (the effects): where a run's nodes come from, what a dry-run asks it
(a partition's limits, a test submission), submitting a job, and signalling its steps.

One class per `scheduler` of a cluster profile, each on its own, beside its pure half in
launcher.planning.schedulers (step lines, the batch script, the words for sbatch's refusals).
The answers go back to planning as plain data (`Partition`), so planning starts nothing.

- `local`: this host; the orchestrator runs here, in the submitting process.
- `slurm`: sbatch through submitit; scontrol, squeue and scancel for the rest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UserError
from launcher.planning import schedulers
from launcher.planning.schedulers import Partition
from launcher.run import rundir
from launcher.schema import cluster as cluster_mod

if TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.schema.cluster import Cluster
    from launcher.schema.recipe import Recipe

LOCAL_CHECK = "the local profile has no scheduler to ask; plan is valid"
ASK_TIMEOUT_S = 5.0  # a controller that does not answer must not hold up a dry-run
# How long a stop waits for the steps it cancelled to end (KillWait's usual 30 s)
STEP_END_WAIT_S = 30.0


@dataclass(frozen=True)
class Job:
    """What a scheduler is handed: a prepared run directory (or a study's folder, for a study
    in one allocation) and the launcher's own work around it."""

    plan: Plan
    path: Path  # what `launcher run` runs
    nodes: int
    minutes: int | None  # a study's one allocation holds its configurations' time together
    ready: Callable[[], None]  # what must exist before it starts (refuses otherwise)
    here: Callable[[], int]  # it, run to its end in this process; its exit status


@dataclass(frozen=True)
class Submitted:
    job_id: str | None  # None: it ran here, to its end
    code: int = 0


class LocalActions:
    """This host: the orchestrator runs in the submitting process."""

    name = "local"

    def job_id(self) -> str | None:
        """The job this process runs in."""
        return None

    def nodes(self, recipe: Recipe, cluster: Cluster, need: Callable[[], int]) -> list[str]:
        """The nodes a run has where it runs (`need()`: how many its plan needs)."""
        return cluster_mod.profile_nodes(cluster, need())

    def partition(self, name: str | None) -> Partition | None:
        """The limits a job of its own is held to, as the scheduler has them; None: none
        known (or none asked)."""
        return None

    def check(self, plan: Plan, script: Path) -> tuple[str, str]:
        """Would it take the job? (what to print, what submission.json's `checked` says);
        a refusal is a UserError."""
        return LOCAL_CHECK, LOCAL_CHECK

    def submit(self, job: Job) -> Submitted:
        """Hand it the job. Here: it runs in this process, to its end."""
        job.ready()
        return Submitted(None, job.here())

    def signal_steps(self, names: set[str]) -> set[str]:
        """SIGTERM the processes `names` the scheduler's way; the ones it told (the rest
        get their process group's)."""
        return set()

    def cancel_steps(self, names: set[str], wait: bool = True) -> None:
        """What the scheduler still runs for processes whose own process was SIGKILLed."""


class SlurmActions:
    """A Slurm allocation: sbatch, scontrol, squeue and scancel."""

    name = "slurm"

    def job_id(self) -> str | None:
        return os.environ.get("SLURM_JOB_ID")

    def nodes(self, recipe: Recipe, cluster: Cluster, need: Callable[[], int]) -> list[str]:
        nodes = allocation_nodes()
        if nodes is None:
            raise UserError(
                f"recipe {recipe.name} is for Slurm cluster {cluster.name}: run it inside an "
                f"allocation (submit does that), or use a recipe for the local profile"
            )
        return nodes

    def partition(self, name: str | None) -> Partition | None:
        """The partition a job goes to (`sbatch_partition(name)`, else the default one) as
        this host's Slurm has it (`scontrol show partition`), or None when it cannot be asked
        (no scontrol, a controller that does not answer, a partition it does not know)."""
        name = sbatch_partition(name)
        if shutil.which("scontrol") is None:
            return None
        argv = ["scontrol", "-o", "show", "partition", *([name] if name else [])]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=ASK_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None
        return schedulers.read_partition(proc.stdout, name) if proc.returncode == 0 else None

    def need_sbatch(self, plan: Plan) -> None:
        if shutil.which("sbatch") is None:
            raise UserError(
                f"recipe {plan.recipe.name} is for Slurm cluster {plan.cluster.name} but sbatch "
                "is not on PATH here: submit from a login node (or start slurm/devcluster/up.sh)"
            )

    def check(self, plan: Plan, script: Path) -> tuple[str, str]:
        """sbatch --test-only on the exact script: the scheduler's own verdict, nothing
        queued."""
        self.need_sbatch(plan)
        proc = subprocess.run(
            ["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60
        )
        words = " ".join((proc.stderr + proc.stdout).split())
        if proc.returncode != 0:
            raise UserError(f"sbatch --test-only refused {script}: {words}"
                            + schedulers.SLURM.sbatch_hint(plan, proc.stderr))
        return words, f"sbatch --test-only: {words}"

    def submit(self, job: Job) -> Submitted:
        """sbatch through submitit, as a command line (`_submit_command`), not a pickled
        function: the script says what it runs, and no submitit handler sits between
        Slurm's signals and the orchestrator. job.sbatch becomes what Slurm really got."""
        self.need_sbatch(job.plan)
        job.ready()
        import submitit

        plan_side = schedulers.SLURM
        folder = job.path / rundir.SLURM
        executor = submitit.SlurmExecutor(folder=str(folder))
        executor.update_parameters(**plan_side.parameters(job.plan, job.nodes, job.minutes))
        command = plan_side.job_command(job.plan, str(job.path))
        try:
            folder.mkdir(parents=True, exist_ok=True)
            queued = executor._submit_command(command)
        except Exception as e:  # sbatch's refusal comes back as a generic error: its words
            raise UserError(f"sbatch refused the job: {' '.join(str(e).split())}"
                            + plan_side.sbatch_hint(job.plan, str(e))) from None
        submitted = folder / f"{queued.job_id}_submission.sh"
        if submitted.exists():  # what Slurm really got, byte for byte
            rundir.write_atomic(job.path / rundir.SBATCH, submitted.read_text())
        return Submitted(queued.job_id)

    def signal_steps(self, names: set[str]) -> set[str]:
        """`scancel --signal=TERM JOB.STEP`, which reaches a step's tasks as SIGTERM (srun
        turns a SIGTERM of its own into SIGKILL of the tasks)."""
        ids = step_ids(names)
        if not ids:
            return set()
        try:
            # In a multi-node job scancel can exit non-zero ("Invalid job id") for the
            # nodes without the step although the step's tasks got the signal: waiting
            # out the grace, then SIGKILL, covers a signal that really did not arrive.
            subprocess.run(
                ["scancel", "--signal=TERM", *[i for v in ids.values() for i in v]],
                capture_output=True, timeout=10,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return set()
        return set(ids)

    def cancel_steps(self, names: set[str], wait: bool = True) -> None:
        """An srun that had to be SIGKILLed leaves its step running: cancel it by name, and
        (`wait`) return once it has ended, at most STEP_END_WAIT_S. Until then Slurm sends
        the step's messages to the dead srun's ports, and an srun started meanwhile on this
        host that took one of them aborts its own step (docs/contracts.md)."""
        def listed() -> set[str]:
            return {i for v in step_ids(names).values() for i in v}

        ids = listed()
        if not ids:
            return
        try:
            subprocess.run(["scancel", "--signal=KILL", *sorted(ids)], capture_output=True,
                           timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return
        deadline = time.monotonic() + (STEP_END_WAIT_S if wait else 0.0)
        while time.monotonic() < deadline and ids & listed():
            time.sleep(0.2)


def sbatch_partition(name: str | None) -> str | None:
    """The partition sbatch sends a job to whose script names `name`: SBATCH_PARTITION where
    the environment sets it (sbatch takes it over the script's --partition line)."""
    return os.environ.get("SBATCH_PARTITION") or name


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


def step_ids(names: set[str]) -> dict[str, list[str]]:
    """This job's steps named after these processes (srun --job-name): name -> step ids."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or not names:
        return {}
    try:
        out = subprocess.run(
            ["squeue", "--steps", f"--jobs={job}", "--noheader", "--format=%i %j"],
            capture_output=True, text=True, timeout=10,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        sid, _, name = line.strip().partition(" ")
        if name.strip() in names:
            found.setdefault(name.strip(), []).append(sid)
    return found


LOCAL, SLURM = LocalActions(), SlurmActions()
Actions = LocalActions | SlurmActions
ACTIONS: dict[str, Actions] = {s.name: s for s in (LOCAL, SLURM)}


def of(cluster: Cluster) -> Actions:
    return ACTIONS[cluster.scheduler]  # the profile's schema admits only these


def partition_limits(cluster: Cluster, name: str | None) -> Partition | None:
    """What a dry-run asks the scheduler before planning judges a job of its own: the
    partition's limits (plain data), None where none are known."""
    return of(cluster).partition(name)
