"""Recipe -> plan -> rendered run directory: the step shared by --dry-run and submit."""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher import cluster as cluster_mod
from launcher import recipe as recipe_mod
from launcher import render, rundir
from launcher.capacity import Capacity, estimates
from launcher.errors import UserError
from launcher.plan import Plan, make_plan, nodes_needed


@dataclass
class Prepared:
    run: rundir.RunDir
    plan: Plan
    nodes: int
    capacity: list[Capacity]
    sbatch: str | None
    placeholder_nodes: bool
    study: str | None = None


def write_run_files(
    run: rundir.RunDir, plan: Plan, placeholder_nodes: bool, with_sbatch: bool = True
) -> tuple[str | None, list[Capacity]]:
    """recipe.yaml, plan.json, commands.sh and (Slurm profiles) job.sbatch.
    Returns the sbatch text and the KV-capacity estimates written into plan.json."""
    run_dir = str(run.path)
    rundir.write_atomic(run.recipe, recipe_mod.dump(plan.recipe))
    doc = render.plan_json(plan, run.run_id, run_dir)
    doc["placeholder_nodes"] = placeholder_nodes
    capacity = estimates(plan)
    doc["capacity"] = [c.to_json() for c in capacity]
    rundir.write_json(run.plan, doc)
    rundir.write_atomic(run.commands, render.commands_sh(plan, run_dir))
    run.commands.chmod(0o755)
    sbatch = None
    if with_sbatch and plan.cluster.scheduler == "slurm":
        sbatch = render.sbatch_text(plan, len(plan.nodes), str(run.slurm), sys.executable)
        rundir.write_atomic(run.sbatch, sbatch)
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
    plan = make_plan(recipe, cluster, names)
    # Absolute: every process, srun step and the batch script refer to it from elsewhere.
    run = rundir.create(runs_root.resolve(), run_name or recipe.name)
    # Slurm nodes are known only inside the allocation, where the plan is made again.
    placeholder = cluster.scheduler == "slurm"
    sbatch, capacity = write_run_files(run, plan, placeholder)
    run.update_state(state="planned", stage=None, created=time.time(), study=study)
    return Prepared(run, plan, need, capacity, sbatch, placeholder, study)


def _sweep_values(spec: str) -> tuple[str, list[str]]:
    key, sep, values = spec.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise UserError(
            f"--sweep {spec!r}: write it as key.path=v1,v2,..., e.g. prefill.endpoints=4,8"
        )
    return key.strip(), items


