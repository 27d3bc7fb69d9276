"""srt-slurm 2.x recipes (`schema: 2`), override files, YAML anchors, list-valued flags, the
site file and mangled files, imported (launcher/schema/srt_slurm.py, srt_slurm_v2.py).

The v1 sources are the bundled published copies; their schema-2 forms in
tests/data/srt-slurm-migrated/ were written by hand from srt-slurm's docs/legacy-v1.md (what
`srtctl migrate` writes), so the two layouts are checked against each other."""

import random
import time
from pathlib import Path

import pytest
import yaml

from launcher.control import prepare
from launcher.errors import UserError
from launcher.schema import recipe as rmod
from launcher.schema import srt_slurm, srt_slurm_v2
from launcher.schema.yaml_io import read_yaml

HERE = Path(__file__).parent
V1 = srt_slurm.BUNDLED / "recipes" / "multi-node"
MIGRATED = {
    "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml":
        V1 / "Kimi-K2.5/GB200/vllm/1k1k-sa/disagg-gb200-1p1d-dep4-dep8.yaml",
    "deepseek-v4-pro-8k1k-low-latency.yaml":
        V1 / "DeepSeek-V4-Pro/GB200/vllm/8k1k-sa/disagg-gb200-low-latency.yaml",
}
MIGRATED_DIR = HERE / "data" / "srt-slurm-migrated"
AGENTIC = (srt_slurm.BUNDLED / "InferenceX/benchmarks/multi_node/srt-slurm-recipes/dsv4/vllm/"
           "gb200-fp4/agentx/disagg-1p1d-dep8-dep8-mtp.yaml")


def one_line(e: UserError) -> str:
    text = str(e)
    assert "\n" not in text and e.problems is None, text
    return text


@pytest.mark.parametrize("name", sorted(MIGRATED))
def test_a_v1_file_and_its_migrated_form_import_to_the_same_recipe(name):
    ours, report = srt_slurm.import_file(MIGRATED_DIR / name)
    theirs, v1_report = srt_slurm.import_file(MIGRATED[name])
    assert report.layout == 2 and v1_report.layout == 1
    # the description names the source, its digest and the deviation keys as each file
    # writes them; everything else is the same recipe
    assert {k: v for k, v in ours.items() if k != "description"} == \
        {k: v for k, v in theirs.items() if k != "description"}
    assert "schema 2" in ours["description"]
    # schema-2 keys are reported by the names the file writes
    keys = {k for k, _ in report.mapped + report.deviations}
    assert "roles.prefill.args.max-model-len" in keys and "roles.decode.workers" in keys
    assert not any(k.startswith(("backend", "resources.prefill")) for k in keys), keys


def test_schema_2_keys_without_a_v1_field_each_get_a_row():
    data = yaml.safe_load((MIGRATED_DIR / "deepseek-v4-pro-8k1k-low-latency.yaml").read_text())
    _, report = srt_slurm.convert(data, "x.yaml", "0" * 64)
    rows = dict(report.deviations)
    assert "etcd" in rows["services[0] (etcd)"] and "services[1] (nats)" in rows
    data["roles"]["decode"]["nodes"] = "colocate"
    data["host_setup"] = {"commands": ["nvidia-smi -lgc 1980"]}
    data["services"].append({"name": "x", "type": "generic", "command": ["sleep", "1"]})
    data["roles"]["prefill"]["sidecar"] = True
    data["backend"] = {"type": "vllm"}
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    head, each = e.value.problems
    named = " ".join(each)
    for key in ("roles.decode.nodes", "host_setup", "services[2] (x)",
                "roles.prefill.sidecar", "backend"):
        assert key in named, key
    assert len(each) == 5, each
    assert "5 problems" in head


