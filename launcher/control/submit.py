"""Submit (the effect): a prepared run goes to Slurm through submitit, or runs here (local)."""

from __future__ import annotations

import shutil
import time

from launcher.control.prepare import Prepared
from launcher.errors import UserError
from launcher.planning import render
from launcher.run import rundir


def submit_slurm(p: Prepared) -> str:
    """sbatch through submitit; the job's payload is the orchestrator. Returns the job id."""
    if shutil.which("sbatch") is None:
        raise UserError(
            f"recipe {p.plan.recipe.name} is for Slurm cluster {p.plan.cluster.name} but sbatch "
            "is not on PATH here: submit from a login node (or start slurm/devcluster/up.sh)"
        )
    import submitit

    from launcher.control import orchestrator

    # No requeue on timeout: a serving benchmark restarted from scratch would mislead.
    executor = submitit.SlurmExecutor(folder=str(p.run.slurm), max_num_timeout=0, python=None)
    executor.update_parameters(**render.slurm_parameters(p.plan, p.nodes))
    try:
        job = executor.submit(orchestrator.run_in_allocation, str(p.run.path))
    except Exception as e:  # sbatch's refusal comes back as a generic error: show its words
        sub = p.run.read_submission()
        sub.error = f"sbatch refused the job: {e}"
        p.run.write_submission(sub)
        raise UserError(sub.error) from None
    submitted = p.run.slurm / f"{job.job_id}_submission.sh"
    if submitted.exists():  # what Slurm really got, byte for byte
        rundir.write_atomic(p.run.sbatch, submitted.read_text())
    sub = p.run.read_submission()
    sub.slurm_job_id, sub.submitted, sub.by = job.job_id, time.time(), _who()
    p.run.write_submission(sub)
    return job.job_id


def _who() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def submit_all(runs: list[Prepared], wait: bool = False) -> int:
    from launcher.control import runs as runs_mod

    code = 0
    for p in runs:
        if p.plan.cluster.scheduler == "local":
            from launcher.control import orchestrator

            print(f"running {p.run.run_id} here (local profile)", flush=True)
            code = max(code, orchestrator.run(p.run.path))
            continue
        job = submit_slurm(p)
        print(f"submitted job {job}: {p.run.path}")
        print(
            f"  follow: python -m launcher status {p.run.path}   logs: python -m launcher logs {p.run.path}"
        )
    if wait:
        for p in runs:
            if p.plan.cluster.scheduler == "slurm":
                code = max(code, runs_mod.follow(p.run))
    return code
