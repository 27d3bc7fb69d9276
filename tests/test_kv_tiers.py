"""KV beyond the GPU: each role's connector chain as the recipe writes it, the Mooncake store
(its master planned and supervised, its config, its host memory), and the sentences the
dry-run says before anything is submitted (launcher/planning/kv_tiers.py,
docs/kv-store.md)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.control import prepare
from launcher.errors import UserError
from launcher.planning import kv_tiers
from launcher.schema import recipe as rmod
from launcher.schema import srt_slurm, srt_slurm_v2
from launcher.telemetry.store import read_samples
from tests import helpers

HERE = Path(__file__).parent
PUBLISHED = (srt_slurm.BUNDLED / "InferenceX/benchmarks/multi_node/srt-slurm-recipes/vllm/"
             "deepseek-v4/agentic/disagg-gb200-1p1d-dep8-dep8-c128-mtp2-agentic.yaml")
SCHEMA2 = (srt_slurm.BUNDLED / "InferenceX/benchmarks/multi_node/srt-slurm-recipes/dsv4/vllm/"
           "gb200-fp4/agentx/disagg-1p1d-dep8-dep8-mtp.yaml")
MASTER = Path(os.environ.get("PD_MOONCAKE_MASTER", "/var/tmp/pd-mooncake/venv/bin/mooncake_master"))
INSTALL = "bash tests/mooncake/setup.sh"
ALIAS = {"deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro"}  # the site's model_paths

STORE = {"metadata_server": "P2PHANDSHAKE", "protocol": "tcp", "device_name": "",
         "global_segment_size": "1GB", "local_buffer_size": "256MB"}


def multi(role: str, second: dict) -> dict:
    return {"kv_connector": "MultiConnector", "kv_role": role,
            "kv_connector_extra_config": {"connectors": [
                {"kv_connector": "NixlConnector", "kv_role": role}, {"kv_role": role, **second}]}}


def store_recipe(tmp_path: Path, **changes) -> Path:
    """local-sim with NIXL + MooncakeStoreConnector on both sides and a kv_store; `changes`
    are merged over it (a dotted key sets one value, None removes it)."""
    data = yaml.safe_load((rmod.RECIPES_DIR / "local-sim.yaml").read_text())
    data["name"] = "local-sim-store"
    for k in ("data", "train"):
        data["accuracy"][k] = str((rmod.RECIPES_DIR / data["accuracy"][k]).resolve())
    data["prefill"]["kv_connector"] = multi("kv_both", {"kv_connector": "MooncakeStoreConnector"})
    data["decode"]["kv_connector"] = multi("kv_consumer",
                                           {"kv_connector": "MooncakeStoreConnector"})
    data["kv_store"] = {"master_command": str(MASTER), "store_config": dict(STORE)}
    for key, value in changes.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    f = tmp_path / "store.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def refusal(tmp_path: Path, f: Path) -> str:
    with pytest.raises(UserError) as e:
        prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    return " ".join(str(e.value).split())


# --- the import -----------------------------------------------------------------------------


def fixed_length(text: str) -> str:
    """The published file with sa-bench in place of its agentic benchmark (another issue's)."""
    return text[:text.index("benchmark:\n  type: custom")] + (
        "benchmark:\n  type: sa-bench\n  isl: 8192\n  osl: 1024\n  concurrencies: [64]\n")


def test_the_store_clients_get_ports_of_the_plans_own_that_nothing_else_takes(tmp_path):
    """Mooncake's store client binds a port at random in MC_STORE_CLIENT_MIN_PORT..MAX_PORT
    (12300-14300 unless set): left there it took the router's port of a run whose block
    began at 12800, and the router then failed to bind; its transfer engine's two listening
    ports come from MC_MIN_RPC_PORT..MAX (15000-17000): one took a decode's port in a block
    at 15800. Every engine sharing the store gets a range for each inside its plan's port
    span, apart from every port the plan gives anything else, 4 per GPU sharing the store; a
    profile whose ports Mooncake would not take is refused."""
    from launcher.planning import plan as plan_mod
    from launcher.planning import render
    from launcher.schema import cluster

    local = cluster.load("local")
    for base in (12800, 24000):
        c = local.model_copy(update={"port_base": base})
        r = rmod.load(str(store_recipe(tmp_path)))
        p = plan_mod.make_plan(r, c, cluster.profile_nodes(c, plan_mod.nodes_needed(r, c)))
        lo, hi = p.store_client_ports
        rlo, rhi = p.store_rpc_ports
        gpus = sum(len(x.gpus) for ep in p.endpoints for x in ep.parts)
        assert hi - lo + 1 == 4 * gpus and p.router_port <= lo and hi < p.router_port + p.port_span
        assert rhi - rlo + 1 == 4 * gpus and hi < rlo and rhi < p.router_port + p.port_span
        others = {p.router_port, p.router_metrics_port, *p.exporter_ports.values(),
                  *dataclasses.astuple(kv_tiers.master_ports(p))}
        for ep in p.endpoints:
            others |= {ep.http_port, ep.dp_rpc_port, ep.nixl_port_base}
            for part in ep.parts:
                others |= set(range(part.vllm_port, part.vllm_port + plan_mod.VLLM_PORT_SPAN))
                others |= {part.http_port} - {None}
        assert not others & set(range(lo, rhi + 1)) and max(others) < lo
        engines = [x for x in render.processes(p) if str(x.kind) == "engine"]
        assert engines and all((x.env["MC_STORE_CLIENT_MIN_PORT"], x.env["MC_STORE_CLIENT_MAX_PORT"])
                               == (str(lo), str(hi)) for x in engines)
        assert all((x.env["MC_MIN_RPC_PORT"], x.env["MC_MAX_RPC_PORT"]) == (str(rlo), str(rhi))
                   for x in engines)
    # without a store, no range and the same span as before
    plain = rmod.load("local-sim")
    p = plan_mod.make_plan(plain, local, cluster.profile_nodes(local, plan_mod.nodes_needed(plain, local)))
    assert p.store_client_ports is None and p.store_rpc_ports is None
    high = local.model_copy(update={"port_base": 40000})
    r = rmod.load(str(store_recipe(tmp_path)))
    with pytest.raises(UserError, match=r"the KV store's clients would take ports 40\d+-40\d+, "
                       "which Mooncake refuses .*lower the cluster profile's port_base"):
        plan_mod.make_plan(r, high, cluster.profile_nodes(high, plan_mod.nodes_needed(r, high)))


def test_the_published_store_recipe_imports_its_store_and_each_roles_connector_as_written():
    src = yaml.safe_load(PUBLISHED.read_text())
    data = yaml.safe_load(fixed_length(PUBLISHED.read_text()))
    out, report = srt_slurm.convert(data, "x.yaml", "0" * 64, ALIAS)
    want = src["backend"]["mooncake_kv_store"]["store_config"]
    assert out["kv_store"]["store_config"] == want
    for role in ("prefill", "decode"):
        written = json.loads(src["backend"]["vllm_config"][role]["kv-transfer-config"])
        assert out[role]["kv_connector"] == written
        assert kv_tiers.names(written) == ["NixlConnector", "MooncakeStoreConnector"]
    assert "kv_connector" not in out  # no connector shared by both sides: each role's own
    mapped = dict(report.mapped)
    assert mapped["backend.mooncake_kv_store.store_config"] == "kv_store.store_config"
    assert "prefill.kv_connector" in mapped["backend.vllm_config.prefill.kv-transfer-config"]
    assert not report.refused


def test_the_published_agentic_store_recipe_imports_whole_with_its_alias_given():
    out, report = srt_slurm.import_file(PUBLISHED, ALIAS)
    assert out["benchmark"]["agentic"]["scenario"] == "inferencex-agentx-mvp"
    assert out["kv_store"]["store_config"] == yaml.safe_load(
        PUBLISHED.read_text())["backend"]["mooncake_kv_store"]["store_config"]
    assert not report.refused


def test_a_schema_2_mooncake_master_service_is_the_same_store_named_by_its_own_keys():
    data = yaml.safe_load(fixed_length(SCHEMA2.read_text()))
    store = {"metadata_server": "P2PHANDSHAKE", "global_segment_size": "140GB",
             "local_buffer_size": "4GB", "protocol": "rdma", "device_name": "mlx5_0"}
    data["services"].append({"name": "mooncake-master", "type": "mooncake-master",
                             "options": {"store_config": store}})
    kv = json.dumps(multi("kv_both", {"kv_connector": "MooncakeStoreConnector"}))
    for role in ("prefill", "decode"):
        data["roles"][role]["args"] = {**data["roles"][role]["args"], "kv-transfer-config": kv}
    out, report = srt_slurm.convert(data, "x.yaml", "0" * 64, ALIAS)
    assert out["kv_store"]["store_config"] == store
    assert out["prefill"]["kv_connector"] == json.loads(kv)
    mapped = dict(report.mapped)
    assert mapped["services[2].options.store_config"] == "kv_store.store_config"
    assert "services[2] (mooncake-master)" not in dict(report.refused)


def test_a_store_block_without_store_config_is_one_sentence():
    data = yaml.safe_load(fixed_length(PUBLISHED.read_text()))
    del data["backend"]["mooncake_kv_store"]["store_config"]
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64, ALIAS)
    assert "mooncake_kv_store: has no store_config" in " ".join(str(e.value).split())


