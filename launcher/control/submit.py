"""Submit (the effect): a prepared run goes to Slurm through submitit, or runs here (local).

Before sbatch: the model must be reachable from the compute nodes (launcher.control.staging)
and a shared compute environment must have its wheelhouse and source copy
(launcher.control.compute_env). `check_slurm` asks the real scheduler (sbatch --test-only)
whether it would take the rendered script: partition, account, gres and segment mistakes
come back in seconds instead of after a queue wait.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time

from launcher.control import compute_env, staging
from launcher.control.prepare import Prepared
from launcher.errors import UserError
from launcher.planning import render, schedulers
from launcher.run import rundir


def _need_sbatch(p: Prepared) -> None:
    if shutil.which("sbatch") is None:
        raise UserError(
            f"recipe {p.plan.recipe.name} is for Slurm cluster {p.plan.cluster.name} but sbatch "
            "is not on PATH here: submit from a login node (or start slurm/devcluster/up.sh)"
        )


def ready(p: Prepared) -> None:
    """What must exist before the job starts: refuse now rather than on the nodes."""
    refuse, _ = staging.check(p.plan.recipe, p.plan.cluster)
    if refuse:
        raise UserError(refuse)
    compute_env.ensure(p.plan.cluster, p.plan.runtime)


def check_slurm(p: Prepared) -> str:
    """sbatch --test-only on the exact script: the scheduler's own verdict, nothing queued."""
    _need_sbatch(p)
    script = p.shared.sbatch_file if p.shared else p.run.sbatch
    proc = subprocess.run(
        ["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60
    )
    words = " ".join((proc.stderr + proc.stdout).split())
    if proc.returncode != 0:
        raise UserError(f"sbatch --test-only refused {script}: {words}"
                        + sbatch_hint(p.plan, proc.stderr))
    return words


def sbatch_hint(plan, stderr: str) -> str:
    """For each option sbatch does not know ("sbatch: unrecognized option '--segment=4'",
    glibc getopt_long's words), the key that put it in the batch script and how to turn it
    off; '' when sbatch refused for another reason."""
    names = re.findall(r"unrecognized option '--([A-Za-z0-9_-]+)", stderr)
    sources = render.directive_sources(plan)
    out = []
    for name in dict.fromkeys(names):
        key, off = sources.get(name, ("", ""))
        if not key:
            out.append(f"--{name} is the launcher's own, which this Slurm does not know: it "
                       "is too old for the launcher")
            continue
        out.append(f"{key} adds --{name}; this Slurm has no such option: "
                   + (off or "the launcher needs it, so it cannot be turned off"))
    return "".join(f"; {x}" for x in out)


def submit_slurm(p: Prepared, runs: list[Prepared] | None = None) -> str:
    """sbatch through submitit; the job runs `python -m launcher run` on the run directory (a
    study in one allocation: on the study's, for every configuration in `runs`). Returns the
    job id."""
    _need_sbatch(p)
    ready(p)
    import submitit

    shared = p.shared
    folder, sbatch = (shared.slurm, shared.sbatch_file) if shared else (p.run.slurm, p.run.sbatch)
    executor = submitit.SlurmExecutor(folder=str(folder))
    executor.update_parameters(**render.slurm_parameters(
        p.plan, shared.nodes if shared else p.nodes, shared.minutes if shared else None))
    members = runs if shared and runs else [p]
    command = render.job_command(p.plan, str(shared.path if shared else p.run.path))
    try:
        # submitit's way to submit a command line, not a pickled function: the script says
        # what it runs, and no submitit handler sits between Slurm's signals and the
        # orchestrator (no requeue either: the script says --no-requeue)
        folder.mkdir(parents=True, exist_ok=True)
        job = executor._submit_command(command)
    except Exception as e:  # sbatch's refusal comes back as a generic error: show its words
        error = f"sbatch refused the job: {' '.join(str(e).split())}" + sbatch_hint(p.plan, str(e))
        for m in members:
            sub = m.run.read_submission()
            sub.error = error
            m.run.write_submission(sub)
        raise UserError(error) from None
    submitted = folder / f"{job.job_id}_submission.sh"
    if submitted.exists():  # what Slurm really got, byte for byte
        rundir.write_atomic(sbatch, submitted.read_text())
    for m in members:
        sub = m.run.read_submission()
        sub.slurm_job_id, sub.submitted, sub.by = job.job_id, time.time(), _who()
        m.run.write_submission(sub)
    return job.job_id


def _who() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


LOCAL_CHECK = "the local profile has no scheduler to ask; plan is valid"


def refused(runs: list[Prepared], why: str) -> None:
    """Record a refusal in every run it left unsubmitted and unstarted: its directory then
    reads refused, with the sentence, not planned."""
    for m in runs:
        try:
            sub = m.run.read_submission()
            if sub.slurm_job_id or sub.error or m.run.state_file.exists():
                continue
            sub.error = why
            m.run.write_submission(sub)
        except OSError:
            pass  # the refusal itself is what the user sees


def blocked(runs: list[Prepared]) -> None:
    """Refuse on the first blocker the plan found (what the dry-run showed as one)."""
    for p in runs:
        if p.blockers:
            raise UserError(p.blockers[0])


def checked(runs: list[Prepared], words: str) -> None:
    """A --check that passed: nothing was submitted, and nothing will run it."""
    for m in runs:
        sub = m.run.read_submission()
        sub.dry_run, sub.checked = True, words
        m.run.write_submission(sub)


def submit_all(runs: list[Prepared], check: bool = False) -> int:
    try:
        return _submit_all(runs, check)
    except UserError as e:
        refused(runs, str(e))
        raise


def _submit_all(runs: list[Prepared], check: bool) -> int:
    code = 0
    blocked(runs)
    if runs and runs[0].shared is not None:
        return submit_study(runs, check)
    if check:
        for p in runs:
            allocates = schedulers.of(p.plan.cluster).allocates
            words = check_slurm(p) if allocates else LOCAL_CHECK
            print(f"{p.run.run_id}: {words}")
            checked([p], f"sbatch --test-only: {words}" if allocates else words)
        return 0
    for p in runs:
        if not schedulers.of(p.plan.cluster).allocates:  # the orchestrator runs here
            from launcher.control import orchestrator

            ready(p)
            print(f"running {p.run.run_id} here (local profile)", flush=True)
            code = max(code, orchestrator.run(p.run.path))
            continue
        job = submit_slurm(p)
        print(f"submitted job {job}: {p.run.path}")
        print(
            f"  follow: python -m launcher status {p.run.path}   logs: python -m launcher logs {p.run.path}"
        )
    return code


def submit_study(runs: list[Prepared], check: bool) -> int:
    """A study in one allocation: one job (or, on the local profile, one run here) for every
    configuration."""
    p, shared = runs[0], runs[0].shared
    assert shared is not None
    allocates = schedulers.of(p.plan.cluster).allocates
    if check:
        words = check_slurm(p) if allocates else LOCAL_CHECK
        print(f"{shared.path.name}: {words}")
        checked(runs, f"sbatch --test-only: {words}" if allocates else words)
        return 0
    from launcher.control import study

    for r in runs:
        ready(r)
    if not allocates:
        print(f"running study {shared.path.name} here in one allocation (local profile): "
              f"{len(runs)} configurations", flush=True)
        return study.run_study(shared.path)
    job = submit_slurm(p, runs)
    print(f"submitted job {job}: study {shared.path} ({len(runs)} configurations in one "
          "allocation)")
    print(f"  follow: python -m launcher status {shared.path}")
    return 0
