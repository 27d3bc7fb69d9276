"""The layer rule the README states: which part of the project may import which. Every
import counts, the lazy ones inside functions too (they are dependencies all the same)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# part -> the parts it may import (besides itself); `errors` and the package root are free.
ALLOWED = {
    "sim": set(),
    "run": set(),
    "schema": {"run", "sim"},
    "planning": {"schema", "run", "sim"},
    "telemetry": {"schema", "run"},
    "clients": {"run"},
    "analysis": {"planning", "schema", "run", "telemetry"},
    "control": {"planning", "schema", "run", "sim", "telemetry"},
    "text": {"control", "planning", "analysis", "schema", "run"},
    "report": {"analysis", "text", "schema", "run"},
    "dashboard": {"analysis", "report", "schema", "run"},
    "cli": {"control", "text", "report", "analysis", "dashboard", "planning", "schema", "run",
            "telemetry"},
}
FREE = {"errors", "launcher"}
TOP = {"cli": "cli", "__main__": "cli", "text": "text", "report": "report", "errors": "errors"}


def part_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "dashboard":
        return "dashboard"
    if parts[0] != "launcher":
        return None
    if len(parts) == 1:
        return "launcher"
    return TOP.get(parts[1], parts[1])


def imports() -> dict[tuple[str, str], list[str]]:
    """(importer part, imported part) -> the files where it happens."""
    out: dict[tuple[str, str], list[str]] = {}
    for f in sorted([*REPO.glob("launcher/**/*.py"), *REPO.glob("dashboard/**/*.py")]):
        rel = f.relative_to(REPO)
        src = part_of(".".join(rel.with_suffix("").parts))
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from launcher import text` imports launcher.text
                names = [f"{node.module}.{a.name}" for a in node.names] \
                    if node.module in ("launcher", "dashboard") else [node.module]
            else:
                continue
            for name in names:
                dst = part_of(name)
                if dst and dst != src:
                    out.setdefault((src, dst), []).append(str(rel))
    return out


def test_every_import_points_down():
    wrong = {f"{a} -> {b} ({', '.join(sorted(set(files)))})"
             for (a, b), files in imports().items()
             if b not in FREE and b not in ALLOWED.get(a, set())}
    assert not wrong, "imports the layer rule forbids:\n" + "\n".join(sorted(wrong))


def test_no_part_is_missing_from_the_rule():
    seen = {a for a, _ in imports()} | {b for _, b in imports()}
    assert seen - FREE <= set(ALLOWED), sorted(seen - FREE - set(ALLOWED))


def test_the_rule_itself_has_no_cycle():
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in ALLOWED.get(n, ()):
            assert state.get(m) != 1, " -> ".join([*path, n, m])
            if m not in state:
                visit(m, [*path, n])
        state[n] = 2

    for n in ALLOWED:
        if n not in state:
            visit(n, [])


def test_the_engine_kind_is_decided_in_one_place():
    """Which engine a run has (real vLLM on GPUs or a CPU, or the simulator) is asked of
    launcher.run.engines, never by comparing the recipe's strings elsewhere. argcheck.py is
    the exception: it runs standalone in the engine's environment, reading its own --engine."""
    import re

    pattern = re.compile(r"""\bengine(_platform)?"?\)?\s*[!=]=\s*["'](vllm|sim|cpu|gpu)["']""")
    found = []
    for f in sorted([*REPO.glob("launcher/**/*.py"), *REPO.glob("dashboard/**/*.py")]):
        rel = str(f.relative_to(REPO))
        if rel in ("launcher/run/engines.py", "launcher/control/argcheck.py") or \
                rel.startswith("launcher/sim/"):
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


