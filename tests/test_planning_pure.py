"""launcher/planning/ is pure: nothing it runs or imports (within the launcher) can start a
process. What a dry-run asks the scheduler is gathered by launcher/control/ and handed to
planning as data."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLANNING = REPO / "launcher" / "planning"
GOLDEN = REPO / "slurm" / "examples"

# What starts a process: these modules, and these functions of os and asyncio.
PROCESS_MODULES = {"subprocess", "pty", "multiprocessing", "concurrent.futures.process"}
OS_CALLS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp",
            *(f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
            *(f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe"))}
ASYNCIO_CALLS = {"create_subprocess_exec", "create_subprocess_shell"}


def _module_file(name: str) -> Path | None:
    base = REPO / name.replace(".", "/")
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _imported(tree: ast.AST) -> set[str]:
    """Every module an import names (at the top or inside a function), and each
    `from M import N` as M and M.N (N may be a module)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.add(n.module)
            out |= {f"{n.module}.{a.name}" for a in n.names}
    return out


def process_starts(source: str) -> list[str]:
    """What in this source can start a process: an import of a process module, a call of
    os.system/os.popen/os.exec*/os.spawn*/os.fork, asyncio.create_subprocess_*."""
    tree = ast.parse(source)
    found = []
    for name in sorted(_imported(tree)):
        top = name.split(".")[0]
        if name in PROCESS_MODULES or top in PROCESS_MODULES or \
                (name.startswith(("os.", "asyncio.")) and name.split(".")[1] in
                 OS_CALLS | ASYNCIO_CALLS):
            found.append(f"import {name}")
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and (
                (n.value.id == "os" and n.attr in OS_CALLS)
                or (n.value.id == "asyncio" and n.attr in ASYNCIO_CALLS)):
            found.append(f"{n.value.id}.{n.attr} (line {n.lineno})")
    return found


def reachable_from_planning() -> dict[str, Path]:
    """launcher/planning/** and every launcher module they import, at any depth."""
    todo = [".".join(p.relative_to(REPO).with_suffix("").parts)
            for p in sorted(PLANNING.rglob("*.py"))]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop().removesuffix(".__init__")
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        todo += [m for m in _imported(ast.parse(path.read_text())) if m.startswith("launcher")]
    return seen


def test_the_scan_finds_each_way_to_start_a_process():
    # the check itself: each way is found, and ordinary code is not
    for source in ("import subprocess", "from subprocess import run", "import os\nos.system('x')",
                   "import os\nos.popen('x')", "import os\nos.execvp('x', [])",
                   "import asyncio\nasyncio.create_subprocess_exec('x')",
                   "from os import posix_spawn", "import multiprocessing"):
        assert process_starts(source), source
    assert process_starts("import os\nos.path.join('a')\nimport shlex") == []


def test_nothing_reachable_from_planning_starts_a_process():
    modules = reachable_from_planning()
    assert "launcher.planning.schedulers" in modules and "launcher.schema.recipe" in modules
    found = {name: why for name, path in modules.items()
             if (why := process_starts(path.read_text()))}
    assert not found, ("launcher/planning must not start processes (ask in launcher/control "
                       f"and hand the answer over as data): {found}")
    for name in modules:
        if name.startswith("launcher.planning"):
            importlib.import_module(name)  # each one imports on its own


def _normalise(text: str, run_dir: Path) -> str:
    sys.path.insert(0, str(GOLDEN))
    try:
        from regenerate import normalise
    finally:
        sys.path.remove(str(GOLDEN))
    return normalise(text, run_dir).replace(str(REPO), "<REPO>")


def _innermost_launcher_frame() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        rel = Path(frame.filename).resolve()
        if rel.is_relative_to(REPO / "launcher"):
            return str(rel.relative_to(REPO))
    return "?"


def test_a_dry_run_plans_with_no_process_started_by_planning(monkeypatch, tmp_path):
    """The dev cluster's dry-run with every process start refused from planning: control
    gathers what it asks (the partition's limits, the launcher's git commit) and planning
    renders exactly the golden files; then, with every start refused, the planning part
    alone renders them again from those facts."""
    from launcher import text
    from launcher.control import prepare, scheduling
    from launcher.planning import capacity, cost, render, schedulers
    from launcher.schema import recipe

    real_popen, started = subprocess.Popen, []

    def guarded(*args, **kwargs):
        where = _innermost_launcher_frame()
        if where.startswith("launcher/planning/"):
            raise AssertionError(f"{where} started a process: {args[:1]}")
        started.append(where)
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", guarded)
    [p] = prepare.prepare_all(str(recipe.shipped()["devcluster-sim"]), [], [], tmp_path)
    files = {"dry-run.txt": text.plan_text(p) + "\n",
             **{f: (p.run.path / f).read_text() for f in ("job.sbatch", "commands.sh")}}
    for name, got in files.items():
        assert _normalise(got, p.run.path) == (GOLDEN / "devcluster-sim" / name).read_text(), name
    assert started and all(w.startswith("launcher/control/") for w in started), started

    # the facts control gathered, as data; from here no process may start at all
    limits = scheduling.partition_limits(p.plan.cluster, p.plan.recipe.slurm.partition)
    facts = json.loads(json.dumps(limits.to_json())) if limits else None

    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    part = schedulers.Partition(facts["partition"], facts["max_minutes"], facts["max_nodes"],
                                facts["max_time"]) if facts else None
    assert cost.partition_blockers(p.plan, p.nodes, part) == []
    out = render.render(p.plan, p.run.run_id, placeholder_nodes=True,
                        capacity=[c.to_json() for c in capacity.estimates(p.plan)])
    assert out.sbatch == (p.run.path / "job.sbatch").read_text()
    assert out.commands == (p.run.path / "commands.sh").read_text()
    assert cost.estimate(p.plan).expected_s > 0


@pytest.mark.parametrize("max_time, max_nodes, want", [
    ("00:05:00", "UNLIMITED", "MaxTime"), ("UNLIMITED", "0", "MaxNodes"),
    ("1-00:00:00", "8", None)])
def test_partition_limits_reach_planning_as_data(max_time, max_nodes, want):
    """scontrol's answer is read into a Partition (control asks, planning judges): a time
    limit or node count past it is a blocker sentence naming the key to change."""
    from launcher.planning import cost, schedulers
    from launcher.planning import plan as plan_mod
    from launcher.schema import cluster as cluster_mod
    from launcher.schema import recipe

    r = recipe.load(str(recipe.shipped()["devcluster-sim"]))
    c = cluster_mod.load(r.cluster)
    pl = plan_mod.make_plan(r, c, cluster_mod.profile_nodes(c, 2))
    out = ("PartitionName=other Default=NO MaxTime=UNLIMITED\n"
           f"PartitionName=batch Default=YES MaxNodes={max_nodes} MaxTime={max_time} State=UP")
    part = schedulers.read_partition(out, None)
    assert part is not None and part.name == "batch" and part.max_time == max_time
    blockers = cost.partition_blockers(pl, 2, part)
    if want is None:
        assert blockers == []
    else:
        assert len(blockers) == 1 and want in blockers[0] and "slurm." in blockers[0]