def test_a_v1_store_recipe_and_its_schema_2_form_differ_only_in_names():
    """srt-slurm 2.x maps a mooncake-master service onto backend.mooncake_kv_store
    (expand_services): the two layouts give one recipe of ours."""
    v1 = yaml.safe_load(fixed_length(PUBLISHED.read_text()))
    block = v1["backend"].pop("mooncake_kv_store")
    v2 = copy.deepcopy(v1)
    v2["backend"]["mooncake_kv_store"] = block
    a, _ = srt_slurm.convert(v2, "x.yaml", "0" * 64, ALIAS)
    normalized, _, _ = srt_slurm_v2.normalize({
        "schema": 2, **{k: v for k, v in v1.items() if k not in ("backend", "resources")},
        "resources": {"gpu_type": "gb200", "gpus_per_node": 4},
        "engine": {"type": "vllm", "connector": None, "dp_launch_mode": "per_node"},
        "services": [{"name": "m", "type": "mooncake-master",
                      "options": {"store_config": block["store_config"]}}],
        "roles": {r: {"nodes": 2, "workers": 1, "gpus": 8, "env": v1["backend"][f"{r}_environment"],
                      "args": v1["backend"]["vllm_config"][r]} for r in ("prefill", "decode")},
    })
    assert normalized["backend"]["mooncake_kv_store"] == {"store_config": block["store_config"]}


