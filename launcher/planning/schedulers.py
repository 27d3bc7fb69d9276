"""Schedulers: where a run's nodes come from, how a process is started and stopped on one,
and how a job is checked and submitted.

One class per `scheduler` of a cluster profile, and what differs between them is its
methods, so adding a scheduler is one class here (the renderer, the planner, the submitter
and the orchestrator ask `of(cluster)`). The planner's questions are pure (addresses, step
lines, the batch script, the time limit); the rest run the scheduler's own programs
(sbatch, scontrol, squeue, scancel) and are handed the launcher's own work (`Job.ready`,
`Job.here`), so nothing here imports the control layer.

- `local`: this host; the profile's nodes are names of slots on it, and the orchestrator
  runs here, in the submitting process.
- `slurm`: an allocation (submitit's sbatch); nodes are known only inside it, every
  process is an `srun` step of the job, and the job has a time limit.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UserError
from launcher.planning.plan import job_port_slots
from launcher.run import rundir
from launcher.run.vocab import Kind
from launcher.schema import cluster as cluster_mod
from launcher.schema.sections import sbatch_problem

if TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.run.plandoc import Process
    from launcher.schema.cluster import Cluster
    from launcher.schema.recipe import Recipe

Commands = list[list[str]]

LOCAL_CHECK = "the local profile has no scheduler to ask; plan is valid"


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


class Local:
    """This host: the orchestrator runs in the submitting process."""

    name = "local"
    allocates = False   # nodes come from a batch allocation, known only inside it

    def job_id(self) -> str | None:
        """The job this process runs in."""
        return None

    def nodes(self, recipe: Recipe, cluster: Cluster, need: Callable[[], int]) -> list[str]:
        """The nodes a run has where it runs (`need()`: how many its plan needs)."""
        return cluster_mod.profile_nodes(cluster, need())

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
        the engine's container on every node. Here: one command per node."""
        steps = [("preflight-host", [[*host, "--node", n] for n in plan.nodes])]
        steps += [(name, [cmd]) for name, cmd in stages]
        return [*steps, ("preflight-container", [[*inside, "--node", n] for n in plan.nodes])]

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

    def cancel_steps(self, names: set[str]) -> None:
        """What the scheduler still runs for processes whose own process was SIGKILLed."""


class Slurm(Local):
    """A Slurm allocation: every process is an srun step of the job."""

    name = "slurm"
    allocates = True

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
        shared compute environment."""
        rt = plan.runtime
        if rt.mode != "shared" or not rt.bootstrap:
            return []
        return [f"bash {shlex.quote(rt.bootstrap)}", f"export PYTHONPATH={shlex.quote(rt.src)}"]

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

    # --- asking Slurm ----------------------------------------------------------------------

    def need_sbatch(self, plan: Plan) -> None:
        if shutil.which("sbatch") is None:
            raise UserError(
                f"recipe {plan.recipe.name} is for Slurm cluster {plan.cluster.name} but sbatch "
                "is not on PATH here: submit from a login node (or start slurm/devcluster/up.sh)"
            )

    def partition(self, name: str | None) -> Partition | None:
        """The partition a job goes to (`name`, else the default one) as this host's Slurm
        has it (`scontrol show partition`), or None when it cannot be asked (no scontrol, a
        controller that does not answer, a partition it does not know)."""
        if shutil.which("scontrol") is None:
            return None
        argv = ["scontrol", "-o", "show", "partition", *([name] if name else [])]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=ASK_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None
        if proc.returncode != 0:
            return None
        for line in proc.stdout.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if (f.get("PartitionName") == name) if name else (f.get("Default") == "YES"):
                return Partition(f["PartitionName"], slurm_minutes(f.get("MaxTime")),
                                 _count(f.get("MaxNodes")), f.get("MaxTime") or "?")
        return None

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
                            + self.sbatch_hint(plan, proc.stderr))
        return words, f"sbatch --test-only: {words}"

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

    def submit(self, job: Job) -> Submitted:
        """sbatch through submitit, as a command line (`_submit_command`), not a pickled
        function: the script says what it runs, and no submitit handler sits between
        Slurm's signals and the orchestrator. job.sbatch becomes what Slurm really got."""
        self.need_sbatch(job.plan)
        job.ready()
        import submitit

        folder = job.path / rundir.SLURM
        executor = submitit.SlurmExecutor(folder=str(folder))
        executor.update_parameters(**self.parameters(job.plan, job.nodes, job.minutes))
        command = self.job_command(job.plan, str(job.path))
        try:
            folder.mkdir(parents=True, exist_ok=True)
            queued = executor._submit_command(command)
        except Exception as e:  # sbatch's refusal comes back as a generic error: its words
            raise UserError(f"sbatch refused the job: {' '.join(str(e).split())}"
                            + self.sbatch_hint(job.plan, str(e))) from None
        submitted = folder / f"{queued.job_id}_submission.sh"
        if submitted.exists():  # what Slurm really got, byte for byte
            rundir.write_atomic(job.path / rundir.SBATCH, submitted.read_text())
        return Submitted(queued.job_id)

    # --- the job's steps -------------------------------------------------------------------

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

    def cancel_steps(self, names: set[str]) -> None:
        """An srun that had to be SIGKILLed leaves its step running: cancel it by name."""
        ids = [i for v in step_ids(names).values() for i in v]
        if ids:
            try:
                subprocess.run(["scancel", "--signal=KILL", *ids], capture_output=True,
                               timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass


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


ASK_TIMEOUT_S = 5.0  # a controller that does not answer must not hold up a dry-run
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
SCHEDULERS: dict[str, Local] = {s.name: s for s in (LOCAL, SLURM)}


def of(cluster: Cluster) -> Local:
    return SCHEDULERS[cluster.scheduler]  # the profile's schema admits only these
