"""qwen3.5-397b-gb200-disagg is the published recipe, setting for setting: every row of
launcher/data/published_qwen35_gb200.yaml (each with its public source) against the dry-run
of each of the five published configurations, reached as one study
(--sweep prefill.endpoints=4,5,6,7,8), and their node/GPU layouts."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from launcher.control import prepare
from launcher.errors import UserError
from launcher.planning import render
from launcher.schema import recipe, sections

REPO = Path(__file__).resolve().parents[1]
TABLE = yaml.safe_load((REPO / "launcher/data/published_qwen35_gb200.yaml").read_text())
SEED = TABLE["recipe"]
LAYOUT = {row["prefill_endpoints"]: row for row in TABLE["layout"]}
GPUS_PER_NODE = 4


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """{prefill endpoints: (plan.json, commands.sh, job.sbatch)} of the one study the
    CLI's --sweep writes (the same entry point as `submit --dry-run --sweep`)."""
    runs = prepare.prepare_all(  # as jobs of their own: each has its own allocation
        SEED, [], ["prefill.endpoints=4,5,6,7,8"], tmp_path_factory.mktemp("runs"),
        allocation="each",
    )
    assert len({p.study for p in runs}) == 1 and runs[0].study
    out = {}
    for p in runs:
        doc = json.loads((p.run.path / "plan.json").read_text())
        n = sum(1 for e in doc["endpoints"] if e["role"] == "prefill")
        out[n] = (doc, (p.run.path / "commands.sh").read_text(),
                  (p.run.path / "job.sbatch").read_text())
    assert sorted(out) == [4, 5, 6, 7, 8]
    return out


def engines(doc, role=None):
    return [p for p in doc["processes"]
            if p["kind"] == "engine" and (role is None or p["role"] == role)]


def serve_flags(argv):
    """The `vllm serve` argv after the model: flag -> list of values (True for a bare flag)."""
    i = argv.index("serve")
    words = argv[i + 2:]
    out: dict[str, list] = {}
    for k, w in enumerate(words):
        if not w.startswith("--"):
            continue
        nxt = words[k + 1] if k + 1 < len(words) else None
        out.setdefault(w, []).append(True if nxt is None or nxt.startswith("--") else nxt)
    return out


def value_of(flags, flag):
    assert flag in flags, f"{flag} missing"
    assert len(flags[flag]) == 1, f"{flag} given {len(flags[flag])} times"
    return flags[flag][0]


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_engine_settings_of_each_configuration(study, n):
    doc, cmds, _ = study[n]
    for role in ("prefill", "decode"):
        procs = engines(doc, role)
        assert procs, role
        for proc in procs:
            flags = serve_flags(proc["argv"])
            for row in TABLE["engine"]:
                want = row["value"]
                if role not in row["sides"]:
                    # A one-side row: the other side must not carry that value.
                    if row["flag"] in flags:
                        assert flags[row["flag"]] != [want], (proc["name"], row)
                    continue
                got = value_of(flags, row["flag"])
                if isinstance(want, dict):
                    got = json.loads(got)
                assert got == want, (proc["name"], row["flag"], row["source"])
            for row in TABLE["absent"]:
                assert row["flag"] not in flags, (proc["name"], row)
            for row in TABLE["env"]:
                if role in row["sides"]:
                    assert proc["env"].get(row["name"]) == row["value"], (proc["name"], row)
            # What plan.json holds is what commands.sh runs.
            assert shlex.join(proc["argv"]) in cmds, proc["name"]


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_settings_that_follow_the_concurrency(study, n):
    """The -cc4096/-cc5120 recipes as the last two points of one sweep: from each point on,
    the engines of the row's sides run its flag (and only they); below it, none does."""
    from launcher.run.plandoc import Process

    doc, cmds, _ = study[n]
    concs = TABLE["benchmark"]["concurrencies"]
    for role in ("prefill", "decode"):
        for raw in engines(doc, role):
            proc = Process.from_json(raw)
            for c in concs:
                flags = serve_flags(proc.argv_at(c))
                for row in TABLE["from_concurrency"]:
                    if role in row["sides"] and c >= row["concurrency"]:
                        later = [r for r in TABLE["from_concurrency"]
                                 if r["flag"] == row["flag"] and r["concurrency"] <= c]
                        want = later[-1]["value"]
                        assert value_of(flags, row["flag"]) == want, (proc.name, c, row["source"])
                    elif role not in row["sides"] or not any(
                            r["concurrency"] <= c for r in TABLE["from_concurrency"]
                            if r["flag"] == row["flag"] and role in r["sides"]):
                        assert row["flag"] not in flags, (proc.name, c)
            if role == "prefill":
                assert proc.restarts == [], proc.name  # prefills stay loaded the whole sweep
            else:
                assert [r["from_concurrency"] for r in proc.restarts] == [4096, 5120]
                # the restart runs the line commands.sh shows, appending to the same log
                for r in proc.restarts:
                    assert shlex.join(r["argv"]) in cmds, (proc.name, r["from_concurrency"])
    assert cmds.count(">= 5120 and started again") == len(engines(doc, "decode"))


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_prefill_only_and_decode_only_settings(study, n):
    doc, _, _ = study[n]
    for proc in engines(doc, "decode"):
        flags = serve_flags(proc["argv"])
        assert "--max-num-batched-tokens" not in flags
        assert value_of(flags, "--data-parallel-size") == "8"
    for proc in engines(doc, "prefill"):
        assert value_of(serve_flags(proc["argv"]), "--max-num-batched-tokens") == "16384"


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_benchmark_as_published(study, n):
    doc, cmds, _ = study[n]
    b = TABLE["benchmark"]
    bench = [p for p in doc["processes"] if p["kind"] == "bench"]
    seen = []
    for proc in bench:
        argv = proc["argv"]
        assert argv[:3] == ["python3", "-m", "launcher.clients.bench"]  # sa-bench's workload
        flags = serve_flags(["serve", "x", *argv[3:]])
        c = int(value_of(flags, "--max-concurrency"))
        seen.append(c)
        for row in b["flags"]:
            want = str(row["per_concurrency"] * c) if "per_concurrency" in row else row["value"]
            assert value_of(flags, row["flag"]) == want, (c, row["flag"], row["source"])
        assert flags.get("--request-rate", [b["request_rate"]]) == [b["request_rate"]]
        assert value_of(flags, "--model") == "Qwen3.5-397B-A17B-NVFP4"
        assert shlex.join(argv) in cmds
    assert seen == b["concurrencies"]


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_accuracy_gate_as_published(study, n):
    doc, _, _ = study[n]
    (acc,) = [p for p in doc["processes"] if p["kind"] == "accuracy"]
    flags = serve_flags(["serve", "x", *acc["argv"]])
    for row in TABLE["accuracy"]["flags"]:
        assert value_of(flags, row["flag"]) == row["value"], (row["flag"], row["source"])
    assert "--metric" not in flags and "--chat" not in flags  # lm-eval's, not this harness's


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_node_and_gpu_layout(study, n):
    doc, _, sbatch = study[n]
    row = LAYOUT[n]
    decode = engines(doc, "decode")
    prefill = engines(doc, "prefill")
    decode_nodes = {p["node"] for p in decode}
    prefill_nodes = {p["node"] for p in prefill}
    assert len(decode_nodes) == row["decode_nodes"] and not decode_nodes & prefill_nodes
    assert len(prefill_nodes) == row["prefill_nodes"], row["source"]
    assert sum(len(p["gpus"]) for p in decode) == row["decode_gpus"]
    assert sum(len(p["gpus"]) for p in prefill) == row["prefill_gpus_used"]
    assert len(prefill) == row["prefill_endpoints"] and all(len(p["gpus"]) == 2 for p in prefill)
    idle = len(prefill_nodes) * GPUS_PER_NODE - row["prefill_gpus_used"]
    assert idle == row["prefill_gpus_idle"], row["source"]
    assert doc["gpu_count"] == {"prefill": row["prefill_gpus_used"], "decode": 8, "agg": 0,
                                "total": row["gpus_used"]}
    nodes = row["prefill_nodes"] + row["decode_nodes"]
    assert len(doc["nodes"]) == nodes and f"#SBATCH --nodes={nodes}\n" in sbatch
    # One DEP8 decode endpoint, an API server on each tray (decode.fronts: per_node)
    assert [(p["dp_ranks"], p["headless"]) for p in decode] == [
        ([0, 1, 2, 3], False), ([4, 5, 6, 7], False)]
    (dec,) = [e for e in doc["endpoints"] if e["role"] == "decode"]
    assert dec["fronts"] == [p["url"] for p in decode]