# --- the dry-run ----------------------------------------------------------------------------


def test_the_dry_run_plans_the_master_its_config_and_each_engines_store_environment(tmp_path):
    f = store_recipe(tmp_path, **{"env.PYTHONHASHSEED": "7"})
    [p] = prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    plan = p.plan
    base = plan.router_port
    master = next(x for x in p.rendered.processes if x.name == "mooncake-master")
    assert str(master.kind) == "store" and master.node == plan.nodes[0]
    assert master.argv == [
        str(MASTER), f"--port={base + 2}", "--enable_http_metadata_server=true",
        f"--http_metadata_server_port={base + 3}", "--eviction_high_watermark_ratio=0.9",
        "--default_kv_lease_ttl=10000", "--rpc_thread_num=16", "--enable_metric_reporting=true",
        f"--metrics_port={base + 4}"]
    assert master.metrics_url == f"http://127.0.0.1:{base + 4}/metrics"
    order = [x.kind for x in p.rendered.processes]
    assert order.index("store") < order.index("engine")  # started before the engines
    written = json.loads((p.run.path / "mooncake_store_config.json").read_text())
    assert written == {**STORE, "master_server_address": f"127.0.0.1:{base + 2}"}
    for proc in p.rendered.processes:
        if proc.kind != "engine":
            continue
        assert proc.env["PYTHONHASHSEED"] == "7"
        assert proc.env["MOONCAKE_CONFIG_PATH"] == f"{p.run.path}/mooncake_store_config.json"
        assert proc.env["MOONCAKE_MASTER"] == f"127.0.0.1:{base + 2}"
        assert proc.env["MOONCAKE_TE_META_DATA_SERVER"] == f"http://127.0.0.1:{base + 3}/metadata"
        # the simulated engine's store client runs with the Python beside the master
        assert proc.env["SIM_STORE_PYTHON"] == str(MASTER.with_name("python"))
        kv = json.loads(proc.argv[proc.argv.index("--kv-transfer-config") + 1])
        assert kv["kv_connector"] == "MultiConnector" and kv["kv_role"] == (
            "kv_both" if proc.role == "prefill" else "kv_consumer")


