"""A setting that follows the sweep point (`<pool>.args_from_concurrency`): the recipe says
it once, the dry-run and commands.sh show every command line, preflight checks each, and the
run restarts only the endpoints whose command line changes before the first point that
needs it, on the same ports and logs, measured only once healthy and joined to the P->D
path again."""

import json
import shlex
from pathlib import Path

import pytest
import yaml
from helpers import launcher, leftovers

from launcher.errors import UserError
from launcher.planning import cost
from launcher.planning import study as study_plan
from launcher.run.plandoc import Process
from launcher.schema import recipe

REPO = Path(__file__).resolve().parents[1]
SEED = "qwen3.5-397b-gb200-disagg"


def _err(*sets: str) -> str:
    with pytest.raises(UserError) as e:
        recipe.load(SEED, list(sets))
    return str(e.value)


@pytest.mark.parametrize("sets, says", [
    (["benchmark.concurrency=[64,5120,4096]"],
     "list benchmark.concurrency in ascending order (now 64, 5120, 4096)"),
    (["decode.args_from_concurrency={4096: {}}"],
     "decode.args_from_concurrency.4096 sets no flag"),
    (["decode.args_from_concurrency={4096: {port: 9}}"], "decode.args_from_concurrency.4096: "
     "remove 'port'"),
    (["decode.args_from_concurrency={4096: {api-key: x}}"], "carries a secret"),
    (["agg.endpoints=0", "agg.args_from_concurrency={4096: {max-num-seqs: 9}}"],
     "agg.args_from_concurrency: agg has no endpoints in mode disagg"),
])
def test_a_step_that_cannot_apply_is_one_sentence(sets, says):
    msg = _err(*sets) if "port" not in sets[-1] else _plan_err(sets)
    assert says in msg, msg


@pytest.mark.parametrize("sets, start, restarts", [
    ([], None, [4096, 5120]),
    # the -cc5120 recipe alone: the decode starts with its setting, nothing restarts
    (["benchmark.concurrency=[5120]"], "768", []),
    (["benchmark.concurrency=[4096,5120]"], "640", [5120]),
    # a shorter sweep never reaches the steps; no sweep: the engines start with args
    (["benchmark.concurrency=[64,128]"], None, []),
    (["benchmark.enabled=false"], None, []),
    # a descending list is fine while no step falls inside it
    (["benchmark.concurrency=[128,64]"], None, []),
])
def test_a_step_is_how_the_engines_start_or_a_restart_or_never_reached(sets, start, restarts):
    from launcher.control.prepare import plan_run
    from launcher.planning import render

    r = recipe.load(SEED, sets)
    plan, _ = plan_run(r, REPO / "runs-never-written", None, {})
    (decode, *_) = [p for p in render.processes(plan) if p.role == "decode"]
    flags = decode.argv[decode.argv.index("serve"):]
    got = (flags[flags.index("--max-cudagraph-capture-size") + 1]
           if "--max-cudagraph-capture-size" in flags else None)
    assert got == start and [x["from_concurrency"] for x in decode.restarts] == restarts


def _plan_err(sets):
    from launcher.planning import plan as plan_mod

    with pytest.raises(UserError) as e:
        plan_mod.check_owned(recipe.load(SEED, sets))
    return str(e.value)


def test_a_step_that_breaks_hybrid_pd_agreement_is_refused_at_planning(tmp_path):
    """The P/D agreement a hybrid model needs holds at every restart point, not only at the
    start: a decode block size changed at 4096 is refused before anything is written."""
    code, out = launcher(tmp_path, "submit", SEED, "--dry-run", "--set",
                         "decode.args_from_concurrency={4096: {block-size: 32}}")
    assert code == 2, out
    assert "from sweep concurrency 4096 on (args_from_concurrency): " in out, out
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_dry_run_shows_each_restart_and_what_it_costs(tmp_path):
    code, out = launcher(tmp_path, "submit", SEED, "--dry-run")
    assert code == 0, out
    assert ("  restarted before concurrency 4096 (decode.args_from_concurrency, the other "
            "engines stay loaded), adding: --max-cudagraph-capture-size 640") in out
    assert "adding: --max-cudagraph-capture-size 768" in out
    # two decode restarts: load rounds at the profile's load time each, bounded by
    # health.timeout_s
    assert ("loading ~15 min (gb200-nvl72's load_time_s) each for 3 load rounds (the start "
            "and 2 restarts, args_from_concurrency)") in out
    assert "at most 3 h 11 min if each load takes its health.timeout_s (40 min)" in out
    run = next((tmp_path / "runs").iterdir())
    doc = json.loads((run / "plan.json").read_text())
    cmds = (run / "commands.sh").read_text()
    for p in map(Process.from_json, doc["processes"]):
        if p.kind != "engine":
            continue
        top = p.argv_at(5120)
        if p.role == "decode":
            assert top[-2:] == ["--max-cudagraph-capture-size", "768"], p.name
            assert p.argv_at(4096)[-2:] == ["--max-cudagraph-capture-size", "640"]
            assert p.argv_at(3072) == p.argv and "--max-cudagraph-capture-size" not in p.argv
            for r in p.restarts:  # appended to the same log, after the first command line
                assert f"{shlex.join(r['argv'])} >> {shlex.quote(str(run / p.log))}" in cmds
        else:
            assert top == p.argv and p.restarts == [], p.name


