"""Schedulers as the planner sees them: addresses, step lines, the batch script, the time
limit, and the words for what a scheduler's own programs said. Pure: nothing here starts a
process; what a scheduler does (sbatch, scontrol, squeue, scancel) is
launcher.control.scheduling, which asks and hands the answers back as data (`Partition`).

One class per `scheduler` of a cluster profile, each on its own (none is built on another),
and what differs between them is its methods: the renderer, the planner and the dry-run ask
`of(cluster)`.

- `local`: this host; the profile's nodes are names of slots on it, and the orchestrator
  runs here, in the submitting process.
- `slurm`: an allocation (submitit's sbatch); nodes are known only inside it, every
  process is an `srun` step of the job, and the job has a time limit.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.planning.plan import job_port_slots
from launcher.run.vocab import Kind
from launcher.schema.sections import sbatch_problem

if TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.run.plandoc import Process
    from launcher.schema.cluster import Cluster
    from launcher.schema.recipe import Recipe

Commands = list[list[str]]


def gpu_request(plan: Plan) -> list[str]:
    """The same GPU request on the job and on every step that needs GPUs (sites that reject
    --gpus-per-node reject it on steps too); none for gpu_directive: none."""
    c = plan.cluster
    if c.gpu_directive == "none":
        return []
    if c.gpu_directive == "gres":
        return [f"--gres=gpu:{c.gres_type + ':' if c.gres_type else ''}{c.gpus_per_node}"]
    return [f"--gpus-per-node={c.gpus_per_node}"]


def site_options(plan: Plan, proc: Process | None) -> list[str]:
    """The profile's and the recipe's extra srun options for a step (a pool's own for its
    engines'), then the IMEX channel's request for a container step."""
    opts = [*plan.cluster.srun_options, *plan.recipe.slurm.srun_options]
    if proc is not None and proc.kind == Kind.ENGINE and proc.role:
        opts += getattr(plan.recipe, str(proc.role)).srun_options
    return opts


@dataclass(frozen=True)
class Partition:
    name: str
    max_minutes: int | None  # None: no limit
    max_nodes: int | None
    max_time: str  # as Slurm writes it

    def to_json(self) -> dict:
        return {"partition": self.name, "max_minutes": self.max_minutes,
                "max_nodes": self.max_nodes, "max_time": self.max_time,
                "source": "scontrol show partition"}


def read_partition(text: str, name: str | None) -> Partition | None:
    """The partition `name` (else the default one) in `scontrol -o show partition`'s
    output, or None when it is not there."""
    for line in text.splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if (f.get("PartitionName") == name) if name else (f.get("Default") == "YES"):
            return Partition(f["PartitionName"], slurm_minutes(f.get("MaxTime")),
                             _count(f.get("MaxNodes")), f.get("MaxTime") or "?")
    return None


class Local:
    """This host: the orchestrator runs in the submitting process."""

    name = "local"
    allocates = False   # nodes come from a batch allocation, known only inside it

    def addresses(self, nodes: list[str]) -> dict[str, str]:
        """Each node's address before the nodes report their own."""
        return {n: "127.0.0.1" for n in nodes}

    def time_limit_s(self, recipe: Recipe) -> int | None:
        """The time limit it puts on a run of `recipe`; None: none."""
        return None

    def port_note(self, plan: Plan) -> str | None:
        """What the dry-run says about the ports beside the plan's, if anything."""
        return None

    def gpu_count_problem(self, cluster: Cluster, gpus: dict) -> str | None:
        """What is wrong with the GPUs a node's host check found (its `gpus` fact)."""
        return None  # the profile's GPUs are slots on a machine that may have none

    def step_prefix(self, plan: Plan, proc: Process, container_flags: list[str]) -> list[str]:
        """What a process's command line starts with (before its environment and argv)."""
        return []

    def preflight_steps(self, plan: Plan, host: list[str], inside: list[str],
                        stages: list[tuple[str, list[str]]]) -> list[tuple[str, Commands]]:
        """(name, commands) of the preflight: the host check on every node, the stages
        (the image's import, the model's download) on the first node, then the check inside
        the engine's container on every node. Here the nodes are one machine: one command
        checks them all (what is the machine's is found once, vLLM's parser built once)."""
        every = [x for n in plan.nodes for x in ("--node", n)]
        steps = [("preflight-host", [[*host, *every]])]
        steps += [(name, [cmd]) for name, cmd in stages]
        return [*steps, ("preflight-container", [[*inside, *every]])]

    def batch_script(self, plan: Plan, nodes: int, folder: str,
                     minutes: int | None = None) -> str | None:
        """job.sbatch, for a scheduler that takes one; `folder`: the batch output's."""
        return None

    def remote_nodes(self, cluster: Cluster) -> bool:
        """Whether the compute nodes are other hosts (a local disk here is not theirs)."""
        return False

    def runs_dir_problem(self, text: str) -> str | None:
        """Why the runs directory's path cannot be written where this scheduler writes it."""
        return None


class Slurm:
    """A Slurm allocation: every process is an srun step of the job."""

    name = "slurm"
    allocates = True

    def addresses(self, nodes: list[str]) -> dict[str, str]:
        return {n: n for n in nodes}

    def time_limit_s(self, recipe: Recipe) -> int | None:
        return recipe.slurm.minutes * 60

    def port_note(self, plan: Plan) -> str | None:
        if plan.job_id is not None:
            return None  # inside the job: its ports are the plan's
        slots, block = job_port_slots(plan.cluster, plan.port_span)
        if slots <= 1:
            return None
        return (f"Ports: each job adds (its job id mod {slots}) x {block:,} to those below, so "
                "jobs that share a host do not collide.")

    def gpu_count_problem(self, cluster: Cluster, gpus: dict) -> str | None:
        count = gpus.get("count")
        if count is None or count == cluster.gpus_per_node:
            return None
        return (f"shows {count} GPUs ({gpus.get('source')}) but the plan needs "
                f"{cluster.gpus_per_node}: check the job's GPU request (profile gpu_directive) "
                f"or the node's health")

    def job_step(self, plan: Plan) -> list[str]:
        """srun's options that put a step in this job. --jobid makes a line runnable by hand
        from a login node (without it, srun would ask for a new allocation)."""
        return ["srun", f"--jobid={plan.job_id or '$SLURM_JOB_ID'}", "--overlap"]

    def step_prefix(self, plan: Plan, proc: Process, container_flags: list[str]) -> list[str]:
        argv = [*self.job_step(plan), "--nodes=1", "--ntasks=1", f"--nodelist={proc.node}",
                f"--job-name={proc.name}", "--kill-on-bad-exit=1"]
        if proc.gpus or proc.kind == Kind.AGENT:  # with device cgroups a step sees what it asks for
            argv += gpu_request(plan)
        return [*argv, *site_options(plan, proc), *container_flags]

    def preflight_steps(self, plan: Plan, host: list[str], inside: list[str],
                        stages: list[tuple[str, list[str]]]) -> list[tuple[str, Commands]]:
        """Each check is one step over every node (the container check, with pyxis, creates
        the job's named container once per node: every later step reuses it); each stage
        one step on the first node."""
        step = [*self.job_step(plan), f"--nodes={len(plan.nodes)}", "--ntasks-per-node=1",
                f"--nodelist={','.join(plan.nodes)}", *gpu_request(plan), *site_options(plan, None)]
        one = [*self.job_step(plan), "--nodes=1", "--ntasks=1", f"--nodelist={plan.nodes[0]}",
               *site_options(plan, None)]
        steps = [("preflight-host", [[*step, "--job-name=preflight-host", *host]])]
        steps += [(name, [[*one, f"--job-name={name}", *cmd]]) for name, cmd in stages]
        container = [*step, "--job-name=preflight-container", *inside]
        return [*steps, ("preflight-container", [container])]

    def remote_nodes(self, cluster: Cluster) -> bool:
        return not cluster.network.loopback_ok

    def runs_dir_problem(self, text: str) -> str | None:
        if "%" in text:
            return ("contains '%', which Slurm reads as a pattern in the batch output's file "
                    "name: choose a directory without it")
        why = sbatch_problem(text)
        return f"goes into the #SBATCH lines: {why}" if why else None

    # --- the batch script ------------------------------------------------------------------

    def parameters(self, plan: Plan, nodes: int, minutes: int | None = None) -> dict:
        """submitit SlurmExecutor parameters: the one place the allocation request is decided.
        `minutes`: a study's one allocation holds its configurations' time together."""
        r, c = plan.recipe, plan.cluster
        params: dict = {
            "job_name": f"pd-{r.name}" + ("-study" if minutes else ""),
            "time": minutes or r.slurm.minutes,
            "partition": r.slurm.partition,
            "account": r.slurm.account,
            "qos": r.slurm.qos,
            "exclusive": c.exclusive or None,
            "stderr_to_stdout": True,
            "wckey": None,
            "use_srun": False,  # one orchestrator in the batch step starts every srun step itself
        }
        if c.gpu_directive == "gres":
            params["gres"] = f"gpu:{c.gres_type + ':' if c.gres_type else ''}{c.gpus_per_node}"
        elif c.gpu_directive == "gpus-per-node":
            params["gpus_per_node"] = c.gpus_per_node
        # submitit counts tasks from `nodes`; the orchestrator is one task, so the node count
        # goes in as an additional parameter, which overrides submitit's --nodes=1 line.
        # B: the batch shell gets the signal, and the batch shell is the orchestrator (exec):
        # it tears down and writes its summary before Slurm kills the job. No requeue: a run
        # directory is written by one attempt only.
        extra: dict = {
            "nodes": nodes, "ntasks_per_node": 1, "signal": f"B:USR2@{r.slurm.signal_lead_s}",
            "no_requeue": True,
        }  # fmt: skip
        if c.mem_zero:
            extra["mem"] = "0"
        if c.segment:
            extra["segment"] = nodes
        extra.update(
            {k.lstrip("-").replace("-", "_"): v for k, v in r.slurm.directives.items()
             if v is not None}
        )  # None removes a directive, as it removes a flag
        params["additional_parameters"] = extra
        params["setup"] = self.setup_lines(plan) or None
        # wckey=None is how submitit drops its default "#SBATCH --wckey=submitit" line.
        return {k: v for k, v in params.items() if v is not None or k == "wckey"}

    def directive_sources(self, plan: Plan) -> dict[str, tuple[str, str]]:
        """Each sbatch option `parameters` writes -> (the recipe or profile key that adds
        it, how to turn it off; '' when the launcher needs it): what a Slurm that does not
        know the option needs said."""
        r, c = plan.recipe, plan.cluster
        profile, where = "the cluster profile's", f"in {r.cluster}"
        out = {
            "partition": ("the recipe's slurm.partition", "remove it (the site's default)"),
            "account": ("the recipe's slurm.account", "remove it"),
            "qos": ("the recipe's slurm.qos", "remove it"),
            "time": ("the recipe's slurm.time_limit", ""),
            "signal": ("the recipe's slurm.signal_lead_s", ""),  # teardown before the limit
            "exclusive": (f"{profile} exclusive: true", f"set exclusive: false {where}"),
            "mem": (f"{profile} mem_zero: true", f"set mem_zero: false {where}"),
            "segment": (f"{profile} segment: true", f"set segment: false {where} (the job is "
                        "then not kept in one rack)"),
        }
        if c.gpu_directive == "gres":
            out["gres"] = (f"{profile} gpu_directive: gres",
                           f"set gpu_directive: gpus-per-node {where}")
        elif c.gpu_directive == "gpus-per-node":
            out["gpus-per-node"] = (f"{profile} gpu_directive: gpus-per-node",
                                    f"set gpu_directive: gres {where} (and gres_type, if the "
                                    "site names its GPUs)")
        for key in r.slurm.directives:
            out[key.lstrip("-").replace("_", "-")] = (f"the recipe's slurm.directives.{key}",
                                                       "remove it")
        return out

    def setup_lines(self, plan: Plan) -> list[str]:
        """Lines the batch script runs before the orchestrator: build (once) and use the
        shared compute environment, and AIPerf's for an agentic run that uses the staged one."""
        rt = plan.runtime
        if rt.mode != "shared" or not rt.bootstrap:
            return []
        aiperf = [f"bash {shlex.quote(plan.staged_aiperf + '/bootstrap.sh')}"] \
            if plan.staged_aiperf else []
        return [f"bash {shlex.quote(rt.bootstrap)}", *aiperf,
                f"export PYTHONPATH={shlex.quote(rt.src)}"]

    def job_command(self, plan: Plan, job_dir: str) -> str:
        """The batch script's one command: the launcher's own `run` on the run directory (a
        study's folder for a study in one allocation), as a person would type it inside an
        allocation. exec: the batch shell becomes the orchestrator, so the pre-time-limit
        signal reaches it."""
        return (f"exec {shlex.quote(plan.runtime.python)} -u -m launcher run "
                f"{shlex.quote(job_dir)}")

    def batch_script(self, plan: Plan, nodes: int, folder: str,
                     minutes: int | None = None) -> str | None:
        """Exactly the text submitit submits (its own renderer, same parameters). `folder`
        is the batch output's, `slurm/` of the directory the job runs."""
        from submitit.slurm.slurm import _make_sbatch_string

        params = self.parameters(plan, nodes, minutes)
        command = self.job_command(plan, str(Path(folder).parent))
        return _make_sbatch_string(command=command, folder=folder, **params)

    def sbatch_hint(self, plan: Plan, stderr: str) -> str:
        """For each option sbatch does not know ("sbatch: unrecognized option '--segment=4'",
        glibc getopt_long's words), the key that put it in the batch script and how to turn
        it off; '' when sbatch refused for another reason."""
        names = re.findall(r"unrecognized option '--([A-Za-z0-9_-]+)", stderr)
        sources = self.directive_sources(plan)
        out = []
        for name in dict.fromkeys(names):
            key, off = sources.get(name, ("", ""))
            if not key:
                out.append(f"--{name} is the launcher's own, which this Slurm does not know: "
                           "it is too old for the launcher")
                continue
            out.append(f"{key} adds --{name}; this Slurm has no such option: "
                       + (off or "the launcher needs it, so it cannot be turned off"))
        return "".join(f"; {x}" for x in out)


UNLIMITED = ("UNLIMITED", "INFINITE", "NONE")


def slurm_minutes(text: str | None) -> int | None:
    """Slurm's time (minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds) in whole minutes; None for no limit or
    a value it does not write."""
    if not text or text.upper() in UNLIMITED:
        return None
    days, _, rest = text.rpartition("-")
    try:
        d = int(days) if days else 0
        parts = [int(p) for p in rest.split(":")]
    except ValueError:
        return None
    if len(parts) > 3:
        return None
    if days:  # days-hours[:minutes[:seconds]]
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:  # minutes[:seconds]
        h, (m, s) = 0, (parts + [0])[:2]
    return d * 1440 + h * 60 + m + (1 if s else 0)


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


LOCAL, SLURM = Local(), Slurm()
Scheduler = Local | Slurm
SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (LOCAL, SLURM)}


def of(cluster: Cluster) -> Scheduler:
    return SCHEDULERS[cluster.scheduler]  # the profile's schema admits only these


def shares_one_host(cluster: Cluster) -> bool:
    """Whether the profile's nodes are this one host (their ports are shared): the local
    profile, or a Slurm whose nodes accept loopback as their address (the dev cluster)."""
    return not of(cluster).remote_nodes(cluster)