def test_a_store_recipe_sets_one_hash_seed_everywhere_when_it_names_none(tmp_path):
    [p] = prepare.prepare_all(str(store_recipe(tmp_path)), [], [], tmp_path / "runs")
    seeds = {x.env.get("PYTHONHASHSEED") for x in p.rendered.processes if x.kind == "engine"}
    assert seeds == {"0"}


def test_the_published_store_recipe_dry_run_shows_master_config_and_host_memory(tmp_path):
    f = tmp_path / "dsv4.yaml"
    f.write_text(fixed_length(PUBLISHED.read_text()))
    site = tmp_path / "srtslurm.yaml"
    site.write_text("model_paths: {deepseek-v4-pro: deepseek-ai/DeepSeek-V4-Pro}\n")
    code, out = helpers.launcher(tmp_path, "submit", str(f), "--dry-run", "--site", str(site),
                                 "--set", "engine_version='0.34'")
    assert code == 0, out
    text = " ".join(out.split())
    assert "KV store: mooncake_master on gb200-r01-01" in text
    assert '"master_server_address":"gb200-r01-01:21002"' in text
    assert ("Host memory for KV tiers on gb200-r01-01: 576.0 GiB of the node's 840 GiB "
            "(decode-0 4 rank(s) x 144 GiB Mooncake segment + buffer)") in text
    assert "KV tiers need" not in text  # 576 of 840: no blocker


# --- one sentence each, before anything is written ------------------------------------------


def test_differing_hash_seeds_are_one_sentence(tmp_path):
    f = store_recipe(tmp_path, **{"prefill.env.PYTHONHASHSEED": "1",
                                  "decode.env.PYTHONHASHSEED": "2"})
    text = refusal(tmp_path, f)
    assert ("PYTHONHASHSEED differs between the engines that share the KV store (prefill.env 1, "
            "decode.env 2)") in text


def test_a_store_config_missing_a_field_vllm_needs_is_one_sentence(tmp_path):
    f = store_recipe(tmp_path, **{"kv_store.store_config.metadata_server": None,
                                  "kv_store.store_config.device_name": None})
    text = refusal(tmp_path, f)
    assert "kv_store.store_config has no metadata_server, device_name" in text
    assert "fills in only master_server_address" in text


def test_a_store_config_key_vllm_would_ignore_is_named_with_the_one_meant(tmp_path):
    f = store_recipe(tmp_path, **{"kv_store.store_config.global_segement_size": "2GB"})
    text = refusal(tmp_path, f)
    assert "global_segement_size is not read by vLLM's Mooncake store (did you mean " \
        "'global_segment_size'?)" in text


def test_an_unknown_child_connector_is_one_sentence_with_the_name_meant(tmp_path):
    f = store_recipe(tmp_path, **{"decode.kv_connector": multi(
        "kv_consumer", {"kv_connector": "MooncakeStorConnector"})})
    text = refusal(tmp_path, f)
    assert ("decode.kv_connector.kv_connector_extra_config.connectors[1]: connector "
            "MooncakeStorConnector is not one vLLM 0.33 knows (did you mean "
            "'MooncakeStoreConnector'?)") in text


def test_a_child_without_its_role_and_an_offload_tier_without_size_are_named(tmp_path):
    kid = {"kv_connector": "NixlConnector"}
    cfg = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"connectors": [
               kid, {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}]}}
    f = store_recipe(tmp_path, **{"prefill.kv_connector": cfg, "kv_store": None,
                                  "decode.kv_connector": None})
    text = refusal(tmp_path, f)
    assert "connectors[0] (NixlConnector) has no kv_role" in text
    assert "OffloadingConnector's CPU tier needs kv_connector_extra_config.cpu_bytes_to_use" in text


def test_a_store_connector_without_kv_store_is_one_sentence(tmp_path):
    text = refusal(tmp_path, store_recipe(tmp_path, kv_store=None))
    assert "prefill's connector names MooncakeStoreConnector but the recipe has no kv_store" in text