def test_in_a_study_the_next_sweep_runs_down_from_where_the_last_one_left_its_engines():
    """The decode a sweep left at its top point's command line is kept by the next
    configuration, whose sweep runs from its top point down (restarting on the way), and
    the one after runs upwards again; without such a start, a sweep runs upwards."""
    base = {"decode-0": ("base",), "prefill-0": ("p",)}
    top = {"decode-0": ("768",), "prefill-0": ("p",)}
    turns = study_plan.schedule([("a", base), ("b", base), ("c", base)],
                                ends={"a": top, "b": top, "c": top})
    assert [(t.run, t.descending, t.restart) for t in turns] == [
        ("a", False, ()), ("b", True, ()), ("c", False, ())]
    assert turns[1].keep == ("decode-0", "prefill-0")
    # without ends (no args_from_concurrency) nothing changes
    assert not any(t.descending for t in study_plan.schedule([("a", base), ("b", base)]))
    # the plan of turns keeps the direction
    assert study_plan.Turn.from_json(turns[1].to_json()) == turns[1]


def test_cost_holds_a_load_per_restart_round():
    from launcher.control.prepare import plan_run

    r = recipe.load(SEED, [])
    plan, _ = plan_run(r, REPO / "runs-never-written", None, {})
    c = cost.estimate(plan)
    assert c.restarts == 2 and c.restart_loads == 2
    assert dict(c.phases)[cost.RESTARTS] == 2 * plan.cluster.load_time_s
    assert c.worst_s - c.expected_s == 3 * (r.health.timeout_s - plan.cluster.load_time_s)


@pytest.fixture(scope="module")
def follow_run(tmp_path_factory):
    """The embedded default with a decode setting from its second point on: one local run
    on simulated engines behind the real router."""
    tmp = tmp_path_factory.mktemp("follow")
    data = yaml.safe_load((REPO / "launcher/recipes/local-sim.yaml").read_text())
    data.update(name="local-sim-follow", accuracy={"enabled": False})
    data["benchmark"].update(concurrency=[4, 16, 32], prompts_multiplier=2, warmup=2)
    data["decode"]["args_from_concurrency"] = {16: {"num-gpu-blocks-override": 640}}
    data["prefill"]["args_from_concurrency"] = {32: {"num-gpu-blocks-override": 3000}}
    for k in ("data", "train"):
        data.get("accuracy", {}).pop(k, None)
    f = tmp / "follow.yaml"
    f.write_text(yaml.safe_dump(data))
    code, out = launcher(tmp, "submit", str(f))
    run = next(p for p in (tmp / "runs").iterdir() if p.name.endswith("local-sim-follow"))
    return code, out, run


def test_only_the_changed_endpoints_restart_and_every_point_is_measured(follow_run):
    code, out, run = follow_run
    assert code == 0, out
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["event"] == "engines_restarted"]
    assert [(e["concurrency"], e["endpoints"]) for e in restarts] == [
        (16, ["decode-0"]), (32, ["prefill-0", "prefill-1"])], restarts
    started = {}
    for e in events:
        if e["event"] == "process_started":
            started.setdefault(e["process"], []).append(e["pid"])
    # the decode (two parts: DP over two nodes) once more at 16, the prefills once more at 32
    assert {n: len(p) for n, p in started.items() if "@" in n and not n.startswith("agent")} \
        == {"decode-0@local-1": 2, "decode-0@local-2": 2,
            "prefill-0@local-3": 2, "prefill-1@local-3": 2}
    rec = json.loads((run / "run.json").read_text())
    assert rec["state"] == "succeeded"
    for name, pids in started.items():
        if name in rec["processes"]:
            assert rec["processes"][name]["pid"] == pids[-1], name
    # each restart came after the point before it and before its own point's client
    order = [(e["event"], e.get("process") or e.get("concurrency")) for e in events
             if e["event"] in ("engines_restarted", "sweep_point")]
    assert order == [("sweep_point", "bench-c4"), ("engines_restarted", 16),
                     ("sweep_point", "bench-c16"), ("engines_restarted", 32),
                     ("sweep_point", "bench-c32")]
    assert all(e["status"] == "ok" for e in events if e["event"] == "sweep_point")
    # the restarted engine ran the later command line, logging on in the same file
    log = (run / "logs/decode-0@local-1.log").read_text()
    starts = [x for x in log.splitlines() if "non-default args" in x]
    assert len(starts) == 2 and "num_gpu_blocks=384" in starts[0] \
        and "num_gpu_blocks=640" in starts[1], starts
    prefill = (run / "logs/prefill-1@local-3.log").read_text()
    assert "num_gpu_blocks=3000" in prefill
    stages = [e["stage"] for e in events if e["event"] == "stage"]
    assert stages.count("restart") == 2


