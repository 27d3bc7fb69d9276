"""Inside the allocation: its nodes, this process's limits, and the plan for the real
nodes, completed with the address each node reports for itself."""

from __future__ import annotations

import dataclasses
import functools
import os
import resource
import subprocess
from collections.abc import Callable

from launcher.control import preflight, probes, scheduling
from launcher.control.prepare import write_run_files
from launcher.control.record import Book
from launcher.control.scheduling import allocation_nodes as allocation_nodes
from launcher.errors import RunFailed, UserError
from launcher.planning import render, schedulers
from launcher.planning.plan import Plan, Runtime, make_plan, nodes_needed
from launcher.run import rundir
from launcher.schema import cluster as cluster_mod
from launcher.schema import recipe as recipe_mod


def check_allocation(recipe_file, need: int, runtime: dict | None, what: str) -> None:
    """Before anything starts or is written (the directory stays for a proper allocation):
    what this allocation lacks for `what`, in one sentence. `launcher run` inside a salloc
    gets no batch script, so nothing has built the job's environment either."""
    try:
        recipe = recipe_mod.load(str(recipe_file))
        profile = recipe.cluster
        cluster = cluster_mod.load(profile)
    except UserError:
        return  # said where the run loads them, with the run recorded
    if not schedulers.of(cluster).allocates:
        return
    nodes = allocation_nodes()
    if nodes is None:
        return  # plan_here: run it inside an allocation
    job = os.environ.get("SLURM_JOB_ID", "?")
    if len(nodes) < need:
        raise UserError(
            f"this allocation (job {job}) has {len(nodes)} node(s) ({', '.join(nodes)}) and "
            f"{what} needs {need} of {cluster.gpus_per_node} GPUs: run it inside one of {need} "
            f"(salloc -N {need} --gpus-per-node={cluster.gpus_per_node} ...); nothing was "
            "started or written")
    rt = runtime or {}
    if rt.get("mode") == "shared" and rt.get("python") and not os.path.exists(rt["python"]):
        raise UserError(
            f"this allocation (job {job}) has no job environment yet: {rt['python']} is "
            f"built by {rt.get('env')}/bootstrap.sh (`python -m launcher env prepare "
            f"--cluster {profile}` writes it), which a submitted job runs first; run "
            f"`srun -N1 -n1 bash {rt.get('env')}/bootstrap.sh` in it, then this again; "
            "nothing was started or written")
    # an agentic run's staged AIPerf: its venv is built by the batch script too
    try:
        staged = Runtime(**rt).aiperf_env if rt.get("mode") == "shared" else None
    except TypeError:
        staged = None
    ag = recipe.benchmark.agentic
    if staged and ag is not None and ag.aiperf is None \
            and not os.path.exists(f"{staged}/venv/bin/aiperf"):
        raise UserError(
            f"this allocation (job {job}) has no AIPerf environment yet: {staged}/venv is "
            f"built by {staged}/bootstrap.sh (`python -m launcher env prepare --cluster "
            f"{profile} --aiperf` writes it), which a submitted agentic job runs first; run "
            f"`srun -N1 -n1 bash {staged}/bootstrap.sh` in it, then this again; nothing was "
            "started or written")


