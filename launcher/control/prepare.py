"""Recipe -> plan -> rendered run directory: the step shared by --dry-run and submit."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.control import compute_env, datasets, scheduling
from launcher.errors import UserError
from launcher.planning import cost, engine_argv, kv_tiers, render, schedulers, study, ucx
from launcher.planning.capacity import estimates, resolve_model
from launcher.planning.kv import KvCapacity
from launcher.planning.plan import Plan, make_plan, nodes_needed
from launcher.run import rundir, studydoc
from launcher.schema import cluster as cluster_mod
from launcher.schema import recipe as recipe_mod
from launcher.schema import yaml_io
from launcher.schema.wording import show


@dataclass
class Prepared:
    run: rundir.RunDir
    rendered: render.Rendered
    nodes: int
    capacity: list[KvCapacity]
    placeholder_nodes: bool
    study: str | None = None
    shared: StudyJob | None = None  # the study's one allocation, when it runs in one
    compared: study.Comparison | None = None  # a study: one allocation against a job each
    choice: study.Choice | None = None  # a study: the way it runs, why, what that changes
    blockers: list[str] = field(default_factory=list)  # what submit will refuse, one sentence each


    @property
    def plan(self) -> Plan:
        return self.rendered.plan

    @property
    def sbatch(self) -> str | None:
        """What is submitted for it: its own job, or its study's one allocation."""
        return self.shared.sbatch if self.shared else self.rendered.sbatch


@dataclass
class StudyJob:
    """A study run in one allocation: its folder, the allocation's node count, time limit
    and sbatch (Slurm), each configuration's turn, and the comparison with one job per
    configuration that chose it."""

    path: Path
    nodes: int
    minutes: int | None
    sbatch: str | None
    turns: list[study.Turn]
    comparison: study.Comparison

    @property
    def sbatch_file(self) -> Path:
        return self.path / rundir.SBATCH

    @property
    def slurm(self) -> Path:
        return self.path / "slurm"


def write_run_files(
    run: rundir.RunDir, plan: Plan, placeholder_nodes: bool, with_sbatch: bool = True
) -> tuple[render.Rendered, list[KvCapacity]]:
    """recipe.yaml, plan.json, commands.sh and (Slurm profiles) job.sbatch, from one
    render of the plan. Returns it and the KV-capacity estimates written into plan.json."""
    assert plan.run_dir == str(run.path), "plan for another run directory"
    rundir.write_atomic(run.recipe, recipe_mod.dump(plan.recipe), sync=False)
    capacity = estimates(plan)
    out = render.render(plan, run.run_id, placeholder_nodes=placeholder_nodes,
                        capacity=[c.to_json() for c in capacity], with_sbatch=with_sbatch)
    rundir.write_json(run.plan, out.doc.to_json(), sync=False)
    rundir.write_atomic(run.commands, out.commands, sync=False)
    run.commands.chmod(0o644)  # not to be run whole (it says so at its top)
    if out.sbatch is not None:
        rundir.write_atomic(run.sbatch, out.sbatch, sync=False)
    if plan.recipe.kv_store is not None:  # the orchestrator writes it again with real addresses
        rundir.write_atomic(run.path / kv_tiers.CONFIG_FILE, kv_tiers.store_config_text(plan),
                            sync=False)
    return out, capacity


def prepare(
    recipe: recipe_mod.Recipe,
    runs_root: Path,
    nodelist: str | None = None,
    study: str | None = None,
    run_name: str | None = None,
) -> Prepared:
    root = runs_dir(runs_root)
    names = cluster_mod.expand_nodelist(nodelist, "--nodelist") if nodelist else None
    plan, need = plan_run(recipe, root, names)
    return write_run(plan, need, root, run_name or recipe.name, study)