def test_several_refusals_print_a_line_each_never_a_literal_backslash_n(cli, tmp_path):
    f = tmp_path / "r.yaml"
    data = yaml.safe_load(MIGRATED[sorted(MIGRATED)[0]].read_text())
    data["profiling"] = {"type": "nsys"}
    data["benchmark"]["type"] = "mmlu"
    f.write_text(yaml.safe_dump(data))
    code, _, err = cli("recipes", "import", str(f))
    assert code == 2
    assert "\\n" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: cannot import") and len(lines) == 3, err
    assert sorted(x.split(":")[0] for x in lines[1:]) == ["  - benchmark.type", "  - profiling"]


def test_empty_sections_as_published_files_keep_them_set_nothing():
    data = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    plain, _ = srt_slurm.convert(data, "x.yaml", "0" * 64)
    data.update(environment={}, sbatch_directives={}, identity={**data["identity"],
                                                                "model": {}})
    data["frontend"]["args"] = {}
    out, report = srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert out == plain
    for key in ("environment", "sbatch_directives", "identity.model", "frontend.args"):
        assert (key, "empty: sets nothing") in report.mapped, key
    data["benchmarks"] = {}  # a misspelt section is still named
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert "did you mean 'benchmark'" in one_line(e.value)


def test_a_schema_key_in_a_v1_file_and_an_unknown_schema_are_one_sentence():
    data = yaml.safe_load(MIGRATED[sorted(MIGRATED)[0]].read_text())
    data["roles"] = {}
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert "roles is a schema-2 key" in one_line(e.value)
    data.pop("roles")
    data["schema"] = 3
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert "schema 3" in one_line(e.value)


# --- override files -----------------------------------------------------------------------


def variants_file(tmp_path: Path) -> Path:
    """The migrated Kimi file as an override file of two variants, in srt-slurm's form."""
    base = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    base.pop("schema")
    doc = {
        "schema": 2,
        "base": base,
        "override_c4096": {"benchmark": {"concurrencies": [4096]}},
        "override_short": {"name": "kimi-short",
                           "roles": {"decode": {"args": {"max-model-len": 2048,
                                                         "stream-interval": None}}}},
    }
    f = tmp_path / "variants.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def test_one_variant_is_deep_merged_over_base_as_srt_slurm_does(tmp_path):
    f = variants_file(tmp_path)
    short, report = srt_slurm.import_file(f"{f}:override_short")
    assert report.source.endswith("variants.yaml:override_short")
    assert short["name"] == "kimi-short"
    assert short["decode"]["args"]["max-model-len"] == 2048
    assert "stream-interval" not in short["decode"]["args"]  # null deletes the key
    assert short["prefill"]["args"]["max-model-len"] == 3072  # kept from base
    c4096, _ = srt_slurm.import_file(f"{f}:override_c4096")
    assert c4096["name"] == "vllm-disagg-gb200-1p1d-dep4-dep8_c4096"  # base name + suffix
    assert c4096["benchmark"]["concurrency"] == [4096]  # a list replaces
    with pytest.raises(UserError) as e:
        srt_slurm.import_file(f"{f}:override_nope")
    assert "override_c4096" in one_line(e.value)
    with pytest.raises(UserError) as e:
        srt_slurm.import_file(f)
    assert "override_NAME" in one_line(e.value)


def test_a_v1_override_file_is_read_the_same_way(tmp_path):
    base = yaml.safe_load(MIGRATED["kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml"].read_text())
    f = tmp_path / "v1-variants.yaml"
    f.write_text(yaml.safe_dump({"base": base,
                                 "override_c64": {"benchmark": {"concurrencies": "64"}},
                                 "zip_override_tp": {"benchmark": {"isl": [1024, 2048]}}}))
    out, report = srt_slurm.import_file(f"{f}:override_c64")
    assert report.layout == 1 and out["benchmark"]["concurrency"] == [64]
    with pytest.raises(UserError) as e:
        srt_slurm.import_file(f"{f}:zip_override_tp")
    assert "srtctl resolve-override" in one_line(e.value)