def test_table_holds_every_published_engine_key():
    """Every key of the published base recipe's vllm_config is a row (or the layout)."""
    published = {
        "kv-transfer-config", "served-model-name", "tensor-parallel-size",
        "pipeline-parallel-size", "data-parallel-size", "enable-expert-parallel",
        "no-disable-hybrid-kv-cache-manager", "generation-config", "no-enable-prefix-caching",
        "async-scheduling", "stream-interval", "mamba-ssm-cache-dtype", "language-model-only",
        "max-num-batched-tokens",
    }  # fmt: skip
    assert {r["flag"].removeprefix("--") for r in TABLE["engine"]} == published
    assert all(r["source"] for r in [*TABLE["engine"], *TABLE["absent"], *TABLE["env"],
                                     *TABLE["from_concurrency"],
                                     *TABLE["benchmark"]["flags"], *TABLE["layout"]])


def test_kv_role_scheme():
    """kv_role: kv_both gives both sides kv_both; the default stays producer/consumer."""
    from launcher.planning import plan as plan_mod
    from launcher.schema import cluster

    prof = cluster.load("gb200-nvl72")
    nodes = cluster.expand_nodelist("gb200-[001-018]")
    both = plan_mod.make_plan(recipe.load(SEED), prof, nodes)
    assert {json.loads(render.kv_transfer_config(both, r))["kv_role"]
            for r in ("prefill", "decode")} == {"kv_both"}
    default = plan_mod.make_plan(
        recipe.load(SEED, ["kv_connector={kv_connector: NixlConnector}"]), prof, nodes)
    assert [json.loads(render.kv_transfer_config(default, r))["kv_role"]
            for r in ("prefill", "decode")] == ["kv_producer", "kv_consumer"]
    with pytest.raises(UserError, match="leave it out"):
        recipe.load(SEED, ["kv_connector.kv_role=kv_producer"])


def test_warmup_multiplier():
    b = recipe.load(SEED).benchmark
    assert (b.warmups(512), b.prompts(512)) == (512, 4096)
    fixed = recipe.load(SEED, ["benchmark.warmup_multiplier=null", "benchmark.warmup=64"])
    assert fixed.benchmark.warmups(512) == 64
    with pytest.raises(UserError, match="not both"):
        recipe.load(SEED, ["benchmark.warmup=64"])
    assert sections.Benchmark().warmups(64) == 0  # the default is unchanged