def release(lost: list[str]) -> str | None:
    """Take lost nodes out of this job (`scontrol update JobId=J NodeList=<the others>`), so
    Slurm keeps it on the others: a job is ended with NODE_FAIL when Slurm marks one of its
    nodes down (after SlurmdTimeout), unless the node is no longer the job's. This process's
    SLURM_* node variables are then what Slurm says (its slurm_job_J_resize.sh), so later
    plans and steps see the smaller allocation. None when done, else why not."""
    import tempfile

    job, nodes = os.environ.get("SLURM_JOB_ID"), allocation_nodes()
    if not job or nodes is None:
        return "not inside a Slurm job"
    keep = [n for n in nodes if n not in lost]
    if not keep:
        return "no node would be left"
    # scontrol writes the resize script into its working directory
    with tempfile.TemporaryDirectory(prefix="pd-resize-") as tmp:
        try:
            p = subprocess.run(["scontrol", "update", f"JobId={job}", f"NodeList={','.join(keep)}"],
                               capture_output=True, text=True, timeout=30, cwd=tmp)
        except (OSError, subprocess.SubprocessError) as e:
            return f"scontrol update failed: {e}"
        if p.returncode:
            return f"scontrol update JobId={job} NodeList=...: " + " ".join(
                (p.stderr or p.stdout or f"exit {p.returncode}").split())
        script = os.path.join(tmp, f"slurm_job_{job}_resize.sh")
        lines = open(script).read().splitlines() if os.path.isfile(script) else []
    changed = _resize_env(lines) or {"SLURM_JOB_NODELIST": ",".join(keep),
                                     "SLURM_NODELIST": ",".join(keep),
                                     "SLURM_JOB_NUM_NODES": str(len(keep)),
                                     "SLURM_NNODES": str(len(keep))}
    os.environ.update({k: v for k, v in changed.items() if v is not None})
    for k in [k for k, v in changed.items() if v is None]:
        os.environ.pop(k, None)
    return None


def _resize_env(lines: list[str]) -> dict[str, str | None]:
    """slurm_job_J_resize.sh's `export K="V"` and `unset K` lines: K -> V (None: unset)."""
    out: dict[str, str | None] = {}
    for line in lines:
        words = line.split(None, 1)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            k, _, v = words[1].partition("=")
            out[k] = v.strip().strip('"')
        elif len(words) == 2 and words[0] == "unset":
            out[words[1].strip()] = None
    return out


def raise_open_files(want: int) -> None:
    """The router and the clients hold a socket per stream: up to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def plan_here(run: rundir.RunDir, book: Book,
              step: Callable[[str, list[list[str]]], None],
              study_span: int | None = None, mount_dir: str | None = None,
              ) -> render.Rendered:
    """Plan on the real nodes (the same pure planner as the dry-run), complete the plan with
    the address each node reports for itself, and render it once: plan.json and
    commands.sh for them, and what the orchestrator starts."""
    recipe = recipe_mod.load(str(run.recipe))
    cluster = cluster_mod.load(recipe.cluster)
    sched = scheduling.of(cluster)
    from launcher.control import compute_env
    from launcher.planning.capacity import resolve_model

    # where the orchestrator runs: the model folder, read once; after an allocation's nodes
    # are found (outside one, that is what is said), before the profile's (they follow it)
    read_model = functools.cache(lambda: resolve_model(recipe))
    nodes = sched.nodes(recipe, cluster, lambda: nodes_needed(recipe, cluster, read_model()))
    model = read_model()
    rt = compute_env.current(run.plan)
    job = sched.job_id()

    def plan_at(slot: int | None) -> Plan:  # None: the block the job id picks
        return make_plan(recipe, cluster, nodes, runtime=rt, job_id=job, model=model,
                         study_span=study_span, port_slot=slot)

    first, moved = probes.free_port_block(plan_at, cluster.port_base)
    if moved:
        book.note(moved)
    first = first.at(str(run.path), mount_dir)
    step("preflight-host", render.check_steps(first)[0][1])
    facts = preflight.read_facts(run.path, list(first.nodes), "host")
    try:
        addresses = preflight.addresses(first, facts)
    except preflight.PreflightFailed as e:
        raise RunFailed("preflight: " + str(e), culprit=e.problems[0].culprit) from None
    problems = preflight.judge_host(first, facts, cluster.nofile)
    if problems:
        raise RunFailed("preflight: " + "; ".join(problems), culprit=problems[0].culprit)
    plan = dataclasses.replace(first, addresses=dict(addresses))
    # job.sbatch stays as it was submitted; the rest now names the real nodes.
    rendered, _ = write_run_files(run, plan, placeholder_nodes=False, with_sbatch=False)
    book.event("planned", nodes=list(plan.nodes), addresses=addresses)
    return rendered