def test_recipes_import_and_submit_take_a_variant_and_submit_the_file_as_one_study(cli,
                                                                                  tmp_path):
    f = variants_file(tmp_path)
    code, out, err = cli("recipes", "import", f"{f}:override_short")
    assert code == 0, err
    assert yaml.safe_load(out)["decode"]["args"]["max-model-len"] == 2048
    before = f.read_text()
    code, _, err = cli("recipes", "import", f"{f}:override_short", "-o", str(f))
    assert code == 2 and "is the source file" in err and f.read_text() == before
    runs = prepare.prepare_all(f"{f}:override_c4096", [], [], tmp_path / "one")
    assert len(runs) == 1 and runs[0].plan.recipe.benchmark.concurrency == [4096]
    runs = prepare.prepare_all(str(f), [], [], tmp_path / "study")
    assert sorted(r.plan.recipe.name for r in runs) == [
        "kimi-short", "vllm-disagg-gb200-1p1d-dep4-dep8_c4096"]
    [study] = {r.run.path.parent for r in runs}  # one study folder holds both
    assert study.name.endswith("-study") and (study / "study.json").is_file()


# --- anchors, aliases, merge keys -----------------------------------------------------------


def test_anchors_and_merge_keys_read_as_pyyaml_safe_load_reads_them():
    assert read_yaml(AGENTIC, "a recipe") == yaml.safe_load(AGENTIC.read_text())
    data = read_yaml(AGENTIC, "a recipe")
    decode, prefill = data["roles"]["decode"], data["roles"]["prefill"]
    assert decode["env"] == prefill["env"] and decode["env"] is not prefill["env"]
    assert decode["args"]["served-model-name"] == prefill["args"]["served-model-name"]
    assert decode["args"]["max-num-seqs"] == 1024 and prefill["args"]["max-num-seqs"] == 16


@pytest.mark.alone
def test_a_billion_laughs_file_is_one_sentence_within_a_second(tmp_path):
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    with pytest.raises(UserError) as e:
        rmod.load(str(f))
    took = time.monotonic() - start
    assert "expand to more than 20,000 values" in one_line(e.value)
    assert took < 1.0, took
    f.write_text("a: &a [1, *a]\n")
    with pytest.raises(UserError) as e:
        read_yaml(f, "a recipe")
    assert "refers to a value that contains it" in one_line(e.value)


def test_the_published_agentic_schema_2_file_imports_as_an_agentic_benchmark():
    """It was refused naming the agentic benchmark; now its custom command is
    benchmark.agentic: the corpus from WEKA_LOADER_OVERRIDE, the script's own settings
    written out, every env key mapped or said why not, nothing refused."""
    recipe, report = srt_slurm.import_file(AGENTIC, aliases={
        "deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro"})
    b = recipe["benchmark"]
    assert "custom" not in b
    assert b["agentic"] == {"scenario": "inferencex-agentx-mvp", "duration_s": 1800.0,
                            "seed": 42, "failed_request_threshold": 0.1,
                            "trace": "semianalysis_cc_traces_weka_062126"}
    assert b["concurrency"] == [256]
    assert not report.refused
    said = {k for k, _ in report.mapped + report.deviations}
    for k in yaml.safe_load(AGENTIC.read_text())["benchmark"]["env"]:
        assert f"benchmark.env.{k}" in said, k
    routing = dict(report.deviations)["frontend.args.router-mode"]
    assert "consistent_hash" in routing


