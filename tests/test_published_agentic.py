"""Every bundled GB200 vLLM agentic recipe of InferenceX imports with the site's aliases and
plans on gb200-nvl72 (import + dry-run plan, no engines), its connectors, store, benchmark
and sessions as the file says; the ones the launcher cannot run are one sentence each."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from launcher.control import prepare
from launcher.errors import UserError
from launcher.planning import kv_tiers
from launcher.schema import srt_slurm

ROOT = srt_slurm.BUNDLED / "InferenceX" / "benchmarks" / "multi_node" / "srt-slurm-recipes"
FILES = sorted(p for p in ROOT.rglob("*.yaml")
               if "agent" in str(p.relative_to(ROOT)) and "/vllm/" in f"/{p.relative_to(ROOT)}")
# an engine of TP8 x PP2 over four trays (vLLM's --nnodes launch)
PIPELINED = {f"agg-gb200-tp8pp2-mooncake-c{c}-agentic.yaml" for c in (16, 32, 48, 72, 96)}

def site_aliases(data: dict) -> dict[str, str]:
    """What a site's srtslurm.yaml gives: the file's alias as the checkpoint it serves."""
    roles = data.get("roles") or (data.get("backend") or {}).get("vllm_config") or {}
    served = next((c["served-model-name"] for c in roles.values()
                   if isinstance(c, dict) and "served-model-name" in c), None)
    args = next((r.get("args") or {} for r in roles.values() if isinstance(r, dict)), {})
    served = served or args.get("served-model-name")
    repo = ((data.get("identity") or {}).get("model") or {}).get("repo") or served
    return {data["model"]["path"]: repo}


def pool_of(recipe, role: str):
    return next(pool for r, pool in recipe.pools() if str(r) == role)


def mode_configs(data: dict) -> dict[str, dict]:
    if data.get("schema") == 2:
        return {r: v.get("args") or {} for r, v in data["roles"].items()}
    return {("agg" if m == "aggregated" else m): c
            for m, c in data["backend"]["vllm_config"].items()}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, object]:
    """Each file imported and planned once, shared by the assertions below."""
    out: dict[str, object] = {}
    for f in FILES:
        data = yaml.safe_load(f.read_text())
        try:
            recipe, report = srt_slurm.import_file(f, site_aliases(data))
        except UserError as e:
            out[f.name] = e
            continue
        path = tmp_path_factory.mktemp("r") / "recipe.yaml"
        path.write_text(srt_slurm.render(recipe, report))
        image = data["model"]["container"]
        sets = [] if ":v0." in image else ["engine_version='0.34'"]  # nightly images
        [p] = prepare.find_blockers(prepare.prepare_all(
            str(path), [*sets, "cluster=gb200-nvl72"], [], tmp_path_factory.mktemp("runs")))
        out[f.name] = (data, recipe, report, p)
    return out


def test_every_published_gb200_vllm_agentic_recipe_is_bundled():
    # InferenceX main @843c6254 holds 27; two more are kept from earlier commits
    assert len(FILES) == 30, [f.name for f in FILES]


@pytest.mark.parametrize("f", FILES, ids=lambda f: f.name)
def test_a_published_agentic_recipe_imports_and_plans(results, f):
    got = results[f.name]
    assert not isinstance(got, UserError), got
    data, recipe, report, p = got
    assert not report.refused
    if f.name in PIPELINED:
        assert_one_engine_of_two_stages_over_four_trays(p)
    env = {k: str(v) for k, v in data["benchmark"]["env"].items()}
    ag = p.plan.recipe.benchmark.agentic
    assert ag.trace == env.get("WEKA_LOADER_OVERRIDE", "semianalysis_cc_traces_weka_062126")
    assert ag.scenario == "inferencex-agentx-mvp"
    assert list(p.plan.recipe.benchmark.points) == [256]  # the file holds no CONC_LIST
    if "AIPERF_EXTRA_INPUTS" in env:
        assert ag.extra_inputs == env["AIPERF_EXTRA_INPUTS"].split()
    if "AIPERF_BENCHMARK_GRACE_PERIOD" in env:
        assert ag.grace_period_s == float(env["AIPERF_BENCHMARK_GRACE_PERIOD"])
    if "AIPERF_LIVE_FAILED_REQUEST_THRESHOLD" in env:
        assert ag.failed_request_threshold == float(env["AIPERF_LIVE_FAILED_REQUEST_THRESHOLD"])
    # each role's connector chain is the file's kv-transfer-config, as written
    for role, cfg in mode_configs(data).items():
        kv = cfg.get("kv-transfer-config")
        if kv is None:
            continue
        written = json.loads(kv)
        got_kv = pool_of(p.plan.recipe, role).kv_connector or p.plan.recipe.kv_connector
        assert kv_tiers.names(got_kv) == kv_tiers.names(written), (role, got_kv)
        if set(written) - {"kv_connector", "kv_role"}:  # not plain NIXL: the role's own
            assert {k: v for k, v in got_kv.items() if k in written} == written
    store = (data.get("backend") or {}).get("mooncake_kv_store") or next(
        (s["options"] for s in data.get("services") or [] if s["type"] == "mooncake-master"),
        None)
    assert (p.plan.recipe.kv_store is not None) == (store is not None)
    if store is not None:
        assert p.plan.recipe.kv_store.store_config == store["store_config"]
    # what is left is the site's: the model, the corpus and AIPerf staged, a setup script
    for b in p.blockers:
        assert ("stage-model" in b or "stage-dataset" in b or "setup_script" in b
                or "env prepare --cluster gb200-nvl72 --aiperf" in b), b


def assert_one_engine_of_two_stages_over_four_trays(p):
    """TP8 x PP2: one engine over four trays, node rank 0 serving, the others --headless,
    each started with the stage count and the rendezvous; 16 GPUs counted."""
    [ep] = p.plan.endpoints
    assert (ep.pool.tensor_parallel, ep.pool.pipeline_parallel, ep.pool.gpus) == (8, 2, 16)
    assert len({part.node for part in ep.parts}) == 4 and p.plan.gpu_count()["total"] == 16
    engines = [x for x in p.rendered.processes if x.endpoint == ep.name]
    assert [x.headless for x in engines] == [False, True, True, True]
    head = p.plan.address(ep.head.node)
    for rank, x in enumerate(engines):
        a = " ".join(x.argv)
        assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in a
        assert (f"--nnodes 4 --node-rank {rank} --master-addr {head} "
                f"--master-port {ep.dp_rpc_port}") in a
        assert "--data-parallel-size" not in a and x.argv.count("--pipeline-parallel-size") == 1
    # what the dry-run prints of it: each node's rank and the engine's shape
    from launcher import text

    rows = [r for r in text.process_rows(p) if r[2].startswith(ep.name)]
    assert [r[3].removeprefix(f"http {ep.http_port}, ") for r in rows] == [
        f"master {ep.dp_rpc_port}, node rank {i} of 4, tp 8 x pp 2" + (" headless" if i else "")
        for i in range(4)]
    assert any("tensor parallel 8 x pipeline parallel 2 over 4 nodes (--nnodes 4)" in line
               for line in text.launch_lines(p.plan))


def test_the_mapped_classes_say_what_became_of_them(results):
    """One file per class: a router mode, KV events, a flag abbreviation, per-role NIXL."""
    _, _, report, _ = results["disagg-1p1d-dep8-dep4-agentic.yaml"]
    dev = dict(report.deviations)
    assert "Dynamo's KV router" in dev["backend.kv_events_config"]
    assert "consistent_hash" in dev["benchmark.env.AIPERF_DYNAMO_SESSION_TIMEOUT_SECONDS"]
    _, recipe, report, p = results["agg-gb200-dcp16-nospec-mooncake-agentic.yaml"]
    assert "kv-cache-memory-bytes" in pool_of(p.plan.recipe, "agg").args
    assert "allow_abbrev" in dict(report.mapped)["backend.vllm_config.aggregated.kv-cache-memory"]
    assert "forbid_trace_idle_gap_cap" in dict(report.deviations)[
        "benchmark.env.AIPERF_TRACE_IDLE_GAP_CAP_SECONDS"]
    _, recipe, report, p = results["disagg-gb200-4p1d-tep4-tp8-agentic.yaml"]
    assert pool_of(p.plan.recipe, "decode").kv_connector["engine_id"]
    assert "engine_id" not in (pool_of(p.plan.recipe, "prefill").kv_connector or {})


def test_aiperf_gets_the_extra_inputs_and_the_cache_warm_up():
    from launcher.clients import agentic

    a = argparse.Namespace(
        aiperf="aiperf", model="m", url="http://r", sessions=4, seed=42, failed_threshold=0.1,
        session_header="X-Session-ID", artifact_dir="d", extra_input=["thinking:true"],
        tokenizer=None, public_dataset="x", duration=1800.0, conversations=None, warmup=0,
        think_cap=None, max_context=None, scenario="inferencex-agentx-mvp", cache_warmup=600.0,
        grace_period=120.0, metrics=[])
    argv = agentic.aiperf_argv(a)
    i = argv.index("--extra-inputs")
    assert argv[i + 1:i + 3] == ["ignore_eos:true", "thinking:true"]
    assert argv[argv.index("--agentic-cache-warmup-duration") + 1] == "600"
    assert argv[argv.index("--benchmark-grace-period") + 1] == "120"


@pytest.mark.parametrize("bad, words", [
    ({"extra_inputs": ["thinking"]}, "thinking is not key:value"),
    ({"cache_warmup_s": 600, "scenario": None}, "cache_warmup_s needs AIPerf's agentic replay"),
])
def test_a_wrong_extra_input_or_cache_warm_up_is_one_sentence(bad, words):
    from pydantic import ValidationError

    from launcher.schema.sections import AgenticBenchmark

    given = {"trace": "semianalysis_cc_traces_weka_062126", "scenario": "inferencex-agentx-mvp",
             **bad}
    with pytest.raises(ValidationError) as e:
        AgenticBenchmark(**given)
    assert words in str(e.value)


def test_the_schema_2_forms_of_the_same_classes_import():
    """InferenceX's schema-2 agentic files (e.g. minimaxm3/vllm/gb200-fp4/agentx @cc775f53)
    write KV events per role, the per-GPU DP layout, power switches and Dynamo's router
    options on a worker."""
    f = ROOT / "dsv4" / "vllm" / "gb200-fp4" / "agentx" / "disagg-1p1d-dep8-dep8-mtp.yaml"
    data = yaml.safe_load(f.read_text())
    data["engine"]["dp_launch_mode"] = "per_gpu"
    data["roles"]["prefill"]["kv_events"] = True
    data["benchmark"]["env"].update(  # the last two as @475b3e6c's files set them
        ENABLE_AGENTX_POWER="1", REQUIRE_POWER="1", AIPERF_BENCHMARK_GRACE_PERIOD="120",
        AIPERF_AGENTIC_CACHE_WARMUP_DURATION="600")
    data["roles"]["prefill"]["args"]["router-mode"] = "least-loaded"  # Dynamo's, on a worker
    recipe, report = srt_slurm.convert(data, "x.yaml", "0" * 64, site_aliases(data))
    dev = dict(report.deviations)
    assert "not a `vllm serve` flag" in dev["roles.prefill.args.router-mode"]
    assert "router-mode" not in {**recipe.get("vllm_args", {}), **recipe["prefill"]["args"]}
    assert "Dynamo's KV router" in dev["roles.prefill.kv_events"]
    assert "one vllm serve per node" in dev["engine.dp_launch_mode"]
    assert "NVML" in dev["benchmark.env.ENABLE_AGENTX_POWER"]
    ag = recipe["benchmark"]["agentic"]
    assert (ag["grace_period_s"], ag["cache_warmup_s"]) == (120.0, 600.0)
    assert not report.refused
    data["frontend"]["type"] = "vllm-router"  # KV events without Dynamo: nothing reads them
    with pytest.raises(UserError, match="roles.prefill.kv_events"):
        srt_slurm.convert(data, "x.yaml", "0" * 64, site_aliases(data))


def test_gpus_that_are_not_the_stages_times_the_tensor_parallel_size_are_one_sentence():
    f = ROOT / "vllm" / "kimi-k3" / "agentic" / "agg-gb200-tp8pp2-mooncake-c16-agentic.yaml"
    data = yaml.safe_load(f.read_text())
    data["resources"]["gpus_per_agg"] = 8  # TP8 without its second stage
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64, site_aliases(data))
    assert ("resources.gpus_per_agg: 8 is not data-parallel-size x tensor-parallel-size x "
            "pipeline-parallel-size (16) of vllm_config.aggregated") in " ".join(str(e.value).split())