# What the engine kind answers with a yes or no (its bool fields) is asked only where the
# question is that one; each file's reads, and why the answer cannot be a value instead.
ENGINE_KIND_QUESTIONS = {
    # validation: the recipe's sim knobs configure only a kind that takes them
    "launcher/schema/recipe.py": 1,
    # the sim knobs' env on its engines; its prompts go through the chat template only where
    # it tokenizes; a hub model is staged only for a kind that loads weights
    "launcher/planning/render.py": 3,
    # a container profile refuses a recipe without an image only for a kind that needs one
    "launcher/planning/containers.py": 1,
    # the TCP warning is said only where KV over TCP is not the kind's normal
    "launcher/planning/ucx.py": 1,
    "launcher/control/pd_check.py": 1,
    # the dry-run's line on who parses the flags: no image of its own to check them again
    "launcher/planning/engine_argv.py": 1,
    # an older summary has no vllm_cpu: plan.json's kind says it
    "launcher/report.py": 1,
    # a hub model needs staging only for a kind that loads weights
    "launcher/control/staging.py": 1,
    # the node's build is held to the recipe's platform only for a kind that has one
    "launcher/control/preflight.py": 1,
    # numactl is needed only by a kind that binds NUMA
    "launcher/control/prepare.py": 1,
    # inside the engine's environment: its build, its model files, numactl
    "launcher/control/nodecheck.py": 3,
    # the published comparison records whether the measured side is a speed model; the
    # chat template's absence is a difference only for a kind that tokenizes
    "launcher/run/published.py": 2,
    # the summary's own record of what its figures are (simulated, vllm_cpu)
    "launcher/run/figures.py": 2,
    # the recommendation records whether its capacities are a speed model's
    "launcher/analysis/recommend.py": 1,
    # the runs page counts the runs whose figures are a speed model's
    "dashboard/app_pages/runs.py": 1,
}


def reads_over_budget(pattern: re.Pattern, budget: dict[str, int], skip) -> list[str]:
    """The lines matching `pattern` in launcher/ and dashboard/ (files `skip` leaves out) of
    each file that has more of them than its `budget` says."""
    found: dict[str, list[str]] = {}
    for f in sorted([*REPO.glob("launcher/**/*.py"), *REPO.glob("dashboard/**/*.py")]):
        rel = str(f.relative_to(REPO))
        if skip(rel):
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if pattern.search(line):
                found.setdefault(rel, []).append(f"{rel}:{n}: {line.strip()}")
    return [line for rel, lines in found.items() if len(lines) > budget.get(rel, 0)
            for line in lines]


def test_the_engine_kind_is_asked_not_tested():
    """Code asks the kind what to do (its values: label, tag, caveat, costs, ...), never which
    kind it is: the identity flags are gone, and each yes-or-no question is read only where
    ENGINE_KIND_QUESTIONS says why."""
    import dataclasses

    from launcher.run import engines

    fields = {f.name: f.type for f in dataclasses.fields(engines.EngineKind)}
    for gone in ("simulated", "on_cpu", "real_vllm"):
        assert gone not in fields and not hasattr(engines.SIM, gone), gone
    flags = sorted(name for name, t in fields.items() if t in (bool, "bool"))
    assert {"loads_weights", "speed_modelled"} <= set(flags), flags  # the counting itself
    pattern = re.compile(rf"\.({'|'.join(flags)})\b")

    def skip(rel: str) -> bool:
        return rel == "launcher/run/engines.py" or rel.startswith("launcher/sim/")

    assert reads_over_budget(pattern, {}, skip)  # the scan itself finds the reads it budgets
    over = reads_over_budget(pattern, ENGINE_KIND_QUESTIONS, skip)
    assert not over, ("reads a yes-or-no of the engine kind (ask it for a value, or say in "
                      "ENGINE_KIND_QUESTIONS why the question is that one):\n" + "\n".join(over))