def test_a_store_no_role_uses_runs_its_master_as_srt_slurm_does_with_a_warning(tmp_path):
    """A published agg recipe (InferenceX agg-gb200-tp8-c4-mtp2-agentic) sets a store and no
    store connector: srt-slurm starts the master anyway, so does the launcher, and says so."""
    f = store_recipe(tmp_path, **{"prefill.kv_connector": None, "decode.kv_connector": None})
    code, out = helpers.launcher(tmp_path, "submit", str(f), "--dry-run")
    assert code == 0, out
    text = " ".join(out.split())
    assert ("warning: kv_store is set but no role's kv_connector names MooncakeStoreConnector: "
            "its master runs") in text
    assert "no engine uses it" in text


def test_a_pool_larger_than_host_memory_is_a_blocker_naming_the_node(tmp_path):
    prof = helpers.profile_copy(tmp_path / "prof.yaml", "local", host_memory_gib=4)
    f = store_recipe(tmp_path, cluster=prof)
    [p] = prepare.find_blockers(prepare.prepare_all(str(f), [], [], tmp_path / "runs"))
    [line] = [b for b in p.blockers if "host memory" in b]
    node = p.plan.nodes[-1]  # the prefill node: two DP2 endpoints, 4 ranks x 1.25 GiB
    assert line.startswith(f"the KV tiers need 5.0 GiB of host memory on {node}")
    assert "has 4 GiB (the profile's host_memory_gib)" in line


def test_a_cpu_offload_tier_counts_its_share_per_rank():
    from launcher.run.vocab import Role

    data = yaml.safe_load((rmod.RECIPES_DIR / "local-sim.yaml").read_text())
    data["accuracy"]["enabled"] = False
    data["prefill"]["tensor_parallel"] = 2
    data["prefill"]["data_parallel"] = 1
    data["prefill"]["kv_connector"] = multi("kv_both", {
        "kv_connector": "SimpleCPUOffloadConnector",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 8 * 1024**3}})
    r = rmod.Recipe.model_validate(data)
    assert kv_tiers.rank_bytes(r, Role.PREFILL) == [("CPU offload", 4 * 1024**3)]
    assert kv_tiers.rank_bytes(r, Role.DECODE) == []
    # vLLM divides it over the world size: pipeline stages are ranks too
    data["prefill"]["pipeline_parallel"] = 2
    staged = rmod.Recipe.model_validate(data)
    assert kv_tiers.rank_bytes(staged, Role.PREFILL) == [("CPU offload", 2 * 1024**3)]


# --- the master, for real -------------------------------------------------------------------


def master_installed() -> None:
    if not MASTER.exists():
        pytest.fail(f"mooncake_master is not installed at {MASTER}: run `{INSTALL}` (as root; "
                    "PD_MOONCAKE_MASTER may name another)")


@pytest.mark.alone
def test_the_master_killed_mid_run_ends_the_run_within_seconds_naming_it(tmp_path):
    """Simulated engines and the real mooncake_master: it is up (its /health) before the
    engines start, its /metrics are scraped, and when it dies the run fails naming it, the
    results so far kept and nothing left running."""
    master_installed()
    prof = helpers.profile_copy(tmp_path / "prof.yaml", "local", port_blocks=1,
                                port_base=helpers.free_port_base(range(27000, 32000, 100), 1000))
    f = store_recipe(tmp_path, cluster=prof, hold_s=120, **{"benchmark.concurrency": [4],
                                                            "accuracy.enabled": False})
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "submit", str(f), "--runs-dir",
                             str(runs)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)
    try:
        def held() -> Path | None:
            for run in runs.glob("*-local-sim-store"):
                ev = (run / "events.jsonl")
                if ev.exists() and '"stage": "hold"' in ev.read_text():
                    return run
            return None

        run = helpers.wait_for(held, 120, "the run to hold after its sweep")
        events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        started = {e["process"]: e for e in events if e.get("event") == "process_started"}
        ready = [e["process"] for e in events if e.get("event") == "ready"]
        assert ready[0] == "mooncake-master"  # healthy before any engine
        assert all(started["mooncake-master"]["ts"] < e["ts"] for n, e in started.items()
                   if n.startswith(("prefill", "decode")))
        os.kill(started["mooncake-master"]["pid"], signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        helpers.stop(proc)
    assert proc.returncode != 0, out
    record = json.loads((run / "run.json").read_text())
    assert record["state"] == "failed"
    assert "mooncake-master" in record["error"] and record.get("culprit") == "mooncake-master"
    assert took < 30, took  # the launcher's exit, its teardown included (4 s here)
    seen = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()
            if '"process_exited"' in x]
    assert seen[0]["process"] == "mooncake-master" and seen[0]["ts"] - killed_at < 5, seen
    assert list((run / "bench").rglob("*.json"))  # the sweep point before it is kept
    assert not helpers.leftovers(run)
    seen = read_samples(run)
    names = set(seen[seen["process"] == "mooncake-master"]["name"].astype(str))
    assert "master_allocated_bytes" in names  # its /metrics, scraped by the node's agent
    # ... and read by the KV tiers view under the names the running binary exports
    from launcher.analysis import derive, kv_tiers, load

    ss = derive.SeriesSet(load.read_telemetry(run, names=load.TIER_NAMES),
                          load.read_plan_safe(run)[0])
    a, b = ss.t_range
    health = kv_tiers.store_health(ss, a, b, load.read_plan_safe(run)[0])
    assert health["master_capacity_bytes"] >= 0 and health["master_watermark"] == 0.9
    assert health["master_puts_refused"] == 0 and health["master_evicted_keys"] == 0


