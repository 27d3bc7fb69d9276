"""Recipe -> plan -> rendered run directory: the step shared by --dry-run and submit."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.control import compute_env
from launcher.errors import UserError
from launcher.planning import render
from launcher.planning.capacity import estimates
from launcher.planning.kv_cache import KvCapacity
from launcher.planning.plan import Plan, make_plan, nodes_needed
from launcher.run import rundir
from launcher.spec import cluster as cluster_mod
from launcher.spec import recipe as recipe_mod


@dataclass
class Prepared:
    run: rundir.RunDir
    plan: Plan
    nodes: int
    capacity: list[KvCapacity]
    sbatch: str | None
    placeholder_nodes: bool
    study: str | None = None


def write_run_files(
    run: rundir.RunDir, plan: Plan, placeholder_nodes: bool, with_sbatch: bool = True
) -> tuple[str | None, list[KvCapacity]]:
    """recipe.yaml, plan.json, commands.sh and (Slurm profiles) job.sbatch.
    Returns the sbatch text and the KV-capacity estimates written into plan.json."""
    run_dir = str(run.path)
    assert plan.run_dir == run_dir, "plan for another run directory"
    rundir.write_atomic(run.recipe, recipe_mod.dump(plan.recipe), sync=False)
    capacity = estimates(plan)
    doc = render.plan_doc(plan, run.run_id, run_dir, placeholder_nodes)
    doc = dataclasses.replace(doc, capacity=[c.to_json() for c in capacity])
    rundir.write_json(run.plan, doc.to_json(), sync=False)
    rundir.write_atomic(run.commands, render.commands_sh(plan, run_dir), sync=False)
    run.commands.chmod(0o755)
    sbatch = None
    if with_sbatch and plan.cluster.scheduler == "slurm":
        sbatch = render.sbatch_text(plan, len(plan.nodes), str(run.slurm))
        rundir.write_atomic(run.sbatch, sbatch, sync=False)
    return sbatch, capacity


def prepare(
    recipe: recipe_mod.Recipe,
    runs_root: Path,
    nodelist: str | None = None,
    study: str | None = None,
    run_name: str | None = None,
) -> Prepared:
    cluster = cluster_mod.load(recipe.cluster)
    need = nodes_needed(recipe, cluster)
    if nodelist:
        names = cluster_mod.expand_nodelist(nodelist)
        if len(names) < need:
            raise UserError(f"--nodelist names {len(names)} nodes but the plan needs {need}")
    else:
        names = cluster_mod.profile_nodes(cluster, need)
    rt = compute_env.runtime(cluster, runs_root)
    plan = make_plan(recipe, cluster, names, runtime=rt)
    # Absolute: every process, srun step and the batch script refer to it from elsewhere.
    run = create_dir(runs_root, run_name or recipe.name)
    plan = dataclasses.replace(plan, run_dir=str(run.path), recipe=stage_inputs(recipe, run))
    # Slurm nodes are known only inside the allocation, where the plan is made again.
    placeholder = cluster.scheduler == "slurm"
    sbatch, capacity = write_run_files(run, plan, placeholder)
    run.write_submission(rundir.Submission(created=time.time(), study=study))
    return Prepared(run, plan, need, capacity, sbatch, placeholder, study)


MAX_STUDY_RUNS = 64
INPUTS = "inputs"


def stage_inputs(recipe: recipe_mod.Recipe, run: rundir.RunDir) -> recipe_mod.Recipe:
    """Copy the data files the run reads (GSM8K test and train) into the run directory when
    they are readable here: every node and container then sees them (the run directory is
    on the shared filesystem and mounted in every container step), and the run keeps what
    it was scored on. A path not readable here is kept as given; preflight checks it on
    the nodes."""
    a = recipe.accuracy
    if not a.enabled:
        return recipe
    update = {}
    for key in ("data", "train"):
        src = getattr(a, key)
        if not src or not Path(src).is_file():
            continue
        dest = run.path / INPUTS / Path(src).name
        try:
            dest.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dest)
        except OSError as e:
            raise UserError(f"cannot copy accuracy.{key} {src} into {dest.parent}: {e}") from None
        update[key] = str(dest)
    if not update:
        return recipe
    return recipe.model_copy(update={"accuracy": a.model_copy(update=update)})


def create_dir(runs_root: Path, name: str) -> rundir.RunDir:
    """A new run (or study) directory under `runs_root`, or one sentence saying why not."""
    root = runs_root.expanduser().resolve()
    if "\n" in str(root) or any(ord(c) < 32 for c in str(root)):
        raise UserError(f"--runs-dir {str(runs_root)!r} contains a control character")
    if root.exists() and not root.is_dir():
        raise UserError(f"--runs-dir {root} is a file, not a directory")
    try:
        return rundir.create(root, name)
    except OSError as e:
        raise UserError(f"cannot create a run directory under {root}: {e.strerror or e}") from None


def _sweep_values(spec: str) -> tuple[str, list[str]]:
    key, sep, values = spec.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise UserError(
            f"--sweep {spec!r}: write it as key.path=v1,v2,..., e.g. prefill.endpoints=4,8"
        )
    if len(set(items)) != len(items):
        raise UserError(f"--sweep {spec!r}: a value is listed twice")
    return key.strip(), items


def _value(key: str, text: str):
    return recipe_mod.parse_override(f"{key}={text}", "--sweep")[1]


def _label(text: str) -> str:
    """A --sweep value as part of a directory name (no '/', no spaces)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:40] or "x"


def prepare_all(
    ref: str,
    overrides: list[str],
    sweeps: list[str],
    runs_root: Path,
    nodelist: str | None = None,
) -> list[Prepared]:
    """One run, or one run per combination of --sweep values, grouped in a study folder."""
    if not sweeps:
        return [prepare(recipe_mod.load(ref, overrides), runs_root, nodelist)]
    axes = [_sweep_values(s) for s in sweeps]
    count = 1
    for _, vals in axes:
        count *= len(vals)
    if count > MAX_STUDY_RUNS:
        raise UserError(
            f"--sweep makes {count} runs; a study holds at most {MAX_STUDY_RUNS}: sweep fewer values"
        )
    combos = list(itertools.product(*[[(k, v) for v in vals] for k, vals in axes]))
    recipes = []
    for combo in combos:
        sets = [f"{k}={v}" for k, v in combo]
        recipes.append((combo, recipe_mod.load(ref, overrides, sets)))  # validate all first
    base = recipes[0][1].name
    study_dir = create_dir(runs_root, f"{base}-study").path
    study = study_dir.name
    out = []
    for combo, recipe in recipes:
        label = "_".join(f"{_label(k.split('.')[-1])}{_label(v)}" for k, v in combo)
        out.append(prepare(recipe, study_dir, nodelist, study=study, run_name=f"{base}_{label}"))
    rundir.write_json(
        study_dir / rundir.STUDY,
        {
            "study": study,
            "recipe": base,
            "axes": {k: [_value(k, v) for v in vals] for k, vals in axes},
            "runs": [
                {"run": p.run.run_id, "values": {k: _value(k, v) for k, v in c}}
                for p, (c, _) in zip(out, recipes, strict=True)
            ],
        },
    )
    return out
