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
PORT_BASES = (32000, 26800, 27800)  # this suite's local study, apart from the others'


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
    assert ("loading ~10 min (gb200-nvl72's load_time_s) each for 3 load rounds (the start "
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


def test_in_a_study_every_configurations_points_that_need_one_engine_setting_run_together():
    """Each configuration's points grouped by the engines they need: every setting of the
    decode is loaded once for the whole study (a configuration visited once per setting),
    the largest configuration first in each setting; its gate once per engine set."""
    base = {"decode-0": ("base",), "prefill-0": ("p",)}
    big = {**base, "prefill-1": ("p1",)}
    top = {"decode-0": ("768",)}
    segs = lambda want: [((4, 8), want), ((16,), {**want, **top})]  # noqa: E731
    turns = study_plan.schedule([("a", segs(base)), ("b", segs(big)), ("c", segs(base))],
                                gates={"a": "g", "b": "g", "c": "g"})
    assert [(t.run, t.points, t.first, t.last) for t in turns] == [
        ("b", (4, 8), True, False), ("a", (4, 8), True, False), ("c", (4, 8), True, False),
        ("b", (16,), False, True), ("a", (16,), False, True), ("c", (16,), False, True)]
    assert sum(t.loads for t in turns) == 4  # decode, two prefills, the decode at 16 once
    assert [t.restart for t in turns] == [(), (), (), ("decode-0",), (), ()]
    # one gate, in the largest configuration's visit of the top setting, for all three
    assert [t.gate for t in turns] == [(), (), (), ("a", "b", "c"), (), ()]
    # gates that ask other things each run their own; without gates none is planned
    other = study_plan.schedule([("a", segs(base)), ("b", segs(big))],
                                gates={"a": "g", "b": "h"})
    assert [t.gate for t in other if t.gate] == [("b",), ("a",)]
    assert not any(t.gate for t in study_plan.schedule([("a", segs(base))]))
    # the plan of turns keeps every visit's points, first, last and gate
    assert study_plan.Turn.from_json(turns[3].to_json()) == turns[3]


def test_the_published_study_loads_each_decode_setting_once(cli, tmp_path):
    """The published five configurations: 3 load rounds (base, cc4096, cc5120) where a
    configuration at a time took 11, one accuracy gate, and its useful GPU time at a
    10-minute load (the gb200 profile's load_time_s) at least 0.8."""
    code, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5,6,7,8",
                         "--dry-run", timeout=300)
    assert code == 0, err
    assert "each for 3 load rounds" in out and "15 visits, 3 load rounds" in out, out
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if p.name.endswith("-study")]
    alloc = json.loads((folder / "study.json").read_text())["allocation"]
    assert alloc["comparison"]["one_rounds"] == 3
    assert sum(1 for t in alloc["turns"] if t["gate"]) == 1
    useful = alloc["comparison"]["useful_gpu_time"]
    assert useful["at_load_time_s"] >= 0.8 > useful["at_health_timeout"], useful
    line = next(x for x in out.splitlines() if "useful GPU time" in x)
    assert "at a 10 min load (load_time_s" in line and "at a 40 min load" in line, line


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