MAX_FUNCTION_LINES = 150  # issue 36: a longer function hides the seams it should be split at


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in `source` longer than `limit` lines."""
    return [(node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_is_over_150_lines():
    def lines(n: int) -> str:
        return "".join(f"    x{i} = {i}\n" for i in range(n))

    # the check itself: a def line and 150 more is one too many, 150 in all is not
    assert long_functions("def f():\n" + lines(MAX_FUNCTION_LINES)) == [("f", 151)]
    assert long_functions("async def g():\n" + lines(MAX_FUNCTION_LINES - 1)) == []
    found = [f"{f.relative_to(REPO)}: {name} is {n} lines"
             for f in sorted([*REPO.glob("launcher/**/*.py"), *REPO.glob("dashboard/**/*.py")])
             for name, n in long_functions(f.read_text())]
    assert not found, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


# A scheduler's flags: what its class answers as a fact (a data attribute, a method that
# returns bool) instead of doing the work as a method. Outside launcher/planning/schedulers.py
# (what the planner asks) and launcher/control/scheduling.py (what it does)
# a branch on one is left only where the question really is "does it allocate":
SCHEDULER_FLAG_BRANCHES = {
    # write_run: an allocation's nodes are known only inside it, so the dry-run's are
    # placeholders; choose: a study's one allocation has a time limit and a partition to
    # fit only where there is an allocation (Choice's one_minutes and limits say None)
    "launcher/control/prepare.py": 2,
    # NodeWatch knocks on an allocation's nodes (their slurmd, sinfo): only those can be lost
    "launcher/control/orchestrator.py": 1,
    # check_allocation: only an allocation (`launcher run` inside a salloc) can be too small
    "launcher/control/allocation.py": 1,
    # remote_nodes: an allocation's nodes are other hosts (unless loopback is theirs), so a
    # runs directory on this host's local disk is not theirs
    "launcher/control/visibility.py": 1,
    # other_hosts: KV over TCP is refused by default where the nodes are other hosts
    # (remote_nodes): there it means NVLink and RDMA are not in use
    "launcher/planning/ucx.py": 1,
}


SCHEDULER_MODULES = ("launcher/planning/schedulers.py", "launcher/control/scheduling.py")


def scheduler_flags() -> set[str]:
    from launcher.control import scheduling
    from launcher.planning import schedulers

    flags = set()
    for cls in {type(s) for s in [*schedulers.SCHEDULERS.values(),
                                  *scheduling.ACTIONS.values()]}:
        for klass in cls.__mro__[:-1]:
            for k, v in vars(klass).items():
                if k.startswith("_") or k == "name":
                    continue
                if not callable(v) or getattr(v, "__annotations__", {}).get("return") == "bool":
                    flags.add(k)
    return flags


def test_schedulers_do_their_work_through_methods():
    """Adding a scheduler is one class in launcher/planning/schedulers.py (and its effects
    in launcher/control/scheduling.py): elsewhere nothing
    branches on what it is, only on what it answers. The scheduler's name is never compared
    either."""
    flags = scheduler_flags()
    assert {"allocates", "remote_nodes"} <= flags, flags  # the counting itself
    pattern = re.compile(rf"\.({'|'.join(sorted(flags))})\b"
                         r"""|\bscheduler\s*[!=]=|[!=]=\s*["'](slurm|local)["']""")
    over = reads_over_budget(pattern, SCHEDULER_FLAG_BRANCHES,
                             lambda rel: rel in SCHEDULER_MODULES)
    assert not over, ("branches on a scheduler flag (make it a method of the scheduler, or "
                      "say in SCHEDULER_FLAG_BRANCHES why the question is whether it "
                      "allocates):\n" + "\n".join(over))


def test_no_scheduler_is_built_on_another():
    """Each scheduler is its own class beside the others: a new one copies no behaviour it
    did not choose from the local one."""
    from launcher.control import scheduling
    from launcher.planning import schedulers

    for table in (schedulers.SCHEDULERS, scheduling.ACTIONS):
        classes = {type(s) for s in table.values()}
        assert len(classes) == len(table) >= 2
        for cls in classes:
            assert cls.__bases__ == (object,), f"{cls.__name__} is built on {cls.__bases__}"
