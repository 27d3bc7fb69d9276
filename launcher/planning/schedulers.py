"""Schedulers (pure): where a run's nodes come from and how a process is started on one.

One object per `scheduler` of a cluster profile; what differs between them is decided here
(the renderer, the planner, the submitter and the orchestrator ask `of(cluster)`):

- `local`: this host; the profile's nodes are names of slots on it, and the orchestrator
  runs here, in the submitting process.
- `slurm`: an allocation (submitit's sbatch); nodes are known only inside it, every
  process is an `srun` step of the job, and the job has a time limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.run.vocab import Kind

if TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.run.plandoc import Process
    from launcher.spec.cluster import Cluster

Commands = list[list[str]]


def gpu_request(plan: Plan) -> str:
    """The same GPU request on the job and on every step that needs GPUs (sites that reject
    --gpus-per-node reject it on steps too)."""
    c = plan.cluster
    if c.gpu_directive == "gres":
        return f"--gres=gpu:{c.gres_type + ':' if c.gres_type else ''}{c.gpus_per_node}"
    return f"--gpus-per-node={c.gpus_per_node}"


class Local:
    """This host: the orchestrator runs in the submitting process."""

    name = "local"
    allocates = False   # nodes come from a batch allocation, known only inside it
    job_id_env: str | None = None  # the variable that holds the job's id inside it
    time_limited = False
    # the profile's GPUs are slots on a machine that may have none: no count to check
    counts_gpus = False

    def addresses(self, nodes: list[str]) -> dict[str, str]:
        """Each node's address before the nodes report their own."""
        return {n: "127.0.0.1" for n in nodes}

    def step_prefix(self, plan: Plan, proc: Process, container_flags: list[str]) -> list[str]:
        """What a process's command line starts with (before its environment and argv)."""
        return []

    def preflight_steps(self, plan: Plan, host: list[str], inside: list[str],
                        stages: list[tuple[str, list[str]]]) -> list[tuple[str, Commands]]:
        """(name, commands) of the preflight: the host check on every node, the stages
        (the image's import, the model's download) on the first node, then the check inside
        the engine's container on every node. Here: one command per node."""
        steps = [("preflight-host", [[*host, "--node", n] for n in plan.nodes])]
        steps += [(name, [cmd]) for name, cmd in stages]
        return [*steps, ("preflight-container", [[*inside, "--node", n] for n in plan.nodes])]

    def remote_nodes(self, cluster: Cluster) -> bool:
        """Whether the compute nodes are other hosts (a local disk here is not theirs)."""
        return False

    def runs_dir_problem(self, text: str) -> str | None:
        """Why the runs directory's path cannot be written where this scheduler writes it."""
        return None


class Slurm(Local):
    """A Slurm allocation: every process is an srun step of the job."""

    name = "slurm"
    allocates = True
    job_id_env = "SLURM_JOB_ID"
    time_limited = True
    counts_gpus = True

    def addresses(self, nodes: list[str]) -> dict[str, str]:
        return {n: n for n in nodes}

    def job_step(self, plan: Plan) -> list[str]:
        """srun's options that put a step in this job. --jobid makes a line runnable by hand
        from a login node (without it, srun would ask for a new allocation)."""
        return ["srun", f"--jobid={plan.job_id or '$SLURM_JOB_ID'}", "--overlap"]

    def step_prefix(self, plan: Plan, proc: Process, container_flags: list[str]) -> list[str]:
        argv = [*self.job_step(plan), "--nodes=1", "--ntasks=1", f"--nodelist={proc.node}",
                f"--job-name={proc.name}", "--kill-on-bad-exit=1"]
        if proc.gpus or proc.kind == Kind.AGENT:  # with device cgroups a step sees what it asks for
            argv.append(gpu_request(plan))
        return [*argv, *container_flags]

    def preflight_steps(self, plan: Plan, host: list[str], inside: list[str],
                        stages: list[tuple[str, list[str]]]) -> list[tuple[str, Commands]]:
        """Each check is one step over every node (the container check, with pyxis, creates
        the job's named container once per node: every later step reuses it); each stage
        one step on the first node."""
        step = [*self.job_step(plan), f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(plan.nodes)}", gpu_request(plan)]
        one = [*self.job_step(plan), "--nodes=1", "--ntasks=1", f"--nodelist={plan.nodes[0]}"]
        steps = [("preflight-host", [[*step, "--job-name=preflight-host", *host]])]
        steps += [(name, [[*one, f"--job-name={name}", *cmd]]) for name, cmd in stages]
        container = [*step, "--job-name=preflight-container", *inside]
        return [*steps, ("preflight-container", [container])]

    def remote_nodes(self, cluster: Cluster) -> bool:
        return not cluster.network.loopback_ok

    def runs_dir_problem(self, text: str) -> str | None:
        from launcher.spec import recipe

        if "%" in text:
            return ("contains '%', which Slurm reads as a pattern in the batch output's file "
                    "name: choose a directory without it")
        why = recipe.sbatch_problem(text)
        return f"goes into the #SBATCH lines: {why}" if why else None


SCHEDULERS: dict[str, Local] = {s.name: s for s in (Local(), Slurm())}


def of(cluster: Cluster) -> Local:
    return SCHEDULERS[cluster.scheduler]  # the profile's schema admits only these