def test_a_study_in_one_allocation_restarts_engines_that_share_a_store_with_its_master(
        tmp_path):
    """Engines kept loaded for the next configuration would outlive the master their store
    segments live in: with a kv_store each configuration starts its master and its engines."""
    master_installed()
    prof = helpers.profile_copy(tmp_path / "prof.yaml", "local", port_blocks=1,
                                port_base=helpers.free_port_base(range(27000, 32000, 100), 1000))
    f = store_recipe(tmp_path, cluster=prof, **{"benchmark.concurrency": [4],
                                                "accuracy.enabled": False})
    study = ("submit", str(f), "--sweep", "benchmark.warmup=2,3", "--allocation", "one")
    (tmp_path / "plan").mkdir()
    code, out = helpers.launcher(tmp_path / "plan", *study, "--dry-run")
    assert code == 0, out
    text = " ".join(out.split())  # the dry-run's "same engine?" rule agrees: loaded twice
    assert "one allocation: 3 nodes" in text and "for 2 load rounds" in text
    assert "6 engine start(s) <- this submission" in text
    code, out = helpers.launcher(tmp_path, *study)
    assert code == 0, out
    runs = sorted(p for p in (tmp_path / "runs").glob("*/*-local-sim-store*") if p.is_dir())
    assert len(runs) == 2, runs
    for run in runs:
        events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        started = [e["process"] for e in events if e.get("event") == "process_started"]
        engines = [i for i, p in enumerate(started) if p.startswith(("decode-", "prefill-"))]
        assert engines and started.index("mooncake-master") < engines[0], (run.name, started)
        assert not [e for e in events if e.get("event") == "process_kept_loaded"]
        assert not helpers.leftovers(run)


def test_a_master_port_taken_on_this_host_is_said_before_anything_starts(tmp_path):
    base = helpers.free_port_base(range(27000, 32000, 100), 1000)
    prof = helpers.profile_copy(tmp_path / "prof.yaml", "local", port_blocks=1, port_base=base)
    f = store_recipe(tmp_path, cluster=prof, **{"benchmark.concurrency": [4],
                                                "accuracy.enabled": False})
    with helpers.listening([base + 2]):
        code, out = helpers.launcher(tmp_path, "submit", str(f))
    assert code != 0, out
    assert f"{base + 2} (mooncake-master rpc" in " ".join(out.split())
    assert not list((tmp_path / "runs").glob("*/logs/mooncake-master.log"))