def test_restart_time_is_loading_and_the_summary_has_every_point(follow_run):
    code, out, run = follow_run
    assert code == 0, out
    summary = json.loads((run / "summary.json").read_text())
    assert [p["max_concurrency"] for p in summary["points"]] == [4, 16, 32]
    phases = summary["lifecycle"]["phases"]
    assert phases["loading"]["seconds"] > 0 and phases["measuring"]["seconds"] > 0
    totals = summary["log_signals"]["totals"]
    assert totals["engine_crashes"] == 0 and totals["tracebacks"] == 0, totals


def test_in_one_allocation_a_restarted_engine_is_the_pools_and_the_next_configuration_restarts_it(
        tmp_path):
    """A study in one allocation whose decode restarts inside each sweep: the pool holds
    the restarted engine (the next configuration finds it with another command line and
    restarts it, as the plan of turns said), and nothing is left running at the end."""
    import subprocess
    import sys

    from launcher.control import prepare
    from launcher.run import rundir

    runs = prepare.prepare_all(
        "local-sim", ["accuracy.enabled=false", "benchmark.concurrency=[4,16]",
                      "benchmark.prompts_multiplier=2", "benchmark.warmup=2",
                      "decode.args_from_concurrency={16: {num-gpu-blocks-override: 640}}"],
        ["prefill.endpoints=1,2"], tmp_path / "runs", allocation="one")
    shared = runs[0].shared
    assert [(t.restart, t.descending) for t in shared.turns] == [((), False), ((), True)]
    p = subprocess.run([sys.executable, "-m", "launcher", "run", str(shared.path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    alloc = json.loads((shared.path / "allocation.json").read_text())
    assert [c["state"] for c in alloc["configurations"]] == ["succeeded", "succeeded"]
    seen = [(e["event"], e["endpoint"], e.get("why", "")) for e in alloc["engines"]
            if e["endpoint"] == "decode-0"]
    # the second configuration keeps the decode the first left at 16, measures 16 first,
    # then restarts it back for 4: three decode starts in all, not four
    assert seen == [
        ("started", "decode-0", ""),
        ("stopped", "decode-0", "restarted before concurrency 16"),
        ("started", "decode-0", ""),
        ("stopped", "decode-0", "restarted before concurrency 4"),
        ("started", "decode-0", ""),
        ("stopped", "decode-0", "stopped at the end of this configuration"),
    ], seen
    for t, order, restart in zip(shared.turns, (["bench-c4", "bench-c16"],
                                                ["bench-c16", "bench-c4"]), (16, 4),
                                 strict=True):
        rd = rundir.RunDir(shared.path / t.run)
        events = [json.loads(x) for x in (rd.path / "events.jsonl").read_text().splitlines()]
        assert [e["concurrency"] for e in events if e["event"] == "engines_restarted"] == [
            restart]
        points = [e for e in events if e["event"] == "sweep_point"]
        assert [e["process"] for e in points] == order
        assert all(e["status"] == "ok" for e in points)
        assert leftovers(rd.path) == [], t.run
        summary = json.loads((rd.path / "summary.json").read_text())
        assert sorted(p["max_concurrency"] for p in summary["points"]) == [4, 16]
    # the kept decode's log in the second run is the first run's file, read from where the
    # second began; the restart appended to it, and nothing was written to another run's log
    second = rundir.RunDir(shared.path / shared.turns[1].run)
    rec = second.read_record()
    head = rec.processes["decode-0@local-1"]
    assert head.log_bytes_at_start and (second.path / head.log).is_symlink()


@pytest.mark.parametrize("restarts", [
    "later", [{"argv": ["vllm"]}], [{"from_concurrency": "16", "argv": ["vllm"]}],
    [{"from_concurrency": 16, "argv": "vllm serve"}], [{"from_concurrency": True, "argv": []}]])
def test_a_damaged_restart_in_plan_json_is_one_sentence(tmp_path, restarts):
    from launcher.run.plandoc import PlanError, read_plan

    doc = json.loads((REPO / "slurm/examples/local-sim/plan.json").read_text())
    engine = next(p for p in doc["processes"] if p["kind"] == "engine")
    engine["restarts"] = restarts
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=r"processes\[\d+\]\.restarts is .*not a list of "
                                        r"\{from_concurrency: int, argv: \[str\]\}"):
        read_plan(tmp_path / "plan.json")