def test_the_published_schema_2_file_with_a_fixed_length_benchmark_reaches_the_command_lines(
        tmp_path):
    """Its anchors and << merge through to each role's engine: the decode inherits the
    prefill's flags and environment and overrides five of them."""
    text = AGENTIC.read_text()
    text = text[:text.index("benchmark:\n  type: custom")] + (
        "benchmark:\n  type: sa-bench\n  isl: 8192\n  osl: 1024\n  concurrencies: [64]\n")
    f = tmp_path / "dsv4.yaml"
    f.write_text(text)
    site = tmp_path / "srtslurm.yaml"
    site.write_text("model_paths: {deepseek-v4-pro: deepseek-ai/DeepSeek-V4-Pro}\n")
    # a nightly image: its own parser judges its flags at preflight (0.33's refuses one key
    # of its attention-config), so the dry-run is told the version is another
    [run] = prepare.prepare_all(str(f), ["engine_version='0.34'"], [], tmp_path / "runs",
                                site=site)
    commands = (run.run.path / "commands.sh").read_text()
    src = yaml.safe_load(text)["roles"]
    for role in ("prefill", "decode"):
        line = next(x for x in commands.splitlines() if f"{role}-0" in x and " serve " in x)
        for name, value in src[role]["env"].items():
            assert f"{name}={value}" in line, (role, name)
        for flag in ("moe-backend", "enable-ep-weight-filter", "kv-events-config",
                     "tokenizer-mode", "block-size"):
            assert f"--{flag}" in line, (role, flag)
    decode = next(x for x in commands.splitlines() if "decode-0" in x and " serve " in x)
    assert "--max-num-seqs 1024" in decode and "--no-enforce-eager" not in decode


@pytest.mark.parametrize("change, feature", [
    ({"benchmark": {"type": "agentperf"}}, "agentic benchmark (benchmark.type agentperf)"),
    ({"services": [{"name": "s", "type": "lmcache-server"}]}, "LMCache"),
])
def test_agentic_and_kv_store_files_are_refused_in_one_sentence(change, feature):
    data = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    data = srt_slurm_v2.deep_merge(data, change)
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert feature in one_line(e.value)


# --- benchmark.type custom ------------------------------------------------------------------


def test_a_custom_benchmark_is_ours_and_names_the_native_benchmark():
    data = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    data["benchmark"] = {"type": "custom",
                         "command": "bash /infmax-workspace/benchmarks/multi_node/srt_bench.sh",
                         "env": {"PREFILL_GPUS": "4", "DSV4": True, "ISL": 1024, "OSL": 1024,
                                 "CONCURRENCIES": "4x8"}}
    data["container_mounts"] = {"/home/me/InferenceX": "/infmax-workspace"}
    out, report = srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert out["benchmark"]["custom"] == {
        "command": "bash /infmax-workspace/benchmarks/multi_node/srt_bench.sh",
        "env": {"PREFILL_GPUS": "4", "DSV4": "true", "ISL": "1024", "OSL": "1024",
                "CONCURRENCIES": "4x8"}}
    assert "benchmark.custom" in dict(report.mapped)["benchmark.type"]
    said = dict(report.deviations)["benchmark.command"]
    assert "builtin sweep sends natively" in said and "--set benchmark.custom=null" in said
    rmod.validate(out, "x.yaml")
    # no command: one sentence naming the key
    data["benchmark"] = {"type": "custom", "env": {}}
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert "benchmark.command" in one_line(e.value)


def test_a_vllm_router_front_ends_args_are_the_routers():
    data = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    data["frontend"] = {"type": "vllm-router", "enable_multiple_frontends": False,
                        "args": {"policy": "consistent_hash", "request-timeout-secs": 600,
                                 "port": 9000}}
    out, report = srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert out["router"] == {"policy": "consistent_hash",
                             "args": {"request-timeout-secs": 600}}
    assert "the launcher sets it" in dict(report.deviations)["frontend.args.port"]
    rmod.validate(out, "x.yaml")


def test_container_mounts_are_our_container_mounts():
    data = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    data["container_mounts"] = {"/lustre/ws": "/infmax-workspace"}
    out, report = srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert out["container"]["mounts"] == ["/lustre/ws:/infmax-workspace"]
    assert ("container_mounts./lustre/ws", "container.mounts") in report.mapped
    data["container_mounts"] = {"$INFMAX_WORKSPACE": "/infmax-workspace"}
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    assert "($NAME) in a mount is not expanded here" in one_line(e.value)


# --- list-valued flags ----------------------------------------------------------------------


