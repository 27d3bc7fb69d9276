"""Submit (the effect): a prepared run goes to Slurm through submitit, or runs here (local)."""

from __future__ import annotations

import shutil
import time

from launcher import render, rundir
from launcher.errors import UserError
from launcher.prepare import Prepared


def submit_slurm(p: Prepared) -> str:
    """sbatch through submitit; the job's payload is the orchestrator. Returns the job id."""
    if shutil.which("sbatch") is None:
        raise UserError(
            f"recipe {p.plan.recipe.name} is for Slurm cluster {p.plan.cluster.name} but sbatch "
            "is not on PATH here: submit from a login node (or start slurm/devcluster/up.sh)"
        )
    import submitit

    from launcher import orchestrator

    # No requeue on timeout: a serving benchmark restarted from scratch would mislead.
    executor = submitit.SlurmExecutor(folder=str(p.run.slurm), max_num_timeout=0, python=None)
    executor.update_parameters(**render.slurm_parameters(p.plan, p.nodes))
    try:
        job = executor.submit(orchestrator.run_in_allocation, str(p.run.path))
    except Exception as e:  # sbatch's refusal comes back as a generic error: show its words
        p.run.update_state(state="failed", error=f"sbatch refused the job: {e}")
        raise UserError(f"sbatch refused the job: {e}") from None
    submitted = p.run.slurm / f"{job.job_id}_submission.sh"
    if submitted.exists():  # what Slurm really got, byte for byte
        rundir.write_atomic(p.run.sbatch, submitted.read_text())
    p.run.update_state(state="submitted", slurm_job_id=job.job_id, submitted=time.time())
    p.run.event("submitted", slurm_job_id=job.job_id)
    return job.job_id


def submit_all(runs: list[Prepared], wait: bool = False) -> int:
    from launcher import runs as runs_mod

    code = 0
    for p in runs:
        if p.plan.cluster.scheduler == "local":
            from launcher import orchestrator

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
                code = max(code, runs_mod.follow(p.run.path))
    return code