def test_in_one_allocation_each_decode_setting_is_loaded_once_and_one_gate_covers_both(
        tmp_path):
    """A study in one allocation whose decode needs another command line from 16 on: every
    configuration's point 4 on the first decode, then every one's point 16 on the second;
    the decode started twice in all, each configuration's curve whole, each point naming
    the engine start it ran on; the accuracy gate run once, on the largest configuration's
    engines at the top setting, recorded for both; nothing left running at the end."""
    import subprocess
    import sys

    import helpers

    from launcher.control import prepare
    from launcher.run import rundir

    profile = helpers.profile_copy(tmp_path / "local.yaml", "local",
                                   port_base=helpers.free_port_base(PORT_BASES, 400))
    runs = prepare.prepare_all(
        "local-sim", [f"cluster={profile}", "benchmark.concurrency=[4,16]",
                      "accuracy.num_questions=20",
                      "benchmark.prompts_multiplier=2", "benchmark.warmup=2",
                      "decode.args_from_concurrency={16: {num-gpu-blocks-override: 640}}"],
        ["prefill.endpoints=1,2"], tmp_path / "runs", allocation="one")
    shared = runs[0].shared
    p1, p2 = (r.run.run_id for r in runs)
    assert [(t.run, t.points, t.restart, t.gate) for t in shared.turns] == [
        (p2, (4,), (), ()), (p1, (4,), (), ()), (p2, (16,), ("decode-0",), (p1, p2)),
        (p1, (16,), (), ())]
    p = subprocess.run([sys.executable, "-m", "launcher", "run", str(shared.path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    alloc = json.loads((shared.path / "allocation.json").read_text())
    assert [c["state"] for c in alloc["configurations"]] == ["running", "running",
                                                              "succeeded", "succeeded"]
    seen = [(e["event"], e["endpoint"], e.get("why", "")) for e in alloc["engines"]
            if e["endpoint"] == "decode-0"]
    assert seen == [
        ("started", "decode-0", ""),
        ("stopped", "decode-0", "this configuration starts it with another command line"),
        ("started", "decode-0", ""),
        ("stopped", "decode-0", "stopped at the end of this configuration"),
    ], seen
    s = alloc["summary"]
    assert s["engine_starts"] == 4 and s["succeeded"] == 2  # decode twice, two prefills
    assert 0 < s["useful_gpu_time"] < 1 and s["measured_windows_s"] > 0, s
    # the same from what the summary rounds: every sweep point's window in the runs' events
    # over the allocation's span (its rounded fields do not divide to the third decimal: 7.35
    # s of windows over 20.55 s is 0.358, shown as 7.3 s over 20.6 s)
    windows = sum(e["seconds"] for run_id in (p1, p2)
                  for e in rundir.RunDir(shared.path / run_id).events()
                  if e.get("event") == "sweep_point")
    wall = alloc["ended"] - alloc["started"]
    assert abs(s["measured_windows_s"] - windows) <= 0.05 + 1e-9, (s, windows)
    assert abs(s["wall_s"] - wall) <= 0.05 + 1e-9, (s, wall)
    assert abs(s["useful_gpu_time"] - windows / wall) <= 5e-4 + 1e-9, (s, windows, wall)
    # the Study page's facts (and the report's): the measured one beside GPU-hours, with the
    # dry-run's estimate
    from launcher.analysis import studies

    facts = dict(studies.allocation_facts(studies.find_study(shared.path.parent, None)))
    assert list(facts).index("useful GPU time") == list(facts).index("GPU-hours") + 1
    assert facts["useful GPU time"].startswith(f"{s['useful_gpu_time']:.2f}: GPU-seconds "
                                               "inside the sweep points' measured windows")
    assert "estimated before: " in facts["useful GPU time"], facts
    starts = {}
    for run_id in (p1, p2):
        rd = rundir.RunDir(shared.path / run_id)
        events = list(rd.events())
        assert not [e for e in events if e["event"] == "engines_restarted"]
        points = [e for e in events if e["event"] == "sweep_point"]
        assert [e["process"] for e in points] == ["bench-c4", "bench-c16"]
        assert all(e["status"] == "ok" for e in points)
        starts[run_id] = [e["engines"]["decode-0@local-1"] for e in points]
        assert leftovers(rd.path) == [], run_id
        summary = json.loads((rd.path / "summary.json").read_text())
        assert sorted(p["max_concurrency"] for p in summary["points"]) == [4, 16]
        assert summary["state"] == "succeeded"
        # its lifecycle is its own visits' time, not the other configuration's between
        lc = summary["lifecycle"]
        assert lc["seconds"] == pytest.approx(sum(v["seconds"] for v in lc["phases"].values()),
                                              abs=0.1)
        gate = [e for e in events if e["event"] == "accuracy"]
        assert len(gate) == 1 and gate[0].get("gate_run") == p2, gate
        assert rd.read_record().accuracy_passed is True
    # both configurations' point 4 ran on the decode p2 started first, both 16s on its
    # second start
    assert starts[p1][0] == starts[p2][0] and starts[p1][1] == starts[p2][1]
    assert starts[p1][0]["started"] < starts[p1][1]["started"]
    assert {x["started_by"] for x in starts[p1]} == {p2}
    assert sum(1 for e in rundir.RunDir(shared.path / p2).events()
               if e["event"] == "accuracy_gate") == 1
    assert not any(e["event"] == "accuracy_gate" for e in rundir.RunDir(shared.path / p1).events())


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