def plan_run(
    recipe: recipe_mod.Recipe, root: Path, names: list[str] | None, profiles: dict | None = None
) -> tuple[Plan, int]:
    """Everything that can refuse a run, before anything is written: the profile, the runs
    directory for it, the node count, the plan. `profiles` keeps each profile and its
    runtime across the runs of a study (reading and hashing them once, not 64 times)."""
    profiles = {} if profiles is None else profiles
    if recipe.cluster not in profiles:
        cluster = cluster_mod.load(recipe.cluster)
        profiles[recipe.cluster] = (cluster, compute_env.runtime(cluster, root))
    cluster, rt = profiles[recipe.cluster]
    check_runs_dir(root, cluster, recipe)
    engine_argv.check_values(recipe)  # before the KV estimate reads them
    recipe_mod.dump(recipe)  # refuses a recipe too large to be read back in the allocation
    model = resolve_model(recipe)  # the model folder, read once for this plan
    need = nodes_needed(recipe, cluster, model)
    if names is not None:
        if len(names) < need:
            raise UserError(f"--nodelist names {len(names)} nodes but the plan needs {need}")
    else:
        names = cluster_mod.profile_nodes(cluster, need)
    plan = make_plan(recipe, cluster, names, runtime=rt, model=model)
    engine_argv.check(plan)
    datasets.check(recipe, cluster)  # a missing or malformed trace: one sentence, now
    if found := kv_tiers.problems(recipe):
        raise UserError.of("vLLM would refuse the engines' KV connectors or store:", found)
    refusal, _ = cost.time_limit_problems(plan, cost.estimate(plan))
    if refusal:
        raise UserError(refusal)
    return plan, need


def launcher_version() -> str:
    """The launcher's version and git commit (dirty when the work tree has changes) and
    submitit's, for the run's fingerprint."""
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    src = Path(__file__).resolve().parents[2]
    git = "no git checkout"
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain",
                                    "--untracked-files=no"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            git = f"git {head.stdout.strip()}" + (" (dirty)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return f"pd-launcher {version('pd-launcher')}, {git}, submitit {version('submitit')}"


def write_run(plan: Plan, need: int, root: Path, name: str, study: str | None) -> Prepared:
    # Absolute: every process, srun step and the batch script refer to it from elsewhere.
    run = create_dir(root, name)
    recipe = stage_inputs(plan.recipe, run)
    plan = dataclasses.replace(plan, run_dir=str(run.path), recipe=recipe)
    # Allocated nodes are known only inside the allocation, where the plan is made for them.
    placeholder = schedulers.of(plan.cluster).allocates
    rendered, capacity = write_run_files(run, plan, placeholder)
    run.write_submission(rundir.Submission(created=time.time(), study=study,
                                           launcher=launcher_version(),
                                           command=" ".join(map(shlex.quote, sys.argv))))
    return Prepared(run, rendered, need, capacity, placeholder, study)


MAX_STUDY_RUNS = 64
INPUTS = rundir.INPUTS


def stage_inputs(recipe: recipe_mod.Recipe, run: rundir.RunDir) -> recipe_mod.Recipe:
    """Copy the data files the run reads (GSM8K test and train) into the run directory when
    they are readable here: every node and container then sees them (the run directory is
    on the shared filesystem and mounted in every container step), and the run keeps what
    it was scored on. A path not readable here is kept as given; preflight checks it on
    the nodes."""
    copy_setup_script(recipe, run)
    a = recipe.accuracy
    if not a.enabled:
        return recipe
    update = {}
    for key in ("data", "train"):
        src = getattr(a, key)
        try:
            readable = bool(src) and Path(src).is_file()
        except (OSError, ValueError):  # a name too long for this filesystem, ...
            readable = False
        if not readable:
            continue
        dest = run.path / INPUTS / Path(src).name
        try:
            dest.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dest)
        except OSError as e:
            raise UserError(
                f"cannot copy accuracy.{key} {show(src)} into {show(dest.parent)}: "
                f"{e.strerror or e}"
            ) from None
        update[key] = str(dest)
    if not update:
        return recipe
    return recipe.model_copy(update={"accuracy": a.model_copy(update=update)})