def dsv4_v2(tmp_path: Path, **prefill_args) -> Path:
    data = yaml.safe_load((MIGRATED_DIR / "deepseek-v4-pro-8k1k-low-latency.yaml").read_text())
    data["roles"]["prefill"]["args"].update(prefill_args)
    f = tmp_path / "dsv4.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def test_a_list_flag_is_rendered_as_repeated_values(tmp_path):
    f = dsv4_v2(tmp_path, **{"numa-bind-nodes": [0, 0, 1, 1]})
    [run] = prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    commands = (run.run.path / "commands.sh").read_text()
    assert "--numa-bind --" in commands and "--numa-bind-nodes 0 0 1 1" in commands
    # longer than the GPUs an engine sees (InferenceX's MiniMax-M3 TP2 decodes write the
    # node's four): vLLM reads the first entries and starts, so it plans
    [longer] = prepare.prepare_all(str(f), ["prefill.args.numa-bind-nodes=[0, 0, 1, 1, 1]"],
                                   [], tmp_path / "runs2")
    assert "--numa-bind-nodes 0 0 1 1 1" in (longer.run.path / "commands.sh").read_text()
    assert yaml.safe_load((run.run.path / "recipe.yaml").read_text())[
        "prefill"]["args"]["numa-bind-nodes"] == [0, 0, 1, 1]


def test_numa_bind_nodes_of_the_wrong_length_is_one_sentence(tmp_path):
    f = dsv4_v2(tmp_path, **{"numa-bind-nodes": [0, 1]})
    with pytest.raises(UserError) as e:
        prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    assert one_line(e.value) == (
        "prefill.args.numa-bind-nodes lists 2 NUMA node(s), but each prefill engine process "
        "sees 4 GPU(s): list one node per GPU it sees")


def test_a_list_flag_goes_through_vllms_parser_like_every_flag(tmp_path):
    from launcher.sim import vllm_flags

    f = dsv4_v2(tmp_path, **{"numa-bind-nodes": [0, "x", 1, 1]})
    with pytest.raises(UserError) as e:  # the version the dry-run has the parser of
        prepare.prepare_all(str(f), [f"engine_version={vllm_flags.VLLM_VERSION}"], [],
                            tmp_path / "runs")
    text = str(e.value)
    assert "would refuse" in text and "prefill.args.numa-bind-nodes" in text, text
    with pytest.raises(UserError) as e:
        prepare.prepare_all(str(f), ["prefill.args.numa-bind-nodes=[0, '--help']"], [],
                            tmp_path / "runs")
    assert "read as an option" in str(e.value)


# --- the site file --------------------------------------------------------------------------


SITE = {
    "cluster": "gb200-a",
    "default_account": "acct",
    "default_partition": "batch",
    "default_time_limit": "04:00:00",
    "default_mounts": {"/lustre/cache": "/cache"},
    "model_paths": {"kimi": "nvidia/Kimi-K2.5-NVFP4"},
    "containers": {"vllm-021": "vllm/vllm-openai:v0.21.0"},
    "default_bash_preamble": "ulimit -n 1048576",
    "network_interface": "enP5p9s0",
}


def aliased(tmp_path: Path) -> Path:
    data = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    data["model"].update(path="kimi", container="vllm-021")
    f = tmp_path / "kimi.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def test_the_site_file_gives_aliases_mounts_and_defaults_and_reports_the_rest(cli, tmp_path):
    f = aliased(tmp_path)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE))
    out, report = srt_slurm.import_file(f, site=srt_slurm.load_site(site))
    assert out["model"]["path"] == "nvidia/Kimi-K2.5-NVFP4"
    assert out["container"] == {"image": "vllm/vllm-openai:v0.21.0", "mounts": ["/lustre/cache:/cache"]}
    assert out["slurm"] == {"account": "acct", "partition": "batch", "time_limit": "04:00:00"}
    rows = dict(report.deviations)
    assert "not run by this launcher" in rows[f"{site}:default_bash_preamble"]
    assert "network.interface" in rows[f"{site}:network_interface"]
    # srtctl reads srtslurm.yaml from where it runs: so does submit
    (tmp_path / "srtslurm.yaml").write_text(yaml.safe_dump(SITE))
    code, out_text, err = cli("recipes", "import", str(f))
    assert code == 0, err
    assert yaml.safe_load(out_text)["slurm"]["account"] == "acct"
    code, _, err = cli("submit", str(f), "--dry-run", "--runs-dir", str(tmp_path / "r"))
    assert code == 0, err
    (tmp_path / "srtslurm.yaml").unlink()
    code, _, err = cli("recipes", "import", str(f))
    assert code == 2 and err.count("--site SRTSLURM_YAML") == 2, err