def _value(key: str, text: str):
    return recipe_mod.parse_override(f"{key}={text}")[1]


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
    combos = list(itertools.product(*[[(k, v) for v in vals] for k, vals in axes]))
    recipes = []
    for combo in combos:
        sets = [f"{k}={v}" for k, v in combo]
        recipes.append((combo, recipe_mod.load(ref, overrides + sets)))  # validate all first
    base = recipes[0][1].name
    study_dir = rundir.create(runs_root, f"{base}-study").path
    study = study_dir.name
    out = []
    for combo, recipe in recipes:
        label = "_".join(f"{k.split('.')[-1]}{v}" for k, v in combo)
        out.append(prepare(recipe, study_dir, nodelist, study=study, run_name=f"{base}_{label}"))
    rundir.write_json(
        study_dir / "study.json",
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


# --- showing a plan ------------------------------------------------------------------------


def _ranges(xs: list[int]) -> str:
    if not xs:
        return "-"
    return f"{xs[0]}" if len(xs) == 1 else f"{xs[0]}-{xs[-1]}"


def process_rows(prepared: Prepared) -> list[tuple[str, str, str, str]]:
    """(node, gpus, process, ports) rows in node order, as the plan table shows them."""
    plan = prepared.plan
    eps = {ep.name: ep for ep in plan.endpoints}
    rows = []
    for proc in render.processes(plan, str(prepared.run.path)):
        if proc.kind == "engine":
            ep = eps[proc.endpoint]
            ranks = proc.dp_ranks
            nixl = [ep.nixl_port_base + r for r in ranks]
            parts = [] if proc.headless else [f"http {ep.http_port}"]
            if ep.multi_node:
                parts.append(f"dp-rpc {ep.dp_rpc_port}")
            if ep.role != "agg":
                parts.append(f"nixl {_ranges(nixl)}")
            parts.append(f"dp ranks {_ranges(ranks)}" + (" headless" if proc.headless else ""))
            ports = ", ".join(parts)
        elif proc.kind == "router":
            ports = f"http {plan.router_port}, metrics {plan.router_metrics_port}"
        elif proc.kind == "agent":
            ports = f"exporter {plan.exporter_ports[proc.node]}"
        else:
            continue
        gpus = ",".join(map(str, proc.gpus)) if proc.gpus else "-"
        rows.append((proc.node, gpus, proc.name, ports))
    order = {n: i for i, n in enumerate(plan.nodes)}
    rows.sort(key=lambda r: (order[r[0]], r[1] == "-"))
    return rows


def render_text(prepared: Prepared) -> str:
    plan, r = prepared.plan, prepared.plan.recipe
    c = plan.gpu_count()
    lines = [
        f"Recipe {r.name} on {plan.cluster.name}: {prepared.nodes} nodes x "
        f"{plan.cluster.gpus_per_node} GPUs, engine {r.engine}"
        + (" (SIMULATED: no GPU work)" if r.engine == "sim" else "")
        + f", mode {r.mode}, {c['total']} GPUs in use "
        f"(prefill {c['prefill']}, decode {c['decode']}, agg {c['agg']})",
    ]
    if prepared.placeholder_nodes:
        lines.append(
            "Node names are placeholders: the real ones are planned inside the allocation."
        )
    rows = [("NODE", "GPUS", "PROCESS", "PORTS")] + process_rows(prepared)
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append(
            "  ".join(x.ljust(w) for x, w in zip(row[:3], widths, strict=False)) + "  " + row[3]
        )
    b = r.benchmark
    if b.enabled:
        lines.append(
            f"Sweep: concurrency {', '.join(map(str, b.concurrency))} at ISL/OSL "
            f"{b.input_len}/{b.output_len} (range ratio {b.range_ratio:g}), driver {b.driver}"
        )
    if r.accuracy.enabled:
        lines.append(
            f"Accuracy gate: {r.accuracy.task} {r.accuracy.num_shots}-shot, "
            f"{r.accuracy.num_questions} questions, pass at >= {r.accuracy.threshold:g}"
        )
    for cap in prepared.capacity:
        lines.append(
            f"KV capacity estimate {cap.endpoint} ({cap.gpus} GPUs): weights "
            f"{cap.weights_gib_per_gpu} GiB/GPU, cache {cap.cache_gib_per_gpu} GiB/GPU, "
            f"{cap.kv_bytes_per_token / 1024:.1f} KiB KV/token + "
            f"{cap.state_bytes_per_request / 2**20:.1f} MiB state/request -> about "
            f"{cap.max_concurrency:,} concurrent requests ({cap.assumptions}; facts from "
            f"{cap.facts_from})"
        )
    files = ["recipe.yaml", "plan.json", "commands.sh"] + (
        ["job.sbatch"] if prepared.sbatch else []
    )
    lines.append(f"Run directory: {prepared.run.path}  ({', '.join(files)})")
    return "\n".join(lines)


def describe(prepared: Prepared) -> dict:
    return {
        "run_dir": str(prepared.run.path),
        "study": prepared.study,
        "nodes": prepared.nodes,
        "placeholder_nodes": prepared.placeholder_nodes,
        "plan": rundir.read_json(prepared.run.plan),
        "sbatch": prepared.sbatch,
        "capacity": [c.to_json() for c in prepared.capacity],
    }