def copy_setup_script(recipe: recipe_mod.Recipe, run: rundir.RunDir) -> None:
    """The setup_script into the run directory, where the engines' steps run it from; a
    script not readable here is a blocker (setup_blocker)."""
    src = recipe.setup_script
    try:
        if not (src and Path(src).is_file()):
            return
        dest = run.path / rundir.INPUTS / Path(src).name
        dest.parent.mkdir(exist_ok=True)
        shutil.copyfile(src, dest)
    except OSError as e:
        raise UserError(f"cannot copy setup_script {show(src)} into the run directory: "
                        f"{e.strerror or e}") from None


def setup_script_lines(p: Prepared) -> tuple[list[str], list[str]]:
    """(warnings, blockers) about a setup_script that is not there. As srt-slurm, the steps
    then go on without it (it only warns), which a recipe whose engines set numa-bind does not
    survive: DeepSeek-V4-Pro's script installs numactl and patches vLLM for it."""
    src = p.plan.recipe.setup_script
    if not src or (p.run.path / rundir.INPUTS / Path(src).name).is_file():
        return [], []
    text = (f"setup_script {src} is not a readable file here, so the engines start "
            f"without it (srt-slurm too only warns); put the script there (an srt-slurm "
            f"recipe's is a copy of srt-slurm's configs/ or configs/patches/{Path(src).name}) "
            "or set setup_script to your copy")
    numa = sorted({proc.name.split("@")[0] for proc in p.rendered.processes
                   if "--numa-bind" in proc.argv})
    if numa and p.plan.recipe.engine_kind.binds_numa:
        return [], [text + f": {', '.join(numa)} set numa-bind, which needs what it installs "
                    "(numactl)"]
    return [text], []


# A run directory's path must fit in PATH_MAX (4096) with the run and file names under it.
MAX_RUNS_DIR = 3000
MAX_NAME = 255  # bytes in one path component (Linux filesystems)
MAX_RUN_NAME = 120  # the part of a run directory's name after its time stamp