def test_a_site_value_of_the_wrong_kind_is_one_sentence(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({**SITE, "containers": ["x"], "gpus_per_node": 8}))
    with pytest.raises(UserError) as e:
        srt_slurm.import_file(aliased(tmp_path), site=srt_slurm.load_site(site))
    text = one_line(e.value)
    assert "containers" in text and "gpus_per_node" in text


# --- mangled files --------------------------------------------------------------------------


SOURCES = sorted((srt_slurm.BUNDLED / "recipes").rglob("*.yaml")) + sorted(
    MIGRATED_DIR.glob("*.yaml")) + [AGENTIC]
WRONG = [None, [], [1, 2], "x", 7, {"a": 1}, "--help", True, -1, 1.5]


def _paths(node, pre=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield pre + (k,)
            yield from _paths(v, pre + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield pre + (i,)
            yield from _paths(v, pre + (i,))


def _mutants(text: str, rng: random.Random):
    """(what, text): values of the wrong type, keys deleted, the file cut short, tabs."""
    data = yaml.safe_load(text)
    paths = list(_paths(data))
    for path, delete in [(p, False) for p in rng.sample(paths, min(6, len(paths)))] + \
            [(p, True) for p in rng.sample(paths, min(2, len(paths)))]:
        d = yaml.safe_load(text)
        node = d
        for k in path[:-1]:
            node = node[k]
        value = rng.choice(WRONG)
        if delete:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        yield f"{'del' if delete else f'{value!r} at'} {path}", yaml.safe_dump(d)
    for cut in sorted(rng.sample(range(len(text)), 3)):
        yield f"cut at {cut}", text[:cut]
    yield "tabs", text.replace("  ", "\t")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_a_mangled_published_file_is_imported_or_refused_in_one_sentence(source, tmp_path):
    rng = random.Random(source.name)  # the same mutants every run
    for what, text in _mutants(source.read_text(), rng):
        f = tmp_path / source.name
        f.write_text(text)
        for ref in srt_slurm.variant_refs(str(f)):
            try:
                recipe = rmod.load(ref)
                prepare.plan_run(recipe, tmp_path / "runs", None)
            except UserError as e:
                lines = e.problems[1] if e.problems else [str(e)]
                assert all("\n" not in x and "\\n" not in x for x in lines), (what, str(e))


@pytest.mark.parametrize("path, value, named", [
    (("roles", "prefill", "args", "max-model-len"), "--help", "max-model-len"),
    (("resources", "gpus_per_node"), None, "resources.gpus_per_node"),
    (("resources", "gpus_per_node"), [4], "resources.gpus_per_node"),
    (("roles", "decode"), ["x"], "roles.decode"),
    (("roles",), None, "roles"),
    (("roles", "decode"), None, "roles: needs prefill and decode"),
])
def test_the_mangled_values_the_issue_names_are_one_sentence(path, value, named, tmp_path):
    data = yaml.safe_load((MIGRATED_DIR / "kimi-k2.5-1k1k-1p1d-dep4-dep8.yaml").read_text())
    node = data
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump(data))
    try:
        prepare.prepare_all(str(f), [], [], tmp_path / "runs")
    except UserError as e:
        text = str(e)
        assert named in text and "\\n" not in text, text
    else:  # vLLM 0.21's own parser judges it at preflight (the dry-run has 0.33's)
        assert named == "max-model-len"