def test_an_aggregated_pool_with_a_store_gets_its_connector_and_the_store(tmp_path):
    """The published agentic recipes include aggregated engines over a Mooncake store (no
    P/D): the pool's own connector reaches its command line, with the store's env."""
    f = store_recipe(tmp_path, mode="agg", prefill=None, decode=None, **{
        "agg.endpoints": 1, "agg.data_parallel": 2,
        "agg.kv_connector": {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}})
    [p] = prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    [eng] = [x for x in p.rendered.processes if x.kind == "engine"]
    kv = json.loads(eng.argv[eng.argv.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
    assert eng.env["MOONCAKE_MASTER"].endswith(f":{p.plan.router_port + 2}")
    assert eng.env["PYTHONHASHSEED"] == "0"
    assert any(x.name == "mooncake-master" for x in p.rendered.processes)


def test_a_master_that_is_not_there_is_said_at_preflight_before_any_engine(tmp_path):
    base = helpers.free_port_base(range(27000, 32000, 100), 1000)
    prof = helpers.profile_copy(tmp_path / "prof.yaml", "local", port_blocks=1, port_base=base)
    f = store_recipe(tmp_path, cluster=prof, **{
        "kv_store.master_command": str(tmp_path / "no-such" / "mooncake_master"),
        "accuracy.enabled": False})
    code, out = helpers.launcher(tmp_path, "submit", str(f))
    assert code != 0, out
    [run] = (tmp_path / "runs").glob("*-local-sim-store")
    record = json.loads((run / "run.json").read_text())
    assert record["state"] == "failed"
    assert (f"the KV store's master {tmp_path}/no-such/mooncake_master does not run in the "
            "node (not found)") in " ".join(record["error"].split())
    started = [json.loads(x).get("process") for x in (run / "events.jsonl").read_text().splitlines()
               if '"process_started"' in x]
    assert not [p for p in started if p.startswith(("prefill", "decode", "mooncake"))]


def test_the_recipes_own_multiconnector_is_checked_once_for_both_sides(tmp_path):
    f = store_recipe(tmp_path, kv_store=None, **{
        "prefill.kv_connector": None, "decode.kv_connector": None,
        "kv_connector": {"kv_connector": "MultiConnector", "kv_connector_extra_config": {
            "connectors": [{"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                           {"kv_connector": "SimpleCPUOfloadConnector", "kv_role": "kv_both"}]}}})
    text = refusal(tmp_path, f)
    said = ("kv_connector.kv_connector_extra_config.connectors[1]: connector "
            "SimpleCPUOfloadConnector is not one vLLM 0.33 knows (did you mean "
            "'SimpleCPUOffloadConnector'?)")
    assert text.count(said) == 1, text


def test_a_store_block_key_of_the_wrong_kind_or_unknown_is_named(tmp_path):
    data = yaml.safe_load(fixed_length(PUBLISHED.read_text()))
    block = data["backend"]["mooncake_kv_store"]
    block["master_extra_args"] = "--nof_eviction_high_watermark_ratio=0.9"
    block["master_port"] = 9000
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64, ALIAS)
    text = " ".join(str(e.value).split())
    assert "mooncake_kv_store.master_extra_args is str: srt-slurm takes a list here" in text
    assert "mooncake_kv_store.master_port is not a key of srt-slurm's mooncake_kv_store" in text


def test_kv_offloading_size_on_a_pd_engine_is_one_sentence_and_counted_on_an_agg_one(tmp_path):
    """vLLM 0.33 turns --kv-offloading-size into the engine's connector: on a P/D engine it
    replaces NIXL (the handoff stops); on an aggregated one it is a CPU tier to budget."""
    f = store_recipe(tmp_path, kv_store=None, **{"prefill.kv_connector": None,
                                                 "decode.kv_connector": None,
                                                 "decode.args.kv-offloading-size": 8})
    text = refusal(tmp_path, f)
    assert ("decode.args.kv-offloading-size on a decode engine makes vLLM replace its "
            "NixlConnector with the CPU offload connector") in text
    f = store_recipe(tmp_path, kv_store=None, mode="agg", prefill=None, decode=None, **{
        "agg.endpoints": 1, "agg.tensor_parallel": 2, "agg.args.kv-offloading-size": 8})
    [p] = prepare.prepare_all(str(f), [], [], tmp_path / "runs2")
    lines = kv_tiers.summary(p.plan)
    assert any("8.0 GiB" in x and "2 rank(s) x 4 GiB CPU offload (--kv-offloading-size)" in x
               for x in lines), lines


@pytest.mark.slurm
def test_the_master_runs_as_a_slurm_step_before_the_engines_on_the_dev_cluster(tmp_path):
    """Through real Slurm: the master is an srun step on the first node, its store config is
    rewritten with the allocation's address and ports (the dry-run's were planned), it is
    ready before the engines start, the simulated engines put and look up their blocks in it
    (their store counters and the master's keys, as the run's telemetry scraped them), and
    nothing is left after the run."""
    import shutil

    master_installed()
    if shutil.which("sinfo") is None:
        pytest.fail("Slurm is not installed: run `bash slurm/devcluster/up.sh` (as root)")
    data = yaml.safe_load((rmod.RECIPES_DIR / "devcluster-sim.yaml").read_text())
    data.pop("container")  # the image has no Mooncake: the host's master, on the same host
    data["name"] = "devcluster-sim-store"
    data["accuracy"]["enabled"] = False
    data["benchmark"]["concurrency"] = [8]
    for role, kv_role in (("prefill", "kv_both"), ("decode", "kv_consumer")):
        data[role]["kv_connector"] = multi(kv_role, {"kv_connector": "MooncakeStoreConnector"})
    data["kv_store"] = {"master_command": str(MASTER), "store_config": dict(STORE)}
    f = tmp_path / "dev-store.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out = helpers.launcher(tmp_path, "submit", str(f), "--wait", timeout=600)
    assert code == 0, out
    [run] = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    record = json.loads((run / "run.json").read_text())
    assert record["state"] == "succeeded", record.get("error")
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    ready = [e["process"] for e in events if e.get("event") == "ready"]
    assert ready[0] == "mooncake-master", ready
    doc = json.loads((run / "plan.json").read_text())
    master = next(p for p in doc["processes"] if p["name"] == "mooncake-master")
    rpc = int(master["argv"][1].split("=")[1])
    written = json.loads((run / "mooncake_store_config.json").read_text())
    assert written["master_server_address"].endswith(f":{rpc}")
    assert written["master_server_address"].split(":")[0] == next(
        n["address"] for n in doc["nodes"] if n["name"] == master["node"])
    commands = (run / "commands.sh").read_text()
    assert any(x.startswith("srun ") and "--job-name=mooncake-master" in x
               for x in commands.splitlines())
    assert not helpers.leftovers(run)  # the engines' store clients included
    # the simulated engines spoke to that master through Mooncake's client: the prefill put
    # its blocks, both looked prompts up, and the master holds keys (telemetry scraped both)
    seen = read_samples(run)
    ops = seen[seen["name"] == "vllm:mooncake_store_operation_total"]

    def most(frame, role: str, op: str) -> float:
        rows = frame[frame["process"].astype(str).str.startswith(role)
                     & frame["labels"].astype(str).str.contains(f'"operation":"{op}"')]
        return rows["value"].max() if len(rows) else 0.0

    assert most(ops, "prefill", "save_put") > 0 and most(ops, "prefill", "lookup_exists") > 0
    assert most(ops, "decode", "save_put") == 0  # kv_consumer: it only reads
    keys = seen[(seen["process"] == "mooncake-master") & (seen["name"] == "master_key_count")]
    assert keys["value"].max() > 0


def test_a_connectors_extra_config_that_is_not_a_mapping_is_one_sentence(tmp_path):
    cfg = multi("kv_both", {"kv_connector": "MooncakeStoreConnector",
                            "kv_connector_extra_config": "load_async"})
    text = refusal(tmp_path, store_recipe(tmp_path, **{"prefill.kv_connector": cfg}))
    assert ("prefill.kv_connector.kv_connector_extra_config.connectors[1]."
            "kv_connector_extra_config must be a mapping of the connector's own settings (got "
            "load_async)") in text


@pytest.mark.parametrize("path", [
    "kv_store.store_config.global_segment_size", "kv_store.store_config.mode",
    "kv_store.store_config.tenant_id", "kv_store.master_args", "kv_store.lease_ttl_ms",
    "kv_store.env", "kv_store", "prefill.kv_connector",
    "prefill.kv_connector.kv_connector_extra_config",
    "prefill.kv_connector.kv_connector_extra_config.connectors", "decode.kv_connector.kv_role",
    "kv_connector.kv_connector_extra_config", "prefill.args.kv-offloading-size",
    "prefill.env.PYTHONHASHSEED",
])
def test_any_value_in_a_kv_tier_key_plans_or_is_one_sentence(path, tmp_path):
    """Never a traceback: every value a user can write there plans, or is refused in words."""
    for i, value in enumerate([None, True, -1, 10**30, "", "x", "..gb", [], [1], [{}], {},
                               {"a": 1}]):
        f = store_recipe(tmp_path, **{path: value})
        try:
            prepare.prepare_all(str(f), [], [], tmp_path / f"runs{i}")
        except UserError as e:
            assert str(e).strip() and "Traceback" not in str(e)