def runs_dir(runs_root: Path) -> Path:
    """--runs-dir as an absolute path, or one sentence saying why it cannot hold runs."""
    text = str(runs_root)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise UserError(
            f"--runs-dir {show(text)} contains a newline or control character: choose a "
            "directory without one (its path is written into shell scripts)"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(
            f"--runs-dir {show(text)} is not UTF-8 text: choose another directory"
        ) from None
    try:
        root = runs_root.expanduser().resolve()
    except (OSError, RuntimeError) as e:
        raise UserError(f"--runs-dir {show(text)}: {e}") from None
    size = len(str(root).encode())
    if size > MAX_RUNS_DIR:
        raise UserError(
            f"--runs-dir is {size:,} bytes long; run directories under it must fit in "
            f"4,096, so use one of at most {MAX_RUNS_DIR:,}"
        )
    long = [p for p in root.parts if len(p.encode()) > MAX_NAME]
    if long:
        raise UserError(
            f"--runs-dir: the name {show(long[0], 40)} is {len(long[0].encode())} bytes; "
            f"a directory name holds at most {MAX_NAME}"
        )
    try:
        is_file = root.exists() and not root.is_dir()
    except OSError as e:
        raise UserError(f"--runs-dir {show(root)}: {e.strerror or e}") from None
    if is_file:
        raise UserError(f"--runs-dir {show(root)} is a file, not a directory")
    return root


def check_runs_dir(root: Path, cluster: cluster_mod.Cluster, recipe: recipe_mod.Recipe) -> None:
    """Characters the runs directory's path cannot hold where this run writes it."""
    text = str(root)
    why = schedulers.of(cluster).runs_dir_problem(text)
    if why:
        raise UserError(f"--runs-dir {show(text)} {why}")
    shared = cluster.compute_env.mode == "shared" and not cluster.compute_env.dir
    if recipe.container is not None and ("," in text or ":" in text) or shared and ":" in text:
        where = "container mounts (SRC:DST,...)" if recipe.container else "PYTHONPATH"
        raise UserError(
            f"--runs-dir {show(text)} goes into {where}, where ':' and ',' separate entries: "
            "choose a directory without them"
        )


def create_dir(runs_root: Path, name: str) -> rundir.RunDir:
    """A new run (or study) directory under `runs_root`, or one sentence saying why not."""
    root = runs_dir(runs_root)
    try:
        return rundir.create(root, name[:MAX_RUN_NAME])
    except OSError as e:
        raise UserError(
            f"--runs-dir {show(root)}: cannot create a run directory there: {e.strerror or e}"
        ) from None


def _sweep_values(spec: str) -> tuple[str, list[str]]:
    key, sep, values = spec.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise UserError(
            f"--sweep {show(spec)}: write it as key.path=v1,v2,..., e.g. prefill.endpoints=4,8"
        )
    empty = [i for i, v in enumerate(values.split(","), 1) if not v.strip()]
    if empty:  # '4,,6' is a typo, not two values: dropping it would sweep something else
        raise UserError(
            f"--sweep {show(spec)}: value {empty[0]} is empty: remove the extra comma "
            "(write '' for empty text)"
        )
    if len(items) > MAX_STUDY_RUNS:
        raise UserError(
            f"--sweep {key.strip()}: {len(items):,} values; a study holds at most "
            f"{MAX_STUDY_RUNS} runs: sweep fewer values"
        )
    dup = next((v for v in items if items.count(v) > 1), None)
    if dup is not None:
        raise UserError(f"--sweep {key.strip()}: the value {show(dup, 40)} is listed twice")
    return key.strip(), items


def _value(key: str, text: str):
    return yaml_io.parse_override(f"{key}={text}", "--sweep")[1]


def _label(text: str) -> str:
    """A --sweep value as part of a directory name (no '/', no spaces; and not a word that
    sbatch reads as a job separator in the #SBATCH line that holds the run's path)."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:40] or "x"
    return re.sub("(het|pack)(job)", r"\1-\2", label, flags=re.I)


def _recipe_labels(refs: list[str], names: list[str]) -> list[str]:
    """How a study of several recipes tells them apart: their names, or where two share one
    (srt-slurm's 1k1k and 8k1k files may), the folder each came from before it."""
    labels = [n if names.count(n) == 1 else f"{Path(r).parent.name}-{n}"
              for r, n in zip(refs, names, strict=True)]
    dup = next((x for x in labels if labels.count(x) > 1), None)
    if dup:
        raise UserError(f"two of the recipes are {dup}: a study tells its configurations "
                        "apart by name; give each recipe once, or rename one (--set name=...)")
    return labels


def _common_name(names: list[str]) -> str:
    """The study's name: the recipes' shared name prefix (whole words), else the first
    recipe's and how many others."""
    distinct = list(dict.fromkeys(names))
    if len(distinct) == 1:
        return names[0]
    prefix = os.path.commonprefix(distinct)
    cut = max(prefix.rfind(c) for c in "-_.") if prefix else -1
    return prefix[:cut] if cut >= 4 else f"{distinct[0]}-and-{len(distinct) - 1}-more"


def prepare_all(
    ref: str | list[str],
    overrides: list[str],
    sweeps: list[str],
    runs_root: Path,
    nodelist: str | None = None,
    allocation: str | None = None,
    aliases: dict[str, str] | None = None,
    site: Path | None = None,
) -> list[Prepared]:
    """One run, or one run per recipe in `ref` and combination of --sweep values, grouped in
    a study folder. Every run is validated and planned before anything is written. A study
    runs in one allocation (`allocation` "one") or one job per configuration ("each"); None:
    whichever the estimate says costs fewer GPU-hours."""
    root = runs_dir(runs_root)
    from launcher.schema import srt_slurm

    # an srt-slurm override file named alone: every variant, one configuration each
    refs = [one for r in ([ref] if isinstance(ref, str) else list(ref))
            for one in srt_slurm.variant_refs(r)]
    if not refs:
        raise UserError("submit needs a recipe (a shipped name or a YAML path)")
    if allocation is not None and not sweeps and len(refs) == 1:
        raise UserError(f"--allocation {allocation} is for a study: add --sweep KEY=V1,V2,... "
                        "or give several recipes")
    axes = [_sweep_values(s) for s in sweeps]
    keys = [k for k, _ in axes]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice:
        raise UserError(f"--sweep {twice} is given twice: list all its values in one --sweep")
    count = len(refs)
    for _, vals in axes:
        count *= len(vals)
        if count > MAX_STUDY_RUNS:
            raise UserError(
                f"--sweep makes more than {MAX_STUDY_RUNS} runs, the most a study holds: "
                "sweep fewer values"
            )
    if count > MAX_STUDY_RUNS:
        raise UserError(f"{len(refs)} recipes are more than {MAX_STUDY_RUNS} runs, the most a "
                        "study holds: give fewer")
    names = cluster_mod.expand_nodelist(nodelist, "--nodelist") if nodelist else None
    sweep_combos = list(itertools.product(*[[(k, v) for v in vals] for k, vals in axes]))
    recipes, per_ref = [], []
    for r in refs:  # each recipe file once, every --sweep combination of it
        got = recipe_mod.load_many(r, overrides, [[f"{k}={v}" for k, v in c]
                                                  for c in sweep_combos], aliases, site)
        recipes += got
        per_ref.append(got[0].name)
    combos = [c for _ in refs for c in sweep_combos]
    if len(refs) > 1:
        labels = _recipe_labels(refs, per_ref)
        combos = [(("recipe", label),) + c for label in labels for c in sweep_combos]
        axes = [("recipe", labels)] + axes
        sweeps = ["recipe"]  # a study, even without --sweep
    profiles: dict = {}
    planned = [plan_run(r, root, names, profiles) for r in recipes]
    if not sweeps:
        [(plan, need)] = planned
        return find_blockers([write_run(plan, need, root, plan.recipe.name, None)])
    base = _common_name([r.name for r in recipes])
    study_dir = create_dir(root, f"{base}-study").path
    study = study_dir.name
    out = []
    for combo, (plan, need) in zip(combos, planned, strict=True):
        label = "_".join(_label(v) if k == "recipe" else f"{_label(k.split('.')[-1])}{_label(v)}"
                         for k, v in combo)
        name = label if combo and combo[0][0] == "recipe" else f"{base}_{label}"
        out.append(write_run(plan, need, study_dir, name, study))
    doc = studydoc.StudyDoc(
        study=study,
        recipe=base,
        axes={k: [v if k == "recipe" else _value(k, v) for v in vals] for k, vals in axes},
        runs=[
            studydoc.StudyRun(run=p.run.run_id, values={
                k: v if k == "recipe" else _value(k, v) for k, v in c})
            for p, c in zip(out, combos, strict=True)
        ],
    )
    try:
        shared, compared, choice = study_job(study_dir, out, root, allocation)
    except UserError:
        shutil.rmtree(study_dir, ignore_errors=True)  # refused: nothing left that reads planned
        raise
    for p in out:
        p.compared, p.choice = compared, choice
    if choice is not None:
        doc.choice = choice.to_json()
    if shared is None:
        studydoc.write_study(study_dir, doc)
        return find_blockers(out)
    doc.allocation = studydoc.StudyAllocation(
        mode="one", nodes=shared.nodes,
        gpus_per_node=out[0].plan.cluster.gpus_per_node, time_minutes=shared.minutes,
        port_span=max(p.plan.port_span for p in out),
        turns=[t.to_json() for t in shared.turns],
        comparison=shared.comparison.to_json(),
    )  # fmt: skip
    for p in out:
        p.shared = shared
        # every configuration's containers see the study's folder; the study's job.sbatch
        # is the one submitted
        p.rendered, _ = write_run_files(p.run, p.plan.at(p.plan.run_dir, str(study_dir)),
                                        p.placeholder_nodes, with_sbatch=False)
        p.run.sbatch.unlink(missing_ok=True)
        sub = p.run.read_submission()
        sub.one_allocation = True
        p.run.write_submission(sub)
    studydoc.write_study(study_dir, doc)
    return find_blockers(out)  # in the order of the values; the allocation's is the turns'


def find_blockers(runs: list[Prepared]) -> list[Prepared]:
    """What submit will refuse, known before it tries, on each run: the model's staging,
    and for a job of its own a time limit or node count past its partition's limits (as
    the Slurm this host reaches has them). The dry-run shows them as blockers."""
    from launcher.control import staging

    parts: dict[tuple[str, str | None], schedulers.Partition | None] = {}
    for p in runs:
        refuse, _ = staging.check(p.plan.recipe, p.plan.cluster)
        p.blockers = [refuse] if refuse else []
        for blocker in (datasets.check(p.plan.recipe, p.plan.cluster)[0],
                        datasets.aiperf_check(p.plan)[0]):
            p.blockers += [blocker] if blocker else []
        p.blockers += ucx.ucx_lines(p.plan)[1]
        p.blockers += setup_script_lines(p)[1]
        p.blockers += kv_tiers.memory_blockers(p.plan)
        if p.shared is not None:
            continue  # a study's one job is fitted to the partition by choose()
        key = (p.plan.cluster.scheduler, p.plan.recipe.slurm.partition)
        if key not in parts:
            parts[key] = scheduling.partition_limits(p.plan.cluster, key[1])
        p.blockers += cost.partition_blockers(p.plan, p.nodes, parts[key])
    return runs



def visits(p: Prepared) -> list[study.Segment]:
    """A configuration's sweep points grouped by the engines they need: one visit each."""
    procs, path, b = p.rendered.processes, str(p.run.path), p.plan.recipe.benchmark
    if not b.enabled:
        return [((), study.signatures(procs, path))]
    if b.slo is not None:  # the search picks its points as it runs: one visit holds it all
        return [((), study.signatures(procs, path, at=b.points[0]))]
    return study.segments(list(b.points), lambda c: study.signatures(procs, path, at=c))


def gate_key(p: Prepared) -> str | None:
    """What a configuration's accuracy gate asks (None: no gate), its own run directory (a
    copy of the data may be there) written as {run_dir}: one gate serves the configurations
    that ask the same of the same engines."""
    import json

    a = p.plan.recipe.accuracy
    return json.dumps(a.model_dump(mode="json"), sort_keys=True).replace(
        str(p.run.path), study.RUN_DIR) if a.enabled else None


def study_job(study_dir: Path, runs: list[Prepared], root: Path, allocation: str | None,
              ) -> tuple[StudyJob | None, study.Comparison | None, study.Choice | None]:
    """The study's one allocation when it is asked for (or, unasked, costs fewer GPU-hours
    than one job per configuration and fits the partition), else None; the comparison of
    the two ways, and the choice with its reasons."""
    clusters = {p.plan.cluster.name for p in runs}
    if len(clusters) > 1:
        if allocation == "one":
            raise UserError(f"--allocation one: the study's configurations use different "
                            f"cluster profiles ({', '.join(sorted(clusters))}); one "
                            "allocation holds one cluster's nodes: use --allocation each")
        return None, None, None
    turns = study.schedule([(p.run.run_id, visits(p)) for p in runs],
                           one_host=schedulers.shares_one_host(runs[0].plan.cluster),
                           gates={p.run.run_id: gate_key(p) for p in runs})
    costs = {p.run.run_id: cost.estimate(p.plan) for p in runs}
    largest = max(runs, key=lambda p: p.nodes)
    load_s, basis = assumed_load_s(root, largest.plan, costs[largest.run.run_id])
    cluster = largest.plan.cluster
    compared = study.compare(turns, costs, largest.nodes, cluster.gpus_per_node, load_s, basis,
                             site_load_s=cluster.load_time_s)
    choice = choose(allocation, compared, runs, largest)
    if choice.way == "each":
        return None, compared, choice
    sbatch = None
    if choice.one_minutes is not None:
        sbatch = schedulers.of(cluster).batch_script(
            largest.plan, largest.nodes, str(study_dir / rundir.SLURM), minutes=choice.one_minutes)
        rundir.write_atomic(study_dir / rundir.SBATCH, sbatch, sync=False)
    return (StudyJob(study_dir, largest.nodes, choice.one_minutes, sbatch, turns, compared),
            compared, choice)


def choose(allocation: str | None, compared: study.Comparison, runs: list[Prepared],
           largest: Prepared) -> study.Choice:
    """One allocation or one job each: as asked, else the fewer GPU-hours where the
    partition admits the one job (its MaxTime and MaxNodes, asked of Slurm where it answers);
    --allocation one past them is refused, naming both numbers."""
    way = allocation or compared.cheaper
    minutes = limits = None
    lead = largest.plan.recipe.slurm.signal_lead_s
    recipe_minutes = None
    if schedulers.of(largest.plan.cluster).allocates:
        # the one job covers its worst case: every load round at health.timeout_s
        recipe_minutes = max(p.plan.recipe.slurm.minutes for p in runs)
        minutes = max(recipe_minutes, -(-int(compared.one_most_s + lead) // 60))
        name = scheduling.sbatch_partition(largest.plan.recipe.slurm.partition)
        part = scheduling.partition_limits(largest.plan.cluster, name)
        limits = (study.Limits(True, part.name, part.max_minutes, part.max_nodes,
                               part.max_time) if part else study.Limits(partition=name))
    choice = study.Choice(way, allocation, compared, tuple(p.nodes for p in runs),
                          recipe_minutes, minutes, lead, limits)
    over = choice.over() if way == "one" else None
    if over and allocation == "one":
        raise UserError(f"--allocation one: {over}: use --allocation each (a job each, "
                        f"{cost.duration(recipe_minutes * 60)} of slurm.time_limit), or "
                        "sweep fewer values")
    if over:
        return dataclasses.replace(choice, way="each", fallback=over)
    return choice


def assumed_load_s(root: Path, plan: Plan, c: cost.Cost) -> tuple[float, str]:
    """How long one engine start is taken to be: the slowest engine's start-to-healthy time
    in earlier runs of this model on this cluster (their median), else the estimate's."""
    seen = []
    try:
        from launcher.run import listing

        recent = listing.entries(root)[:50]
    except OSError:
        recent = []
    for entry in recent:
        for run in entry.runs if isinstance(entry, listing.Study) else [entry]:
            ready = ((rundir.read_json(run.summary) or {}).get("lifecycle") or {}).get(
                "engine_ready_s") or {}
            times = [v for v in ready.values() if isinstance(v, int | float)]
            if not times:
                continue
            try:
                recipe = yaml_io.read_yaml(run.recipe, "a recipe")
            except UserError:
                continue
            if ((recipe.get("model") or {}).get("path") == plan.recipe.model.path
                    and recipe.get("cluster") == plan.cluster.name):
                seen.append(max(times))
    if seen:
        seen.sort()
        return seen[len(seen) // 2], (f"measured: the median of {len(seen)} earlier run(s) of "
                                      f"{plan.recipe.model.path} on {plan.cluster.name}")
    return c.load_expected_s, f"{c.load_basis} (no earlier run of this model on this cluster)"
