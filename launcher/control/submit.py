"""Submit (the effect): a prepared run, or a study in one allocation, is handed to its
scheduler (launcher.control.scheduling): Slurm queues it through submitit, the local profile
runs it here.

Before anything starts: the model must be reachable from the compute nodes
(launcher.control.staging) and a shared compute environment must have its wheelhouse and
source copy (launcher.control.compute_env). `--check` asks the scheduler itself whether it
would take the rendered script (Slurm: sbatch --test-only): partition, account, gres and
segment mistakes come back in seconds instead of after a queue wait.
"""

from __future__ import annotations

import time

from launcher.control import compute_env, scheduling, staging
from launcher.control.prepare import Prepared
from launcher.errors import UserError


def ready(p: Prepared) -> None:
    """What must exist before the job starts: refuse now rather than on the nodes."""
    refuse, _ = staging.check(p.plan.recipe, p.plan.cluster)
    if refuse:
        raise UserError(refuse)
    compute_env.ensure(p.plan.cluster, p.plan.runtime)


def submitted(members: list[Prepared], job_id: str) -> None:
    """Every run the job runs records it (and who submitted it, when)."""
    for m in members:
        sub = m.run.read_submission()
        sub.slurm_job_id, sub.submitted, sub.by = job_id, time.time(), _who()
        m.run.write_submission(sub)


def _who() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


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
            said, words = scheduling.of(p.plan.cluster).check(p.plan, p.run.sbatch)
            print(f"{p.run.run_id}: {said}")
            checked([p], words)
        return 0
    for p in runs:
        done = scheduling.of(p.plan.cluster).submit(_job(p))
        code = max(code, done.code)
        if done.job_id is None:
            continue  # it ran here, to its end
        submitted([p], done.job_id)
        print(f"submitted job {done.job_id}: {p.run.path}")
        print(
            f"  follow: python -m launcher status {p.run.path}   logs: python -m launcher logs {p.run.path}"
        )
    return code


def _job(p: Prepared) -> scheduling.Job:
    def here() -> int:
        from launcher.control import orchestrator

        print(f"running {p.run.run_id} here (local profile)", flush=True)
        return orchestrator.run(p.run.path)

    return scheduling.Job(p.plan, p.run.path, p.nodes, None, lambda: ready(p), here)


def submit_study(runs: list[Prepared], check: bool) -> int:
    """A study in one allocation: one job (or, on the local profile, one run here) for every
    configuration."""
    p, shared = runs[0], runs[0].shared
    assert shared is not None
    sched = scheduling.of(p.plan.cluster)
    if check:
        said, words = sched.check(p.plan, shared.sbatch_file)
        print(f"{shared.path.name}: {said}")
        checked(runs, words)
        return 0
    from launcher.control import study

    for r in runs:
        ready(r)

    def here() -> int:
        print(f"running study {shared.path.name} here in one allocation (local profile): "
              f"{len(runs)} configurations", flush=True)
        return study.run_study(shared.path)

    # every configuration is ready (above): nothing more to do before it starts
    done = sched.submit(scheduling.Job(p.plan, shared.path, shared.nodes, shared.minutes,
                                       lambda: None, here))
    if done.job_id is None:
        return done.code
    submitted(runs, done.job_id)
    print(f"submitted job {done.job_id}: study {shared.path} ({len(runs)} configurations in "
          "one allocation)")
    print(f"  follow: python -m launcher status {shared.path}")
    return 0
